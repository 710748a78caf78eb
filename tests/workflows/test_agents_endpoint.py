"""The OpenAI-compatible endpoint over loopback, with the real ``openai`` client and a scripted
engine: attribution of calls to episodes, batching, limits, errors, failed episodes, disconnects;
episodes in worker processes (tests/agent_programs.py), each with its own URL and key."""

import functools
import json
import os
import time

import agent_programs as programs
import httpx
import pytest
from processes import gone_within
from scripted import Script

from drmas.workflows.agents import AgentsWorkflow
from drmas.workflows.agents.episodes import EpisodeFailure, read_outcome
from drmas.records import GenerationSettings
from drmas.data.rollout_config import ValidationConfig

pytestmark = pytest.mark.usefixtures("out")  # every episode reports to tmp_path/out
AGENTS = ["writer", "critic"]


@pytest.fixture
def tasks_file(tmp_path):
    path = tmp_path / "tasks.jsonl"
    path.write_text("".join(f'{{"q": "task{i}"}}\n' for i in range(4)))
    return str(path)


def make(episode, tasks_file, **kwargs):
    return AgentsWorkflow(episode, AGENTS, tasks_file, val_share=0.0, **{"workers": 4, **kwargs})


def echo(agent, prompt, i):
    return f"{agent}<{prompt.messages[-1][1]}>!"  # ends with the stop string the episodes use


class Limited(Script):
    """A scripted engine that also says its policy's settings and counts prompt tokens (one per
    character), as the trainer's generate function does."""

    train = True

    def settings(self, agent):
        return GenerationSettings(temperature=1.0, top_p=1.0, top_k=0, max_new_tokens=12, stop=("</s>",))

    def context_length(self, agent):
        return 200

    def prompt_tokens(self, agent, prompt):
        return sum(len(c) for _, c in prompt.messages)


@pytest.mark.integration  # episode worker processes
def test_calls_are_attributed_to_their_episode_with_turns_and_mixed_rewards(tasks_file):
    wf = make(programs.three_calls, tasks_file, alpha=0.5)
    try:
        result = wf.rollout(wf.tasks("train"), Script(echo), n=3)
    finally:
        wf.close()
    assert len(result.episodes) == 12 and all(e.success and e.turns == 3 for e in result.episodes)
    assert len(result.samples) == 36
    for s in result.samples:
        task = s.traj_uid.split("#")[0]
        assert s.task_uid == task
        assert f"task{task}" in s.text  # the episode's own task, through its own URL
        # the trained text keeps the stop string; the content the program read did not
        want = {("writer", 0): f"writer<task{task}>!", ("writer", 1): f"writer<writer<task{task}>+>!",
                ("critic", 0): f"critic<writer<writer<task{task}>+>>!"}
        assert s.text == want[(s.agent, s.turn)]
        assert s.reward == pytest.approx(0.5 * 1.0 + (0.5 if s.agent == "writer" else 0.0))
        assert s.response_ids == [2, 3] and s.engine_logprobs == [-0.5, -0.5] and s.valid


@pytest.mark.integration  # 16 worker processes
def test_a_round_of_calls_from_every_episode_is_one_batched_engine_call(tasks_file):
    script = Script(echo)
    # a window no test waits out: only "every running episode is waiting" can trigger a call
    wf = make(programs.three_rounds, tasks_file, window_ms=10**7, episode_timeout_s=60, workers=16)
    try:
        result = wf.rollout(wf.tasks("train"), script, n=4)
    finally:
        wf.close()
    assert not [e for e in result.episodes if "failure" in e.info]
    # 16 episodes
    assert [(agent, len(prompts), n) for agent, prompts, n in script.calls] == [("writer", 4, 4)] * 3
    assert wf.scalars(result.counts) == {"endpoint/requests": 48.0, "endpoint/generation_overrides": 0.0,
                                         "endpoint/template_errors": 0.0, "endpoint/batch_size_mean": 16.0,
                                         "endpoint/tool_calls": 0.0, "endpoint/tool_call_errors": 0.0,
                                         "endpoint/workers_started": 16.0, "endpoint/workers_recycled": 0.0,
                                         "endpoint/late_calls": 0.0, "endpoint/program_failures": 0.0,
                                         "endpoint/unknown_agents": 0.0, "endpoint/ignored_fields": 0.0,
                                         "endpoint/structured_outputs": 0.0}


