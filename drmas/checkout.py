"""Where drmas keeps its shipped configs (inside the package, so a wheel has them), where a
checkout keeps its recipe scripts, and which folders of ``sys.path`` are drmas's own."""

from __future__ import annotations

import os
import re

__all__ = ["CONFIGS", "RECIPES", "SCRIPT_FOLDERS", "config_args", "config_path", "recipe_script",
           "shipped_configs", "without_drmas_folders"]

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

CONFIGS = os.path.join(os.path.dirname(os.path.abspath(__file__)), "configs")
"""The shipped configs (``drmas/configs``; a checkout's ``configs/`` links to it)."""


def shipped_configs() -> list[str]:
    """The shipped configs' names (``qwen3_8b`` for ``drmas/configs/qwen3_8b.yaml``)."""
    return sorted(f.removesuffix(".yaml") for f in os.listdir(CONFIGS) if f.endswith(".yaml"))


def config_path(name: str) -> str:
    """The path of the shipped config ``name`` (``.yaml`` optional); a KeyError names the shipped ones."""
    path = os.path.join(CONFIGS, name.removesuffix(".yaml") + ".yaml")
    if os.sep in name or not os.path.isfile(path):
        raise KeyError(f"no shipped config {name!r}; the shipped configs: {', '.join(shipped_configs())}")
    return path


def _shipped_config(value: str) -> str:
    """``--config``'s value, or the shipped config it names where no file of that name exists."""
    if os.path.exists(value) or not re.fullmatch(r"[\w.-]+", value):  # a file, or inline YAML
        return value
    try:
        return config_path(value)
    except KeyError as err:
        raise KeyError(f"--config {value}: no such file, and {err.args[0]}") from None


def config_args(args: list[str]) -> list[str]:
    """``args`` with each ``--config NAME`` (or ``--config=NAME``) naming a shipped config by name
    (``qwen3_8b``) replaced by its path; a name that is neither a file nor shipped: a KeyError."""
    out = list(args)
    for i, arg in enumerate(out):
        if arg == "--config" and i + 1 < len(out):
            out[i + 1] = _shipped_config(out[i + 1])
        elif arg.startswith("--config="):
            out[i] = "--config=" + _shipped_config(arg.split("=", 1)[1])
    return out


RECIPES = {"search": "search.py", "math": "math_team.py", "code": "code_team.py", "games": "games.py",
           "debate": "debate.py", "agents": "own_agents.py"}
"""Each shipped recipe's script in ``recipes/``. Python puts a script's folder first on
``sys.path``, so no script name may be a module a recipe or a library imports: not ``math.py`` or
``code.py`` (the standard library's), not ``agents.py`` (the OpenAI Agents SDK's package);
``tests/test_import_world.py`` checks every script folder against the installed distributions."""

SCRIPT_FOLDERS = tuple(os.path.join(ROOT, d) for d in ("recipes", "bench", "scripts", "tests"))
"""The folders of the scripts drmas ships (and of its tests): on ``sys.path`` only because Python
put a script's folder there."""

_OWN = tuple(os.path.realpath(f) for f in (*SCRIPT_FOLDERS, os.path.dirname(os.path.abspath(__file__))))


def without_drmas_folders(path: list[str]) -> list[str]:
    """``path`` (a ``sys.path``) without drmas's script folders or its package's own folder (and
    anything below them): what a user's program imports from besides its own folder and the working
    directory, so that no module of drmas's can shadow a package the program imports."""

    def own(entry: str) -> bool:
        real = os.path.realpath(entry or os.curdir)
        return any(real == f or real.startswith(f + os.sep) for f in _OWN)

    return [entry for entry in path if not own(entry)]


def recipe_script(recipe: str) -> str:
    """The path of a shipped recipe's script (a KeyError names the recipes there are)."""
    if recipe not in RECIPES:
        raise KeyError(f"no recipe {recipe!r}; the recipes: {sorted(RECIPES)}")
    return os.path.join(ROOT, "recipes", RECIPES[recipe])
