"""The OpenAI chat-completions wire format, as far as the endpoint speaks it: a request body
checked and turned into a :class:`~drmas.records.ChatPrompt`, errors in OpenAI's shape, and the
response body. Pure functions: no server, no engine.

Every field a client sends is served or refused with a 400 that names it, never ignored (the
table in docs/agents.md). Sampling stays the policy's own (the trainer computes log-probs at the
temperature the tokens were sampled with); a request asking for other values, or for a ``seed``,
is answered with the policy's and counted.
"""

from __future__ import annotations

import json
import math
import time
import uuid
from dataclasses import dataclass, field
from typing import Any, Sequence

from drmas.workflows.agents.errors import ApiError
from drmas.workflows.agents.fields import PENALTIES, check_fields, format_note, template_kwargs, with_note
from drmas.records import ChatPrompt, Completion, GenerationSettings

__all__ = ["ApiError", "ChatRequest", "Reply", "chat_chunks", "chat_response", "message_content",
           "parse_chat_request"]

_ROLES = {"system": "system", "developer": "system", "user": "user", "assistant": "assistant", "tool": "tool"}
_MAX_N = 16
"""The most choices one request may ask for (validation; training takes one)."""


@dataclass(frozen=True)
class ChatRequest:
    """A checked request: which agent answers, its prompt (with the request's stops and length),
    how many choices, and whether it asked for sampling other than the policy's."""

    agent: str
    prompt: ChatPrompt
    n: int = 1
    overrides_generation: bool = False
    tools: tuple[dict[str, Any], ...] = ()
    """The tools offered (their calls are parsed out of the answer); empty: none."""
    stream: bool = False
    """Answer as server-sent events (:func:`chat_chunks`)."""
    include_usage: bool = False
    """Streaming: a last chunk with the token counts (``stream_options.include_usage``)."""
    logprobs: bool = False
    """Answer with each sampled token's log-prob (``logprobs: true``)."""
    own_cap: bool = False
    """The program capped the length below the policy's limit: a reply ended there is no format fault."""
    ignored: tuple[str, ...] = ()
    """Fields answered as if absent (``fields.IGNORED``), counted."""
    structured: bool = False
    """A ``response_format`` asked for JSON: shown to the policy in the prompt (``fields.format_note``)."""


@dataclass
class Reply:
    """One choice of an answer: the completion (the sample) and what the client is shown."""

    completion: Completion
    content: str
    """Without the stop string and without call markup."""
    tool_calls: list[dict[str, Any]] = field(default_factory=list)
    malformed: int = 0
    """Calls begun that the parser did not take (the sample is invalid)."""
    logprobs: list[dict[str, Any]] | None = None
    """OpenAI's ``logprobs.content``: each generated token's text and log-prob, where asked."""
    reasoning: str | None = None
    """The thinking (Qwen3's ``<think>`` block) split off ``content`` by vLLM's reasoning parser:
    the chat answer's ``reasoning_content``."""
    full: str | None = None
    """``content`` before the split (what the Responses API's output text shows)."""
    id: str = ""
    """The answer's id, as the client sees it (``chatcmpl-...``, ``resp_...``): an episode may reward
    the call by it."""


def _positive_int(body: dict[str, Any], key: str) -> int | None:
    value = body.get(key)
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise ApiError(400, f"{key} must be a positive integer, got {value!r}", "invalid_value", key)
    return value