@pytest.mark.integration  # episode worker processes
def test_an_episode_rewards_single_calls_by_the_id_its_client_saw(tasks_file):
    # every interface bound, guarded by the keys; the URLs name the host given
    wf = make(programs.rewarded_calls, tasks_file, host="0.0.0.0", advertise_host="127.0.0.1")
    try:
        result = wf.rollout(wf.tasks("train")[:2], Script(echo), n=1)
        assert wf._endpoint.bound == "0.0.0.0" and wf._endpoint.host == "127.0.0.1"
    finally:
        wf.close()
    # team 1.0 for both calls, plus each call's own: the chat answer -0.25, the Responses answer 0.5
    assert [(s.agent, s.reward) for s in result.samples if s.task_uid == "0"] == [("writer", 0.75),
                                                                                  ("critic", 1.5)]
    assert "'chatcmpl-stranger', which is no answer of this episode" in result.episodes[1].info["failure"]


@pytest.mark.integration  # episode worker processes
def test_limits_and_bad_requests_get_openai_errors(tasks_file, out):
    script = Limited(echo)
    wf = make(programs.limits, tasks_file)
    try:
        result = wf.rollout(wf.tasks("train")[:2], script, n=1)
    finally:
        wf.close()
    seen = programs.reports(out)
    assert seen["unknown"][0] == 404 and "writer, critic" in seen["unknown"][1]
    assert wf.scalars(result.counts)["endpoint/unknown_agents"] == 1
    assert seen["n"][0] == 400 and "n must be 1" in seen["n"][1]
    assert seen["long"] == (200, "writer<long>!", None)  # 100 asked: clamped to the policy's 12
    assert seen["tools"][::2] == (400, "tools_unavailable") and "parses no tool calls" in seen["tools"][1]
    assert seen["legacy"][0] == 400 and "legacy completions API" in seen["legacy"][1]
    assert seen["logprobs"][::2] == (400, "logprobs_unavailable")  # this engine has no tokenizer
    assert seen["context"][::2] == (400, "context_length_exceeded") and "190" in seen["context"][1]
    assert seen["json"] == 400 and seen["no_key"] == 401 and seen["wrong_key"][0] == 401
    assert seen["models"] == AGENTS
    assert seen["content"] == "writer<ok>"  # without the stop string
    # the good call carried its stop and length to the engine; the policy's temperature answered it
    prompt = [p for agent, ps, _ in script.calls for p in ps if p.messages[-1][1] == "ok"][0]
    assert prompt.stop == ("!",) and prompt.max_new_tokens == 5
    assert [p.max_new_tokens for _, ps, _ in script.calls for p in ps if p.messages[-1][1] == "long"] == [12]
    assert wf.scalars(result.counts)["endpoint/generation_overrides"] == 1.0
    # refused calls leave no sample: the long call and the good one
    assert [s.text for s in result.samples if s.task_uid == "0"] == ["writer<long>!", "writer<ok>!"]


class Cut(Limited):
    """Every completion ends by length."""

    def __call__(self, agent, prompts, n):
        return [[c.__class__(c.prompt_ids, c.response_ids, c.logprobs, c.text, "length") for c in cs]
                for cs in super().__call__(agent, prompts, n)]


