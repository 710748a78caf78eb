"""The agents recipe as users run it, from a folder of their own: the example math team (written
against ``openai`` only, the recipe's default) trained through the endpoint on tiny-random with the
verifier's policy frozen, and the README's command for one's own program."""

import json
import os

import pytest
import torch
from recipe_runs import ROOT, check_run, run_dir, run_recipe, scalars

from drmas.models import load_causal_lm
from drmas.report import read_validations

pytestmark = pytest.mark.integration  # runs the recipe in a process of its own

EXAMPLE = ROOT / "examples" / "agents"
POLICIES = ("{solver: {model: tiny-random, optim: {lr: 1.0e-3}, update: {micro_batch_size: 8}, "
            "generation: {train: {temperature: 1.0, max_new_tokens: 12}, "
            "eval: {temperature: 1.0, max_new_tokens: 12}}}, "
            "verifier: {model: tiny-random, trainable: false, "
            "generation: {train: {temperature: 1.0, max_new_tokens: 12}, "
            "eval: {temperature: 1.0, max_new_tokens: 12}}}}")


def test_the_example_team_trains_through_the_endpoint_with_a_frozen_verifier(tmp_path):
    # the random model's rewards are all equal (advantages 0): the entropy bonus makes weights move;
    # run from tmp_path with no episode or task file: the example's files resolve from the checkout
    run_recipe("agents", tmp_path, "--model.engine", "hf", "--model.loss.entropy_coef", "0.01",
               "--model.policies", POLICIES)
    s = check_run(tmp_path, ("solver", "verifier"), policy="solver")
    example_val = {json.loads(line)["id"] for line in open(EXAMPLE / "val.jsonl")}
    assert {t["uid"] for t in read_validations(run_dir(tmp_path))[0]["tasks"]} <= example_val
    assert all(v == 0 for v in s["rollout/failed_episodes"].values())
    assert all(v >= 1 for v in s["endpoint/batch_size_mean"].values())
    assert "train/verifier/loss" not in s and all(v > 0 for v in s["rollout/verifier/samples"].values())
    d = run_dir(tmp_path)
    assert not os.path.exists(os.path.join(d, "hf", "iter_2", "verifier"))  # a frozen policy is not exported
    state = torch.load(os.path.join(d, "checkpoints", "last.ckpt"), map_location="cpu",
                       weights_only=False)["state_dict"]
    initial = load_causal_lm("tiny-random")[0].state_dict()
    assert all(torch.equal(state[f"policies.verifier.model.{k}"], v) for k, v in initial.items())


TEAM = """
def episode(task, client):
    draft = client.chat.completions.create(
        model="writer", messages=[{"role": "user", "content": task["topic"]}])
    text = draft.choices[0].message.content
    review = client.chat.completions.create(
        model="critic", messages=[{"role": "user", "content": "Review: " + text}])
    return {"team": float(len(text) % 2), "critic": 0.1 if review.choices[0].message.content else 0.0}
"""


def test_the_readmes_command_for_ones_own_program_validates_on_its_own_tasks(tmp_path):
    (tmp_path / "my_team.py").write_text(TEAM)
    with open(tmp_path / "tasks.jsonl", "w") as f:
        for i in range(10):
            f.write(json.dumps({"id": f"t{i}", "topic": f"Write about the number {i}."}) + "\n")
    proc = run_recipe("agents", tmp_path, "--model.engine", "hf", "--data.validation.tasks", "4",
                      "--data.workflow.init_args.episode", "my_team.py:episode",
                      "--data.workflow.init_args.agents", "[writer, critic]",
                      "--data.workflow.init_args.train_file", "tasks.jsonl")
    assert "1 of the 10 tasks of tasks.jsonl held apart for validation" in proc.stderr
    d = run_dir(tmp_path)
    validated = read_validations(d)
    assert sorted(validated) == [0, 2]
    held = {t["uid"] for t in validated[0]["tasks"]}
    assert len(held) == 1 and held <= {f"t{i}" for i in range(10)}  # the user's own task, not the example's
    s = scalars(d)
    assert all(v > 0 for v in s["rollout/writer/samples"].values())
    assert all(v > 0 for v in s["rollout/critic/samples"].values())


def test_a_pydantic_ai_program_trains_through_the_recipe(tmp_path):
    pytest.importorskip("pydantic_ai")
    with open(tmp_path / "tasks.jsonl", "w") as f:
        for i in range(8):
            f.write(json.dumps({"id": f"t{i}", "question": f"What is {i} + 2?", "answer": i + 2}) + "\n")
    run_recipe("agents", tmp_path, "--model.engine", "hf", "--data.validation.tasks", "2",
               "--data.workflow.init_args.episode",
               f"{EXAMPLE / 'frameworks' / 'pydantic_ai_agent.py'}:episode",
               "--data.workflow.init_args.agents", "[solver]",
               "--data.workflow.init_args.train_file", "tasks.jsonl")
    s = scalars(run_dir(tmp_path))
    # every episode played through the framework's own loop and was recorded: none failed, none raised
    samples = s["rollout/solver/samples"]
    assert sorted(samples) == [1, 2] and all(v > 0 for v in samples.values())
    assert all(v == 0 for v in s["rollout/failed_episodes"].values())
    assert all(v == 0 for v in s["endpoint/program_failures"].values())
    assert all(v == 0 for v in s["endpoint/late_calls"].values())
