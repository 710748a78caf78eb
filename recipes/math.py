"""Math reasoning with two agents: Dr. MAS solver/verifier (default) or AT-GRPO reasoner/tool user.

    python recipes/math.py fit                                   # embedded default, CPU, offline
    python recipes/math.py fit --config configs/qwen3_8b.yaml    # GPUs
    python recipes/math.py fit --data.workflow math_reasoner_tool_user \\
        --data.rollout.sampling tree --data.rollout.estimator at_grpo           # the AT-GRPO team (4 turns;
                                                                # --data.workflow.init_args.max_turns 2
                                                                # on a CPU)
    python recipes/math.py fit --print_config
"""

import os
import sys

# Python puts this script's folder first on sys.path, where this file would shadow the standard
# library's `math`; the checkout's root takes its place (so recipes run uninstalled).
sys.path[0] = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

from drmas.cli import CONFIGS, run_recipe  # noqa: E402

if __name__ == "__main__":
    run_recipe("math_solver_verifier", "math", os.path.join(CONFIGS, "smollm2_135m_cpu.yaml"))
