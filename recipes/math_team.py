"""Math reasoning with two agents: Dr. MAS solver/verifier (default) or AT-GRPO reasoner/tool user.

The recipe 'math' of drmas.recipes.math (its docstring lists the commands), run from a
checkout: ``python recipes/math_team.py fit``, as ``python -m drmas.recipes.math fit`` from any folder.
"""

from drmas.recipes import main

if __name__ == "__main__":
    main("math")
