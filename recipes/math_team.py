"""Math reasoning with two agents: Dr. MAS solver/verifier (default) or AT-GRPO reasoner/tool user.

    python recipes/math_team.py fit                                   # embedded default, CPU, offline
    python recipes/math_team.py fit --config configs/qwen3_8b.yaml    # GPUs
    python recipes/math_team.py fit --data.workflow math_reasoner_tool_user \\
        --data.rollout.sampling tree --data.rollout.estimator at_grpo           # the AT-GRPO team (4 turns;
                                                                # --data.workflow.init_args.max_turns 2
                                                                # on a CPU)
    python recipes/math_team.py fit --print_config
"""

import os

from drmas.checkout import CONFIGS
from drmas.cli import run_recipe

if __name__ == "__main__":
    run_recipe("math_solver_verifier", "math", os.path.join(CONFIGS, "smollm2_135m_cpu.yaml"))
