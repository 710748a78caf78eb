"""Agent frameworks' own tool loops through the endpoint, with the examples under
examples/agents/frameworks/: LangGraph (a tool-calling agent, two agents with a handoff), the
OpenAI Agents SDK (a function tool and a handoff, on its Responses model, plain and streamed, and
on its chat-completions model), AutoGen AgentChat (an assistant with a tool), LlamaIndex (a
FunctionAgent on OpenAILike), pydantic-ai (an agent with a tool, on its chat and Responses models)
and DSPy (ReAct). The engine is scripted to emit tool calls in the hermes format (parsed by vLLM's
parser with tiny-random's tokenizer), so each framework's round trip runs for real: its request,
the parsed call, its tool, the result sent back, the answer. DSPy's ReAct asks for its tool in its
own text fields, not as OpenAI tool calls, so its script answers in those fields."""

import json
import re
from pathlib import Path

import pytest
from scripted import HermesScript as ToolEngine

from drmas.workflows.agents import AgentsWorkflow

pytest.importorskip("vllm.tool_parsers")
pytestmark = pytest.mark.integration  # each test starts workers that import a whole framework
EXAMPLES = __import__("pathlib").Path(__file__).resolve().parents[2] / "examples" / "agents" / "frameworks"


def call(name, arguments):
    return f"<tool_call>{json.dumps({'name': name, 'arguments': arguments})}</tool_call>"


def oracle(agent, prompt, i):
    """A handoff tool first, else the calculator once, then the answer that quotes its result."""
    results = [c for role, c in prompt.messages if role == "tool" and re.fullmatch(r"\s*-?\d+\s*", c)]
    if results:
        return f"The answer is {results[-1].strip()}."
    names = [json.loads(t)["function"]["name"] for t in prompt.tools]
    handoff = next((n for n in names if n.startswith("transfer_to")), None)
    if handoff:
        return call(handoff, {})
    if "add" in names:
        return "Let me add. " + call("add", {"a": 2, "b": 3})
    return "I cannot tell."


@pytest.fixture
def tasks_file(tmp_path):
    path = tmp_path / "tasks.jsonl"
    path.write_text('{"question": "What is 2 + 3?", "answer": 5}\n' * 2)
    return str(path)


def play(program, agents, tasks_file, capfd, oracle=oracle):
    engine = ToolEngine(oracle)
    wf = AgentsWorkflow(f"{EXAMPLES / program}", agents, tasks_file, val_share=0.0, workers=2)
    try:
        result = wf.rollout(wf.tasks("train"), engine, n=1)
    finally:
        wf.close()
    assert not [e.info for e in result.episodes if "failure" in e.info or "program_failure" in e.info]
    err = capfd.readouterr().err
    assert "Traceback" not in err and "Event loop is closed" not in err, err
    scalars = wf.scalars(result.counts)
    # every answered call is a sample of the episode that made it: none late, none lost
    assert scalars["endpoint/requests"] == len(result.samples) and scalars["endpoint/late_calls"] == 0
    # thread pools a framework keeps (LiteLLM's, the event loop's) are idle: no worker replaced
    assert scalars["endpoint/workers_recycled"] == 0
    assert {s.traj_uid for s in result.samples} <= {e.traj_uid for e in result.episodes}
    return result, scalars, engine


def by_agent(result):
    out = {}
    for s in result.samples:
        out[s.agent] = out.get(s.agent, 0) + 1
    return out


def test_a_langgraph_tool_calling_agent(tasks_file, capfd):
    result, scalars, _ = play("langgraph_tools.py:episode", ["solver"], tasks_file, capfd)
    # per episode: the call of add, then the answer with its result
    assert by_agent(result) == {"solver": 4}
    assert all(e.team_reward == pytest.approx(1.1) for e in result.episodes)
    assert scalars["endpoint/tool_calls"] == pytest.approx(0.5) and scalars["endpoint/tool_call_errors"] == 0
    assert {s.text for s in result.samples} == {"Let me add. " + call("add", {"a": 2, "b": 3}),
                                               "The answer is 5."}


def test_two_langgraph_agents_with_a_handoff(tasks_file, capfd):
    result, scalars, engine = play("langgraph_handoff.py:episode", ["router", "solver"], tasks_file, capfd)
    assert by_agent(result) == {"router": 2, "solver": 4}
    assert all(e.success and e.team_reward == 1.0 for e in result.episodes)
    assert [s.reward for s in result.samples if s.agent == "router"] == pytest.approx([1.1, 1.1])
    # the solver saw the router's handoff and its result before its own call
    solver_prompts = [p for a, ps, _ in engine.calls if a == "solver" for p in ps]
    assert all(("tool", "transferred to solver") in p.messages for p in solver_prompts)