def _messages(raw: Any) -> tuple[tuple[tuple[str, str], ...], tuple[str, ...]]:
    """The messages as ``(role, content)`` and each one's tool fields as JSON text (see ChatPrompt)."""
    if not isinstance(raw, list) or not raw:
        raise ApiError(400, "messages must be a non-empty list of {role, content} objects",
                       "invalid_value", "messages")
    out, fields = [], []
    for i, m in enumerate(raw):
        param = f"messages[{i}]"
        if not isinstance(m, dict):
            raise ApiError(400, f"{param} must be an object with role and content", "invalid_value", param)
        role = m.get("role")
        if role == "function" or m.get("function_call"):
            raise ApiError(400, f"{param}: the legacy function-calling fields are not served; send tools, "
                           "assistant tool_calls and tool messages", "unsupported_parameter", param)
        fields.append(_tool_fields(m, role, param))
        if role not in _ROLES:
            raise ApiError(400, f"{param}.role must be one of {sorted(_ROLES)}, got {role!r}",
                           "invalid_value", param)
        content = m.get("content")
        if isinstance(content, list):
            content = _text_parts(content, f"{param}.content")
        if content is None and role == "assistant":
            content = ""
        if not isinstance(content, str):
            raise ApiError(400, f"{param}.content must be a string or a list of text parts, got "
                           f"{type(content).__name__}", "invalid_value", param)
        name = m.get("name")
        if name is not None:  # rendered by encode_prompt where the template takes it
            if not isinstance(name, str) or not name:
                raise ApiError(400, f"{param}.name must be a non-empty string", "invalid_value", param)
            extra = json.loads(fields[-1]) if fields[-1] else {}
            fields[-1] = json.dumps({**extra, "name": name}, ensure_ascii=False)
        out.append((_ROLES[role], content))
    return tuple(out), (tuple(fields) if any(fields) else ())


def _tool_fields(m: dict[str, Any], role: Any, param: str) -> str:
    """An assistant's ``tool_calls`` or a tool result's ``tool_call_id``, as JSON text ("" for none)."""
    if role == "tool":
        if not isinstance(m.get("tool_call_id"), str):
            raise ApiError(400, f"{param}: a tool message needs the tool_call_id it answers", "invalid_value",
                           param)
        return json.dumps({"tool_call_id": m["tool_call_id"]})
    calls = m.get("tool_calls")
    if not calls:
        return ""
    if role != "assistant" or not isinstance(calls, list):
        raise ApiError(400, f"{param}.tool_calls must be a list on an assistant message", "invalid_value",
                       param)
    for j, c in enumerate(calls):
        fn = c.get("function") if isinstance(c, dict) else None
        if not isinstance(fn, dict) or not isinstance(fn.get("name"), str):
            raise ApiError(400, f"{param}.tool_calls[{j}] must be {{id, type: function, function: {{name, "
                           "arguments}}}}", "invalid_value", param)
    return json.dumps({"tool_calls": calls}, ensure_ascii=False)


def _tools(body: dict[str, Any]) -> tuple[dict[str, Any], ...]:
    """The tools the answer may call: all of ``tools``, none for ``tool_choice: none``, the named
    one for a named choice (``required`` offers all; neither is enforced, see docs/agents.md)."""
    if body.get("functions"):
        raise ApiError(400, "functions (legacy) is not served: send tools", "unsupported_parameter",
                       "functions")
    tools, choice = body.get("tools") or [], body.get("tool_choice")
    if not isinstance(tools, list):
        raise ApiError(400, "tools must be a list of function tools", "invalid_value", "tools")
    for i, t in enumerate(tools):
        fn = t.get("function") if isinstance(t, dict) else None
        if not isinstance(t, dict) or t.get("type") != "function" or not isinstance(fn, dict) \
                or not isinstance(fn.get("name"), str) or not fn["name"]:
            raise ApiError(400, f"tools[{i}] must be {{type: function, function: {{name, description, "
                           "parameters}}}} (function tools only)", "invalid_value", "tools")
        for key, kind, what in (("description", str, "a string"), ("strict", bool, "true or false"),
                                ("parameters", dict, "a JSON Schema object")):
            if fn.get(key) is not None and not isinstance(fn[key], kind):
                raise ApiError(400, f"tools[{i}] ({fn['name']!r}): {key} must be {what}, got "
                               f"{type(fn[key]).__name__}", "invalid_value", "tools")
    names = [t["function"]["name"] for t in tools]
    if choice in (None, "auto", "required"):
        return tuple(tools)
    if choice == "none":
        return ()
    fn = choice.get("function") if isinstance(choice, dict) else None
    named = fn.get("name") if isinstance(fn, dict) else None
    if named is None or choice.get("type") != "function":
        raise ApiError(400, "tool_choice must be auto, none, required or {type: function, function: {name}}, "
                       f"got {choice!r}", "invalid_value", "tool_choice")
    if named not in names:
        raise ApiError(400, f"tool_choice names {named!r}, which is not among the tools ({', '.join(names)})",
                       "invalid_value", "tool_choice")
    return tuple(t for t in tools if t["function"]["name"] == named)


