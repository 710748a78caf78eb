"""A policy's settings, in the groups a reader looks for them: the model at the top, then how it
is optimised (``optim``), how its update runs (``update``), how it samples (``generation``), its
engine's own settings and its LoRA adapter. One dataclass per group, each value declared once;
LightningCLI makes them ``--model.policies.<name>.<group>.<key>`` and YAML."""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any

from drmas.models.lora import LoraSettings
from drmas.records import GenerationSettings
from drmas.tool_calls import FORMATS

__all__ = ["LR_SCHEDULES", "OptimSettings", "PolicyConfig", "PolicyGeneration", "UpdateSettings", "lr_factor"]

LR_SCHEDULES = ("constant", "linear", "cosine")


@dataclass
class OptimSettings:
    """AdamW and its learning-rate schedule, over the run's iterations."""

    lr: float = 1e-6
    """Peak learning rate."""
    betas: tuple[float, float] = (0.9, 0.999)
    """AdamW betas."""
    weight_decay: float = 0.0
    """AdamW weight decay."""
    grad_clip: float = 1.0
    """Clip the total grad norm to this value (0 = no clipping; the norm is still recorded)."""
    schedule: str = "constant"
    """``constant``, ``linear`` (decay to 0) or ``cosine`` (to 0), after the warm-up."""
    warmup_iterations: int = 0
    """Iterations of linear warm-up from 0 to ``lr``."""

    def __post_init__(self) -> None:
        if self.schedule not in LR_SCHEDULES:
            raise ValueError(f"optim.schedule must be one of {LR_SCHEDULES}, got {self.schedule!r}")
        if self.warmup_iterations < 0:
            raise ValueError(f"optim.warmup_iterations must be >= 0, got {self.warmup_iterations}")


@dataclass
class UpdateSettings:
    """How one update pass runs: its micro-batches, epochs and memory savers."""

    micro_batch_size: int = 4
    """Sequences per forward/backward pass; gradients accumulate to one step per PPO epoch."""
    ppo_epochs: int = 1
    """Optimiser steps per RL iteration, each over all of this policy's samples."""
    gradient_checkpointing: bool = False
    """Recompute activations in backward to save memory."""
    logprob_chunk_tokens: int = 1024
    """Response tokens per chunk of the vocabulary projection (0 = project every position at once,
    the memory-hungry way); see ``drmas.modules.logprobs``."""

    def __post_init__(self) -> None:
        if self.micro_batch_size < 1 or self.ppo_epochs < 1:
            raise ValueError("update.micro_batch_size and update.ppo_epochs must be >= 1")
        if self.logprob_chunk_tokens < 0:
            raise ValueError("update.logprob_chunk_tokens must be >= 0 (0 = no chunking), "
                             f"got {self.logprob_chunk_tokens}")


@dataclass
class PolicyGeneration:
    """How the policy samples in training rollouts and in validation and testing."""

    train: GenerationSettings = field(
        default_factory=lambda: GenerationSettings(temperature=1.0, max_new_tokens=64))
    """Training rollouts."""
    eval: GenerationSettings = field(
        default_factory=lambda: GenerationSettings(temperature=0.7, max_new_tokens=64))
    """Validation and testing."""


@dataclass
class PolicyConfig:
    """Settings of one policy (one model shared by the agents mapped to it): the model at the top
    level, then its groups."""

    model: str = "embedded:smollm2-135m-instruct"
    """Model name: ``embedded:<name>``, ``tiny-random``, a local directory or a hub id."""
    dtype: str = "float32"
    """Parameter dtype of the trained model (use ``--trainer.precision bf16-mixed`` for autocast)."""
    trainable: bool = True
    """False: a frozen policy. It serves its agents and never changes: no optimiser, no KL
    reference, no HF export; its agents' samples are logged and count in their advantage groups,
    but are not trained on."""
    chat_template_kwargs: dict[str, Any] = field(default_factory=dict)
    """Extra chat-template variables, e.g. ``{enable_thinking: false}`` for Qwen3."""
    tool_format: str = "auto"
    """How tools offered through the agents endpoint are shown and calls read back: ``auto`` (the
    chat template's own where it renders tools, else ``hermes`` as text), ``hermes``,
    ``llama3_json``, ``mistral`` (``drmas.tool_calls``)."""
    optim: OptimSettings = field(default_factory=OptimSettings)
    """The optimiser and its schedule."""
    update: UpdateSettings = field(default_factory=UpdateSettings)
    """Micro-batches, epochs and memory savers of the update."""
    generation: PolicyGeneration = field(default_factory=PolicyGeneration)
    """Sampling in training (``train``) and in validation and testing (``eval``)."""
    engine_settings: dict[str, Any] = field(default_factory=dict)
    """This policy's own engine settings over ``--model.engine_settings`` (any key of the
    engine's settings, e.g. ``{gpu_memory_utilization: 0.25}``)."""
    lora: LoraSettings | None = None
    """Train a LoRA adapter instead of every weight (None = full fine-tuning)."""
    ranks: list[int] | int | None = None
    """The trainer ranks that hold this policy, its pool (docs/scaling.md, "Per-policy pools"): a list
    of ranks, or a count laid out after the previous policies' pools; None: every rank (one shared
    pool, the default). Its model, optimiser and update exist only on those ranks."""

    def __post_init__(self) -> None:
        if self.tool_format != "auto" and self.tool_format not in FORMATS:
            raise ValueError(f"tool_format must be auto or one of {sorted(FORMATS)}, "
                             f"got {self.tool_format!r}")
        if not self.trainable and self.lora is not None:
            raise ValueError("a frozen policy (trainable: false) has no lora section: an adapter that is "
                             "never trained changes nothing")

    @property
    def share_base(self) -> bool:
        """Whether this policy's adapter shares its base model (``lora.share_base``)."""
        return self.lora is not None and self.lora.share_base


def lr_factor(c: OptimSettings, iteration: int, total: int) -> float:
    """Multiplier of ``lr`` at a 0-based iteration."""
    if iteration < c.warmup_iterations:
        return (iteration + 1) / (c.warmup_iterations + 1)
    if c.schedule == "constant" or total <= c.warmup_iterations:
        return 1.0
    progress = min(1.0, (iteration - c.warmup_iterations) / max(1, total - c.warmup_iterations))
    if c.schedule == "linear":
        return 1.0 - progress
    return 0.5 * (1.0 + math.cos(math.pi * progress))
