"""bench/baselines.py end to end on the tiny random model: two rows, one iteration, one seed."""

import subprocess
import sys

import pytest
from recipe_runs import ROOT

pytestmark = pytest.mark.integration  # runs bench/baselines.py, and the recipes, in processes of their own


def test_two_rows_of_the_baselines_matrix(tmp_path):
    cmd = [sys.executable, str(ROOT / "bench" / "baselines.py"), "--recipe", "math",
           "--config", str(ROOT / "configs" / "tiny_random.yaml"),
           "--rows", "prompt_only", "drmas", "at_grpo",
           "--seeds", "0", "--iterations", "1", "--val_every", "1", "--model", "tiny-random",
           "--out", str(tmp_path / "bl"), "--", "--model.engine", "hf"]
    proc = subprocess.run(cmd, cwd=tmp_path, capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stderr[-3000:]
    table = (tmp_path / "bl" / "baselines.md").read_text()
    assert ("| prompt_only | 0.000 ± 0.000 | - | 1 |" in table
            and "| drmas | 0.000 ± 0.000 | 0.000 ± 0.000 | 1 |" in table)
    # the trained row did not evaluate its initial weights again: its iteration-0 point is prompt_only's
    from drmas.plots import read_scalars

    trained = read_scalars(str(tmp_path / "bl" / "runs" / "drmas-seed0" / "math" / "version_0"))
    assert [s for s, _ in trained["val/avg@2"]] == [1] and "rollout/success_rate" in trained
    for png in ("val.png", "success.png"):
        assert (tmp_path / "bl" / png).read_bytes()[:4] == b"\x89PNG"
    # a row the workflow cannot play is a line of the table, not the end of the matrix
    assert "| at_grpo | n/a: SolverVerifierWorkflow does not support sampling='tree'" in table
    # called again with the same --out, finished runs are read back, not run again
    again = subprocess.run(cmd, cwd=tmp_path, capture_output=True, text=True, timeout=600)
    assert again.returncode == 0 and "2 runs (2 read back from an earlier call)" in again.stdout
    assert (tmp_path / "bl" / "baselines.md").read_text() == table
    bad = subprocess.run(cmd[:2] + ["--recipe", "search", "--rows", "single"], capture_output=True, text=True)
    assert bad.returncode != 0 and "unknown rows ['single']; rows of search: prompt_only, grpo" in bad.stderr
