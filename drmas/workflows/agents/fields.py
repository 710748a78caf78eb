"""The request fields beyond messages and tools: which are served, applied, ignored (and counted)
or refused by name, and structured output shown to the policy. Pure functions."""

from __future__ import annotations

import json
from typing import Any

from drmas.workflows.agents.errors import ApiError

__all__ = ["IGNORED", "NO_EFFECT", "PENALTIES", "SERVED", "check_fields", "format_note",
           "template_kwargs", "with_note"]

PENALTIES = ("frequency_penalty", "presence_penalty", "repetition_penalty")
SAMPLING = ("temperature", "top_p", "top_k", "min_p")
SERVED = {"model", "messages", "max_tokens", "max_completion_tokens", "stop", "n", "seed", "logit_bias",
          "stream", "stream_options", "tools", "tool_choice", "response_format", "logprobs", "top_logprobs",
          "store", "chat_template_kwargs", *SAMPLING, *PENALTIES}
NO_EFFECT = {"user", "metadata", "service_tier", "parallel_tool_calls", "prompt_cache_key",
             "safety_identifier"}
"""Fields that change nothing an endpoint answers (an end-user id, tags, a billing tier, a cache
key; ``parallel_tool_calls`` is not enforced, see docs/agents.md)."""
IGNORED = {"reasoning_effort", "verbosity", "return_token_ids", "include_stop_str_in_output",
           "skip_special_tokens", "spaces_between_special_tokens", "ignore_eos", "min_tokens"}
"""Fields vLLM-targeted programs send that would change the sampled tokens or the answer's shape in
ways the trainer does not follow: answered as if absent, and counted (``endpoint/ignored_fields``)."""


def check_fields(body: dict[str, Any]) -> list[str]:
    """Refuse, by name, every field that is neither served nor known; returns the ignored ones."""
    unknown = sorted(k for k in body if k not in SERVED and k not in NO_EFFECT and k not in IGNORED)
    if unknown:
        raise ApiError(400, f"unknown or unsupported parameter {unknown[0]!r} (the drmas endpoint serves "
                       "the fields listed in docs/agents.md)", "unsupported_parameter", unknown[0])
    if body.get("top_logprobs"):
        raise ApiError(400, "top_logprobs > 0 is not served: the engines return the sampled token's "
                       "log-prob only", "unsupported_parameter", "top_logprobs")
    if body.get("store"):
        raise ApiError(400, "store: true is not served: the drmas endpoint keeps no completions for "
                       "later retrieval", "unsupported_parameter", "store")
    return sorted(k for k in body if k in IGNORED and body[k] is not None)


def template_kwargs(raw: Any) -> str:
    """``chat_template_kwargs`` (e.g. Qwen3's ``enable_thinking``) as JSON text for the prompt, applied
    through the policy's template over its own; "" for none."""
    if raw is None:
        return ""
    if not isinstance(raw, dict) or any(k in ("tools", "messages", "add_generation_prompt") for k in raw):
        raise ApiError(400, "chat_template_kwargs must be an object of the template's own variables (not "
                       "tools, messages or add_generation_prompt)", "invalid_value", "chat_template_kwargs")
    return json.dumps(raw, sort_keys=True, ensure_ascii=False) if raw else ""


def format_note(fmt: Any) -> str | None:
    """What the policy is told for a ``response_format`` (None for plain text).

    Structured output is shown to the policy, never forced: the schema goes into the prompt and
    the reply is sampled as usual, so its tokens and log-probs are the policy's own and the trainer's
    importance ratio stays exact; a reply that does not parse is the program's outcome (it raises,
    and its episode is trained with ``failure_reward``), which teaches compliance. Guided decoding
    would mask the logits: the sampled tokens' log-probs would then not be the policy's."""
    if fmt is None:
        return None
    kind = fmt.get("type") if isinstance(fmt, dict) else None
    if kind == "text":
        return None
    if kind == "json_object":
        return "Answer with one JSON object and nothing else."
    if kind == "json_schema":
        spec = fmt.get("json_schema")
        schema = spec.get("schema") if isinstance(spec, dict) else None
        named = isinstance(spec, dict) and isinstance(spec.get("name", ""), str)
        if not named or not isinstance(schema, dict):
            raise ApiError(400, "response_format json_schema must be {type: json_schema, json_schema: {name, "
                           "schema: {...}}}", "invalid_value", "response_format")
        return ("Answer with one JSON object and nothing else, matching this JSON Schema:\n"
                + json.dumps(schema, ensure_ascii=False))
    raise ApiError(400, f"response_format must be text, json_object or json_schema, got {kind or fmt!r}",
                   "invalid_value", "response_format")


def with_note(messages: tuple[tuple[str, str], ...], fields: tuple[str, ...],
              note: str) -> tuple[tuple[tuple[str, str], ...], tuple[str, ...]]:
    """The messages with ``note`` at the end of the first system message (one is added first)."""
    if messages and messages[0][0] == "system":
        return ((("system", f"{messages[0][1]}\n\n{note}"),) + messages[1:]), fields
    return (("system", note),) + messages, (("",) + fields if fields else ())
