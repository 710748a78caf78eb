"""The lint holds on every run of the suite: ruff with the project's own rules (pyproject.toml)."""

import importlib.util
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]


def test_ruff_finds_nothing():
    if importlib.util.find_spec("ruff") is None:
        pytest.fail("ruff is not installed: run `bash scripts/setup.sh --dev` (the dev extra brings it)")
    proc = subprocess.run([sys.executable, "-m", "ruff", "check", "drmas", "tests", "recipes", "bench"],
                          cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stdout + proc.stderr