def _text_parts(parts: list[Any], param: str) -> str:
    """List-of-parts content as one string: the text parts joined (what LangChain and the Agents
    SDK send); any other part is refused by its type."""
    texts = []
    for j, part in enumerate(parts):
        kind = part.get("type") if isinstance(part, dict) else None
        if kind not in ("text", "input_text", "output_text") or not isinstance(part.get("text"), str):
            raise ApiError(400, f"{param}[{j}] is a {kind or type(part).__name__!r} part: the drmas endpoint "
                           "serves text models and takes text parts only", "unsupported_content", param)
        texts.append(part["text"])
    return "".join(texts)


def _stops(raw: Any) -> tuple[str, ...]:
    if raw is None:
        return ()
    stops = [raw] if isinstance(raw, str) else raw
    if not isinstance(stops, list) or not all(isinstance(s, str) and s for s in stops):
        raise ApiError(400, f"stop must be a non-empty string or a list of them, got {raw!r}",
                       "invalid_value", "stop")
    return tuple(stops)


def _overrides(body: dict[str, Any], policy: GenerationSettings | None) -> bool:
    """Whether the request asks for sampling other than the policy's."""
    # one seed per rollout: a request's cannot be honoured
    if (any(body.get(k) not in (None, 0, 0.0) for k in (*PENALTIES, "min_p")) or body.get("logit_bias")
            or body.get("seed") is not None):
        return True
    if policy is None:
        return any(body.get(k) is not None for k in ("temperature", "top_p", "top_k"))
    for key, own in (("temperature", policy.temperature), ("top_p", policy.top_p), ("top_k", policy.top_k)):
        value = body.get(key)
        if value is not None and not (isinstance(value, (int, float)) and math.isclose(value, own)):
            return True
    return False


def parse_chat_request(body: Any, agents: Sequence[str],
                       settings: dict[str, GenerationSettings] | None = None,
                       training: bool = True) -> ChatRequest:
    """The request of a ``POST /v1/chat/completions`` body, or an :class:`ApiError`: 400 for a
    malformed or unsupported body, 404 for an unknown agent (``model``). ``settings``: each
    agent's policy settings (the limits a request must stay within; None: not checked)."""
    if not isinstance(body, dict):
        raise ApiError(400, "the request body must be a JSON object", "invalid_json")
    options = body.get("stream_options")
    if options is not None and (not isinstance(options, dict) or set(options) - {"include_usage"}):
        raise ApiError(400, f"stream_options takes include_usage only, got {options!r}", "invalid_value",
                       "stream_options")
    ignored = check_fields(body)
    note = format_note(body.get("response_format"))
    kwargs = template_kwargs(body.get("chat_template_kwargs"))
    tools = _tools(body)
    model = body.get("model")
    if model not in agents:
        raise ApiError(404, f"the model {model!r} is not an agent of this run; the agents are: "
                       f"{', '.join(agents)}", "model_not_found", "model")
    messages, fields = _messages(body.get("messages"))
    if note is not None:
        messages, fields = with_note(messages, fields, note)
    n = _positive_int(body, "n") or 1
    if n > _MAX_N:
        raise ApiError(400, f"n is {n}: at most {_MAX_N} choices per request", "invalid_value", "n")
    if training and n != 1:
        raise ApiError(400, f"n must be 1 while training (got {n}): each choice would be a sample given its "
                       "episode's reward, which the other choices did not earn", "invalid_value", "n")
    key = "max_completion_tokens" if body.get("max_completion_tokens") is not None else "max_tokens"
    length = _positive_int(body, key)
    policy = (settings or {}).get(model)
    own_cap = length is not None and (policy is None or length < policy.max_new_tokens)
    if length is not None and policy is not None:  # programs send 4096 and more: the policy's limit holds
        length = min(length, policy.max_new_tokens)
    prompt = ChatPrompt(messages, "", _stops(body.get("stop")), length,
                        tuple(json.dumps(t, ensure_ascii=False, sort_keys=True) for t in tools), fields,
                        kwargs)
    return ChatRequest(model, prompt, n, _overrides(body, policy), tools, bool(body.get("stream")),
                       bool((options or {}).get("include_usage")), bool(body.get("logprobs")), own_cap,
                       tuple(ignored), note is not None)


