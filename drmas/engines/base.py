"""The rollout-engine interface shared by the HF and vLLM engines."""

from __future__ import annotations

from abc import ABC, abstractmethod
from dataclasses import dataclass, field
from typing import Iterator, Sequence

import torch

__all__ = ["Engine", "EngineError", "Generation", "SamplingParams", "check_request", "full_state_items"]


class EngineError(RuntimeError):
    """An engine failed while generating; the message names the policy and the agent."""


@dataclass
class SamplingParams:
    """Sampling settings of one generate call."""

    temperature: float = 1.0
    """Softmax temperature; 0 means greedy."""
    top_p: float = 1.0
    """Nucleus sampling mass (1.0 = off)."""
    top_k: int = 0
    """Keep the k most likely tokens (0 = off)."""
    max_new_tokens: int = 128
    """Response length budget in tokens."""
    stop: list[str] = field(default_factory=list)
    """Stop strings; the response ends after the first one and includes it."""


@dataclass
class Generation:
    """One sampled response to one prompt."""

    token_ids: list[int]
    """Response tokens (EOS included when the model emitted it)."""
    logprobs: list[float]
    """Engine log-prob of each response token under the sampling distribution (after temperature)."""
    text: str
    """Decoded response, cut right after the first stop string."""
    finish_reason: str
    """``"stop"`` (EOS or a stop string) or ``"length"``."""


class Engine(ABC):
    """Generates from token-id prompts with the current weights of one policy."""

    prompt_tokens: int = 0
    """Prompt tokens of the requests served since :meth:`take_cache_stats` (one per request, not per sample)."""
    cached_tokens: int = 0
    """How many of them came from a prefix cache (engines without one leave both at 0)."""

    def take_cache_stats(self) -> tuple[int, int]:
        """``(prompt_tokens, cached_tokens)`` since the last call; resets both."""
        stats = (self.prompt_tokens, self.cached_tokens)
        self.prompt_tokens = self.cached_tokens = 0
        return stats

    @abstractmethod
    def generate(
        self, prompts: Sequence[Sequence[int]], n: int, params: SamplingParams
    ) -> list[list[Generation]]:
        """``n`` generations for each prompt, in prompt order."""

    @abstractmethod
    def sync_weights(self, model: torch.nn.Module) -> None:
        """Serve ``model``'s current weights from now on."""

    def sleep(self) -> None:
        """Free accelerator memory for training until the next ``sync_weights`` (default: no-op)."""

    @property
    def asleep(self) -> bool:
        """Whether :meth:`sleep` discarded the weights (the next ``sync_weights`` brings them back)."""
        return False

    def close(self) -> None:
        """Release engine resources (KV cache, worker threads)."""


def check_request(prompts: Sequence[Sequence[int]], n: int, params: SamplingParams) -> None:
    """Refuse requests every engine would mishandle, with the offending value in the message."""
    if n < 1:
        raise ValueError(f"n must be >= 1, got {n}")
    if params.max_new_tokens < 1:
        raise ValueError(f"max_new_tokens must be >= 1, got {params.max_new_tokens}")
    if params.temperature < 0:
        raise ValueError(f"temperature must be >= 0 (0 = greedy), got {params.temperature}")
    if not 0 < params.top_p <= 1:
        raise ValueError(f"top_p must be in (0, 1], got {params.top_p}")
    if params.top_k < 0:
        raise ValueError(f"top_k must be >= 0 (0 = off), got {params.top_k}")
    for i, p in enumerate(prompts):
        if len(p) == 0:
            raise ValueError(f"prompt {i} is empty; engines need at least one prompt token")


def full_state_items(model: torch.nn.Module, dtype: torch.dtype | None = None) -> Iterator[tuple[str, torch.Tensor]]:
    """``model``'s state-dict items one at a time, each a full tensor (cast to ``dtype``).

    A sharded (FSDP2) parameter is gathered from every rank when its turn comes and dropped once
    the consumer has copied it, so no rank holds a second full copy of the model. Gathering is a
    collective: every rank must consume the whole iterator, in the same order.
    """
    for name, tensor in model.state_dict().items():
        if hasattr(tensor, "full_tensor"):
            tensor = tensor.full_tensor()
        tensor = tensor.detach()
        yield name, tensor if dtype is None else tensor.to(dtype)
