"""Tool calls through the endpoint with the real ``openai`` client: tools offered and rendered,
calls parsed out of the generated text by vLLM's hermes parser, the tool's result sent back, a
malformed call returned as text and its sample made invalid; and the rendering of tools on a
template that takes them (Qwen3's) and on one that ignores them (the hermes fallback)."""

import json
import time
from pathlib import Path

import agent_programs as programs
import pytest
from agent_programs import ADD
from scripted import HermesScript as ToolEngine

from drmas.workflows.agents import AgentsWorkflow
from drmas.models import load_tokenizer
from drmas.modules.policy_generate import encode_prompt
from drmas.records import ChatPrompt

pytest.importorskip("vllm.tool_parsers")
pytestmark = pytest.mark.usefixtures("out")  # every episode reports to tmp_path/out

CALL = '<tool_call>{"name": "add", "arguments": {"a": 2, "b": 3}}</tool_call>'


def reply(agent, prompt, i):
    last_role, last = prompt.messages[-1]
    if last_role == "tool":
        return f"The sum is {last}."
    if last == "broken":
        return 'Let me call <tool_call>{"name": "add", "arguments": {"a": 2'  # never closed
    if last == "unknown":
        return '<tool_call>{"name": "divide", "arguments": {}}</tool_call>'
    return "Calling. " + CALL


@pytest.fixture
def tasks_file(tmp_path):
    path = tmp_path / "tasks.jsonl"
    path.write_text('{"q": "sum"}\n{"q": "broken"}\n')
    return str(path)


@pytest.mark.integration  # episode worker processes
def test_a_tool_call_round_trip_and_a_malformed_call(tasks_file, out):
    engine = ToolEngine(reply)
    wf = AgentsWorkflow(programs.tools_round_trip, ["writer"], tasks_file, val_share=0.0, workers=2)
    try:
        result = wf.rollout(wf.tasks("train"), engine, n=1)
    finally:
        wf.close()
    seen = programs.reports(out)
    assert not [e for e in result.episodes if "failure" in e.info], result.episodes
    finish, content, calls = seen["first"]
    assert finish == "tool_calls" and content == "Calling. " and len(calls) == 1
    assert calls[0].function.name == "add" and json.loads(calls[0].function.arguments) == {"a": 2, "b": 3}
    assert calls[0].id.startswith("call_") and calls[0].type == "function"
    assert seen["final"] == ("stop", "The sum is 5.")
    # a call of a tool that was not offered, and an unclosed one: text, no calls
    assert seen["unknown"] == ("stop", None)
    finish, content, calls = seen["broken"]
    assert finish == "stop" and calls is None and content.endswith('"a": 2')
    # tool_choice none: the prompt carried no tools and the text was not parsed
    assert seen["none"] == ("stop", "Calling. " + CALL)
    assert seen["named"][0] == 400
    assert "'mul'" in seen["named"][1] and "not among the tools" in seen["named"][1]

    # what reached the engine: the tools, the assistant's call and the tool's answer with its id
    prompts = [p for _, ps, _ in engine.calls for p in ps]
    second = next(p for p in prompts if p.messages[-1][0] == "tool")
    assert [json.loads(t) for t in second.tools] == [ADD]
    fields = [json.loads(f) if f else {} for f in second.fields]
    assert fields[1]["tool_calls"][0]["function"]["name"] == "add"
    assert fields[1]["tool_calls"][0]["id"] == seen["first"][2][0].id
    assert fields[2] == {"tool_call_id": seen["first"][2][0].id}
    assert next(p for p in prompts if p.messages == (("user", "x"),)).tools == ()
    by_text = {s.text: s for s in result.samples}
    assert not by_text[reply("writer", ChatPrompt((("user", "broken"),)), 0)].valid  # the format penalty
    assert by_text["Calling. " + CALL].valid
    # each sample keeps the call as the program made it, for the episode records: its place among the
    # episode's calls, the messages (the tool's answer with its id) and the tool calls it was answered
    summed = sorted((x.info for x in result.samples if x.traj_uid == by_text["The sum is 5."].traj_uid),
                    key=lambda info: info["call"])
    assert [info["call"] for info in summed] == [0, 1, 2, 3]  # first, final, unknown, none
    first, final = summed[:2]
    assert first["tool_calls"][0]["id"] == seen["first"][2][0].id
    assert first["tool_calls"][0]["function"]["name"] == "add" and final["tool_calls"] == []
    assert final["messages"][-1] == {"role": "tool", "content": "5", "tool_call_id": seen["first"][2][0].id}
    assert final["messages"][1]["tool_calls"][0]["id"] == seen["first"][2][0].id
    scalars = wf.scalars(result.counts)
    requests = scalars["endpoint/requests"]
    assert requests == 5  # sum: first, final, unknown, none; broken: first; the named one was refused
    assert scalars["endpoint/tool_calls"] == pytest.approx(1 / requests)
    assert scalars["endpoint/tool_call_errors"] == pytest.approx(2 / requests)


