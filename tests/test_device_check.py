"""The GPU device check (scripts/device_check.sh) on a machine without CUDA: it refuses in one line
with exit 2, before anything runs (its dry run is ``bash scripts/device_check.sh --dry-run``)."""

import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

ROOT = Path(__file__).resolve().parent.parent


@pytest.mark.integration  # runs scripts/device_check.sh, which starts Python processes
@pytest.mark.skipif(torch.cuda.is_available(), reason="this machine has a CUDA device")
@pytest.mark.parametrize("mode", [[], ["recipes"], ["8b"]])
def test_the_device_check_refuses_without_a_cuda_device(tmp_path, mode):
    proc = subprocess.run(["bash", str(ROOT / "scripts" / "device_check.sh"), *mode], cwd=tmp_path,
                          env={**os.environ, "OUT": str(tmp_path / "out"), "PYTHON": sys.executable},
                          capture_output=True, text=True, timeout=120)
    assert proc.returncode == 2, proc.stderr
    assert proc.stderr.splitlines() == [
        f"device_check: no CUDA device here ({sys.executable}: torch.cuda.is_available() is not True); "
        "run it on the lent GPU machine, or with --dry-run"]
    assert not os.listdir(tmp_path / "out")  # nothing ran


def test_the_device_check_names_what_it_needs_carried(tmp_path):
    """--dry-run in a copy without .whl/ and .devcarry/: one line that says how to make them."""
    script = tmp_path / "scripts" / "device_check.sh"
    script.parent.mkdir()
    script.write_text((ROOT / "scripts" / "device_check.sh").read_text())
    env = {**os.environ, "OUT": str(tmp_path / "out"), "PYTHON": sys.executable}
    proc = subprocess.run(["bash", str(script), "--dry-run"], cwd=tmp_path, capture_output=True, text=True,
                          env=env, timeout=60)
    assert proc.returncode == 2
    assert proc.stderr.splitlines() == ["device_check: .whl/ or .devcarry/ is missing: run "
                                        "scripts/device_prepare.sh here and carry both"]
