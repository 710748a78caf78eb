"""Agent programs the endpoint tests train: episodes run in worker processes, which import them
from here by module path, so this module stays light (no torch). What an episode saw is written
with :func:`report` to the folder in ``AGENT_TEST_OUT`` and read back by the test with
:func:`reports`."""

import asyncio
import ctypes
import json
import os
import pickle
import time
import uuid
from pathlib import Path

import httpx
import openai
from openai.types.chat import ChatCompletion
from openai.types.responses import Response

OUT = "AGENT_TEST_OUT"
ADD = {"type": "function", "function": {"name": "add", "description": "a + b",
                                        "parameters": {"type": "object", "properties": {
                                            "a": {"type": "integer"}, "b": {"type": "integer"}}}}}
RESPONSES_ADD = {"type": "function", "name": "add", "description": "a + b",
                 "parameters": ADD["function"]["parameters"], "strict": False}


def report(**seen) -> None:
    path = Path(os.environ[OUT]) / f"{uuid.uuid4().hex}.pkl"
    path.write_bytes(pickle.dumps(seen))


def reports(folder) -> dict:
    """Everything the episodes reported, merged."""
    seen = {}
    for path in sorted(Path(folder).glob("*.pkl")):
        seen.update(pickle.loads(path.read_bytes()))
    return seen


def ask(client, agent, text, **kwargs):
    reply = client.chat.completions.create(model=agent, messages=[{"role": "user", "content": text}],
                                           **kwargs)
    return reply.choices[0].message.content


def status(fn):
    """``(status code, message, error code)`` of a call that may be refused."""
    try:
        out = fn()
    except openai.APIStatusError as err:
        return err.status_code, str(err), err.code
    return 200, out, None


def one(task, client):
    return 1.0


def three_calls(task, client):
    first = ask(client, "writer", task["q"], stop=["!"])
    second = ask(client, "writer", first + "+", stop="!")
    ask(client, "critic", second)
    return {"team": 1.0, "writer": 0.5}


def three_rounds(task, client):
    text = task["q"]
    for _ in range(3):
        text = ask(client, "writer", text, stop="!")
    return 1.0


def process_global(task, client):
    """A program that builds a client from the environment once per process and keeps it (as a
    framework's default client or a cached model is), and one that uses the openai module's own
    client: both reach the episode the worker plays now."""
    global CLIENT
    if CLIENT is None:
        CLIENT = openai.OpenAI(max_retries=0)
    report(**{task["q"]: (os.getpid(), str(CLIENT.base_url), CLIENT.api_key, str(client.base_url))})
    text = ask(CLIENT, "writer", task["q"], stop="!")
    reply = openai.chat.completions.create(model="critic", messages=[{"role": "user", "content": text}])
    return {"team": float(task["q"] in reply.choices[0].message.content)}


CLIENT = None


def leaves_threads(task, client):
    """Returns with two threads still running: one calls its episode's URL after the return (410),
    the other outlives the worker's grace (the worker is replaced before its next episode)."""
    import threading

    kept = openai.OpenAI(base_url=client.base_url, api_key=client.api_key, max_retries=0)
    returned = threading.Event()

    def late():  # counted from the episode's own call's answer, however long that took on a busy machine
        returned.wait()
        time.sleep(0.25)  # within the worker's 0.5 s grace for its episode's threads
        report(**{task["q"]: (os.getpid(), status(lambda: ask(kept, "writer", "late")))})

    threading.Thread(target=late).start()
    threading.Thread(target=time.sleep, args=(3.0,), daemon=True).start()
    ask(client, "writer", task["q"])
    returned.set()
    return 1.0


def rewarded_calls(task, client):
    """Rewards one call by its id; task1 rewards an id that is none of its answers."""
    first = client.chat.completions.create(model="writer", messages=[{"role": "user", "content": "a"}])
    second = client.responses.create(model="critic", input="b")
    calls = {second.id: 0.5, first.id: -0.25} if task["q"] != "task1" else {"chatcmpl-stranger": 1.0}
    return {"team": 1.0, "calls": calls}


