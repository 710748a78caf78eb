"""Where a checkout keeps its configs and recipe scripts."""

from __future__ import annotations

import os

__all__ = ["CONFIGS", "RECIPES", "recipe_script"]

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

CONFIGS = os.path.join(ROOT, "configs")
"""The configs shipped with a checkout (the recipes' default configs live here)."""

RECIPES = {"search": "search.py", "math": "math_team.py", "code": "code_team.py", "games": "games.py",
           "debate": "debate.py", "agents": "agents.py"}
"""Each shipped recipe's script in ``recipes/``. The math and code recipes are not ``math.py`` and
``code.py``: Python puts a script's folder first on ``sys.path``, where those would shadow the
standard library's modules of the same names."""


def recipe_script(recipe: str) -> str:
    """The path of a shipped recipe's script (a KeyError names the recipes there are)."""
    if recipe not in RECIPES:
        raise KeyError(f"no recipe {recipe!r}; the recipes: {sorted(RECIPES)}")
    return os.path.join(ROOT, "recipes", RECIPES[recipe])
