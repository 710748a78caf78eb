"""Code with two agents (AT-GRPO): a coder writes a program, a tester writes tests.

    python recipes/code.py fit                                   # embedded problems, embedded model, CPU
    python recipes/code.py fit --data.workflow.init_args.train my_problems.jsonl
    python recipes/code.py fit --data.rollout.sampling tree --data.rollout.estimator at_grpo
    python recipes/code.py fit --config configs/qwen3_8b.yaml    # GPUs
"""

import os
import sys

sys.path[0] = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))  # run from a checkout, uninstalled

from drmas.cli import CONFIGS, run_recipe  # noqa: E402

if __name__ == "__main__":
    run_recipe("code", "code", os.path.join(CONFIGS, "smollm2_135m_cpu.yaml"))
