"""Planning puzzles with two agents (AT-GRPO): a tool user writes a program, a planner acts.

The recipe 'games' of drmas.recipes.games (its docstring lists the commands), run from a
checkout: ``python recipes/games.py fit``, as ``python -m drmas.recipes.games fit`` from any folder.
"""

from drmas.recipes import main

if __name__ == "__main__":
    main("games")