def message_content(completion: Completion, stops: Sequence[str]) -> str:
    """The answer as OpenAI shows it: without the stop string that ended it (the trained tokens
    keep it, as the engine produced them)."""
    text = completion.text
    if completion.finish_reason == "stop":
        for s in sorted(stops, key=len, reverse=True):
            if s and text.endswith(s):
                return text[: -len(s)]
    return text


def _usage(replies: Sequence[Reply]) -> dict[str, int]:
    prompt = len(replies[0].completion.prompt_ids) if replies else 0
    generated = sum(len(r.completion.response_ids) for r in replies)
    return {"prompt_tokens": prompt, "completion_tokens": generated, "total_tokens": prompt + generated}


def _finish(r: Reply) -> str:
    return "tool_calls" if r.tool_calls else "length" if r.completion.finish_reason == "length" else "stop"


def _logprobs(reply: Reply) -> dict[str, Any] | None:
    return None if reply.logprobs is None else {"content": reply.logprobs, "refusal": None}


def chat_response(agent: str, replies: Sequence[Reply]) -> dict[str, Any]:
    """The ``chat.completion`` object for one request's choices."""
    choices = []
    for i, r in enumerate(replies):
        content = (r.content or None) if r.tool_calls else r.content  # OpenAI: null beside calls
        message: dict[str, Any] = {"role": "assistant", "content": content}
        if r.reasoning is not None:
            message["reasoning_content"] = r.reasoning
        if r.tool_calls:
            message["tool_calls"] = r.tool_calls
        choices.append({"index": i, "message": message, "finish_reason": _finish(r),
                        "logprobs": _logprobs(r)})
    return {"id": replies[0].id or f"chatcmpl-{uuid.uuid4().hex}", "object": "chat.completion",
            "created": int(time.time()),
            "model": agent, "choices": choices, "usage": _usage(replies)}


def chat_chunks(agent: str, replies: Sequence[Reply], include_usage: bool) -> list[dict[str, Any]]:
    """The same answer as ``chat.completion.chunk`` objects, OpenAI's streaming shape: per choice
    the role, the content, each tool call (whole, one delta each), the finish reason; then the
    usage where asked. The answer is generated whole, then streamed."""
    head = {"id": replies[0].id or f"chatcmpl-{uuid.uuid4().hex}", "object": "chat.completion.chunk",
            "created": int(time.time()), "model": agent}

    def chunk(i: int, delta: dict[str, Any], finish: str | None = None,
              logprobs: Any = None) -> dict[str, Any]:
        choice = {"index": i, "delta": delta, "finish_reason": finish, "logprobs": logprobs}
        return {**head, "choices": [choice], **({"usage": None} if include_usage else {})}

    out = []
    for i, r in enumerate(replies):
        out.append(chunk(i, {"role": "assistant", "content": ""}))
        if r.reasoning is not None:
            out.append(chunk(i, {"reasoning_content": r.reasoning}))
        if r.content or r.logprobs:
            out.append(chunk(i, {"content": r.content}, logprobs=_logprobs(r)))
        for k, call in enumerate(r.tool_calls):
            out.append(chunk(i, {"tool_calls": [{"index": k, **call}]}))
        out.append(chunk(i, {}, _finish(r)))
    if include_usage:
        out.append({**head, "choices": [], "usage": _usage(replies)})
    return out
