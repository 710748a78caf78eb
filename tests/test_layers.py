"""Imports only run downward: records at the bottom, workflows free of the trainer, data free of modules."""

import ast
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]


def module_name(path: Path) -> str:
    parts = list(path.relative_to(ROOT).with_suffix("").parts)
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def imports(path: Path) -> set[str]:
    """Every module a file imports, at any depth of its code (absolute names)."""
    out = set()
    package = module_name(path) if path.name == "__init__.py" else module_name(path).rpartition(".")[0]
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            out |= {a.name for a in node.names}
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                base = ".".join(package.split(".")[: len(package.split(".")) - node.level + 1]
                                + ([base] if base else []))
            out.add(base)
            out |= {f"{base}.{a.name}" for a in node.names}
    return out


GRAPH = {module_name(p): imports(p) for p in (ROOT / "drmas").rglob("*.py")}


def under(name: str, package: str) -> bool:
    return name == package or name.startswith(package + ".")


def offenders(importer: str, forbidden: tuple[str, ...]) -> dict[str, list[str]]:
    found = {}
    for mod, deps in GRAPH.items():
        if under(mod, importer):
            bad = sorted(d for d in deps if any(under(d, f) for f in forbidden))
            if bad:
                found[mod] = bad
    return found


@pytest.mark.parametrize(
    "importer, forbidden",
    [
        ("drmas.records", ("drmas",)),
        ("drmas.registry", ("drmas",)),
        ("drmas.hardware", ("drmas",)),
        ("drmas.tool_calls", ("drmas",)),
        ("drmas.ranks", ("drmas",)),
        ("drmas.watch", ("drmas.cli", "drmas.modules", "drmas.data", "drmas.engines", "drmas.workflows",
                         "drmas.callbacks", "drmas.models", "drmas.algorithms", "drmas.records")),
        ("drmas.atomic", ("drmas",)),
        ("drmas.checkout", ("drmas",)),
        # config files know the workflows' names, nothing of the trainer
        ("drmas.config_files", ("drmas.cli", "drmas.modules", "drmas.data", "drmas.engines",
                                "drmas.callbacks", "lightning")),
        # the top: a recipe runs the command line; the drmas command runs recipes
        ("drmas.recipes", ("drmas.command",)),
        ("drmas.iteration", ("drmas.data", "drmas.modules", "drmas.workflows", "drmas.engines",
                             "drmas.callbacks", "drmas.cli", "lightning")),
        ("drmas.console", ("drmas",)),
        ("drmas.children", ("drmas",)),
        ("drmas.episode_worker", ("drmas",)),
        ("drmas.algorithms", ("drmas.records", "drmas.workflows", "drmas.data", "drmas.engines",
                              "drmas.modules", "drmas.callbacks", "drmas.models", "drmas.cli",
                              "drmas.metrics", "lightning")),
        ("drmas.workflows", ("drmas.data", "drmas.modules", "drmas.callbacks", "drmas.engines", "drmas.cli",
                        "lightning")),
        ("drmas.engines", ("drmas.workflows", "drmas.data", "drmas.modules", "drmas.callbacks", "drmas.cli",
                           "lightning")),
        ("drmas.data", ("drmas.modules", "drmas.callbacks", "drmas.engines", "drmas.cli")),
        ("drmas.modules", ("drmas.data", "drmas.workflows", "drmas.callbacks", "drmas.cli")),
        ("drmas.callbacks", ("drmas.cli",)),
        ("drmas.models", ("drmas.workflows", "drmas.data", "drmas.modules", "drmas.callbacks",
                          "drmas.engines", "drmas.cli", "lightning")),
        ("drmas.packing", ("drmas.registry", "drmas.algorithms", "drmas.workflows", "drmas.data",
                           "drmas.engines", "drmas.modules", "drmas.callbacks", "drmas.models", "drmas.cli",
                           "lightning")),
        ("drmas.metrics", ("drmas.workflows", "drmas.data", "drmas.engines", "drmas.modules",
                           "drmas.callbacks", "drmas.cli")),
        ("drmas.plots", ("drmas.workflows", "drmas.data", "drmas.engines", "drmas.modules", "drmas.callbacks",
                         "drmas.cli")),
        ("drmas.evaluation", ("drmas.cli", "drmas.callbacks")),
        ("drmas.summary", ("drmas.cli", "drmas.workflows", "drmas.data", "drmas.engines", "drmas.modules")),
        ("drmas.report", ("drmas.cli", "drmas.workflows", "drmas.data", "drmas.engines", "drmas.modules",
                          "drmas.callbacks")),
        # the page reads the records' files (drmas.data.episodes reads them) and nothing of a trainer
        ("drmas.view", ("drmas.cli", "drmas.workflows", "drmas.engines", "drmas.modules", "drmas.callbacks",
                        "lightning", "torch")),
    ],
)
def test_imports_run_downward(importer, forbidden):
    assert offenders(importer, forbidden) == {}


