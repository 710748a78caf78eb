"""Per-policy pools in a recipe run, as a user runs it: the math team on 2 CPU ranks (gloo), the
solver's pool rank 0 and the verifier's rank 1, each rank building only its own policy's vLLM engine,
episodes played on both ranks sending each agent's calls to its policy's engine wherever it runs."""

import os
import re

import pytest
import torch
from transformers import AutoModelForCausalLM

from drmas.models import resolve_model_path
from recipe_runs import assert_engine_logprobs_match, assert_engines_in_processes_of_their_own, run_dir, \
    run_recipe, scalars

pytestmark = pytest.mark.integration  # runs the recipe on 2 ranks in processes of their own (~50 s)

POOLS = ("{solver: {model: tiny-random, optim: {lr: 1.0e-3}, ranks: [0]}, "
         "verifier: {model: tiny-random, optim: {lr: 1.0e-3}, ranks: [1]}}")


def test_each_policy_on_its_own_rank_answers_the_other_ranks_calls_and_trains_there(tmp_path):
    proc = run_recipe("math", tmp_path, "--trainer.devices", "2", "--trainer.strategy", "fsdp",
                      "--model.engine", "vllm", "--model.policies", POOLS,
                      "--model.loss.entropy_coef", "0.01", "--trainer.precision", "32-true",
                      "--checkpoint.every_n_iterations", "0", "--data.validation.tasks", "0")
    # each rank built the engine of its own policy only
    assert_engines_in_processes_of_their_own(proc, {(0, "solver"), (1, "verifier")})
    # engine-side counts: each engine answered the other rank's episodes as well as its own rank's
    answered = {m[1]: (int(m[2]), int(m[3])) for m in re.finditer(
        r"^\[rank \d\] the vllm engine of policy (\w+) answered this rank: (\d+), rank \d: (\d+)$",
        proc.stdout, re.M)}
    assert set(answered) == {"solver", "verifier"} and all(own > 0 and other > 0 for own, other in
                                                             answered.values()), answered
    d = run_dir(tmp_path)
    s = scalars(d)
    for agent in ("solver", "verifier"):
        for it in (1, 2):  # every sample of the policy trained by its own pool
            assert s[f"train/{agent}/samples"][it] == s[f"rollout/{agent}/samples"][it] > 0
    # iteration 2 sampled from each pool's weights after its step: engine and trainer agree
    assert_engine_logprobs_match(s, ("solver", "verifier"), (1, 2))
    # the HF export: each policy written by its own pool's rank, into one directory, and moved
    start = AutoModelForCausalLM.from_pretrained(resolve_model_path("tiny-random")).state_dict()
    for policy in ("solver", "verifier"):
        saved = AutoModelForCausalLM.from_pretrained(os.path.join(d, "hf", "iter_2", policy)).state_dict()
        assert any(not torch.equal(saved[n], start[n]) for n in start), policy
