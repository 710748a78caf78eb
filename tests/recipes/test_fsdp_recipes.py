"""The recipes on 2 CPU ranks with ``--trainer.strategy fsdp`` (gloo): data-parallel rollouts,
sharded policies, sharded checkpoints and resume, as a user runs them."""

import math
import os

import torch
from recipe_runs import check_run, run_dir, run_recipe, scalars

AGENTS = ("verifier", "searcher", "answerer")
FSDP = ["--trainer.devices", "2", "--trainer.strategy", "fsdp"]


def meta(ckpt: str) -> dict:
    return torch.load(os.path.join(ckpt, "meta.pt"), map_location="cpu", weights_only=True)["drmas"]


def test_search_on_two_ranks_checkpoints_shards_and_resumes(tmp_path):
    run_recipe("search", tmp_path, *FSDP, "--model.engine", "hf", "--model.entropy_coef", "0.01")
    check_run(tmp_path, AGENTS)
    first = run_dir(tmp_path)
    s = scalars(first)
    for it in (1, 2):  # every rank's share is counted, not rank 0's alone
        rollout = sum(v[it] for k, v in s.items() if k.startswith("rollout/") and k.endswith("/samples"))
        assert s["train/shared/samples"][it] == rollout > 0
    ckpt = os.path.join(first, "checkpoints", "last.ckpt")
    # one shard file per rank, written atomically: no temporary directory left behind
    assert sorted(f for f in os.listdir(ckpt) if f.endswith(".distcp")) == ["__0_0.distcp", "__1_0.distcp"]
    assert not [f for f in os.listdir(os.path.dirname(ckpt)) if f.startswith(".")]
    state = meta(ckpt)
    assert state["iteration"] == 2 and len(state["rng"]) == 2  # each rank's random state

    proc = run_recipe("search", tmp_path, *FSDP, "--model.engine", "hf", "--model.entropy_coef", "0.01",
                      "--trainer.max_epochs", "3", "--ckpt_path", ckpt)
    assert "Restored all states" in proc.stderr
    resumed = scalars(run_dir(tmp_path))
    assert sorted(resumed["rollout/success_rate"]) == [3]  # continues at iteration 3, not from 1
    assert meta(os.path.join(run_dir(tmp_path), "checkpoints", "last.ckpt"))["iteration"] == 3

    # a sharded checkpoint without sharding: one line naming what to do, not IsADirectoryError
    proc = run_recipe("search", tmp_path, "--model.engine", "hf", "--trainer.max_epochs", "3", "--ckpt_path", ckpt,
                      check=False)
    assert proc.returncode != 0
    assert "is a sharded checkpoint written by 2 ranks: resume it with --trainer.strategy fsdp" in proc.stderr


def test_math_with_one_model_per_agent_and_vllm_on_two_ranks(tmp_path):
    policies = "{solver: {model: tiny-random, lr: 1.0e-3}, verifier: {model: tiny-random, lr: 1.0e-3}}"
    run_recipe("math", tmp_path, *FSDP, "--model.engine", "vllm", "--model.policies", policies,
               "--model.entropy_coef", "0.01", "--data.tasks_per_iteration", "3")
    s = scalars(run_dir(tmp_path))
    for agent in ("solver", "verifier"):
        for it in (1, 2):
            assert s[f"train/{agent}/samples"][it] == s[f"rollout/{agent}/samples"][it] > 0
            assert s[f"train/{agent}/grad_norm"][it] > 0  # the entropy term moves the weights
        # iteration 2 samples from the weights after step 1, gathered from the shards into each
        # rank's vLLM engine: engine and trainer log-probs agree (stale weights would not)
        assert math.isclose(s[f"train/{agent}/is_weight_mean"][2], 1.0, abs_tol=2e-3)


def test_unknown_strategy_names_the_accepted_ones(tmp_path):
    proc = run_recipe("math", tmp_path, "--trainer.strategy", "ddp", check=False)
    assert proc.returncode != 0
    assert "--trainer.strategy 'ddp' is not supported; use one of: auto" in proc.stderr and "fsdp" in proc.stderr
