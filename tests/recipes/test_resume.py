"""A run killed with SIGKILL mid-way resumes from its last iteration and continues the
uninterrupted run number for number, learning-rate schedule included."""

import glob
import os
import signal
import subprocess
import sys
import time

import pytest
import torch
from recipe_runs import ROOT, TINY, run_dir, scalars
from recipe_runs import run_recipe as _run

# cosine decay with one warm-up iteration over 4 iterations: the lr differs every iteration
COMMON = ["--model.engine", "hf", "--model.entropy_coef", "0.01", "--trainer.max_epochs", "4",
          "--model.policies.shared.lr_schedule", "cosine", "--model.policies.shared.warmup_iterations", "1",
          "--data.val_tasks", "1"]


def saved_iteration(path: str) -> int | None:
    try:
        return torch.load(path, map_location="cpu", weights_only=True)["drmas"]["iteration"]
    except (FileNotFoundError, EOFError, RuntimeError):
        return None


def kill_after_iteration(tmp, at_least: int) -> int:
    """Start the recipe, SIGKILL it once last.ckpt holds iteration >= ``at_least``; return that iteration."""
    cmd = [sys.executable, str(ROOT / "recipes" / "search.py"), "fit", *TINY,
           "--trainer.logger.init_args.save_dir", str(tmp / "runs"), *COMMON]
    proc = subprocess.Popen(cmd, cwd=tmp, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    deadline = time.monotonic() + 600
    try:
        while time.monotonic() < deadline:
            found = glob.glob(str(tmp / "runs/*/version_*/checkpoints/last.ckpt"))
            done = saved_iteration(found[0]) if found else None
            if done is not None and done >= at_least:
                os.kill(proc.pid, signal.SIGKILL)
                proc.wait()
                return done
            if proc.poll() is not None:
                raise AssertionError(f"the run ended before it could be killed:\n{proc.stderr.read().decode()[-3000:]}")
            time.sleep(0.1)
        raise AssertionError("no checkpoint of iteration 2 within 600 s")
    finally:
        if proc.poll() is None:
            proc.kill()


def test_a_killed_run_resumes_where_it_stopped(tmp_path):
    full, part = tmp_path / "full", tmp_path / "part"
    full.mkdir(), part.mkdir()
    _run("search", full, *COMMON)
    killed_at = kill_after_iteration(part, at_least=2)
    assert killed_at < 4, "the run finished before it was killed"
    ckpt = glob.glob(str(part / "runs/*/version_*/checkpoints/last.ckpt"))[0]
    proc = _run("search", part, *COMMON, "--ckpt_path", ckpt)
    assert "--ckpt_path" in proc.stdout

    a, b = scalars(run_dir(full)), scalars(run_dir(part))
    lrs = [a["train/shared/lr"][k] for k in range(1, 5)]
    assert len(set(lrs)) == 4, lrs  # warm-up, then cosine: a different lr every iteration
    # the resumed run logs iterations after the kill exactly as the uninterrupted run did
    for k in range(killed_at + 1, 5):
        for tag in ("train/shared/lr", "train/shared/loss", "train/shared/grad_norm", "train/shared/entropy",
                    "rollout/verifier/samples"):
            assert b[tag][k] == pytest.approx(a[tag][k], rel=1e-5), (tag, k)
    assert b["val/avg@2"][4] == pytest.approx(a["val/avg@2"][4])


def test_stale_rollouts_are_refused(tmp_path):
    proc = _run("search", tmp_path, "--model.engine", "hf", "--trainer.reload_dataloaders_every_n_epochs", "2",
                check=False)
    assert proc.returncode != 0
    assert "reload_dataloaders_every_n_epochs must be 1 (one rollout per iteration), got 2" in proc.stderr
