"""What the trainer needs to generate with its policies: the chat prompt's token ids, and the
engine call that names the policy and the agent when it fails."""

from __future__ import annotations

from typing import Any

from drmas.engines import EngineError
from drmas.records import ChatPrompt

__all__ = ["encode_prompt", "run_engine"]


def encode_prompt(tokenizer, prompt: ChatPrompt, template_kwargs: dict[str, Any] | None = None) -> list[int]:
    """Token ids of the chat prompt with the generation header and the assistant prefill."""
    messages = [{"role": r, "content": c} for r, c in prompt.messages]
    text = tokenizer.apply_chat_template(
        messages, tokenize=False, add_generation_prompt=True, **(template_kwargs or {})
    ) + prompt.prefill
    return tokenizer(text, add_special_tokens=False)["input_ids"]


def run_engine(engine: Any, kind: str, policy: str, agent: str, ids: list[list[int]], n: int, params: Any,
               stops: Any = None, lengths: Any = None) -> Any:
    """``engine.generate(ids, n, params, stops, lengths)``; any failure re-raised as
    :class:`EngineError` naming the policy and the agent, so a lost device or a bad request says
    whose rollout it ended."""
    try:
        return engine.generate(ids, n, params, stops, lengths)
    except Exception as err:
        raise EngineError(f"the {kind} engine of policy {policy!r} failed generating for agent {agent!r} "
                          f"({len(ids)} prompts x {n}): {type(err).__name__}: {err}") from err
