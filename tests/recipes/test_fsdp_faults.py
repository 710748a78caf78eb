"""Faults that strike one rank of a 2-rank FSDP run (gloo), injected by ``faulty.py``: every rank
still runs the same collectives, so nothing hangs. A non-finite loss on rank 1 alone makes
both ranks skip that step; SIGTERM on rank 1 alone, or on both ranks, stops every rank with exit
143 at the next micro-batch or rollout request, without a partial checkpoint; a kill between a
sharded checkpoint's completion and its swap resumes, through ``--ckpt_path last``, from it."""

import os
import time

import pytest
import torch
from recipe_runs import run_dir, scalars
from safetensors.torch import load_file
from test_resume import run_faulty

pytestmark = pytest.mark.integration  # runs the recipe in processes of its own, on 2 ranks

FSDP = ["--trainer.devices", "2", "--trainer.strategy", "fsdp", "--model.engine", "hf",
        "--data.validation.tasks", "0", "--model.loss.entropy_coef", "0.01"]


def exits(folder, ranks=2, wait=60.0) -> dict[int, tuple[int, float]]:
    """Each rank's exit code and time, as faulty.py records them (a rank that hung never does)."""
    deadline = time.time() + wait
    while len(os.listdir(folder)) < ranks and time.time() < deadline:
        time.sleep(0.5)
    out = {}
    for name in os.listdir(folder):
        code, when, *_ = open(os.path.join(folder, name)).read().split(maxsplit=2)
        out[int(name.removeprefix("rank"))] = (int(code), float(when))
    return out


def exit_lines(folder, ranks=2, wait=60.0) -> dict[int, str]:
    """The line drmas ended each rank with (as faulty.py records it)."""
    exits(folder, ranks, wait)  # every rank's record, or a minute's wait
    return {int(name.removeprefix("rank")): open(os.path.join(folder, name)).read().split(maxsplit=2)[2]
            for name in os.listdir(folder)}


def saved_iteration(ckpt: str) -> int:
    return torch.load(os.path.join(ckpt, "meta.pt"), map_location="cpu",
                      weights_only=True)["drmas"]["iteration"]


def hf_weights(tmp, iteration):
    return load_file(os.path.join(run_dir(tmp), "hf", f"iter_{iteration}", "shared", "model.safetensors"))


def test_nan_then_sigterm_on_rank_1_alone(tmp_path):
    (tmp_path / "exits").mkdir()
    stamp = tmp_path / "sent"
    env = {"FAULT_RANK": "1", "FAULT_STAMP": str(stamp), "FAULT_EXITS": str(tmp_path / "exits")}
    proc = run_faulty("nan_loss@2,sigterm_update", 3, tmp_path, *FSDP,
                      "--hf_checkpoint.every_n_iterations", "1",
                      "--model.policies.shared.update.micro_batch_size", "1",
                       # several micro-batches per rank
                      env=env)
    assert proc.returncode == 143, proc.stderr[-4000:]
    # the NaN on rank 1 alone: both ranks skipped iteration 2's step (each says so), and the
    # run went on to iteration 3 instead of waiting in rank 0's backward
    s = scalars(run_dir(tmp_path))
    assert s["train/shared/skipped_steps"] == {2: 1.0}
    assert proc.stderr.count("non-finite loss or gradient") == 2
    first, second = hf_weights(tmp_path, 1), hf_weights(tmp_path, 2)
    assert all(torch.equal(first[k], second[k]) for k in first)  # no rank stepped
    # SIGTERM on rank 1 alone in iteration 3's update: both ranks stop with 143, soon after it
    ended = exits(tmp_path / "exits")
    assert sorted(ended) == [0, 1] and {code for code, _ in ended.values()} == {143}, ended
    print("SIGTERM to each rank's exit (s):",
          {r: round(t - float(stamp.read_text()), 1) for r, (_, t) in ended.items()})
    ckpt = os.path.join(run_dir(tmp_path), "checkpoints", "last.ckpt")
    assert saved_iteration(ckpt) == 2  # the checkpoint of the last whole iteration, none partial
    assert not [f for f in os.listdir(os.path.dirname(ckpt)) if f.startswith(".")]
    assert (f"drmas: preempted (SIGTERM) during iteration 3; the last checkpoint is {ckpt} "
            "(iteration 2)") in proc.stderr


def test_a_kill_before_the_checkpoint_swap_resumes_from_it_and_sigterm_on_both_ranks(tmp_path):
    proc = run_faulty("kill_swap", 2, tmp_path, *FSDP, "--trainer.max_epochs", "3")
    assert proc.returncode == -9, proc.stderr[-4000:]
    folder = os.path.join(run_dir(tmp_path), "checkpoints")
    assert saved_iteration(os.path.join(folder, "last.ckpt")) == 1
    assert saved_iteration(os.path.join(folder, ".last.ckpt.partial")) == 2  # whole, not swapped in
    # resumed through --ckpt_path last: from iteration 2's checkpoint, the newest whole one; both
    # ranks get SIGTERM at the first request of iteration 4 and stop together
    (tmp_path / "exits").mkdir()
    proc = run_faulty("sigterm_rollout", 4, tmp_path, *FSDP, "--trainer.max_epochs", "5",
                      "--ckpt_path", "last", env={"FAULT_EXITS": str(tmp_path / "exits")})
    assert proc.returncode == 143, proc.stderr[-4000:]
    assert f"--ckpt_path last: resuming from {os.path.join(folder, 'last.ckpt')}" in proc.stdout
    assert saved_iteration(os.path.join(folder, "last.ckpt")) == 2 and not os.path.exists(
        os.path.join(folder, ".last.ckpt.partial"))  # moved into place
    resumed = run_dir(tmp_path)  # the resumed run logs to a new version
    assert sorted(scalars(resumed)["rollout/success_rate"]) == [3]  # iteration 3 only, then stopped
    assert saved_iteration(os.path.join(resumed, "checkpoints", "last.ckpt")) == 3
    ended = exits(tmp_path / "exits")
    assert sorted(ended) == [0, 1] and {code for code, _ in ended.values()} == {143}, ended