@pytest.mark.integration  # episode worker processes
def test_only_the_policys_own_limit_costs_the_format_penalty(tasks_file):
    wf = make(programs.capped, tasks_file, format_penalty=0.25)
    try:
        result = wf.rollout(wf.tasks("train")[:1], Cut(echo), n=1)
    finally:
        wf.close()
    # team 1.0: the reply cut at the program's max_tokens=3 is valid; the one cut at the policy's 12 is not
    assert [(s.text, s.valid, s.reward) for s in result.samples] == [
        ("writer<short>!", True, 1.0), ("writer<long>!", False, 0.75)]


@pytest.mark.integration  # episode workers, one of them timed out (4 s)
def test_failed_episodes_leave_no_samples_and_a_timed_out_episodes_process_is_ended(tasks_file, out):
    wf = make(programs.failing, tasks_file, episode_timeout_s=1.5)
    try:
        t0 = time.monotonic()
        result = wf.rollout(wf.tasks("train"), Script(echo), n=1)
        assert time.monotonic() - t0 < 30  # the sleeper was not waited for
        why = {e.task_uid: e.info.get("failure", "") for e in result.episodes}
        raised = result.episodes[0].info["program_failure"]  # the program's own: trained, not dropped
        assert raised.startswith("Traceback") and raised.endswith("RuntimeError: the program broke")
        assert "'stranger'" in why["1"] and "timeout of 1.5 s" in why["2"] and why["3"] == ""
        assert [(s.task_uid, s.reward, s.team_reward) for s in result.samples] == [("0", -1.0, 0.0),
                                                                                  ("3", 1.0, 1.0)]
        assert wf.scalars(result.counts)["endpoint/program_failures"] == 1
        assert [e.success for e in result.episodes] == [False, False, False, True]
        pid, url, key = programs.reports(out)["late"]
        assert f"pid {pid}" in why["2"] and gone_within(pid, 10)  # its process was ended
        # its URL: 410 with its own key, 401 with another episode's key or none
        assert httpx.get(f"{url}models", headers={"Authorization": f"Bearer {key}"}).status_code == 410
        other = next(k for sid, k in wf._endpoint.gone.items() if k != key)
        assert httpx.get(f"{url}models", headers={"Authorization": f"Bearer {other}"}).status_code == 401
        assert httpx.get(f"{url}models").status_code == 401
        again = wf.rollout(wf.tasks("train")[3:], Script(echo), n=2)  # the pool goes on, one worker new
        assert all(e.success for e in again.episodes)
    finally:
        wf.close()
    wf = make(programs.one, tasks_file)
    try:
        result = wf.rollout(wf.tasks("train")[:1], Script(echo), n=2)
    finally:
        wf.close()
    assert all("made no call" in e.info["failure"] for e in result.episodes) and not result.samples


@pytest.mark.integration  # episode workers, crashed and replaced (4 s)
def test_a_crash_in_user_code_fails_that_episode_only(tasks_file):
    wf = make(programs.crashing, tasks_file, workers=2)
    try:
        for _ in range(2):  # and the pool replaces the lost workers for the next rollout
            result = wf.rollout(wf.tasks("train"), Script(echo), n=2)
            why = {e.traj_uid: e.info.get("failure", "") for e in result.episodes}
            for j in range(2):
                assert "was lost" in why[f"0#{j}"] and "exited with code 3" in why[f"0#{j}"]
                assert "was killed by SIGSEGV" in why[f"1#{j}"]
            assert [e.success for e in result.episodes] == [False] * 4 + [True] * 4
            assert {s.task_uid for s in result.samples} == {"2", "3"}
            assert result.counts["endpoint/workers_started"] >= 4  # four lost, all replaced
    finally:
        wf.close()


