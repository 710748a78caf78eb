"""Team / local reward mixing and the invalid-action penalty (AT-GRPO credit assignment)."""

from __future__ import annotations

from typing import TypeVar

import torch
from torch import Tensor

__all__ = ["invalid_action_penalty", "mix_rewards", "sample_reward"]

R = TypeVar("R", float, Tensor)


def mix_rewards(team: R, local: R, alpha: float = 1.0) -> R:
    """``alpha * team + local``: every agent shares the team reward, scaled by ``alpha``,
    plus its own role (local) reward. Works on floats and on tensors (broadcasting)."""
    return alpha * team + local


def invalid_action_penalty(valid: bool | Tensor, penalty: float = 0.1) -> float | Tensor:
    """Local reward term for format validity: 0 for a valid action, ``-penalty`` otherwise.

    ``penalty`` is a non-negative magnitude; ``valid`` may be a bool or a bool tensor.
    """
    if penalty < 0:
        raise ValueError(f"penalty is a magnitude and must be >= 0, got {penalty}")
    if isinstance(valid, Tensor):
        return torch.where(valid.bool(), 0.0, -float(penalty))
    return 0.0 if valid else -float(penalty)


def sample_reward(team: float, role: float, valid: bool, alpha: float = 1.0,
                  format_penalty: float = 0.1) -> tuple[float, float]:
    """``(local, reward)`` of one sample, the same for every domain: the local reward is the
    agent's own (role) reward plus the invalid-action penalty, and the reward the estimators use
    is ``alpha * team + local``."""
    local = role + invalid_action_penalty(valid, format_penalty)
    return local, mix_rewards(team, local, alpha)
