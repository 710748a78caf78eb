"""Per-policy pools in a recipe run, as a user runs it: the math team on 2 CPU ranks (gloo), the
solver's pool rank 0 and the verifier's rank 1, rollouts one update behind, a checkpoint after every
iteration. Each rank builds only its own policy's engine (in a process of its own), episodes played
on both ranks send each agent's calls to its policy's engine wherever it runs; a run stopped by
SIGTERM, then by SIGKILL, resumes as if it had not been, and a failing step on rank 1 ends both
ranks naming it.
(A vLLM engine reached from another rank: tests/engines/test_engines.py.)"""

import glob
import os
import re

import pytest
import torch
from transformers import AutoModelForCausalLM

from drmas.checkout import recipe_script
from drmas.models import resolve_model_path
from forked import run_script
from recipe_runs import TINY, assert_engine_logprobs_match, run_dir, scalars
from test_fsdp_faults import exit_lines, exits, saved_iteration
from test_resume import FAULTY

pytestmark = pytest.mark.integration  # runs the recipe on 2 ranks in processes of their own (~30 s a run)

# different learning rates: a resumed rank given another policy's schedule would log it
POOLS = ("{solver: {model: tiny-random, optim: {lr: 1.0e-3, warmup_iterations: 1}, ranks: [0]}, "
         "verifier: {model: tiny-random, optim: {lr: 2.0e-3, warmup_iterations: 1}, ranks: [1]}}")
ARGS = ["--trainer.devices", "2", "--trainer.strategy", "fsdp", "--model.engine", "hf",
        "--model.policies", POOLS, "--model.loss.entropy_coef", "0.01", "--trainer.precision", "32-true",
        "--data.validation.tasks", "0", "--data.rollout.staleness", "1", "--trainer.max_epochs", "3"]
TEAM = ("solver", "verifier")
ERROR = re.escape("RuntimeError: CUDA out of memory. Tried to allocate 2.00 GiB (injected)")


def run(tmp, *args: str, fault: str | None = None, at: int = 0, env: dict | None = None):
    """The pooled math team into ``tmp``, with ``faulty.py``'s ``fault`` at iteration ``at``."""
    argv = [recipe_script("math"), "fit", *TINY, "--trainer.logger.init_args.save_dir", str(tmp / "runs"),
            *ARGS, *args]
    argv = [FAULTY, fault, str(at), *argv] if fault else argv
    return run_script(argv, cwd=tmp, env={**os.environ, "TMPDIR": str(tmp), **(env or {})})


def checkpoint(tmp) -> str:
    return os.path.join(run_dir(tmp), "checkpoints", "last.ckpt")