@pytest.mark.parametrize("episode", ["episode", "episode_streamed", "episode_chat"])
def test_the_agents_sdk_with_a_function_tool_and_a_handoff(tasks_file, capfd, episode):
    result, scalars, engine = play(f"agents_sdk.py:{episode}", ["triage", "solver"], tasks_file, capfd)
    assert by_agent(result) == {"triage": 2, "solver": 4}
    assert all(e.success for e in result.episodes)
    assert [s.reward for s in result.samples if s.agent == "triage"] == pytest.approx([1.1, 1.1])
    assert scalars["endpoint/tool_calls"] == pytest.approx(4 / 6)  # a handoff and an add per episode
    first = [p for a, ps, _ in engine.calls if a == "triage" for p in ps][0]
    assert [json.loads(t)["function"]["name"] for t in first.tools] == ["transfer_to_solver"]


def test_an_autogen_assistant_with_a_tool(tasks_file, capfd):
    result, scalars, _ = play("autogen_tool.py:episode", ["solver"], tasks_file, capfd)
    assert by_agent(result) == {"solver": 4}  # the call, then the reflection on its result
    assert all(e.team_reward == pytest.approx(1.1) for e in result.episodes)
    assert scalars["endpoint/tool_calls"] == pytest.approx(0.5)


def field(name, value):
    return f"[[ ## {name} ## ]]\n{value}\n\n"


def react_oracle(agent, prompt, i):
    """DSPy's ReAct asks for its steps in its chat adapter's fields, with no OpenAI tools: the
    calculator first, ``finish`` once its observation is in the trajectory, then the answer (the
    extraction step asks for ``reasoning`` and ``answer``)."""
    system, user = prompt.messages[0][1], prompt.messages[-1][1]
    seen = re.search(r"\[\[ ## observation_0 ## \]\]\s*(-?\d+)", user)
    if "`next_tool_name`" not in system:
        return field("reasoning", "The tool added them.") + field("answer", seen[1] if seen else "?") + \
            "[[ ## completed ## ]]"
    tool, args = ("finish", {}) if seen else ("add", {"a": 2, "b": 3})
    return field("next_thought", "Next step.") + field("next_tool_name", tool) + \
        field("next_tool_args", json.dumps(args)) + "[[ ## completed ## ]]"


def test_a_dspy_react_agent(tasks_file, capfd):
    result, scalars, engine = play("dspy_react.py:episode", ["solver"], tasks_file, capfd, react_oracle)
    # per episode: the add step, the finish step, the extraction of the answer
    assert by_agent(result) == {"solver": 6}
    assert all(e.team_reward == pytest.approx(1.1) for e in result.episodes)
    # ReAct's calls are fields of its text, not OpenAI tool calls: no tools offered, none parsed
    assert scalars["endpoint/tool_calls"] == 0 and scalars["endpoint/tool_call_errors"] == 0
    assert not any(p.tools for _, ps, _ in engine.calls for p in ps)
    # the calculator's result reached the finish and the extraction steps, in the trajectory
    seen = "[[ ## observation_0 ## ]]\n5\n"
    assert sum(n for _, ps, n in engine.calls for p in ps if seen in p.messages[-1][1]) == 4
    assert {s.text.split("[[ ## answer ## ]]\n")[-1] for s in result.samples if "answer" in s.text} == \
        {"5\n\n[[ ## completed ## ]]"}


def test_a_llamaindex_function_agent(tasks_file, capfd):
    result, scalars, engine = play("llamaindex_agent.py:episode", ["solver"], tasks_file, capfd)
    assert by_agent(result) == {"solver": 4}  # the call of add, then the answer with its result
    assert all(e.team_reward == pytest.approx(1.1) for e in result.episodes)
    assert scalars["endpoint/tool_calls"] == pytest.approx(0.5) and scalars["endpoint/tool_call_errors"] == 0
    assert {s.text for s in result.samples} == {"Let me add. " + call("add", {"a": 2, "b": 3}),
                                               "The answer is 5."}
    first = [p for a, ps, _ in engine.calls if a == "solver" for p in ps][0]
    assert [json.loads(t)["function"]["name"] for t in first.tools] == ["add"]
    assert first.messages[0] == ("system", "Use the add tool for sums.")


@pytest.mark.parametrize("episode", ["episode", "episode_responses"])
def test_a_pydantic_ai_agent_with_a_tool(tasks_file, capfd, episode):
    result, scalars, engine = play(f"pydantic_ai_agent.py:{episode}", ["solver"], tasks_file, capfd)
    assert by_agent(result) == {"solver": 4}  # the call of add, then the answer with its result
    assert all(e.team_reward == pytest.approx(1.1) for e in result.episodes)
    assert scalars["endpoint/tool_calls"] == pytest.approx(0.5) and scalars["endpoint/tool_call_errors"] == 0
    first = [p for a, ps, _ in engine.calls if a == "solver" for p in ps][0]
    assert [json.loads(t)["function"]["name"] for t in first.tools] == ["add"]


