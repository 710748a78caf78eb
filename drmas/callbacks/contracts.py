"""What the callbacks read from the trainer's module and from the data module, as Protocols.

drmas's ``MultiAgentRL`` and ``RolloutDataModule`` satisfy them. A module of one's own that offers
these members works with the callbacks; one that lacks a member is refused when the callback is
set up, naming the member and the callback (:func:`require`), instead of the callback reading a
default in its place."""

from __future__ import annotations

from typing import Any, Mapping, Protocol, runtime_checkable

import torch

from drmas.records import PreparedIteration

__all__ = ["AgentModule", "ExportedPolicy", "IteratedModule", "PolicyModule", "PreparedSource", "require"]


@runtime_checkable
class ExportedPolicy(Protocol):
    """One policy as :class:`~drmas.callbacks.HFCheckpoint` exports it."""

    model: torch.nn.Module
    tokenizer: Any
    """Saved beside the weights (None: none to save)."""
    adapter: str | None
    """Its LoRA adapter's name (None: the whole model is trained)."""
    trainable: bool
    """False: a frozen policy, never exported."""


@runtime_checkable
class IteratedModule(Protocol):
    """What :class:`~drmas.callbacks.IterationCheckpoint` reads from the LightningModule."""

    iteration: int
    """The RL iteration running now (0 before the first)."""


@runtime_checkable
class PolicyModule(Protocol):
    """What :class:`~drmas.callbacks.HFCheckpoint` reads from the LightningModule."""

    iteration: int
    policies: Mapping[str, ExportedPolicy]


@runtime_checkable
class AgentModule(Protocol):
    """What :class:`~drmas.callbacks.RolloutStats` reads from the LightningModule."""

    agent_map: dict[str, str]
    """Each agent's policy."""

    def log_scalars(self, metrics: dict[str, float], step: int | None = None) -> None:
        """Log at ``step`` (default: the current iteration)."""


@runtime_checkable
class PreparedSource(Protocol):
    """What :class:`~drmas.callbacks.RolloutStats` reads from the data module."""

    current: PreparedIteration | None
    """The iteration prepared for training (None before the first rollout)."""
    log_completions_every: int


def _members(protocol: type) -> list[str]:
    names = list(getattr(protocol, "__annotations__", {}))
    return names + [k for k, v in vars(protocol).items() if callable(v) and not k.startswith("_")]


def require(obj: Any, protocol: type, reader: str) -> None:
    """Refuse ``obj`` when it lacks a member of ``protocol``: a TypeError naming each missing member
    and ``reader``, the callback that reads it."""
    missing = [m for m in _members(protocol) if not hasattr(obj, m)]
    if missing:
        raise TypeError(f"{reader} reads {', '.join(missing)} from {type(obj).__name__}, which has none "
                        f"(drmas.callbacks.contracts.{protocol.__name__})")