def _text(tokenizer, prompt, **kwargs):
    return tokenizer.decode(encode_prompt(tokenizer, prompt, **kwargs))


@pytest.mark.integration  # episode worker processes
def test_tools_rendered_by_a_template_that_takes_them_and_by_the_fallback_elsewhere():
    call = {"id": "call_1", "type": "function", "function": {"name": "add", "arguments": '{"a": 2, "b": 3}'}}
    fields = ("", json.dumps({"tool_calls": [call]}), json.dumps({"tool_call_id": "call_1"}))
    prompt = ChatPrompt((("user", "2+3?"), ("assistant", ""), ("tool", "5")), tools=(json.dumps(ADD),),
                        fields=fields)
    qwen = _text(load_tokenizer("tiny-random-qwen3"), prompt, template_kwargs={"enable_thinking": False})
    assert "# Tools" in qwen and '"name": "add"' in qwen  # Qwen3's own tools section
    assert '<tool_call>\n{"name": "add", "arguments": {"a": 2, "b": 3}}\n</tool_call>' in qwen
    assert "<tool_response>\n5\n</tool_response>" in qwen
    tiny = load_tokenizer("tiny-random")
    plain = _text(tiny, prompt)
    assert "<tools>[" in plain and '"description": "a + b"' in plain  # the hermes fallback, as text
    assert '<tool_call>{"name": "add", "arguments": {"a": 2, "b": 3}}</tool_call>' in plain
    assert "<tool_response>5</tool_response>" in plain
    assert "<tools>" not in _text(tiny, ChatPrompt((("user", "2+3?"),)))
    with pytest.raises(ValueError, match="does not render it"):
        encode_prompt(tiny, prompt, tool_format="mistral")


def test_a_name_is_the_templates_where_it_takes_one_and_never_written_into_an_assistants_words():
    fields = (json.dumps({"name": "alice"}), json.dumps({"name": "solver"}), "")
    prompt = ChatPrompt((("user", "hi"), ("assistant", "5"), ("user", "sure?")), fields=fields)
    tiny = load_tokenizer("tiny-random")  # its template has no name field
    text = _text(tiny, prompt)
    assert "alice: hi" in text and "solver" not in text and "5" in text
    tiny.chat_template = tiny.chat_template.replace("message['content']",
                                                    "(message.name or '') + message['content']")
    assert "name" in tiny.chat_template
    text = _text(tiny, prompt)  # a template that reads it gets it as a field, the content untouched
    assert "alicehi" in text and "solver5" in text


def test_a_tool_format_the_template_cannot_render_is_refused_when_the_policy_is_built():
    from drmas.modules.policy import Policy, PolicyConfig

    with pytest.raises(ValueError, match="policy 'p': tool_format 'mistral'.*ignores tools"):
        Policy("p", PolicyConfig(model="tiny-random", tool_format="mistral"))
    with pytest.raises(ValueError, match="tool_format must be auto or one of"):
        PolicyConfig(model="tiny-random", tool_format="xml")


