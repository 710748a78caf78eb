"""OpenAI's Responses API (``POST /v1/responses``) as far as agent frameworks use it, on top of the
chat path: a request's input items become chat messages (then :func:`parse_chat_request` checks
them as any chat request), and the answer becomes output items. Pure functions.

Served: ``input`` as a string or items (messages with text parts, ``function_call`` and
``function_call_output``), ``instructions`` (a system message first), function ``tools`` and
``tool_choice``, ``max_output_tokens``, ``store`` (nothing is kept either way), the sampling
fields as on the chat path, ``text`` (its ``format`` as the chat path's ``response_format``: JSON
shown to the policy), ``chat_template_kwargs``, ``stream`` (the answer's events, after it was
generated whole); ``reasoning`` and ``text.verbosity`` answered as if absent and counted, as the
chat path's ``reasoning_effort`` and ``verbosity``. Refused by name: ``previous_response_id``
(send the whole conversation, as ``store: false`` clients do), ``include``, built-in tools,
other item types.
"""

from __future__ import annotations

import time
import uuid
from typing import Any

from drmas.workflows.agents.protocol import ApiError, Reply

__all__ = ["chat_body", "response_events", "response_object"]

_SAME = ("model", "temperature", "top_p", "seed", "user", "metadata", "parallel_tool_calls", "service_tier",
         "prompt_cache_key", "safety_identifier", "chat_template_kwargs")
_NO_EFFECT = {"store", "truncation"}


def _refuse(param: str, why: str) -> ApiError:
    return ApiError(400, f"{param} is not served on /v1/responses: {why}", "unsupported_parameter", param)


def _text(content: Any, param: str) -> str:
    if isinstance(content, str):
        return content
    if not isinstance(content, list):
        raise ApiError(400, f"{param} must be a string or a list of text parts", "invalid_value", param)
    out = []
    for j, part in enumerate(content):
        kind = part.get("type") if isinstance(part, dict) else None
        if kind not in ("input_text", "output_text", "text") or not isinstance(part.get("text"), str):
            raise ApiError(400, f"{param}[{j}] is a {kind!r} part: the drmas endpoint takes text parts only",
                           "unsupported_content", param)
        out.append(part["text"])
    return "".join(out)


def _messages(items: Any, instructions: Any) -> list[dict[str, Any]]:
    """Input items as chat messages: consecutive function calls join one assistant message."""
    messages: list[dict[str, Any]] = []
    if instructions is not None:
        messages.append({"role": "system", "content": _text(instructions, "instructions")})
    if isinstance(items, str):
        return messages + [{"role": "user", "content": items}]
    if not isinstance(items, list) or not items:
        raise ApiError(400, "input must be a string or a non-empty list of items", "invalid_value", "input")
    for i, item in enumerate(items):
        param = f"input[{i}]"
        kind = item.get("type", "message") if isinstance(item, dict) else None
        if kind == "message":
            if item.get("role") not in ("user", "system", "developer", "assistant"):
                raise ApiError(400, f"{param}.role must be user, system, developer or assistant",
                               "invalid_value", param)
            content = _text(item.get("content", ""), f"{param}.content")
            messages.append({"role": item["role"], "content": content})
        elif kind == "function_call":
            call = {"id": item.get("call_id"), "type": "function",
                    "function": {"name": item.get("name"), "arguments": item.get("arguments", "{}")}}
            last = messages[-1] if messages else None
            if last is not None and last["role"] == "assistant":
                last.setdefault("tool_calls", []).append(call)
            else:
                messages.append({"role": "assistant", "content": "", "tool_calls": [call]})
        elif kind == "function_call_output":
            output = item.get("output")
            text = output if isinstance(output, str) else _text(output, f"{param}.output")
            messages.append({"role": "tool", "tool_call_id": item.get("call_id"), "content": text})
        else:
            raise ApiError(400, f"{param} is a {kind!r} item: the drmas endpoint takes messages, "
                           "function_call and function_call_output items", "unsupported_item", param)
    return messages


def _tools(tools: Any, choice: Any) -> tuple[list[dict[str, Any]], Any]:
    out = []
    for i, t in enumerate(tools or []):
        if not isinstance(t, dict) or t.get("type") != "function":
            kind = t.get("type") if isinstance(t, dict) else t
            raise ApiError(400, f"tools[{i}] is a {kind!r} tool: the drmas endpoint serves function tools "
                           "only", "unsupported_parameter", "tools")
        out.append({"type": "function", "function": {k: t[k] for k in ("name", "description", "parameters")
                                                      if k in t}})
    if isinstance(choice, dict) and choice.get("type") == "function":
        choice = {"type": "function", "function": {"name": choice.get("name")}}
    return out, choice