def limits(task, client):
    if task["q"] != "task0":
        return 0.0 if ask(client, "writer", "x") else 1.0
    seen = {
        "unknown": status(lambda: ask(client, "judge", "x")),
        "n": status(lambda: ask(client, "writer", "x", n=2)),
        "long": status(lambda: ask(client, "writer", "long", max_tokens=100)),
        "tools": status(lambda: ask(client, "writer", "x",
                                    tools=[{"type": "function", "function": {"name": "f"}}])),
        "context": status(lambda: ask(client, "writer", "y" * 190)),
        "legacy": status(lambda: client.completions.create(model="writer", prompt="x")),
        "logprobs": status(lambda: ask(client, "writer", "x", logprobs=True)),
    }
    url, key = str(client.base_url).rstrip("/"), client.api_key
    seen["json"] = httpx.post(f"{url}/chat/completions", content=b"{not json",
                              headers={"Authorization": f"Bearer {key}"}).status_code
    seen["no_key"] = httpx.post(f"{url}/chat/completions", json={}).status_code
    stranger = openai.OpenAI(base_url=url, api_key="nope", max_retries=0)
    seen["wrong_key"] = status(lambda: stranger.models.list())
    seen["models"] = [m.id for m in client.models.list()]
    seen["content"] = ask(client, "writer", "ok", stop=["!"], max_tokens=5, temperature=0.2)
    report(**seen)
    return 1.0


def capped(task, client):
    """A reply cut at the program's own cap, then one cut at the policy's limit (4096 asked)."""
    ask(client, "writer", "short", max_tokens=3)
    ask(client, "writer", "long", max_tokens=4096)
    return 1.0


def failing(task, client):
    """task0 raises, task1 returns a reward for a stranger, task2 outlives its timeout, task3 is fine."""
    ask(client, "writer", task["q"])
    kind = task["q"]
    if kind == "task0":
        raise RuntimeError("the program broke")
    if kind == "task1":
        return {"writer": 1.0, "stranger": 2.0}
    if kind == "task2":
        report(late=(os.getpid(), str(client.base_url), client.api_key))
        time.sleep(60)
    return 1.0


def crashing(task, client):
    """task0's process exits under it, task1's segfaults; the others are fine."""
    ask(client, "writer", task["q"])
    if task["q"] == "task0":
        os._exit(3)
    if task["q"] == "task1":
        ctypes.string_at(0)
    return 1.0


def from_file(task, client):
    """Raises on the tasks ``fail.json`` of the report folder lists under "raise" (read per episode),
    loses its process on those under "exit"."""
    ask(client, "writer", task["q"])
    fail = json.loads((Path(os.environ[OUT]) / "fail.json").read_text())
    if task["q"] in fail.get("raise", []):
        raise ValueError("the reply did not parse")
    if task["q"] in fail.get("exit", []):
        os._exit(3)
    return 1.0


def impatient(task, client):
    """A client that gives up on a slow answer, then a patient one."""
    hasty = openai.OpenAI(base_url=client.base_url, api_key=client.api_key, max_retries=0, timeout=0.2)
    try:
        ask(hasty, "writer", "slow")
    except openai.APITimeoutError:
        return float(ask(client, "critic", "patient") == "fine")
    return 0.0


POOL = None


async def concurrent_async(task, client):
    async def call(agent):
        reply = await client.chat.completions.create(model=agent,
                                                     messages=[{"role": "user", "content": task["q"]}])
        return reply.choices[0].message.content

    a, b = await asyncio.gather(call("writer"), call("critic"))
    # a connection pool kept by the process across episodes, as a framework's default client keeps
    # one: its connections belong to the worker's event loop, which outlives every episode
    global POOL
    POOL = POOL or httpx.AsyncClient()
    await openai.AsyncOpenAI(http_client=POOL, max_retries=0).models.list()
    return {"team": float(a.startswith("writer") and b.startswith("critic")), "critic": -1.0}


def two_choices(task, client):
    reply = client.chat.completions.create(model="critic", messages=[{"role": "user", "content": "x"}], n=2)
    return float(len(reply.choices) == 2)


