"""Team / local reward mixing and the format penalty (AT-GRPO credit assignment).

The words, used alike everywhere: an agent's **role reward** is what its own action earned in
its role (a workflow's ``Action.role_reward``); its **local reward** is the role reward plus the
format term (``-format_penalty`` for an action that did not parse, else 0); the **reward** the
estimators use is ``alpha * team + local``.
"""

from __future__ import annotations

from typing import TypeVar

import torch
from torch import Tensor

__all__ = ["format_term", "mix_rewards", "sample_reward"]

R = TypeVar("R", float, Tensor)


def mix_rewards(team: R, local: R, alpha: float = 1.0) -> R:
    """``alpha * team + local``: every agent shares the team reward, scaled by ``alpha``, plus
    its own local reward. Works on floats and on tensors (broadcasting)."""
    return alpha * team + local


def format_term(valid: bool | Tensor, format_penalty: float = 0.1) -> float | Tensor:
    """The local reward's format term: 0 for a valid action, ``-format_penalty`` otherwise.

    ``format_penalty`` is a non-negative magnitude; ``valid`` may be a bool or a bool tensor.
    """
    if format_penalty < 0:
        raise ValueError(f"format_penalty is a magnitude and must be >= 0, got {format_penalty}")
    if isinstance(valid, Tensor):
        return torch.where(valid.bool(), 0.0, -float(format_penalty))
    return 0.0 if valid else -float(format_penalty)


def sample_reward(team: float, role: float, valid: bool, alpha: float = 1.0,
                  format_penalty: float = 0.1) -> tuple[float, float]:
    """``(local, reward)`` of one sample, the same for every workflow: the local reward is the
    agent's role reward plus the format term, and the reward the estimators use is
    ``alpha * team + local``."""
    local = role + format_term(valid, format_penalty)
    return local, mix_rewards(team, local, alpha)
