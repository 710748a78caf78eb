"""Faults during a real run (the search recipe on tiny-random, injected by ``faulty.py``): a run
killed with SIGKILL in the middle of an update, or preempted with SIGTERM, resumes with
``--ckpt_path last`` and continues the uninterrupted run number for number, learning-rate
schedule and final weights included; a kill while a checkpoint is being written leaves the
previous one loadable; an engine failure stops the run with the agent and policy named."""

import glob
import os
import re
import subprocess
import time

import pytest
import torch
from forked import run_script
from recipe_runs import ROOT, TINY, engine_processes, run_dir, scalars
from recipe_runs import run_recipe as _run
from safetensors.torch import load_file

pytestmark = pytest.mark.integration  # runs the recipe in a process of its own

# cosine decay with one warm-up iteration over 4 iterations: the lr differs every iteration
COMMON = ["--model.engine", "hf", "--model.loss.entropy_coef", "0.01", "--trainer.max_epochs", "4",
          "--model.policies.shared.optim.schedule", "cosine",
          "--model.policies.shared.optim.warmup_iterations", "1",
          "--data.validation.tasks", "1"]
TAGS = ("train/shared/lr", "train/shared/loss", "train/shared/grad_norm", "train/shared/entropy",
        "rollout/verifier/samples", "rollout/success_rate")
FAULTY = os.path.join(os.path.dirname(__file__), "faulty.py")


def run_faulty(fault: str, at: int, tmp, *args: str, env=None) -> subprocess.CompletedProcess:
    argv = [FAULTY, fault, str(at), str(ROOT / "recipes" / "search.py"), "fit", *TINY,
            "--trainer.logger.init_args.save_dir", str(tmp / "runs"), *COMMON, *args]
    return run_script(argv, cwd=tmp, env={**os.environ, "TMPDIR": str(tmp), **(env or {})})


def saved_iteration(path: str) -> int:
    return torch.load(path, map_location="cpu", weights_only=True)["drmas"]["iteration"]


def final_weights(tmp) -> dict[str, torch.Tensor]:
    return load_file(os.path.join(run_dir(tmp), "hf", "iter_4", "shared", "model.safetensors"))