def sloppy_react_oracle(agent, prompt, i):
    """The first ReAct step in plain prose (no fields), which DSPy asks again through its JSON
    adapter; answered there as a JSON object, then as ``react_oracle``."""
    system, user = prompt.messages[0][1], prompt.messages[-1][1]
    if "Outputs will be a JSON object" in system:
        return json.dumps({"next_thought": "Add them.", "next_tool_name": "add",
                           "next_tool_args": {"a": 2, "b": 3}})
    if "`next_tool_name`" in system and "observation_0" not in user:
        return "I will add 2 and 3 with the add tool."
    return react_oracle(agent, prompt, i)


def test_a_dspy_react_agent_whose_step_falls_back_to_json(tasks_file, capfd):
    result, scalars, engine = play("dspy_react.py:episode", ["solver"], tasks_file, capfd,
                                   sloppy_react_oracle)
    # per episode: the step in prose, its JSON retry, the finish step, the extraction of the answer
    assert by_agent(result) == {"solver": 8}
    assert all(e.team_reward == pytest.approx(1.1) for e in result.episodes)
    assert scalars["endpoint/tool_calls"] == 0 and scalars["endpoint/tool_call_errors"] == 0
    retries = [p for _, ps, _ in engine.calls for p in ps
               if "Outputs will be a JSON object" in p.messages[0][1]]
    assert len(retries) >= 1 and all("`next_tool_name`" in p.messages[0][1] for p in retries)
    # its response_format json_object served by showing JSON to the policy, counted
    assert all(p.messages[0][1].endswith("Answer with one JSON object and nothing else.") for p in retries)
    # one retry per episode (their identical prompts reached the engine as one)
    assert scalars["endpoint/structured_outputs"] == len(result.episodes) == 2


def test_a_pydantic_ai_agent_that_raises_on_bad_tool_arguments_is_trained_with_the_failure_reward(
        tasks_file):
    """The policy keeps calling add with a word for a number: pydantic-ai's argument validation
    sends it back for a retry, then gives up and raises; every call of the episode gets
    failure_reward, so the behaviour that broke the program gets a negative advantage."""
    engine = ToolEngine(lambda agent, prompt, i: call("add", {"a": "two", "b": 3}))
    wf = AgentsWorkflow(f"{EXAMPLES / 'pydantic_ai_agent.py'}:episode", ["solver"], tasks_file, val_share=0.0,
                        workers=2, failure_reward=-2.0)
    try:
        result = wf.rollout(wf.tasks("train"), engine, n=1)
    finally:
        wf.close()
    errors = [e.info["program_failure"] for e in result.episodes]
    assert len(errors) == 2 and all("UnexpectedModelBehavior" in e and "retries" in e for e in errors)
    calls = by_agent(result)["solver"]
    assert calls >= 4 and all(s.reward == -2.0 and s.team_reward == 0.0 for s in result.samples)
    assert wf.scalars(result.counts)["endpoint/program_failures"] == 2


def test_clients_built_at_import_follow_the_workers_episodes(tasks_file, tmp_path, capfd):
    """One worker plays every episode in turn with a LangChain model and a DSPy LM built once, when
    the program was imported: each episode's calls are recorded into that episode."""
    path = tmp_path / "four.jsonl"
    path.write_text("".join(json.dumps({"q": f"task{i}"}) + "\n" for i in range(4)))

    def answer(agent, prompt, i):
        if agent == "writer":
            return f"About {prompt.messages[-1][1]}."
        return "[[ ## verdict ## ]]\ngood\n\n[[ ## completed ## ]]"

    wf = AgentsWorkflow(f"{Path(__file__).parent / 'built_once.py'}:episode", ["writer", "critic"], str(path),
                        val_share=0.0, workers=1)
    try:
        result = wf.rollout(wf.tasks("train"), ToolEngine(answer), n=1)
    finally:
        wf.close()
    assert all(e.success for e in result.episodes), [e.info for e in result.episodes]
    for e in result.episodes:  # the writer's answer and the critic's verdict on it, in that episode
        mine = [s for s in result.samples if s.traj_uid == e.traj_uid]
        assert [s.agent for s in mine] == ["writer", "critic"] and mine[0].text == f"About task{e.task_uid}."
    scalars = wf.scalars(result.counts)
    assert scalars["endpoint/requests"] == len(result.samples) == 8 and scalars["endpoint/late_calls"] == 0
    assert scalars["endpoint/workers_recycled"] == 0 and scalars["endpoint/workers_started"] == 1
    assert "Traceback" not in capfd.readouterr().err