@pytest.mark.integration  # episode worker processes
def test_streaming_answers_in_openais_chunks_and_a_client_gone_before_the_answer_leaves_none(tasks_file, out):
    def slow_reply(agent, prompt, i):
        if prompt.messages[-1][1] == "slow":
            time.sleep(1.0)
        return reply(agent, prompt, i)

    wf = AgentsWorkflow(programs.streaming, ["writer"], tasks_file, val_share=0.0, window_ms=0, workers=2)
    try:
        result = wf.rollout(wf.tasks("train"), ToolEngine(slow_reply), n=1)
    finally:
        wf.close()
    seen = programs.reports(out)
    ok, impatient = result.episodes
    assert ok.success and "none was delivered" in impatient.info["failure"]
    chunks = seen["chunks"]
    assert chunks[0].choices[0].delta.role == "assistant"
    assert "".join(c.choices[0].delta.content or "" for c in chunks if c.choices) == "Calling. "
    deltas = [d for c in chunks if c.choices for d in (c.choices[0].delta.tool_calls or [])]
    assert len(deltas) == 1 and deltas[0].function.name == "add" and deltas[0].id.startswith("call_")
    assert [c.choices[0].finish_reason for c in chunks if c.choices][-1] == "tool_calls"
    assert chunks[-1].choices == [] and chunks[-1].usage == seen["plain"].usage
    final = seen["final"].choices[0]
    assert final.finish_reason == "tool_calls" and final.message.content == "Calling. "
    assert json.loads(final.message.tool_calls[0].function.arguments) == {"a": 2, "b": 3}
    # three answers of task "sum" kept; the impatient stream of the other left nothing
    assert sorted(s.task_uid for s in result.samples) == ["0", "0", "0"]


@pytest.mark.integration  # episode worker processes
def test_the_responses_api_with_a_function_tool_round_trip(tasks_file, out):
    engine = ToolEngine(reply)
    wf = AgentsWorkflow(programs.responses_round_trip, ["writer"], tasks_file, val_share=0.0, workers=1)
    try:
        result = wf.rollout(wf.tasks("train")[:1], engine, n=1)
    finally:
        wf.close()
    seen = programs.reports(out)
    assert result.episodes[0].success, result.episodes[0].info
    first = seen["first"]
    assert first.status == "completed" and first.output_text == "Calling. "
    calls = [i for i in first.output if i.type == "function_call"]
    assert len(calls) == 1 and calls[0].name == "add" and json.loads(calls[0].arguments) == {"a": 2, "b": 3}
    assert seen["final"].output_text == "The sum is 5."
    assert seen["events"] == [
        "response.created", "response.in_progress",
        "response.output_item.added", "response.content_part.added", "response.output_text.delta",
        "response.output_text.done", "response.content_part.done", "response.output_item.done",
        "response.output_item.added", "response.function_call_arguments.delta",
        "response.function_call_arguments.done", "response.output_item.done", "response.completed"]
    for streamed in (seen["streamed"], seen["assembled"]):
        assert streamed.output_text == "Calling. " and streamed.status == "completed"
        (call,) = [i for i in streamed.output if i.type == "function_call"]
        assert call.name == "add" and json.loads(call.arguments) == {"a": 2, "b": 3}
    assert seen["previous"][0] == seen["builtin"][0] == seen["text"][0] == 400
    assert "previous_response_id" in seen["previous"][1] and "whole conversation" in seen["previous"][1]
    assert "'web_search' tool" in seen["builtin"][1] and "text must be an object" in seen["text"][1]
    # what reached the engine: instructions first, then the call and its output as chat turns
    prompts = [p for _, ps, _ in engine.calls for p in ps]
    assert prompts[0].messages == (("system", "Use the tools."), ("user", "sum"))
    second = prompts[1]
    assert [r for r, _ in second.messages] == ["user", "assistant", "tool"] and second.messages[2][1] == "5"
    assert json.loads(second.fields[2]) == {"tool_call_id": calls[0].call_id}
    assert len(result.samples) == 4  # two plain, two streamed


@pytest.mark.integration  # episode worker processes
def test_the_calculator_example_rewards_the_right_answer_and_a_call_that_ran(tmp_path):
    example = Path(__file__).resolve().parents[2] / "examples" / "agents" / "calculator.py"

    def solver(agent, prompt, i):
        role, last = prompt.messages[-1]
        if role == "tool":
            return f"The answer is {last}."
        expression = last.removeprefix("What is ").rstrip("?")
        if "13" in expression:  # one that cannot be evaluated: no result, the answer guessed
            expression += " +"
        return '<tool_call>{"name": "calculator", "arguments": {"expression": "%s"}}</tool_call>' % expression

    tasks = tmp_path / "tasks.jsonl"
    tasks.write_text('{"question": "What is 21 * 4?", "answer": 84}\n'
                     '{"question": "What is 13 + 2?", "answer": 15}\n')
    wf = AgentsWorkflow(f"{example}:episode", ["solver"], str(tasks), val_share=0.0, workers=2)
    try:
        result = wf.rollout(wf.tasks("train"), ToolEngine(solver), n=1)
    finally:
        wf.close()
    ran, failed = result.episodes
    assert (ran.success, ran.team_reward, failed.success, failed.team_reward) == (True, 1.0, False, 0.0)
    # each episode's two calls: the right answer and 0.5 for the call that ran; nothing for the other
    assert sorted((s.task_uid, s.reward) for s in result.samples) == [("0", 1.5)] * 2 + [("1", 0.0)] * 2