def fields(task, client):
    def chat(**kwargs):
        return status(lambda: client.chat.completions.create(model="writer", **kwargs)
                      .choices[0].message.content)

    if task["q"] != "task0":
        return 0.0 if ask(client, "writer", "x") else 1.0
    user = [{"role": "user", "content": "x"}]
    report(
        parts=chat(messages=[{"role": "user", "content": [{"type": "text", "text": "two "},
                                                          {"type": "text", "text": "parts"}]}]),
        image=chat(messages=[{"role": "user", "content": [
            {"type": "text", "text": "look"}, {"type": "image_url", "image_url": {"url": "data:,"}}]}]),
        name=chat(messages=[{"role": "user", "content": "hi", "name": "alice"}]),
        seed=chat(messages=user, seed=7),
        unknown=chat(messages=user, extra_body={"mirostat": 2}),
        logprobs=status(lambda: [(t.token, t.logprob) for t in client.chat.completions.create(
            model="writer", messages=user, logprobs=True).choices[0].logprobs.content]),
        streamed_logprobs=[(t.token, t.logprob) for c in client.chat.completions.create(
            model="writer", messages=user, logprobs=True, stream=True)
            if c.choices and c.choices[0].logprobs for t in c.choices[0].logprobs.content],
        top=chat(messages=user, logprobs=False, top_logprobs=2),
        json=chat(messages=user, response_format={"type": "json_object"}),
        schema=chat(messages=user, response_format={"type": "json_schema", "json_schema": {
            "name": "answer", "schema": {"type": "object", "properties": {"x": {"type": "integer"}}}}}),
        bad_format=chat(messages=user, response_format={"type": "json_schema", "json_schema": "x"}),
        kwargs=chat(messages=user, extra_body={"chat_template_kwargs": {"enable_thinking": False}}),
        vllm_style=chat(messages=user, reasoning_effort="low", extra_body={"min_p": 0.1}),
        bad_choice=chat(messages=user, tools=[ADD], tool_choice={"type": "function", "function": "add"}),
        many=chat(messages=user, n=17),
        big=httpx.post(f"{str(client.base_url).rstrip('/')}/chat/completions",
                       content=b"{" + b" " * 17 * 2**20,
                       headers={"Authorization": f"Bearer {client.api_key}"}).status_code,
        harmless=chat(messages=user, user="u1", metadata={"k": "v"}, store=False),
        twice=chat(messages=[{"role": "user", "content": "a"}, {"role": "user", "content": "b"}]),
        late_system=chat(messages=[{"role": "user", "content": "a"}, {"role": "assistant", "content": "b"},
                                   {"role": "system", "content": "c"}]),
        after=chat(messages=user),
    )
    return 1.0


def tools_round_trip(task, client):
    """A tool offered, called, run and its result sent back; an unknown tool, tool_choice none and a
    named tool that was not offered."""
    messages = [{"role": "user", "content": task["q"]}]
    first = client.chat.completions.create(model="writer", messages=messages, tools=[ADD],
                                           tool_choice="auto", parallel_tool_calls=True)
    choice = first.choices[0]
    if task["q"] == "broken":
        report(broken=(choice.finish_reason, choice.message.content, choice.message.tool_calls))
        return 0.0
    seen = {"first": (choice.finish_reason, choice.message.content, choice.message.tool_calls)}
    call = choice.message.tool_calls[0]
    args = json.loads(call.function.arguments)
    messages += [choice.message.model_dump(exclude_none=True),
                 {"role": "tool", "tool_call_id": call.id, "content": str(args["a"] + args["b"])}]
    final = client.chat.completions.create(model="writer", messages=messages, tools=[ADD])
    seen["final"] = (final.choices[0].finish_reason, final.choices[0].message.content)
    unknown = client.chat.completions.create(
        model="writer", messages=[{"role": "user", "content": "unknown"}], tools=[ADD])
    seen["unknown"] = (unknown.choices[0].finish_reason, unknown.choices[0].message.tool_calls)
    plain = client.chat.completions.create(model="writer", messages=[{"role": "user", "content": "x"}],
                                           tools=[ADD], tool_choice="none")
    seen["none"] = (plain.choices[0].finish_reason, plain.choices[0].message.content)
    seen["named"] = status(lambda: client.chat.completions.create(
        model="writer", messages=messages[:1], tools=[ADD],
        tool_choice={"type": "function", "function": {"name": "mul"}}))
    report(**seen)
    return 1.0


def tool_loop(task, client):
    """The tool loop every framework runs: a call, its result sent back, the answer; and a tool whose
    definition is broken, refused alone."""
    messages = [{"role": "user", "content": "2+3?"}]
    first = client.chat.completions.create(model="writer", messages=messages, tools=[ADD]).choices[0]
    calls = [(c.function.name, json.loads(c.function.arguments)) for c in first.message.tool_calls or []]
    seen = {"first": (first.finish_reason, first.message.content, calls)}
    if calls:
        call = first.message.tool_calls[0]
        messages += [first.message.model_dump(exclude_none=True),
                     {"role": "tool", "tool_call_id": call.id, "content": str(sum(calls[0][1].values()))}]
        final = client.chat.completions.create(model="writer", messages=messages, tools=[ADD]).choices[0]
        seen["final"] = (final.finish_reason, final.message.content)
    bad = {"type": "function", "function": {"name": "broken", "parameters": "a string, not a schema"}}
    seen["bad"] = status(lambda: client.chat.completions.create(model="writer", messages=messages[:1],
                                                                tools=[ADD, bad]))
    report(**{task["q"]: seen})
    return 1.0


