"""What the trainer keeps per run besides weights: random states and the per-iteration training
scalars, both of which exist once per rank and must be combined across ranks."""

from __future__ import annotations

import random
from typing import Any, Sequence

import numpy as np
import torch

__all__ = ["capture_rng", "epoch_scalars", "restore_rng", "seed_rng"]

# Metrics every rank records identically (the global grad norm, the rank-agreed skip): rank 0's
# list is the value, the others would only repeat it.
_AGREED = ("grad_norm", "skipped_steps")


def capture_rng() -> dict[str, Any]:
    """This process's random states, as values ``torch.load(weights_only=True)`` reads back."""
    return {"torch": torch.get_rng_state(), "python": random.getstate(),
            "numpy": [v.tolist() if isinstance(v, np.ndarray) else v for v in np.random.get_state()],
            "cuda": torch.cuda.get_rng_state_all() if torch.cuda.is_available() else []}


def restore_rng(state: dict[str, Any]) -> None:
    torch.set_rng_state(state["torch"])
    random.setstate(state["python"])
    name, keys, *rest = state["numpy"]
    np.random.set_state((name, np.asarray(keys, dtype=np.uint32), *rest))
    cuda = state.get("cuda") or []
    if cuda and torch.cuda.is_available() and len(cuda) == torch.cuda.device_count():
        torch.cuda.set_rng_state_all(cuda)


def seed_rng(seed: int) -> None:
    """Seed this process's random states (torch, CUDA, Python, NumPy) from ``seed``."""
    torch.manual_seed(seed)
    random.seed(seed)
    np.random.seed(seed % 2**32)


def epoch_scalars(per_rank: Sequence[dict[str, dict[str, list[tuple[float, float]]]]],
                  ppo_epochs: dict[str, int]) -> dict[str, float]:
    """``train/<policy>/<key>`` scalars of one iteration from every rank's recorded values.

    Each rank records ``(value, weight)`` pairs per policy and key, the weight being the
    micro-batch's share of the whole batch: the weighted mean over all ranks is the value of the
    whole batch; ``samples`` and ``tokens`` add up over ranks; the agreed keys come from rank 0.
    """
    merged: dict[str, dict[str, list[tuple[float, float]]]] = {}
    for rank, buckets in enumerate(per_rank):
        for policy, bucket in buckets.items():
            into = merged.setdefault(policy, {})
            for key, values in bucket.items():
                if key in _AGREED and rank > 0:
                    continue
                into.setdefault(key, []).extend(values)
    scalars: dict[str, float] = {}
    for name, bucket in merged.items():
        for key, values in bucket.items():
            if key == "skipped_steps":
                scalars[f"train/{name}/skipped_steps"] = float(len(values))
            elif key in ("samples", "tokens"):  # sequences, and tokens through the decoder, per PPO epoch
                scalars[f"train/{name}/{key}"] = sum(v for v, _ in values) / ppo_epochs[name]
            elif key == "engine_logprob_gap_max":  # the largest over every micro-batch of every rank
                scalars[f"train/{name}/{key}"] = max(v for v, _ in values)
            elif key == "grad_norm":
                scalars[f"train/{name}/grad_norm"] = values[-1][0]
                scalars[f"train/{name}/grad_norm_max"] = max(v for v, _ in values)
            else:
                scalars[f"train/{name}/{key}"] = (sum(v * w for v, w in values)
                                                  / max(sum(w for _, w in values), 1e-12))
    return scalars