@pytest.mark.integration  # episode worker processes
def test_clients_built_once_per_process_reach_the_episode_the_worker_plays(tasks_file, out):
    wf = make(programs.process_global, tasks_file, workers=1)  # one worker plays the four in turn
    try:
        result = wf.rollout(wf.tasks("train"), Script(echo), n=1)
    finally:
        wf.close()
    assert all(e.success for e in result.episodes), [e.info for e in result.episodes]
    seen = programs.reports(out)
    assert len({pid for pid, *_ in seen.values()}) == 1
    kept = {(url, key) for _, url, key, _ in seen.values()}
    assert len(kept) == 1 and "/workers/" in next(iter(kept))[0]  # the worker's address, built once
    assert len({given for *_, given in seen.values()}) == 4  # each episode's own client: its own URL
    # the kept client's call and the module client's call of each episode are in that episode
    for e in result.episodes:
        mine = [s for s in result.samples if s.traj_uid == e.traj_uid]
        assert [s.agent for s in mine] == ["writer", "critic"]
        assert all(f"task{e.task_uid}" in s.text for s in mine)
    assert wf.scalars(result.counts)["endpoint/late_calls"] == 0


@pytest.mark.integration  # episode workers, one recycled (3 s)
def test_a_call_after_its_episode_ended_is_answered_410_and_lingering_threads_recycle_the_worker(
        tasks_file, out):
    wf = make(programs.leaves_threads, tasks_file, workers=1)
    try:
        result = wf.rollout(wf.tasks("train")[:2], Script(echo), n=1)
        time.sleep(0.5)  # the last episode's late call
    finally:
        wf.close()
    assert all(e.success for e in result.episodes) and len(result.samples) == 2  # the late calls: none
    seen = programs.reports(out)
    assert all(answer[0] == 410 and answer[2] == "episode_gone" for _, answer in seen.values()), seen
    assert len({pid for pid, _ in seen.values()}) == 2
    counts = wf.scalars(result.counts)
    # replaced before task1; the second worker is replaced when the next rollout begins
    assert counts["endpoint/workers_recycled"] == 1 and counts["endpoint/workers_started"] == 2
    assert counts["endpoint/late_calls"] == 1  # task0's late call came during the rollout


TRAINER = """
import sys
sys.path[:0] = sys.argv[1:3]
from scripted import Script
import agent_programs
from drmas.workflows.agents import AgentsWorkflow
wf = AgentsWorkflow(agent_programs.sleeper, ["writer"], sys.argv[3], val_share=0.0, workers=2)
wf.rollout(wf.tasks("train")[:2], Script(lambda a, p, i: "hi"), n=1)
"""


@pytest.mark.integration  # starts a trainer process
@pytest.mark.parametrize("signal_name", ["SIGKILL", "SIGTERM"])
def test_the_workers_die_with_the_trainer(tasks_file, out, signal_name):
    import signal
    import subprocess
    import sys

    here = os.path.dirname(os.path.abspath(__file__))
    trainer = subprocess.Popen([sys.executable, "-c", TRAINER, here, os.path.dirname(here), tasks_file])
    try:
        deadline = time.monotonic() + 60
        while len(programs.reports(out)) < 2 and time.monotonic() < deadline:
            time.sleep(0.2)
        pids = list(programs.reports(out).values())
        assert len(pids) == 2, "the episodes did not start"
        trainer.send_signal(getattr(signal, signal_name))
        trainer.wait(30)
        assert all(gone_within(pid, 15) for pid in pids), pids
    finally:
        trainer.kill()


@pytest.mark.integration  # episode worker processes
def test_an_episode_a_worker_cannot_import_is_refused_at_start(tasks_file, monkeypatch):
    def nested(task, client):
        return 1.0

    for bad in (nested, lambda t, c: 1.0, functools.partial(programs.one)):
        with pytest.raises(ValueError, match="episodes run in worker processes"):
            make(bad, tasks_file)
    broken = os.path.join(os.path.dirname(tasks_file), "broken.py")
    with open(broken, "w") as f:
        f.write("import os\nif os.environ.get('IN_WORKER'):\n    raise ImportError('not here')\n"
                "def episode(task, client):\n    return 1.0\n")
    wf = make(f"{broken}:episode", tasks_file)  # it loads here
    monkeypatch.setenv("IN_WORKER", "1")  # and not in the workers
    try:
        with pytest.raises(RuntimeError, match=r"could not be loaded in a worker process(.|\n)*not here"):
            wf.rollout(wf.tasks("train"), Script(echo), n=1)
    finally:
        wf.close()