def thinking(task, client):
    """A thinking policy's answer: its thinking apart from its content, plain, streamed and on the
    Responses API (whose output text keeps it)."""
    messages = [{"role": "user", "content": "2+3?"}]
    plain = client.chat.completions.create(model="writer", messages=messages).choices[0].message
    chunks = list(client.chat.completions.create(model="writer", messages=messages, stream=True))
    deltas = [c.choices[0].delta for c in chunks if c.choices]
    response = client.responses.create(model="writer", input="2+3?")
    report(plain=(plain.content, getattr(plain, "reasoning_content", None)),
           streamed=("".join(d.content or "" for d in deltas),
                     "".join(getattr(d, "reasoning_content", None) or "" for d in deltas)),
           responses=response.output_text)
    return 1.0


def streaming(task, client):
    if task["q"] == "broken":  # a client gone before the answer
        hasty = openai.OpenAI(base_url=client.base_url, api_key=client.api_key, max_retries=0, timeout=0.2)
        try:
            slow = [{"role": "user", "content": "slow"}]
            for _ in hasty.chat.completions.create(model="writer", messages=slow, stream=True):
                pass
        except openai.APITimeoutError:
            pass
        return 0.0
    messages = [{"role": "user", "content": "sum"}]
    seen = {"plain": client.chat.completions.create(model="writer", messages=messages, tools=[ADD]),
            "chunks": list(client.chat.completions.create(
                model="writer", messages=messages, tools=[ADD], stream=True,
                stream_options={"include_usage": True}))}
    with client.chat.completions.stream(model="writer", messages=messages, tools=[ADD]) as stream:
        for _ in stream:
            pass
        final = stream.get_final_completion()  # the SDK's own assembly of the chunks
    seen["final"] = ChatCompletion.model_validate(final.model_dump())  # a generic type pickles not
    report(**seen)
    return 1.0


def responses_round_trip(task, client):
    if task["q"] == "broken":
        return 0.0
    first = client.responses.create(model="writer", instructions="Use the tools.", input="sum",
                                    tools=[RESPONSES_ADD], store=False)
    call = next(item for item in first.output if item.type == "function_call")
    args = json.loads(call.arguments)
    answer = {"type": "function_call_output", "call_id": call.call_id, "output": str(args["a"] + args["b"])}
    history = [{"role": "user", "content": "sum"}, *[i.model_dump(exclude_none=True) for i in first.output],
               answer]
    final = client.responses.create(model="writer", input=history, tools=[RESPONSES_ADD], store=False)
    seen = {"first": first, "final": final}
    events = list(client.responses.create(model="writer", input="sum", tools=[RESPONSES_ADD], store=False,
                                          stream=True))
    seen["events"] = [e.type for e in events]
    seen["streamed"] = events[-1].response
    with client.responses.stream(model="writer", input="sum", tools=[RESPONSES_ADD], store=False) as stream:
        for _ in stream:
            pass
        assembled = stream.get_final_response()  # the SDK's own assembly of the events
    seen["assembled"] = Response.model_validate(assembled.model_dump())
    for name, kwargs in (("previous", {"previous_response_id": first.id}),
                         ("builtin", {"tools": [{"type": "web_search"}]}),
                         ("text", {"text": "plain"})):
        seen[name] = status(lambda: client.responses.create(model="writer", input="sum", **kwargs))
    report(**seen)
    return 1.0


def conversation(task, client):
    """The writer answers, the critic reads the answer; each is rewarded for its own brevity."""
    text = client.chat.completions.create(model="writer", messages=[{"role": "user", "content": task["q"]}],
                                          stop=["y"])
    critique = client.chat.completions.create(
        model="critic", messages=[{"role": "user", "content": task["q"]},
                                  {"role": "assistant", "content": text.choices[0].message.content},
                                  {"role": "user", "content": "Is that right?"}])
    return {"team": 1.0, "writer": -text.usage.completion_tokens / 10,
            "critic": -critique.usage.completion_tokens / 10}


def short_answers(task, client):
    """The writer is rewarded for answering in few tokens (it stops at a "y")."""
    reply = client.chat.completions.create(model="writer", messages=[{"role": "user", "content": task["q"]}],
                                           stop=["y"])
    return {"writer": -reply.usage.completion_tokens / 16}


def with_tools(task, client):
    """A tool result already in the history: each policy renders the tools and the call its way."""
    call = {"id": "call_7", "type": "function", "function": {"name": "add", "arguments": '{"a": 2, "b": 3}'}}
    messages = [{"role": "user", "content": task["q"]},
                {"role": "assistant", "content": "", "tool_calls": [call]},
                {"role": "tool", "tool_call_id": "call_7", "content": "5"}]
    for agent in ("writer", "critic"):
        client.chat.completions.create(model=agent, messages=messages, tools=[ADD])
    return 1.0


def sleeper(task, client):
    ask(client, "writer", task["q"])
    report(**{f"sleeper-{os.getpid()}": os.getpid()})
    time.sleep(600)
    return 1.0