def chat_body(body: Any) -> dict[str, Any]:
    """The chat-completions body of a Responses request (every field served, or a 400)."""
    if not isinstance(body, dict):
        raise ApiError(400, "the request body must be a JSON object", "invalid_json")
    if body.get("previous_response_id"):
        raise _refuse("previous_response_id", "nothing is stored; send the whole conversation as input "
                      "(store: false)")
    if body.get("include"):
        raise _refuse("include", "no extra output is produced")
    text = body.get("text") or {}
    if not isinstance(text, dict) or not isinstance(text.get("format") or {}, dict):
        raise ApiError(400, "text must be an object ({format: {type: text, json_object or json_schema}})",
                       "invalid_value", "text")
    known = {*_SAME, *_NO_EFFECT, "input", "instructions", "tools", "tool_choice", "max_output_tokens",
             "previous_response_id", "stream", "reasoning", "include", "text", "top_logprobs"}
    unknown = sorted(set(body) - known)
    if unknown:
        raise ApiError(400, f"unknown or unsupported parameter {unknown[0]!r} on /v1/responses",
                       "unsupported_parameter", unknown[0])
    out = {k: body[k] for k in _SAME if body.get(k) is not None}
    if body.get("stream"):
        out["stream"] = True
    fmt = text.get("format")
    if fmt is not None:  # the Responses API flattens what chat nests under json_schema
        out["response_format"] = (fmt if fmt.get("type") != "json_schema" else
                                  {"type": "json_schema", "json_schema": {k: v for k, v in fmt.items()
                                                                         if k != "type"}})
    for src, dst in ((body.get("reasoning"), "reasoning_effort"), (text.get("verbosity"), "verbosity")):
        if src is not None:  # ignored and counted on the chat path
            out[dst] = src
    out["messages"] = _messages(body.get("input"), body.get("instructions"))
    tools, choice = _tools(body.get("tools"), body.get("tool_choice"))
    if tools:
        out["tools"] = tools
    if choice is not None:
        out["tool_choice"] = choice
    for src, dst in (("max_output_tokens", "max_tokens"), ("top_logprobs", "top_logprobs")):
        if body.get(src) is not None:
            out[dst] = body[src]
    return out


def response_object(agent: str, reply: Reply, body: dict[str, Any]) -> dict[str, Any]:
    """The ``response`` object of one answer: a message item with the text (if any), then a
    ``function_call`` item per parsed call."""
    output: list[dict[str, Any]] = []
    text = reply.full if reply.full is not None else reply.content  # thinking kept in the text here
    if text or not reply.tool_calls:
        output.append({"type": "message", "id": f"msg_{uuid.uuid4().hex}", "status": "completed",
                       "role": "assistant",
                       "content": [{"type": "output_text", "text": text, "annotations": []}]})
    for call in reply.tool_calls:
        output.append({"type": "function_call", "id": f"fc_{uuid.uuid4().hex}", "call_id": call["id"],
                       "name": call["function"]["name"], "arguments": call["function"]["arguments"],
                       "status": "completed"})
    length = reply.completion.finish_reason == "length" and not reply.tool_calls
    prompt, generated = len(reply.completion.prompt_ids), len(reply.completion.response_ids)
    return {
        "id": reply.id or f"resp_{uuid.uuid4().hex}", "object": "response",
        "created_at": float(int(time.time())),
        "model": agent, "status": "incomplete" if length else "completed",
        "incomplete_details": {"reason": "max_output_tokens"} if length else None,
        "output": output, "parallel_tool_calls": body.get("parallel_tool_calls", True),
        "tool_choice": body.get("tool_choice", "auto"), "tools": list(body.get("tools") or []),
        "instructions": body.get("instructions"), "error": None, "store": False,
        "usage": {"input_tokens": prompt, "output_tokens": generated, "total_tokens": prompt + generated,
                  "input_tokens_details": {"cached_tokens": 0, "cache_write_tokens": 0},
                  "output_tokens_details": {"reasoning_tokens": 0}},
    }


def response_events(agent: str, reply: Reply, body: dict[str, Any]) -> list[dict[str, Any]]:
    """The same answer as the Responses API's stream: created, in progress, per output item its
    added / delta / done events, then completed (or incomplete)."""
    final = response_object(agent, reply, body)
    events: list[dict[str, Any]] = []

    def emit(kind: str, **fields: Any) -> None:
        events.append({"type": kind, "sequence_number": len(events), **fields})

    start = {**final, "status": "in_progress", "incomplete_details": None, "output": [], "usage": None}
    emit("response.created", response=start)
    emit("response.in_progress", response=start)
    for i, item in enumerate(final["output"]):
        at = {"item_id": item["id"], "output_index": i}
        if item["type"] == "message":
            text = item["content"][0]["text"]
            part = {"type": "output_text", "text": "", "annotations": []}
            emit("response.output_item.added", output_index=i,
                 item={**item, "status": "in_progress", "content": []})
            emit("response.content_part.added", **at, content_index=0, part=part)
            emit("response.output_text.delta", **at, content_index=0, delta=text, logprobs=[])
            emit("response.output_text.done", **at, content_index=0, text=text, logprobs=[])
            emit("response.content_part.done", **at, content_index=0, part={**part, "text": text})
        else:
            emit("response.output_item.added", output_index=i,
                 item={**item, "status": "in_progress", "arguments": ""})
            emit("response.function_call_arguments.delta", **at, delta=item["arguments"])
            emit("response.function_call_arguments.done", **at, arguments=item["arguments"])
        emit("response.output_item.done", output_index=i, item=item)
    emit("response.completed" if final["status"] == "completed" else "response.incomplete", response=final)
    return events
