"""What the trainer needs to generate with its policies: vLLM engine settings, the check that
several engines fit one GPU, and the chat prompt's token ids."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from drmas.records import ChatPrompt

__all__ = ["VLLMConfig", "check_gpu_fractions", "encode_prompt"]


@dataclass
class VLLMConfig:
    """Settings of the vLLM engines (one per policy)."""

    dtype: str = "bfloat16"
    """Engine dtype; the truncated importance weights correct its mismatch with the trainer."""
    max_model_len: int = 4096
    """Longest prompt + response the engine accepts."""
    gpu_memory_utilization: float = 0.5
    """GPU memory fraction per engine (split it between the engines of several policies)."""
    kv_cache_gib: float = 2.0
    """KV-cache size on CPU, in GiB."""


def check_gpu_fractions(fractions: dict[str, float]) -> None:
    """Refuse vLLM engines (one per policy, on the same GPU) whose memory fractions add up to more
    than the whole GPU; the message names each engine's share."""
    total = sum(fractions.values())
    if total > 1.0 + 1e-9:
        shares = ", ".join(f"{name} {frac:g}" for name, frac in fractions.items())
        raise ValueError(f"the vLLM engines of the policies share one GPU but ask for {total:g} of it ({shares}): "
                         f"set --model.vllm.gpu_memory_utilization to at most {1.0 / len(fractions):.2f}")


def encode_prompt(tokenizer, prompt: ChatPrompt, template_kwargs: dict[str, Any] | None = None) -> list[int]:
    """Token ids of the chat prompt with the generation header and the assistant prefill."""
    messages = [{"role": r, "content": c} for r, c in prompt.messages]
    text = tokenizer.apply_chat_template(
        messages, tokenize=False, add_generation_prompt=True, **(template_kwargs or {})
    ) + prompt.prefill
    return tokenizer(text, add_special_tokens=False)["input_ids"]
