"""Code with two agents (AT-GRPO): a coder writes a program, a tester writes tests.

    python recipes/code_team.py fit                                   # embedded problems, embedded model, CPU
    python recipes/code_team.py fit --data.workflow.init_args.train my_problems.jsonl
    python recipes/code_team.py fit --data.rollout.sampling tree --data.rollout.estimator at_grpo
    python recipes/code_team.py fit --config configs/qwen3_8b.yaml    # GPUs
"""

import os

from drmas.checkout import CONFIGS
from drmas.cli import run_recipe

if __name__ == "__main__":
    run_recipe("code", "code", os.path.join(CONFIGS, "smollm2_135m_cpu.yaml"))
