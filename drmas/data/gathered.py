"""What a rollout becomes once every rank played its share: gathered from every rank (failures
agreed), its broken rewards dropped, and summarised per agent."""

from __future__ import annotations

import logging
import math
from collections import defaultdict
from typing import Any

from drmas.ranks import portable, raise_first
from drmas.records import RolloutResult, Sample

__all__ = ["drop_nonfinite", "gather", "outcome_scalars"]

log = logging.getLogger(__name__)


def outcome_scalars(result: RolloutResult, prefix: str) -> dict[str, float]:
    """``<prefix>/success_rate`` and ``turns_mean`` over the episodes, and per agent
    ``<prefix>/<agent>/reward_mean`` (finite rewards) and ``valid_ratio``: what training rollouts
    and validation both log."""
    out: dict[str, float] = {}
    if result.episodes:
        out[f"{prefix}/success_rate"] = sum(e.success for e in result.episodes) / len(result.episodes)
        out[f"{prefix}/turns_mean"] = sum(e.turns for e in result.episodes) / len(result.episodes)
    per_agent: dict[str, list[Sample]] = defaultdict(list)
    for s in result.samples:
        per_agent[s.agent].append(s)
    for agent, samples in per_agent.items():
        rewards = [s.reward for s in samples if math.isfinite(s.reward)]
        out[f"{prefix}/{agent}/reward_mean"] = sum(rewards) / max(1, len(rewards))
        out[f"{prefix}/{agent}/valid_ratio"] = sum(s.valid for s in samples) / len(samples)
    return out


def drop_nonfinite(result: RolloutResult, iteration: int) -> tuple[RolloutResult, float]:
    """``result`` without the samples whose reward is NaN or infinite (a broken reward function
    would otherwise poison every advantage of their group), and how many were dropped."""
    kept = [s for s in result.samples if math.isfinite(s.reward)]
    dropped = len(result.samples) - len(kept)
    if dropped:
        agents = sorted({s.agent for s in result.samples if not math.isfinite(s.reward)})
        log.warning("iteration %d: %d sample(s) of %s with a NaN or infinite reward dropped (not trained on)",
                    iteration, dropped, ", ".join(agents))
        result = RolloutResult(kept, result.episodes)
    return result, float(dropped)


def gather(backend: Any, local: RolloutResult, failure: BaseException | None = None,
            stats: tuple[int, int] = (0, 0),
            background: bool = False) -> tuple[RolloutResult, tuple[int, int]]:
    """All ranks' samples and episodes in rank order, and their engines' cache counts summed, in
    one collective (``local`` and ``stats`` themselves with one rank); ``background``: on the
    background rollout's process group.

    A rank whose rollout stopped (``failure``: a SIGTERM, an engine or environment error) still
    joins the collective and hands over what stopped it; then every rank raises the lowest failed
    rank's exception (the same type everywhere, so a SIGTERM on one rank stops every rank as
    preempted, and two ranks failing differently still stop alike). A rank that raised before the
    gather would leave the others waiting in it until the process group's timeout.
    """
    if backend.world_size == 1:
        if failure is not None:
            raise failure
        return local, stats
    message = (local, stats, portable(failure, backend.rank))
    parts = (backend.gather_objects(message, background=True) if background
             else backend.gather_objects(message))
    failures = [err for _, _, err in parts]
    if any(err is not None for err in failures):
        first = next(r for r, err in enumerate(failures) if err is not None)
        log.error("rank %d stopped its rollout with %s: %s; every rank stops", first,
                  type(failures[first]).__name__, failures[first])
        raise_first(failures, backend.rank, failure)
    counts: dict[str, float] = defaultdict(float)
    for r, _, _ in parts:
        for key, value in r.counts.items():
            counts[key] += value
    return (RolloutResult([s for r, _, _ in parts for s in r.samples],
                          [e for r, _, _ in parts for e in r.episodes], dict(counts)),
            (sum(n for _, (n, _), _ in parts), sum(c for _, (_, c), _ in parts)))
