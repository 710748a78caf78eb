"""A run from before the renames (``train_sampling`` -> ``train_generation``, a workflow's
``modes``/``mode`` -> ``samplings``/``sampling``): its config, read with a warning naming the new
key, and its checkpoint, written by the code of that time, resume and validate with today's code."""

import io
import json
import subprocess
import sys
import tarfile

import pytest
from recipe_runs import ROOT, TINY, run_dir

from drmas.plots import read_scalars
from forked import run_script

BEFORE = "fa7e15f0bad5bd47c6804bb622ebfc64b8fb2c35"
"""The last commit before the renames."""


def test_a_run_from_before_the_renames_resumes_and_validates(tmp_path):
    archive = subprocess.run(["git", "-C", str(ROOT), "archive", BEFORE], capture_output=True)
    if archive.returncode != 0:
        pytest.skip(f"commit {BEFORE[:7]} (before the renames) is not in this checkout's history")
    old = tmp_path / "old"
    with tarfile.open(fileobj=io.BytesIO(archive.stdout)) as tar:
        tar.extractall(old, filter="data")
    old_config = ["--config", str(old / "configs" / "tiny_random.yaml")]  # train_sampling, eval_sampling
    logs = ["--trainer.logger.init_args.save_dir", str(tmp_path / "runs"), "--model.engine", "hf"]
    # the code of that time, in a process of its own: one iteration and its checkpoint
    first = subprocess.run([sys.executable, str(old / "recipes" / "search.py"), "fit", *old_config, *logs,
                            "--trainer.max_epochs", "1"], cwd=tmp_path, capture_output=True, text=True, timeout=600)
    assert first.returncode == 0, first.stderr[-3000:]
    ckpt = f"{run_dir(tmp_path)}/checkpoints/last.ckpt"
    assert "train_sampling" in (old / "configs" / "tiny_random.yaml").read_text()

    resumed = run_script([str(ROOT / "recipes" / "search.py"), "fit", *old_config, *logs, "--ckpt_path", ckpt,
                          "--trainer.max_epochs", "2"], cwd=tmp_path)
    assert resumed.returncode == 0, resumed.stderr[-3000:]
    assert "the policy setting train_sampling is deprecated and will be removed: name it train_generation" in resumed.stderr
    s = read_scalars(run_dir(tmp_path))  # the resumed run's own log version
    assert [i for i, _ in s["rollout/success_rate"]] == [2] and [i for i, _ in s["val/avg@2"]] == [2]

    checked = run_script([str(ROOT / "recipes" / "search.py"), "validate", *TINY, *logs, "--ckpt_path", ckpt],
                         cwd=tmp_path)
    assert checked.returncode == 0, checked.stderr[-3000:]
    record = json.loads(open(f"{run_dir(tmp_path)}/eval_val.json").read())
    assert record["iteration"] == 1 and record["ckpt_path"] == ckpt and "val/avg@2" in record["scalars"]
