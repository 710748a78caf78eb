"""Dr. MAS multi-turn search: a verifier routes, a searcher searches, an answerer answers.

The recipe 'search' of drmas.recipes.search (its docstring lists the commands), run from a
checkout: ``python recipes/search.py fit``, as ``python -m drmas.recipes.search fit`` from any folder.
"""

from drmas.recipes import main

if __name__ == "__main__":
    main("search")
