"""The recipes on 2 CPU ranks with ``--trainer.strategy fsdp`` (gloo): data-parallel rollouts,
sharded policies, sharded checkpoints and resume, as a user runs them."""

import os
import re

import pytest
import torch
from safetensors.torch import load_file
from torch.distributed.checkpoint.format_utils import dcp_to_torch_save
from recipe_runs import (assert_engine_logprobs_match, assert_engines_in_processes_of_their_own, check_run,
                         run_dir, run_recipe, scalars)

pytestmark = pytest.mark.integration  # runs the recipe in processes of its own, on 2 ranks

AGENTS = ("solver", "verifier")
FSDP = ["--trainer.devices", "2", "--trainer.strategy", "fsdp"]


def meta(ckpt: str) -> dict:
    return torch.load(os.path.join(ckpt, "meta.pt"), map_location="cpu", weights_only=True)["drmas"]


# no validation: the 2-iteration run would validate at its end and draw random numbers that the
# 3-iteration run draws later
SHARDED = ("--trainer.strategy", "fsdp", "--model.engine", "hf", "--model.loss.entropy_coef", "0.01",
           "--data.validation.tasks", "0")
TWO = ("--trainer.devices", "2")


@pytest.fixture(scope="module")
def two_ranks(tmp_path_factory) -> str:
    """The sharded checkpoint of a 2-iteration run on 2 ranks (the tests below resume it)."""
    tmp = tmp_path_factory.mktemp("two_ranks")
    run_recipe("search", tmp, *SHARDED, *TWO)
    return os.path.join(run_dir(tmp), "checkpoints", "last.ckpt")


def test_a_resumed_two_rank_run_continues_the_uninterrupted_one_exactly(tmp_path, two_ranks):
    full, resumed = tmp_path / "full", tmp_path / "resumed"
    full.mkdir(), resumed.mkdir()
    run_recipe("search", full, *SHARDED, *TWO, "--trainer.max_epochs", "3")
    proc = run_recipe("search", resumed, *SHARDED, *TWO, "--trainer.max_epochs", "3",
                      "--ckpt_path", two_ranks)
    assert "Restored all states" in proc.stderr
    want, got = scalars(run_dir(full)), scalars(run_dir(resumed))
    assert sorted(got["rollout/success_rate"]) == [3]  # continues at iteration 3, not from 1
    compared = [k for k in got if k.startswith(("train/", "rollout/")) and 3 in got[k]]
    assert len(compared) > 20 and want["train/shared/grad_norm"][3] > 0
    for key in compared:  # each rank's random state and optimiser shard restored: same numbers
        assert got[key][3] == want[key][3], key
    # and the same final weights in the HF export
    final = [load_file(os.path.join(run_dir(d), "hf", "iter_3", "shared", "model.safetensors"))
             for d in (full, resumed)]
    assert final[0].keys() == final[1].keys()
    assert all(torch.equal(final[0][k], final[1][k]) for k in final[0])

    # a sharded checkpoint without sharding: one line naming what to do, not IsADirectoryError
    proc = run_recipe("search", tmp_path, "--model.engine", "hf", "--trainer.max_epochs", "3",
                      "--ckpt_path", two_ranks, check=False)
    assert proc.returncode != 0
    assert "sharded checkpoint written by 2 ranks: resume it with --trainer.strategy fsdp, on any number" \
        in proc.stderr


def full_state(ckpt: str, into: str) -> dict:
    """A sharded checkpoint as one state dict (weights and optimiser state by parameter name)."""
    dcp_to_torch_save(ckpt, into)
    return torch.load(into, map_location="cpu", weights_only=False)


def assert_one_adam_step_apart(before: dict, after: dict) -> None:
    """``after`` is ``before`` plus one AdamW step: its moments and weights follow from the restored
    ones and the step's gradient (recovered from the first moment). A fresh optimiser (step 1,
    ``exp_avg_sq = (1 - b2) g^2``) or other weights would break both."""
    group = after["optimizer_shared"]["param_groups"][0]
    (b1, b2), lr, eps, wd = group["betas"], group["lr"], group["eps"], group["weight_decay"]
    state = after["optimizer_shared"]["state"]
    assert state.keys() == before["optimizer_shared"]["state"].keys() and len(state) > 10
    for name, new in state.items():
        old = before["optimizer_shared"]["state"][name]
        t = int(new["step"])
        assert t == int(old["step"]) + 1, name
        grad = (new["exp_avg"] - b1 * old["exp_avg"]) / (1 - b1)
        torch.testing.assert_close(new["exp_avg_sq"], b2 * old["exp_avg_sq"] + (1 - b2) * grad**2)
        step = (new["exp_avg"] / (1 - b1**t)) / ((new["exp_avg_sq"] / (1 - b2**t)).sqrt() + eps)
        w0, w1 = before["state_dict"][name], after["state_dict"][name]
        torch.testing.assert_close(w1, w0 * (1 - lr * wd) - lr * step, rtol=0, atol=1e-7)


