"""drmas as a user installs it: the built wheel (not the editable checkout) in a fresh virtual
environment runs a recipe from an empty folder with a shipped config by name, and its ``drmas``
command lists and copies the shipped configs.

The environment is made with ``--system-site-packages`` and its dependencies come from the test's
own environment (a ``.pth`` line naming its site-packages, whose own ``.pth`` files, the editable
install's among them, are not run): the tests have no network, so ``pip install --no-deps``."""

from __future__ import annotations

import glob
import os
import shutil
import subprocess
import sys
import sysconfig
from pathlib import Path

import pytest
import yaml

ROOT = Path(__file__).resolve().parents[1]

pytestmark = pytest.mark.integration  # builds a wheel and runs a recipe in a process of its own


@pytest.fixture(scope="module")
def venv(tmp_path_factory) -> Path:
    """A virtual environment with the freshly built wheel installed: its ``bin`` folder."""
    root = tmp_path_factory.mktemp("wheel")
    # built from a copy: an in-tree build reuses build/, where files deleted from drmas/ would linger
    source = root / "source"
    shutil.copytree(ROOT, source, symlinks=True, ignore=shutil.ignore_patterns(
        ".git", ".venv", "build", "*.egg-info", "__pycache__", ".*_cache", ".hypothesis", "runs"))
    subprocess.run([sys.executable, "-m", "pip", "wheel", "--no-deps", "--no-build-isolation", "-q",
                    "-w", str(root / "dist"), str(source)], check=True, capture_output=True, cwd=root)
    (wheel,) = glob.glob(str(root / "dist" / "drmas-*.whl"))
    subprocess.run([sys.executable, "-m", "venv", "--system-site-packages", "--without-pip",
                    str(root / "venv")], check=True)
    python = root / "venv" / "bin" / "python"
    site = subprocess.run([str(python), "-c", "import sysconfig; print(sysconfig.get_path('purelib'))"],
                          check=True, capture_output=True, text=True).stdout.strip()
    Path(site, "test_environment.pth").write_text(sysconfig.get_path("purelib") + "\n")
    subprocess.run([str(python), "-m", "pip", "install", "--no-deps", "-q", wheel], check=True,
                   capture_output=True)
    return root / "venv" / "bin"


def run(venv: Path, *args: str, cwd: Path) -> subprocess.CompletedProcess:
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    return subprocess.run(args, cwd=cwd, env={**env, "PATH": f"{venv}{os.pathsep}{env['PATH']}"},
                          capture_output=True, text=True, timeout=600)


def test_the_installed_wheel_trains_a_recipe_from_an_empty_folder(venv, tmp_path):
    where = run(venv, "python", "-c", "import drmas.recipes; print(drmas.recipes.__file__)", cwd=tmp_path)
    assert where.stdout.startswith(str(venv.parent)), where  # the wheel's drmas, not the checkout's
    proc = run(venv, "python", "-m", "drmas.recipes.search", "fit", "--config", "tiny_random",
               "--trainer.max_epochs", "1", "--data.validation.tasks", "0", "--model.engine", "hf",
               "--trainer.logger.init_args.save_dir", "runs", cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr[-4000:]
    run_dir = tmp_path / "runs" / "search" / "version_0"
    assert "(iterations 1 and 1;" in proc.stdout  # the end-of-run table
    assert (run_dir / "checkpoints" / "last.ckpt").is_file()
    assert (run_dir / "hf" / "iter_1" / "shared" / "model.safetensors").is_file()
    assert (run_dir / "episodes" / "iter_000001.jsonl.gz").is_file()
    # the packaged tiny_random config, found by name (the default config says the embedded model)
    config = yaml.safe_load((run_dir / "config.yaml").read_text())
    assert config["model"]["policies"]["shared"]["model"] == "tiny-random"


def test_the_drmas_command_lists_and_copies_configs(venv, tmp_path):
    names = run(venv, "drmas", "configs", cwd=tmp_path).stdout.split()
    assert {"qwen3_8b", "smollm2_135m_cpu", "tiny_random"} <= set(names)
    copied = run(venv, "drmas", "cp", "qwen3_8b", ".", cwd=tmp_path)
    assert copied.returncode == 0 and (tmp_path / "qwen3_8b.yaml").read_text() == \
        (ROOT / "drmas" / "configs" / "qwen3_8b.yaml").read_text()
    again = run(venv, "drmas", "cp", "qwen3_8b", ".", cwd=tmp_path)
    assert again.returncode == 1 and "exists" in again.stderr
    # (an unknown --config name is refused in tests/test_shipped_configs.py, without a recipe's imports)


def test_the_wheel_carries_the_agents_recipes_default_team(venv, tmp_path):
    # the agents workflow without an episode or tasks: the example team, from the installed package
    code = ("from drmas.workflows.agents import AgentsWorkflow; w = AgentsWorkflow(); "
            "print(w.episode); print(list(w.agents))")
    proc = run(venv, "python", "-c", code, cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr[-4000:]
    episode, agents = proc.stdout.strip().splitlines()[-2:]
    assert str(venv.parent) in episode and "example_team/math_team.py" in episode  # loaded there
    assert agents == "['solver', 'verifier']"
    example = ROOT / "examples" / "agents"  # the checkout's files are links to the package's
    assert all((example / f).resolve().parent == ROOT / "drmas" / "workflows" / "agents" / "example_team"
               for f in ("math_team.py", "train.jsonl", "val.jsonl"))
