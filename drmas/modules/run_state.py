"""What the trainer keeps per run besides weights: the checkpoint's run state (iteration, history,
every rank's random state, the precision), random states and the per-iteration training scalars,
which exist once per rank and must be combined across ranks."""

from __future__ import annotations

import random
from typing import Any, Sequence

import numpy as np
import torch
from lightning.pytorch.utilities import rank_zero_info

from drmas.hardware import machine

__all__ = ["capture_rng", "epoch_scalars", "load_state", "record_gaps", "record_micro_batch",
           "restore_rank_rng", "restore_rng", "save_state", "seed_rng"]

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


def save_state(iteration: int, versions: dict[str, int], history: list, rngs: list, precision: str | None,
               schedules: dict[str, Any] | None = None) -> dict[str, Any]:
    """The run's state in a checkpoint (``rngs``: every rank's :func:`capture_rng`; ``versions`` and
    ``schedules``: every policy's weight version and learning-rate schedule, by name)."""
    return {"iteration": iteration, "versions": versions, "history": history, "rng": rngs,
            "precision": precision, "machine": machine(), "schedules": schedules or {}}


def load_state(checkpoint: dict[str, Any], world_size: int, precision: str | None) -> dict[str, Any]:
    """The run's state of a checkpoint, refused when it resumes in another precision; another rank
    count is said (the strategy's load reshards the weights and optimiser states)."""
    state = checkpoint.get("drmas")
    if state is None:
        raise ValueError("this checkpoint was not written by drmas.MultiAgentRL")
    ranks = len(state["rng"])
    if ranks != world_size:
        rank_zero_info(f"drmas: this checkpoint was written by {ranks} rank(s) and resumes on {world_size}: "
                       "the sharded weights and optimiser states are resharded, each rank draws from its own "
                       "seed (of its rank and the iteration), and the numbers differ from an "
                       "uninterrupted run from here on")
    saved = state.get("precision")
    if saved is not None and precision is not None and saved != precision:
        raise ValueError(
            f"this checkpoint was trained in precision {saved} (on "
            f"{state.get('machine', 'another machine')}) and this run would continue in {precision}: a run "
            "is resumed in the precision it started in, "
            f"so that its numbers continue as they would have; resume with --trainer.precision {saved}")
    return state


def restore_rank_rng(rngs: list, rank: int, world_size: int, seed: int) -> None:
    """This rank's saved random state, or with another rank count one seeded from ``seed`` (the
    iteration) and the rank (the rollouts draw from their own seeds, of ``--data.rollout.seed``)."""
    if len(rngs) == world_size:
        restore_rng(rngs[rank])
    else:
        seed_rng(seed + 1_000_003 * rank)


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
    whole batch; ``samples`` and ``tokens`` add up over ranks; the agreed keys come from the first
    rank that trained the policy (rank 0, or under per-policy pools its pool's first).
    """
    merged: dict[str, dict[str, list[tuple[float, float]]]] = {}
    for buckets in per_rank:
        for policy, bucket in buckets.items():
            first = policy not in merged
            into = merged.setdefault(policy, {})
            for key, values in bucket.items():
                if key in _AGREED and not first:
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


def record_gaps(gaps: dict[tuple[str, int], tuple[float, Any]], batch: Any, old: torch.Tensor) -> float:
    """Each sample's log-prob gap between the trainer (``old``, before the update) and the engine,
    into ``gaps`` by (policy, sample index) for its record (drmas.data.episodes): the mean absolute
    gap per response token, and every response token's ``trainer - engine`` as float16 (2 bytes a
    token, gathered from every rank); returns the largest token's gap."""
    diff = (old - batch.engine_logprobs) * batch.response_mask
    mask = batch.response_mask.bool()
    per_row = (diff.abs().sum(1) / batch.response_mask.sum(1).clamp(min=1)).tolist()
    for row, (i, gap) in enumerate(zip(batch.sample_index.tolist(), per_row)):
        gaps[(batch.policy, i)] = (gap, diff[row][mask[row]].to(torch.float16).cpu().numpy())
    return float(diff.abs().max())


def record_micro_batch(bucket: dict[str, list[tuple[float, float]]], gaps: dict, batch: Any, chunked: bool,
                       loss: torch.Tensor, metrics: dict[str, Any], old: torch.Tensor,
                       importance_weights: torch.Tensor | None, cap: float | None) -> None:
    """A trained micro-batch's ``(value, weight)`` pairs into its policy's ``bucket`` (the weight: its
    share of the batch, for :func:`epoch_scalars`): the loss terms, samples, tokens through the decoder
    (shared prefixes once where ``chunked`` packing ran), the engine-vs-trainer gap (first PPO epoch:
    the engine's weights are the trainer's; each sample's into ``gaps``) and the importance weights."""
    mask = batch.response_mask
    for k, v in metrics.items():
        bucket[k].append((float(v), batch.loss_scale))
    bucket["loss"].append((float(loss.detach()), batch.loss_scale))
    bucket["samples"].append((float(batch.input_ids.shape[0]), 0.0))
    ran = batch.packed.tokens if batch.packed is not None and chunked else batch.attention_mask.sum()
    bucket["tokens"].append((float(ran), 0.0))
    if batch.ppo_epoch == 0 and mask.any():
        bucket["engine_logprob_gap_max"].append((record_gaps(gaps, batch, old), 0.0))
    if importance_weights is not None and mask.any():
        bucket["importance_weight_mean"].append((float(importance_weights[mask].mean()), batch.loss_scale))
        truncated = (importance_weights[mask] >= cap).float()  # the tokens whose weight the cap bound
        bucket["importance_truncated_frac"].append((float(truncated.mean()), batch.loss_scale))