@pytest.mark.parametrize("fmt, call", [
    ("llama3_json", '<|python_tag|>{"name": "add", "parameters": {"a": 2, "b": 3}}'),
    ("llama3_json", '{"name": "add", "parameters": {"a": 2, "b": 3}}'),  # bare JSON, as Llama 3 is asked
    ("mistral", '[TOOL_CALLS] [{"name": "add", "arguments": {"a": 2, "b": 3}}]'),  # pre-v11 (v3 tokenizer)
])
def test_llama3_and_mistral_tool_calls_round_trip(tmp_path, out, fmt, call):
    from scripted import TokenScript, llama3_tokenizer, mistral_tokenizer

    tok, marker = ((llama3_tokenizer(), "<|python_tag|>") if fmt == "llama3_json"
                   else (mistral_tokenizer(tmp_path), "[TOOL_CALLS]"))

    def answer(agent, prompt, i):
        role, last = prompt.messages[-1]
        return f"The sum is {last}." if role == "tool" else call

    engine = TokenScript(answer, fmt, tok, marker)
    tasks = tmp_path / "tasks.jsonl"
    tasks.write_text('{"q": "sum"}\n')
    wf = AgentsWorkflow(programs.tool_loop, ["writer"], str(tasks), val_share=0.0, workers=1)
    try:
        result = wf.rollout(wf.tasks("train"), engine, n=1)
    finally:
        wf.close()
    seen = programs.reports(out)["sum"]
    # the marker is a special token the engine's text leaves out: parsed from the tokens
    assert seen["first"] == ("tool_calls", None, [("add", {"a": 2, "b": 3})])
    assert seen["final"] == ("stop", "The sum is 5.")
    assert seen["bad"][0] == 400
    assert "tools[1] ('broken'): parameters must be a JSON Schema object" in seen["bad"][1]
    first, final = result.samples  # the broken tool's call was refused: no sample
    assert (tok.get_vocab()[marker] in first.response_ids) == (marker in call) and first.valid and final.valid
    assert wf.scalars(result.counts)["endpoint/tool_calls"] == pytest.approx(1 / 2)
    if fmt == "llama3_json":  # the call sent back is rendered with its arguments as an object, as written
        second = engine.calls[1][1][0]
        assert ('<|python_tag|>{"name": "add", "parameters": {"a": 2, "b": 3}}<|eom_id|>'
                in tok.decode(encode_prompt(tok, second)))


@pytest.mark.integration  # an episode worker and a model with a thinking template (4 s)
def test_a_thinking_policys_thinking_is_reasoning_content(tmp_path, out):
    from scripted import Script

    class Thinking(Script):
        tok = load_tokenizer("tiny-random-qwen3")  # its template thinks: vLLM's qwen3 reasoning parser

        def tokenizer(self, agent):
            return self.tok

    tasks = tmp_path / "tasks.jsonl"
    tasks.write_text('{"q": "sum"}\n')
    wf = AgentsWorkflow(programs.thinking, ["writer"], str(tasks), val_share=0.0, workers=1)
    try:
        answer = "<think>2 and 3 make 5.</think>\n\n5"
        result = wf.rollout(wf.tasks("train"), Thinking(lambda a, p, i: answer), n=1)
    finally:
        wf.close()
    seen = programs.reports(out)
    assert seen["plain"] == seen["streamed"] == ("5", "2 and 3 make 5.")
    assert seen["responses"] == "<think>2 and 3 make 5.</think>\n\n5"  # no reasoning item: kept in the text
    assert {s.text for s in result.samples} == {"<think>2 and 3 make 5.</think>\n\n5"}  # trained whole
