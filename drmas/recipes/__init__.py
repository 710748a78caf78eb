"""The shipped recipes, a module each, run from any folder after ``pip install drmas``:
``python -m drmas.recipes.search fit`` (or ``drmas search fit``); a checkout's ``recipes/*.py`` call
the same :func:`main`. Each is :func:`drmas.cli.run_recipe` with its workflow over the packaged
default config (:data:`DEFAULT_CONFIG`: the embedded model on a CPU); ``--config NAME`` takes any
shipped config by name (``drmas configs`` lists them, ``drmas cp NAME FILE`` copies one out)."""

from __future__ import annotations

from typing import Any

__all__ = ["DEFAULT_CONFIG", "WORKFLOWS", "main"]

WORKFLOWS = {"search": "search", "math": "math_solver_verifier", "code": "code", "games": "games",
             "debate": "debate", "agents": "agents"}
"""Each recipe's default workflow; its logs and its ``recipes.<name>`` config section take the
recipe's name."""

DEFAULT_CONFIG = "smollm2_135m_cpu"
"""The shipped config every recipe reads first (``--config`` files and flags override it)."""


def main(recipe: str, args: list[str] | None = None) -> Any:
    """Run ``recipe``'s command line (``args``, else ``sys.argv``). A rank of a multi-rank run ends
    its process when the run is done (:func:`drmas.cli.exit_now`)."""
    from drmas.checkout import config_path
    from drmas.cli import exit_now, run_recipe

    cli = run_recipe(WORKFLOWS[recipe], recipe, config_path(DEFAULT_CONFIG), args)
    if getattr(cli, "ranks_left", 1) > 1:
        exit_now(0)
    return cli
