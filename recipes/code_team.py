"""Code with two agents (AT-GRPO): a coder writes a program, a tester writes tests.

The recipe 'code' of drmas.recipes.code (its docstring lists the commands), run from a
checkout: ``python recipes/code_team.py fit``, as ``python -m drmas.recipes.code fit`` from any folder.
"""

from drmas.recipes import main

if __name__ == "__main__":
    main("code")