def test_the_walk_sees_real_imports():
    # guards the test itself: a rule that can never fail is no rule
    assert "drmas.records" in GRAPH["drmas.workflows.episode"]
    assert any(under(d, "drmas.data") for d in GRAPH["drmas.cli"])
    assert "drmas.algorithms.advantages" in GRAPH["drmas.algorithms"]  # relative-free package import


def test_every_module_is_under_a_rule():
    """A new top-level module or package must say what it may import (a rule above)."""
    ruled = {"drmas", "drmas.cli", "drmas.registry", "drmas.records", "drmas.hardware", "drmas.ranks",
             "drmas.watch",
             "drmas.atomic", "drmas.console", "drmas.children", "drmas.episode_worker", "drmas.algorithms",
             "drmas.workflows",
             "drmas.engines", "drmas.data", "drmas.modules", "drmas.callbacks", "drmas.models",
             "drmas.packing", "drmas.tool_calls", "drmas.metrics", "drmas.plots", "drmas.evaluation",
             "drmas.report", "drmas.summary", "drmas.checkout", "drmas.iteration", "drmas.view",
             "drmas.recipes", "drmas.command", "drmas.config_files"}
    tops = {".".join(m.split(".")[:2]) for m in GRAPH}
    assert tops - ruled == set(), "add a rule (and a line in docs/architecture.md) for these"


def test_nothing_imports_a_recipe():
    files = [p for d in ("drmas", "tests", "bench", "examples", "recipes") for p in (ROOT / d).rglob("*.py")]
    bad = {str(p.relative_to(ROOT)): sorted(d for d in imports(p) if under(d, "recipes")) for p in files}
    assert {k: v for k, v in bad.items() if v} == {}
    # the package's recipes and command sit above everything else of drmas's
    above = {mod: sorted(d for d in deps if under(d, "drmas.recipes") or under(d, "drmas.command"))
             for mod, deps in GRAPH.items() if not under(mod, "drmas.recipes") and mod != "drmas.command"}
    assert {k: v for k, v in above.items() if v} == {}


@pytest.mark.integration  # a fresh interpreter imports the workflows (7 s)
def test_workflows_load_without_lightning_or_engines():
    code = ("import sys, drmas.workflows.search, drmas.workflows.math, drmas.data.rollouts; "
            "print(sorted(m for m in ('lightning', 'drmas.engines', 'drmas.modules', "
            "'drmas.data.datamodule') "
            "if m in sys.modules))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.strip() == "[]"


def test_an_episode_worker_starts_without_torch():
    """Each worker imports this module: no torch, nothing of drmas's above it."""
    code = ("import sys, drmas.episode_worker; "
            "print(sorted(m for m in ('torch', 'drmas.workflows') if m in sys.modules))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.strip() == "[]"


def test_the_trainer_and_the_rollout_side_name_no_engine():
    """Everything engine-specific lives with its engine (``Engine.settings_type``, ``available``,
    ``context_limit``...): a new engine is one file, not edits to the trainer."""
    import re

    named = re.compile(r"vllm|HFEngine|engines\.hf\b|[\"']hf[\"']", re.IGNORECASE)
    hits = [f"{p.relative_to(ROOT)}:{i}: {line.strip()}"
            for package in ("modules", "data") for p in sorted((ROOT / "drmas" / package).rglob("*.py"))
            for i, line in enumerate(p.read_text().splitlines(), 1) if named.search(line)]
    assert not hits, "\n".join(hits)


def test_drmas_raises_no_future_warning_of_its_own():
    """No renamed-name shims: before 1.0 a rename is outright (CHANGELOG.md)."""
    hits = [f"{p.relative_to(ROOT)}:{node.lineno}" for p in sorted((ROOT / "drmas").rglob("*.py"))
            for node in ast.walk(ast.parse(p.read_text())) if isinstance(node, ast.Call)
            and getattr(node.func, "attr", None) == "warn" and "FutureWarning" in ast.unparse(node)]
    assert not hits, hits


def test_the_contract_table_is_the_rollout_protocol():
    """docs/architecture.md's table of the trainer's side of the rollout contract names exactly the
    members of ``RolloutBackend``, and ``MultiAgentRL`` has every one."""
    import inspect
    import re

    from drmas.data.rollouts import RolloutBackend
    from drmas.modules import MultiAgentRL

    doc = (ROOT / "docs" / "architecture.md").read_text()
    section = doc.split("## One contract between rollouts and the trainer")[1].split("\n## ")[0]
    rows = [line.split("|")[1] for line in section.splitlines() if line.startswith("| `")]
    named = {re.match(r"\w+", name)[0] for row in rows for name in re.findall(r"`([^`]+)`", row)}
    members = set(RolloutBackend.__annotations__) | {
        n for n, v in vars(RolloutBackend).items() if inspect.isfunction(v) and not n.startswith("_")}
    assert named == members
    assert all(hasattr(MultiAgentRL, m) for m in members - {"iteration"})