def test_a_checkpoint_of_two_ranks_resumes_on_one_and_back_resharded(tmp_path, two_ranks):
    ckpts = [two_ranks]
    for name, devices, epochs in (("one", "1", "3"), ("back", "2", "4")):
        (tmp_path / name).mkdir()
        proc = run_recipe("search", tmp_path / name, *SHARDED, "--trainer.devices", devices,
                          "--trainer.max_epochs", epochs, "--ckpt_path", ckpts[-1])
        written = "2 rank(s) and resumes on 1" if devices == "1" else "1 rank(s) and resumes on 2"
        assert f"drmas: this checkpoint was written by {written}: the sharded weights" in proc.stderr
        # continued, not restarted
        assert sorted(scalars(run_dir(tmp_path / name))["rollout/success_rate"]) == [int(epochs)]
        ckpts.append(os.path.join(run_dir(tmp_path / name), "checkpoints", "last.ckpt"))
    assert [len(meta(c)["rng"]) for c in ckpts] == [2, 1, 2]
    states = [full_state(c, str(tmp_path / f"{k}.pt")) for k, c in enumerate(ckpts)]
    assert_one_adam_step_apart(states[0], states[1])  # 2 ranks -> 1: weights and moments resharded exactly
    assert_one_adam_step_apart(states[1], states[2])  # and 1 -> 2


def test_math_with_one_model_per_agent_and_vllm_on_two_ranks_logs_every_rank_and_checkpoints_shards(
        tmp_path):
    policies = ("{solver: {model: tiny-random, optim: {lr: 1.0e-3}}, "
                "verifier: {model: tiny-random, optim: {lr: 1.0e-3}}}")
    proc = run_recipe("math", tmp_path, *FSDP, "--model.engine", "vllm", "--model.policies", policies,
                      "--model.loss.entropy_coef", "0.01", "--data.rollout.tasks_per_iteration", "3",
                      "--trainer.precision", "32-true", "--model.preflight", "true")
    # the first-minute pass checked each policy's sharded weights against what its engines loaded,
    # their sums added up over the two ranks' shards, and ran a sharded forward and backward
    assert re.search(r"^first-minute pass: every engine built, .* ok in [\d.]+ s", proc.stdout, re.M)
    # each rank built its own engines, once, each in a process of its own on the rank's device
    assert_engines_in_processes_of_their_own(proc, {(r, p) for r in (0, 1) for p in AGENTS})
    cores = {line.rsplit("cores ", 1)[1].split(",")[0] for line in proc.stdout.splitlines()
             if " vLLM engine of policy " in line}
    assert cores == {"0", "1"}  # 2 ranks on 2 cores: each rank's engines on its own core
    check_run(tmp_path, AGENTS, policy="solver")
    first = run_dir(tmp_path)
    s = scalars(first)
    for agent in AGENTS:
        for it in (1, 2):  # every rank's share is counted, not rank 0's alone
            assert s[f"train/{agent}/samples"][it] == s[f"rollout/{agent}/samples"][it] > 0
            assert s[f"train/{agent}/grad_norm"][it] > 0  # the entropy term moves the weights
    # iteration 2 samples from the weights after step 1, gathered from the shards into each
    # rank's engine process: engine and trainer log-probs agree (stale weights would not)
    assert_engine_logprobs_match(s, AGENTS, (1, 2))
    assert "val/arithmetic/avg@2" in s  # the embedded problems are one source
    ckpt = os.path.join(first, "checkpoints", "last.ckpt")
    # one shard file per rank, written atomically: no temporary directory left behind
    assert sorted(f for f in os.listdir(ckpt) if f.endswith(".distcp")) == ["__0_0.distcp", "__1_0.distcp"]
    assert not [f for f in os.listdir(os.path.dirname(ckpt)) if f.startswith(".")]
    state = meta(ckpt)
    assert state["iteration"] == 2 and len(state["rng"]) == 2  # each rank's random state


def test_unknown_strategy_names_the_accepted_ones(tmp_path):
    proc = run_recipe("math", tmp_path, "--trainer.strategy", "ddp", check=False)
    assert proc.returncode != 0
    assert ("--trainer.strategy 'ddp' is not supported; use one of: auto" in proc.stderr
            and "fsdp" in proc.stderr)
