"""A debate: two debaters argue about a math word problem, a judge picks one; the verdict

The recipe 'debate' of drmas.recipes.debate (its docstring lists the commands), run from a
checkout: ``python recipes/debate.py fit``, as ``python -m drmas.recipes.debate fit`` from any folder.
"""

from drmas.recipes import main

if __name__ == "__main__":
    main("debate")