@pytest.mark.integration  # episode worker processes
def test_a_client_that_disconnects_leaves_no_sample(tasks_file):
    def slow(agent, prompt, i):
        if prompt.messages[-1][1] == "slow":
            time.sleep(1.0)
        return "fine"

    wf = make(programs.impatient, tasks_file, window_ms=0)
    try:
        result = wf.rollout(wf.tasks("train")[:1], Script(slow), n=1)
    finally:
        wf.close()
    assert result.episodes[0].success, result.episodes[0].info
    assert [(s.agent, s.text) for s in result.samples] == [("critic", "fine")]


@pytest.mark.integration  # episode worker processes
def test_async_programs_and_concurrent_calls(tasks_file, capfd):
    script = Script(echo)
    wf = make(programs.concurrent_async, tasks_file, workers=2)
    try:
        for _ in range(2):  # a worker's second async episode, after one that left a client open
            result = wf.rollout(wf.tasks("train")[:2], script, n=2)
            assert all(e.success for e in result.episodes), [e.info for e in result.episodes]
            assert (sorted((s.agent, s.reward) for s in result.samples)
                    == [("critic", 0.0)] * 4 + [("writer", 1.0)] * 4)
    finally:
        wf.close()
    err = capfd.readouterr().err
    assert "Traceback" not in err and "Event loop is closed" not in err, err


def test_what_an_episode_may_return():
    assert read_outcome(2, AGENTS).team == 2.0 and read_outcome(2, AGENTS).success
    out = read_outcome({"writer": 0.5, "success": True}, AGENTS)
    assert (out.team, out.local, out.success) == (0.0, {"writer": 0.5}, True)
    for bad in ("1", None, [1.0], {"judge": 1.0}, {"team": "high"}, {"success": 1}):
        with pytest.raises(EpisodeFailure):
            read_outcome(bad, AGENTS)


def test_tasks_splits_and_bad_arguments(tmp_path, tasks_file):
    wf = AgentsWorkflow(programs.one, AGENTS, tasks_file)  # val_share 0.1: one of four held apart
    assert len(wf.tasks("val")) == 1 and len(wf.tasks("train")) == 3
    assert {t.uid for t in wf.tasks("val") + list(wf.tasks("train"))} == {"0", "1", "2", "3"}
    assert wf.tasks("train")[0].row == {"q": f"task{wf.tasks('train')[0].uid}"}
    with pytest.raises(ValueError, match="give test_file"):
        wf.tasks("test")
    ids = tmp_path / "ids.jsonl"
    ids.write_text('{"id": "a"}\n{"id": 7}\n')
    assert ([t.uid for t in AgentsWorkflow(programs.one, AGENTS, str(ids), val_share=0).tasks("train")]
            == ["a", "7"])
    ids.write_text('{"id": "a"}\n{"id": "a"}\n')
    with pytest.raises(ValueError, match="'a' is given to more than one row"):
        AgentsWorkflow(programs.one, AGENTS, str(ids))
    with pytest.raises(FileNotFoundError, match="missing.jsonl"):
        AgentsWorkflow(programs.one, AGENTS, str(tmp_path / "missing.jsonl"))
    with pytest.raises(ValueError, match="has no function 'nope'"):
        AgentsWorkflow("json:nope", AGENTS, tasks_file)
    with pytest.raises(ValueError, match="name the agents"):
        AgentsWorkflow(programs.one, [], tasks_file)
    with pytest.raises(ValueError, match="opaque program cannot be copied"):
        wf.rollout(wf.tasks("train"), Script(echo), n=2, sampling="tree")


