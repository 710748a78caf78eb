"""bench/study.py through bench/learning.py on the tiny random model: a study killed in its first
run continues from the run's checkpoint, refuses another precision, reads finished runs back, and
starts again a run whose checkpoint stayed on another machine."""

import json
import os
import shutil
import signal
import subprocess
import sys
import time

import pytest
from recipe_runs import ROOT

from drmas.plots import read_scalars

pytestmark = pytest.mark.integration  # runs bench/study.py, and the recipe, in processes of their own


def test_a_killed_study_continues_and_refuses_another_precision(tmp_path):
    out = tmp_path / "study"
    cmd = [sys.executable, str(ROOT / "bench" / "learning.py"),
           "--config", str(ROOT / "configs" / "tiny_random.yaml"),
           "--seeds", "0", "--iterations", "3", "--val_every", "3", "--val_tasks", "1", "--val_k", "2",
           "--out", str(out), "--", "--model.engine", "hf"]
    run = out / "main" / "seed0"
    ckpt = run / "search" / "version_0" / "checkpoints" / "last.ckpt"
    proc = subprocess.Popen(cmd, cwd=tmp_path, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            start_new_session=True)
    deadline = time.time() + 600
    while not ckpt.exists() and proc.poll() is None and time.time() < deadline:
        time.sleep(0.5)
    assert proc.poll() is None, proc.communicate()[1][-3000:]
    os.killpg(proc.pid, signal.SIGKILL)  # the driver and its recipe process, after iteration 1 or later
    proc.wait()
    record = json.loads((run / "run.json").read_text())
    assert "finished" not in record and record["precision"] in ("bf16-mixed", "32-true")
    assert "cores" in record["machine"]

    # a machine of another precision stops the study with the reason, and changes nothing
    other = "32-true" if record["precision"] == "bf16-mixed" else "bf16-mixed"
    (run / "run.json").write_text(json.dumps({**record, "precision": other}))
    refused = subprocess.run(cmd, cwd=tmp_path, capture_output=True, text=True, timeout=600)
    assert refused.returncode != 0
    assert (f"main-seed0 started in {other} on" in refused.stderr
            and "two precisions in one curve" in refused.stderr)
    (run / "run.json").write_text(json.dumps(record))

    again = subprocess.run(cmd, cwd=tmp_path, capture_output=True, text=True, timeout=600)
    assert again.returncode == 0, again.stderr[-3000:]
    assert "[1/1] main-seed0: continuing after iteration" in again.stdout and "iteration 3/3" in again.stdout
    s = read_scalars(str(run / "search" / "version_0"))  # one log folder for both calls
    assert [i for i, _ in s["rollout/success_rate"]] == [1, 2, 3] and [i for i, _ in s["val/avg@2"]] == [0, 3]
    assert json.loads((run / "run.json").read_text())["finished"]
    assert not ckpt.exists() and (run / "search" / "version_0" / "hf").is_dir()  # weights kept, optimiser not
    gain = (out / "main" / "gain.md").read_text()
    assert "| avg@2 | all | 0.000 | 0.000 | +0.000 | [+0.000, +0.000] | no |" in gain
    assert (out / "main" / "validation.png").read_bytes()[:4] == b"\x89PNG"

    # finished: read back, nothing run again
    third = subprocess.run(cmd, cwd=tmp_path, capture_output=True, text=True, timeout=600)
    assert third.returncode == 0 and "1 of 1 runs finished before; 0 to run" in third.stdout
    assert (out / "main" / "gain.md").read_text() == gain

    # as git carries it to another machine: started there, its checkpoint and weights left behind;
    # its partial logs go and it runs again, so no iteration is logged twice
    record = json.loads((run / "run.json").read_text())
    del record["finished"]
    (run / "run.json").write_text(json.dumps({**record, "machine": "elsewhere"}))
    shutil.rmtree(run / "search" / "version_0" / "hf")
    fourth = subprocess.run(cmd, cwd=tmp_path, capture_output=True, text=True, timeout=600)
    assert fourth.returncode == 0, fourth.stderr[-3000:]
    assert "main-seed0: started on elsewhere without a checkpoint here; starting it again" in fourth.stdout
    s = read_scalars(str(run / "search" / "version_0"))
    assert [i for i, _ in s["rollout/success_rate"]] == [1, 2, 3] and [i for i, _ in s["val/avg@2"]] == [0, 3]
    assert json.loads((run / "run.json").read_text())["machine"] != "elsewhere"
