"""The agents recipe as users run it: the example math team (written against ``openai`` only)
trained through the endpoint on tiny-random, with the verifier's policy frozen."""

import os

import pytest
import torch
from recipe_runs import ROOT, check_run, run_dir, run_recipe

from drmas.models import load_causal_lm

pytestmark = pytest.mark.integration  # runs the recipe in a process of its own

EXAMPLE = ROOT / "examples" / "agents"
POLICIES = ("{solver: {model: tiny-random, lr: 1.0e-3, micro_batch_size: 8, "
            "train_generation: {temperature: 1.0, max_new_tokens: 12}, "
            "eval_generation: {temperature: 1.0, max_new_tokens: 12}}, "
            "verifier: {model: tiny-random, trainable: false, "
            "train_generation: {temperature: 1.0, max_new_tokens: 12}, "
            "eval_generation: {temperature: 1.0, max_new_tokens: 12}}}")


def test_the_example_team_trains_through_the_endpoint_with_a_frozen_verifier(tmp_path):
    # the random model's rewards are all equal (advantages 0): the entropy bonus makes weights move
    run_recipe("agents", tmp_path, "--model.engine", "hf", "--model.loss.entropy_coef", "0.01",
               "--model.policies", POLICIES,
               "--data.workflow.init_args.episode", f"{EXAMPLE / 'math_team.py'}:episode",
               "--data.workflow.init_args.train_file", str(EXAMPLE / "train.jsonl"),
               "--data.workflow.init_args.val_file", str(EXAMPLE / "val.jsonl"))
    s = check_run(tmp_path, ("solver", "verifier"), policy="solver")
    assert all(v == 0 for v in s["rollout/failed_episodes"].values())
    assert all(v >= 1 for v in s["endpoint/batch_size_mean"].values())
    assert "train/verifier/loss" not in s and all(v > 0 for v in s["rollout/verifier/samples"].values())
    d = run_dir(tmp_path)
    assert not os.path.exists(os.path.join(d, "hf", "iter_2", "verifier"))  # a frozen policy is not exported
    state = torch.load(os.path.join(d, "checkpoints", "last.ckpt"), map_location="cpu",
                       weights_only=False)["state_dict"]
    initial = load_causal_lm("tiny-random")[0].state_dict()
    assert all(torch.equal(state[f"policies.verifier.model.{k}"], v) for k, v in initial.items())
