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


FRAMEWORKS = """
import asyncio, importlib.util, inspect, json, os
import openai

_loaded = {}


def program(name):
    file, _, fn = name.partition(":")
    if file not in _loaded:  # each framework imported when its first task comes
        spec = importlib.util.spec_from_file_location(file, os.path.join(EXAMPLES, file + ".py"))
        _loaded[file] = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(_loaded[file])
    return getattr(_loaded[file], fn or "episode")


async def episode(task, client):
    fn, raised = program(task["program"]), None
    try:
        if inspect.iscoroutinefunction(fn):
            return await fn(task, client)
        sync = openai.OpenAI(base_url=str(client.base_url), api_key=client.api_key, max_retries=0)
        return await asyncio.to_thread(fn, task, sync)
    except Exception as err:
        raised = type(err).__name__
        raise
    finally:
        with open("played.jsonl", "a") as f:
            f.write(json.dumps({"program": task["program"], "raised": raised}) + "\\n")
"""
PROGRAMS = ("langgraph_tools", "langgraph_handoff", "autogen_tool", "llamaindex_agent", "dspy_react",
            "pydantic_ai_agent", "pydantic_ai_agent:episode_responses")


def test_every_named_framework_trains_through_the_recipe_script(tmp_path):
    # One run, one task per program of examples/agents/frameworks/ (each framework's own loop on
    # the endpoint), dispatched by a program of the user's folder: each imports, plays through the
    # recipe and is recorded. DSPy's ReAct reads its steps from text fields that random text never
    # fills, so its episodes raise DSPy's own parse error (trained with failure_reward).
    (tmp_path / "team.py").write_text(f"EXAMPLES = {str(EXAMPLE / 'frameworks')!r}\n" + FRAMEWORKS)
    with open(tmp_path / "tasks.jsonl", "w") as f:
        for program in PROGRAMS:
            f.write(json.dumps({"id": program, "program": program, "question": "What is 2 + 3?",
                                "answer": 5}) + "\n")
    proc = run_recipe("agents", tmp_path, "--model.engine", "hf", "--data.validation.tasks", "0",
                      "--data.rollout.tasks_per_iteration", str(len(PROGRAMS)),
                      "--data.workflow.init_args.episode", "team.py:episode",
                      "--data.workflow.init_args.agents", "[solver, router]",
                      "--data.workflow.init_args.train_file", "tasks.jsonl",
                      "--data.workflow.init_args.val_share", "0", "--data.workflow.init_args.workers", "2")
    assert "Traceback" not in proc.stderr, proc.stderr[-3000:]
    played = [json.loads(line) for line in open(tmp_path / "played.jsonl")]
    assert sorted(p["program"] for p in played) == sorted(PROGRAMS * 4)  # 2 episodes x 2 iterations each
    assert {p["program"]: p["raised"] for p in played if p["raised"]} == {"dspy_react": "AdapterParseError"}
    assert sum(p["program"] == "dspy_react" for p in played if p["raised"]) == 4
    s = scalars(run_dir(tmp_path))
    assert s["endpoint/program_failures"] == {1: 2.0, 2: 2.0}
    assert all(v == 0 for v in s["rollout/failed_episodes"].values())
    assert all(v == 0 for v in s["endpoint/late_calls"].values())
    assert all(v > 0 for v in s["rollout/solver/samples"].values())
    assert s["endpoint/requests"] == {i: s["rollout/solver/samples"][i] + s["rollout/router/samples"][i]
                                      for i in (1, 2)}


SDK_TEAM = """
import json, os
from sdk_team import episode as responses_handoff, episode_chat, episode_default_client  # a sibling module

PROGRAMS = {"chat": episode_chat, "responses": responses_handoff, "default_client": episode_default_client}


async def episode(task, client):
    out = await PROGRAMS[task["program"]](task, client)
    with open("played.jsonl", "a") as f:  # in the working directory: the run's folder
        calls = len(out.get("calls", {}))
        f.write(json.dumps({"program": task["program"], "pid": os.getpid(), "calls": calls}) + "\\n")
    return out
"""


def test_agents_sdk_programs_train_through_the_recipe_script_from_a_folder_of_their_own(tmp_path):
    # The recipe's own folder (recipes/) must not be where `import agents` lands: the SDK's
    # package must. One run plays three programs of examples/agents/frameworks/agents_sdk.py, as
    # its docs show them, through a team file in a folder of its own that imports a sibling module,
    # started from another folder: the chat-completions model, the Responses model with a handoff,
    # and a client installed once per process (workers 1: every episode on the same process).
    team = tmp_path / "team"
    team.mkdir()
    (team / "sdk_team.py").write_text((EXAMPLE / "frameworks" / "agents_sdk.py").read_text())
    (team / "my_team.py").write_text(SDK_TEAM)
    with open(tmp_path / "tasks.jsonl", "w") as f:
        for program in ("chat", "responses", "default_client"):
            f.write(json.dumps({"id": program, "program": program, "question": "What is 2 + 3?",
                                "answer": 5}) + "\n")
    proc = run_recipe("agents", tmp_path, "--model.engine", "hf", "--data.validation.tasks", "0",
                      "--data.rollout.tasks_per_iteration", "3",
                      "--data.workflow.init_args.episode", "team/my_team.py:episode",
                      "--data.workflow.init_args.agents", "[triage, solver]",
                      "--data.workflow.init_args.train_file", "tasks.jsonl",
                      "--data.workflow.init_args.val_share", "0", "--data.workflow.init_args.workers", "1",
                      # a reply cut at the token limit is an incomplete response, which the SDK
                      # raises on: random text stopped at a space ends by a stop, as a model's reply does
                      "--model.policies.shared.generation.train.stop", '[" "]',
                      "--model.policies.shared.generation.train.max_new_tokens", "32")
    assert "Traceback" not in proc.stderr, proc.stderr[-3000:]
    s = scalars(run_dir(tmp_path))
    for tag in ("rollout/failed_episodes", "endpoint/program_failures", "endpoint/late_calls"):
        assert all(v == 0 for v in s[tag].values()), (tag, s[tag])
    played = [json.loads(line) for line in open(tmp_path / "played.jsonl")]
    # 3 tasks x 2 episodes x 2 iterations, each program's 4 in the one worker process
    assert sorted(p["program"] for p in played) == sorted(["chat", "responses", "default_client"] * 4)
    assert len({p["pid"] for p in played}) == 1
    # the client installed once: each of its calls was answered in the episode that made it (a call
    # id the episode did not get back would fail the episode), and every call was recorded
    assert all(p["calls"] >= 1 for p in played if p["program"] == "default_client")
    solver = s.get("rollout/solver/samples", {})  # on random text no handoff fires
    assert s["endpoint/requests"] == {i: s["rollout/triage/samples"][i] + solver.get(i, 0) for i in (1, 2)}
