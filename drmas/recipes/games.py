"""Planning puzzles with two agents (AT-GRPO): a tool user writes a program, a planner acts.

    python -m drmas.recipes.games fit  # Plan-Path 4x4, embedded model, CPU
    python -m drmas.recipes.games fit --data.workflow.init_args.game sokoban --data.workflow.init_args.size 6
    python -m drmas.recipes.games fit --data.workflow.init_args.game sudoku --data.workflow.init_args.size 4
    python -m drmas.recipes.games fit --data.rollout.sampling tree --data.rollout.estimator at_grpo
    python -m drmas.recipes.games fit --config qwen3_8b  # GPUs
"""

from drmas.recipes import main

if __name__ == "__main__":
    main("games")