class Backend:
    """The trainer's side of the rollout contract, scripted: one policy, one rank."""

    iteration, rank, world_size = 0, 0, 1

    def __init__(self, generate):
        self.generate = generate

    def gather_objects(self, obj):
        return [obj]

    def bind_agents(self, agents):
        return {a: "shared" for a in agents}

    def generate_fn(self, train):
        return self.generate

    def sync_weights(self, seed=None):
        pass

    def engine_cache_stats(self):
        return (0, 0)

    def engine_busy(self):
        return {}

    def batch_spec(self, policy):
        from drmas.records import BatchSpec

        return BatchSpec(pad_id=0, micro_batch_size=4, ppo_epochs=1)


@pytest.mark.integration  # episode worker processes
def test_program_failures_are_trained_lost_episodes_are_an_outage_and_one_error_everywhere_stops(
        tasks_file, out):
    from drmas.data.rollouts import OutageError, RolloutConfig, Rollouts
    from drmas.workflows.agents.workflow import ProgramError

    fail = out / "fail.json"
    wf = make(programs.from_file, tasks_file, same_failure_limit=2, failure_reward=-0.5)
    try:
        rollouts = Rollouts(wf,
                            RolloutConfig(estimator="grpo",
                                          group_size=2, tasks_per_iteration=4, max_failed_share=0.5),
                            ValidationConfig(tasks=0))
        fail.write_text(json.dumps({"raise": ["task1", "task2"]}))
        plan = rollouts.prepare(Backend(Script(echo)), iteration=1)
        assert plan.scalars["rollout/failed_episodes"] == 0.0
        assert plan.scalars["endpoint/program_failures"] == 4
        rewards = {s.task_uid: s.reward for s in plan.samples}
        assert rewards == {"0": 1.0, "1": -0.5, "2": -0.5, "3": 1.0}  # every task's calls trained
        fail.write_text(json.dumps({"raise": ["task0", "task1", "task2", "task3"]}))
        rollouts.prepare(Backend(Script(echo)), iteration=2)  # all raise the same error: once is learnable
        with pytest.raises(ProgramError, match=r"the last 2 rollouts raised the same error(.|\n)*"
                                               r"ValueError: the reply did not parse"):
            rollouts.prepare(Backend(Script(echo)), iteration=3)
        fail.write_text(json.dumps({"exit": ["task0", "task1", "task2"]}))  # lost workers: the infrastructure
        with pytest.raises(OutageError, match=r"6 of 8 episodes failed(.|\n)*exited with code 3"):
            rollouts.prepare(Backend(Script(echo)), iteration=4)
    finally:
        wf.close()


@pytest.mark.integration  # episode worker processes
def test_validation_takes_n_choices_and_tree_sampling_is_refused_with_the_reason(tasks_file):
    from drmas.data.rollouts import RolloutConfig, Rollouts

    evaluating = Script(echo)
    evaluating.train = False  # the trainer's generate function for validation says so
    wf = make(programs.two_choices, tasks_file)
    try:
        result = wf.rollout(wf.tasks("train")[:1], evaluating, n=2)
        with pytest.raises(ValueError, match="sampling='tree' .*an opaque program cannot be copied"):
            Rollouts(wf, RolloutConfig(sampling="tree", estimator="at_grpo"))
    finally:
        wf.close()
    assert [e.success for e in result.episodes] == [True, True] and len(result.samples) == 4
    # two episodes' identical prompts, merged
    assert [(a, n) for a, _, n in evaluating.calls] == [("critic", 4)]


