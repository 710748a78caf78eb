"""The ``drmas`` command (installed with the package):

    drmas search fit [--config qwen3_8b] [flags]   # a recipe, as python -m drmas.recipes.search
    drmas configs                                  # the shipped configs' names
    drmas cp qwen3_8b my_run.yaml                  # a shipped config copied out, to edit
"""

from __future__ import annotations

import os
import shutil
import sys

from drmas.checkout import config_path, shipped_configs
from drmas.recipes import WORKFLOWS, main as run

__all__ = ["main"]

USAGE = (f"usage: drmas RECIPE {{fit,validate,test}} [flags]   (RECIPE: {', '.join(WORKFLOWS)})\n"
         "       drmas configs\n"
         "       drmas cp CONFIG FILE")


def copy_config(name: str, dest: str) -> str:
    """Copy the shipped config ``name`` to ``dest`` (a file, or a folder to put it in); never over a
    file that exists. Returns the path written."""
    source = config_path(name)
    if os.path.isdir(dest):
        dest = os.path.join(dest, os.path.basename(source))
    if os.path.exists(dest):
        raise FileExistsError(f"{dest} exists; drmas cp does not overwrite")
    shutil.copyfile(source, dest)
    return dest


def main(argv: list[str] | None = None) -> None:
    args = sys.argv[1:] if argv is None else argv
    if not args or args[0] in ("-h", "--help"):
        print(USAGE)
        sys.exit(0 if args else 2)
    if args[0] == "configs":
        print("\n".join(shipped_configs()))
        return
    if args[0] == "cp":
        if len(args) != 3:
            sys.exit(f"{USAGE}\ndrmas cp takes a config's name and a destination")
        try:
            print(copy_config(args[1], args[2]))
        except (KeyError, FileExistsError) as err:
            sys.exit(f"error: {err.args[0]}")
        return
    if args[0] not in WORKFLOWS:
        sys.exit(f"error: no recipe {args[0]!r}\n{USAGE}")
    sys.argv = [f"drmas {args[0]}", *args[1:]]  # the recipe's own command line, as its module reads it
    run(args[0])