@pytest.fixture(scope="module")
def uninterrupted(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("pools")
    proc = run(tmp)
    assert proc.returncode == 0, proc.stderr[-4000:]
    return proc, tmp, scalars(run_dir(tmp))


def test_each_policy_on_its_own_rank_answers_the_other_ranks_calls_and_trains_there(uninterrupted):
    proc, tmp, s = uninterrupted
    # engine-side counts: each rank built its own policy's engine only, and it answered the other
    # rank's episodes as well as its own rank's
    answered = {(int(m[1]), m[2]): (int(m[3]), int(m[4])) for m in re.finditer(
        r"^\[rank (\d)\] the hf engine of policy (\w+) answered this rank: (\d+), rank \d: (\d+)$",
        proc.stdout, re.M)}
    assert set(answered) == {(0, "solver"), (1, "verifier")}, proc.stdout[-3000:]
    assert all(own > 0 and other > 0 for own, other in answered.values()), answered
    assert len(re.findall(r"^HF engine of policy \w+: process \d+", proc.stdout, re.M)) == 2
    for agent in TEAM:
        for it in (1, 2, 3):  # every sample of the policy trained by its own pool
            assert s[f"train/{agent}/samples"][it] == s[f"rollout/{agent}/samples"][it] > 0
        # one update behind from iteration 2, per policy
        assert s[f"train/{agent}/staleness_max"] == {1: 0.0, 2: 1.0, 3: 1.0}
    # iteration 1 sampled from the weights each pool's trainer holds: engine and trainer agree
    assert_engine_logprobs_match(s, TEAM, (1,))
    # the HF export: each policy written by its own pool's rank, into one directory, and moved
    start = AutoModelForCausalLM.from_pretrained(resolve_model_path("tiny-random")).state_dict()
    for policy in TEAM:
        saved = AutoModelForCausalLM.from_pretrained(os.path.join(run_dir(tmp), "hf", "iter_3", policy))
        assert any(not torch.equal(saved.state_dict()[n], start[n]) for n in start), policy


def test_a_pooled_run_preempted_then_killed_resumes_as_if_never_stopped(tmp_path, uninterrupted):
    """SIGTERM on both ranks in iteration 2's update: both stop (exit 143, a preempted job), though the
    rollout behind the update still asks the other rank's engine as it closes; ``--ckpt_path last``
    plays iteration 2 again and SIGKILL strikes in iteration 3's update; resumed again, it plays
    iteration 3 from the checkpoint of iteration 2 (each rank's optimiser and schedule read back by
    policy). Iterations 2 and 3 log what the uninterrupted run logged."""
    preempted = run(tmp_path, fault="sigterm_update", at=2)
    assert preempted.returncode == 143, preempted.stderr[-3000:]
    assert saved_iteration(checkpoint(tmp_path)) == 1
    killed = run(tmp_path, "--ckpt_path", "last", fault="kill_update", at=3)
    assert killed.returncode == -9, killed.stderr[-3000:]
    assert saved_iteration(checkpoint(tmp_path)) == 2
    resumed = run(tmp_path, "--ckpt_path", "last")
    assert resumed.returncode == 0, resumed.stderr[-4000:]
    a = uninterrupted[2]
    assert a["train/verifier/lr"][3] == 2 * a["train/solver/lr"][3]
    tags = [f"train/{p}/{k}" for p in TEAM for k in ("lr", "loss", "grad_norm", "entropy", "samples")]
    versions = sorted(glob.glob(str(tmp_path / "runs/*/version_*")))  # preempted, killed, resumed
    for it, version in ((2, versions[1]), (3, versions[2])):
        b = scalars(version)
        assert max(b["train/verifier/lr"]) == it
        for tag in [*tags, "rollout/solver/reward_mean", "rollout/verifier/samples"]:
            assert b[tag][it] == pytest.approx(a[tag][it], rel=1e-5, abs=1e-7), (tag, it)


def test_a_failing_step_in_the_verifiers_pool_ends_both_ranks_naming_it(tmp_path):
    """Rank 1 (the verifier's pool) fails its optimiser step in iteration 2 while iteration 3's rollout
    plays behind the update on both ranks: rank 0, which agrees nothing with rank 1 there, ends through
    the failure board within the minute, naming rank 1, the policy and the error. (Its checkpoint
    resumes as the test above shows.)"""
    (tmp_path / "exits").mkdir()
    env = {"FAULT_RANK": "1", "FAULT_EXITS": str(tmp_path / "exits")}
    # with the first-minute pass and a validation before training
    checked = ("--model.preflight", "true", "--data.validation.tasks", "1")
    proc = run(tmp_path, *checked, fault="step_error", at=2, env=env)
    assert proc.returncode == 1, proc.stderr[-4000:]
    # each pool checked its own transfer (its sums added up over the pool's shards) and micro-batch
    assert "one micro-batch forward and backward: ok in" in proc.stdout
    assert 0 in scalars(run_dir(tmp_path))["val/solver/reward_mean"]  # validated across the pools
    ended = exits(tmp_path / "exits")
    assert sorted(ended) == [0, 1] and {code for code, _ in ended.values()} == {1}, ended
    assert abs(ended[0][1] - ended[1][1]) < 60
    lines = exit_lines(tmp_path / "exits")
    # the line also names where the rollout behind was, when it was waiting somewhere
    failed = r"drmas: rank 1 failed during iteration 2 in the optimiser step of policy verifier( \([^)]+\))?"
    for rank in (0, 1):  # (the failure board's line also says where the rank itself stopped)
        assert re.match(rf"{failed}: {ERROR}(; rank {rank} stopped in [^;]+)?$", lines[rank]), lines
    assert "the background rollout of iteration(s) 3 was stopped with the run" in proc.stderr
    assert saved_iteration(checkpoint(tmp_path)) == 1