class StrictTemplate(Limited):
    """Prompt tokens counted by a real tokenizer's chat template that, like Mistral's, refuses
    two user turns in a row and a system message after the first turn."""

    def __init__(self, reply):
        super().__init__(reply)
        from drmas.models import load_tokenizer

        self.tok = load_tokenizer("tiny-random")
        self.tok.chat_template = (
            "{% for m in messages %}"
            "{% if m['role'] == 'system' and not loop.first %}"
            "{{ raise_exception('a system message must come first') }}{% endif %}"
            "{% if loop.index0 > 0 and m['role'] == 'user' and messages[loop.index0 - 1]['role'] == 'user' %}"
            "{{ raise_exception('roles must alternate user/assistant') }}{% endif %}"
            "{{ m['role'] }}: {{ m['content'] }}\n{% endfor %}assistant:")

    def tokenizer(self, agent):
        return self.tok

    def prompt_tokens(self, agent, prompt):
        from drmas.modules.policy_generate import encode_prompt

        return len(encode_prompt(self.tok, prompt))


@pytest.mark.integration  # episode worker processes
def test_every_field_is_served_or_refused_by_name_and_a_rejected_template_fails_one_call(tasks_file, out):
    script = StrictTemplate(echo)
    wf = make(programs.fields, tasks_file)
    try:
        result = wf.rollout(wf.tasks("train")[:2], script, n=1)
    finally:
        wf.close()
    seen = programs.reports(out)
    assert seen["parts"][:2] == (200, "writer<two parts>!")
    assert seen["image"][0] == 400 and "'image_url' part" in seen["image"][1]
    assert "content[1]" in seen["image"][1]
    assert seen["name"][:2] == (200, "writer<hi>!")  # the name is a field: encode_prompt renders it
    assert seen["unknown"][::2] == (400, "unsupported_parameter") and "'mirostat'" in seen["unknown"][1]
    # the sampled tokens' own log-probs, each token's text by the policy's tokenizer
    tokens = [(script.tok.decode([t]), -0.5) for t in (2, 3)]
    assert seen["logprobs"] == (200, tokens, None) and seen["streamed_logprobs"] == tokens
    assert seen["top"][0] == 400 and "top_logprobs" in seen["top"][1]
    # structured output is shown to the policy (its own tokens), never forced
    assert seen["json"][:2] == seen["schema"][:2] == (200, "writer<x>!")
    notes = [p.messages[0][1] for _, ps, _ in script.calls for p in ps if p.messages[0][0] == "system"]
    assert notes == ["Answer with one JSON object and nothing else.",
                     'Answer with one JSON object and nothing else, matching this JSON Schema:\n'
                     '{"type": "object", "properties": {"x": {"type": "integer"}}}']
    assert seen["bad_format"][::2] == (400, "invalid_value") and "json_schema" in seen["bad_format"][1]
    # a template variable is applied through the template; fields vLLM-targeted programs send served
    assert [p.template_kwargs for _, ps, _ in script.calls for p in ps if p.template_kwargs] == [
        '{"enable_thinking": false}']
    assert seen["kwargs"][0] == seen["vllm_style"][0] == 200
    assert seen["bad_choice"][::2] == (400, "invalid_value") and "tool_choice" in seen["bad_choice"][1]
    assert seen["many"][0] == 400 and "at most 16" in seen["many"][1] and seen["big"] == 413
    assert seen["harmless"][0] == 200 and seen["seed"][0] == 200
    assert seen["twice"][::2] == (400, "chat_template_error") and "must alternate" in seen["twice"][1]
    assert seen["late_system"][0] == 400 and "must come first" in seen["late_system"][1]
    assert seen["after"][0] == 200  # the run went on
    scalars = wf.scalars(result.counts)
    assert scalars["endpoint/template_errors"] == 2.0
    assert scalars["endpoint/generation_overrides"] == 2.0  # the seed, min_p
    assert scalars["endpoint/ignored_fields"] == 1.0 and scalars["endpoint/structured_outputs"] == 2.0
    # served calls of task 0: parts, name, seed, logprobs twice, json, schema, kwargs, vllm_style,
    # harmless, after; its refused ones left no sample
    assert len([s for s in result.samples if s.task_uid == "0"]) == 11
