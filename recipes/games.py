"""Planning puzzles with two agents (AT-GRPO): a tool user writes a program, a planner acts.

    python recipes/games.py fit                                   # Plan-Path 4x4, embedded model, CPU
    python recipes/games.py fit --data.workflow.init_args.game sokoban --data.workflow.init_args.size 6
    python recipes/games.py fit --data.workflow.init_args.game sudoku --data.workflow.init_args.size 4
    python recipes/games.py fit --data.rollout.sampling tree --data.rollout.estimator at_grpo
    python recipes/games.py fit --config configs/qwen3_8b.yaml    # GPUs
"""

import os

from drmas.checkout import CONFIGS
from drmas.cli import run_recipe

if __name__ == "__main__":
    run_recipe("games", "games", os.path.join(CONFIGS, "smollm2_135m_cpu.yaml"))