@pytest.fixture(scope="module")
def uninterrupted(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("full")
    _run("search", tmp, *COMMON)
    return scalars(run_dir(tmp)), final_weights(tmp)


def assert_continues(tmp, uninterrupted, first: int) -> None:
    """The resumed run (the newest log version) logs iterations ``first``..4 as the uninterrupted
    run did, and ends with the same weights."""
    a, weights = uninterrupted
    b = scalars(run_dir(tmp))
    assert len({a["train/shared/lr"][k] for k in range(1, 5)}) == 4  # warm-up, then cosine
    assert sorted(k for k in b["train/shared/lr"]) == list(range(first, 5))  # nothing skipped or repeated
    for k in range(first, 5):
        for tag in TAGS:
            assert b[tag][k] == pytest.approx(a[tag][k], rel=1e-5, abs=1e-7), (tag, k)
    assert b["val/avg@2"][4] == pytest.approx(a["val/avg@2"][4])
    resumed = final_weights(tmp)
    assert resumed.keys() == weights.keys()
    # CPU kernels are deterministic here: the weights agree to float32 rounding, in practice exactly
    assert max((resumed[k] - weights[k]).abs().max().item() for k in weights) <= 1e-6


def test_a_run_killed_mid_update_resumes_with_ckpt_path_last(tmp_path, uninterrupted):
    killed = run_faulty("kill_update", 3, tmp_path)
    assert killed.returncode == -9, killed.stderr[-3000:]
    (ckpt,) = glob.glob(str(tmp_path / "runs/search/version_0/checkpoints/last.ckpt"))
    assert saved_iteration(ckpt) == 2  # iteration 3 was half trained: its update is lost, not saved
    proc = _run("search", tmp_path, *COMMON, "--ckpt_path", "last")
    assert f"--ckpt_path last: resuming from {ckpt}" in proc.stdout
    assert_continues(tmp_path, uninterrupted, first=3)


BEHIND = [*COMMON, "--model.engine", "vllm", "--trainer.max_epochs", "3", "--data.rollout.staleness", "1"]
"""Rollouts one update behind (vLLM: its process's draws are the rollout's alone), 3 iterations."""


def assert_continues_behind(tmp, a) -> None:
    """The resumed run logs iterations 2-3 as the uninterrupted one did, the lag's scalars included."""
    b = scalars(run_dir(tmp))
    assert sorted(b["train/shared/lr"]) == [2, 3]
    for k in (2, 3):
        for tag in (*TAGS, "train/shared/staleness_max", "train/shared/importance_weight_mean",
                    "train/shared/engine_logprob_gap_max"):
            assert b[tag][k] == pytest.approx(a[tag][k], rel=1e-5, abs=1e-7), (tag, k)
    assert [a["train/shared/staleness_max"][k] for k in (1, 2, 3)] == [0, 1, 1]
    assert b["val/avg@2"][3] == pytest.approx(a["val/avg@2"][3])


def test_rollouts_one_update_behind_preempted_mid_update_stop_as_a_synchronous_run_does(tmp_path):
    """SIGTERM in iteration 2's update, while the vLLM engine process serves iteration 3's rollout
    behind it: the run stops at the next micro-batch with the synchronous path's line and exit
    code, no traceback, drops the rollout behind (said), leaves no engine process, and resumes as
    if uninterrupted: the checkpoint of iteration 1 holds iteration 2's rollout (played on the
    initial weights), which the resumed run trains on while iteration 3's plays behind it. The
    resumed run's engine draws only iteration 3's rollout, the uninterrupted one's drew 1 to 3
    before it: equal scalars show each draw is seeded from (seed, rank, iteration), not from the
    process's RNG, which no checkpoint holds."""
    full, part = tmp_path / "full", tmp_path / "part"
    full.mkdir(), part.mkdir()
    _run("search", full, *BEHIND)
    proc = run_faulty("sigterm_update,hold_rollout", 2, part, *BEHIND)  # iteration 3's rollout still plays
    assert proc.returncode == 143, proc.stderr[-3000:]
    ckpt = str(part / "runs/search/version_0/checkpoints/last.ckpt")
    assert (f"drmas: preempted (SIGTERM) during iteration 2; the last checkpoint is {ckpt} (iteration 1); "
            f"resume with --ckpt_path {ckpt} (or --ckpt_path last)") in proc.stderr
    assert ("the background rollout of iteration(s) 3 was stopped with the run (not trained on; a resumed "
            "run plays it again from its checkpoint)") in proc.stderr
    assert saved_iteration(ckpt) == 1 and "Traceback" not in proc.stderr, proc.stderr[-3000:]
    engines = [pid for _, pid, _ in engine_processes(proc).values()]
    assert len(engines) == 1 and not os.path.exists(f"/proc/{engines[0]}")  # closed and reaped at exit
    _run("search", part, *BEHIND, "--ckpt_path", "last")
    assert_continues_behind(part, scalars(run_dir(full)))


def test_sigterm_stops_at_the_next_micro_batch_and_the_run_resumes(tmp_path, uninterrupted):
    stamp = tmp_path / "sent"
    proc = run_faulty("sigterm_update", 3, tmp_path, env={"FAULT_STAMP": str(stamp)})
    stopped = time.time() - float(stamp.read_text())
    assert proc.returncode == 143, proc.stderr[-3000:]  # as a process killed by SIGTERM: requeue me
    ckpt = str(tmp_path / "runs/search/version_0/checkpoints/last.ckpt")
    assert (f"drmas: preempted (SIGTERM) during iteration 3; the last checkpoint is {ckpt} (iteration 2); "
            f"resume with --ckpt_path {ckpt} (or --ckpt_path last); "
            "the unfinished iteration is played again") in proc.stderr
    assert saved_iteration(ckpt) == 2 and not os.path.exists(os.path.join(run_dir(tmp_path), "hf", "iter_4"))
    print(f"SIGTERM to exit: {stopped:.1f} s")  # one micro-batch and the teardown; no wall-clock assert
    _run("search", tmp_path, *COMMON, "--ckpt_path", "last")
    assert_continues(tmp_path, uninterrupted, first=3)


def test_a_kill_while_checkpoints_are_written_leaves_the_previous_ones(tmp_path):
    lightning, hf = tmp_path / "lightning", tmp_path / "hf"
    lightning.mkdir(), hf.mkdir()
    proc = run_faulty("kill_ckpt", 2, lightning)
    assert proc.returncode == -9, proc.stderr[-3000:]
    ckpts = lightning / "runs/search/version_0/checkpoints"
    assert saved_iteration(str(ckpts / "last.ckpt")) == 1  # whole, and still the previous iteration
    (half,) = lightning.glob("tmp*")  # the killed write's bytes, in the temp dir, never renamed
    assert 0 < half.stat().st_size < (ckpts / "last.ckpt").stat().st_size

    proc = run_faulty("kill_hf", 2, hf, "--hf_checkpoint.every_n_iterations", "1")
    assert proc.returncode == -9, proc.stderr[-3000:]
    root = os.path.join(run_dir(hf), "hf")
    assert open(os.path.join(root, "latest")).read().strip() == "iter_1"
    assert (sorted(os.listdir(root))[0].startswith(".iter_2.tmp-")
            and not os.path.exists(os.path.join(root, "iter_2")))
    from transformers import AutoModelForCausalLM
    AutoModelForCausalLM.from_pretrained(os.path.join(root, "iter_1", "shared"))  # loads
    with pytest.raises(Exception):  # what the kill left behind is indeed broken
        load_file(glob.glob(os.path.join(root, ".iter_2.tmp-*", "shared", "model.safetensors"))[0])


def test_an_engine_failure_names_the_agent_and_policy_after_the_last_checkpoint(tmp_path):
    proc = run_faulty("engine_error", 2, tmp_path)
    assert proc.returncode == 1
    assert re.search(r"EngineError: the hf engine of policy 'shared' failed generating for agent 'verifier' "
                     r"\(\d+ prompts x \d+\): RuntimeError: CUDA error: device lost",
                     proc.stderr), proc.stderr[-3000:]
    ckpt = str(tmp_path / "runs/search/version_0/checkpoints/last.ckpt")
    assert saved_iteration(ckpt) == 1
    assert (f"drmas: stopped by EngineError during iteration 2; the last checkpoint is {ckpt} "
            "(iteration 1)") in proc.stderr


def test_sigterm_during_a_rollout_stops_before_the_next_request(tmp_path):
    proc = run_faulty("sigterm_rollout", 2, tmp_path)
    assert proc.returncode == 143, proc.stderr[-3000:]
    ckpt = str(tmp_path / "runs/search/version_0/checkpoints/last.ckpt")
    assert saved_iteration(ckpt) == 1
    assert (f"drmas: preempted (SIGTERM) during iteration 2; the last checkpoint is {ckpt} "
            "(iteration 1)") in proc.stderr
    # iteration 2's rollout never finished
    assert sorted(scalars(run_dir(tmp_path))["rollout/success_rate"]) == [1]


def test_ckpt_path_last_without_a_checkpoint_starts_fresh(tmp_path):
    proc = _run("search", tmp_path, "--model.engine", "hf", "--trainer.max_epochs", "1",
                "--ckpt_path", "last")
    assert ("--ckpt_path last: no checkpoint matches" in proc.stdout
            and "starting from the beginning" in proc.stdout)
    assert sorted(scalars(run_dir(tmp_path))["rollout/success_rate"]) == [1]


def test_stale_rollouts_are_refused(tmp_path):
    proc = _run("search", tmp_path, "--model.engine", "hf",
                "--trainer.reload_dataloaders_every_n_epochs", "2", check=False)
    assert proc.returncode != 0
    assert "reload_dataloaders_every_n_epochs must be 1 (one rollout per iteration), got 2" in proc.stderr
