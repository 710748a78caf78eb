"""Group-relative advantage estimators.

Every estimator turns a batch of samples (one LLM call each) into one advantage per sample.
They differ only in how samples are grouped and which score enters the group statistics;
the statistics themselves live in :func:`group_advantages`.

A sample is any object with the attributes ``reward``, ``task_uid``, ``traj_uid``, ``agent``
and ``turn`` (:class:`Scored`; ``drmas.records.Sample`` is one).
"""

from __future__ import annotations

import math
from collections import Counter
from collections.abc import Callable, Hashable, Sequence
from typing import Any, Protocol

import torch
from torch import Tensor

from drmas.registry import Registry

__all__ = [
    "ADVANTAGE_ESTIMATORS",
    "SAMPLINGS",
    "Scored",
    "baseline_inflation",
    "compute_advantages",
    "estimators_for",
    "group_advantages",
    "group_of",
    "register_estimator",
]

SAMPLINGS = ("parallel", "tree")
"""How a rollout samples: ``parallel`` (independent trajectories per task) or ``tree`` (K
candidates per node, one executed)."""

_SCALES = ("std", "none")


class Scored(Protocol):
    """What the estimators read of a sample."""

    reward: float
    task_uid: Hashable
    traj_uid: Hashable
    """The trajectory; in tree sampling the task's one executed trajectory, i.e. its tree."""
    agent: Hashable
    turn: int


def _group_ids(keys: Sequence[Hashable] | Tensor, n: int) -> Tensor:
    """Dense integer ids 0..G-1, one per sample; equal keys share an id."""
    if isinstance(keys, Tensor):
        if keys.dtype.is_floating_point or keys.dtype == torch.bool or keys.dim() != 1:
            raise TypeError("precomputed group ids must be a 1-D integer tensor")
        if keys.numel() != n:
            raise ValueError(f"got {n} scores but {keys.numel()} group ids")
        return torch.unique(keys, return_inverse=True)[1]
    if len(keys) != n:
        raise ValueError(f"got {n} scores but {len(keys)} keys")
    # The only per-sample Python work: hashing each key once.
    table: dict[Hashable, int] = {}
    return torch.tensor([table.setdefault(k, len(table)) for k in keys], dtype=torch.long)


def group_advantages(
    scores: Tensor,
    keys: Sequence[Hashable] | Tensor,
    scale: str = "std",
    eps: float = 1e-6,
) -> Tensor:
    """Group-relative advantages: ``A_i = (s_i - mean_g) / (std_g + eps)``.

    Args:
        scores: one score per sample, shape ``[N]``.
        keys: one hashable group key per sample, or a 1-D integer tensor of precomputed
            group ids (skips hashing; any integers, they need not be contiguous).
        scale: ``"std"`` divides by the unbiased group std plus ``eps``; ``"none"`` only
            subtracts the group mean (Dr. GRPO).
        eps: added to the std.

    Groups of one sample and groups whose scores are all equal get exactly 0.
    The result does not depend on the order of the samples; it has the dtype of ``scores``.
    """
    if scale not in _SCALES:
        raise ValueError(f"scale must be one of {_SCALES}, got {scale!r}")
    scores = torch.as_tensor(scores)
    if scores.dim() != 1:
        raise ValueError(f"scores must be 1-D, got shape {tuple(scores.shape)}")
    n = scores.numel()
    ids = _group_ids(keys, n)
    out_dtype = scores.dtype if scores.dtype.is_floating_point else torch.float32
    if n == 0:
        return torch.zeros(0, dtype=out_dtype)
    s = scores.detach().to(torch.float64).cpu()
    if not torch.isfinite(s).all():
        bad = torch.nonzero(~torch.isfinite(s)).flatten()[:5].tolist()
        raise ValueError(f"scores must be finite; non-finite at indices {bad}")

    num_groups = int(ids.max()) + 1
    count = torch.bincount(ids, minlength=num_groups).to(torch.float64)
    mean = torch.bincount(ids, weights=s, minlength=num_groups) / count
    dev = s - mean[ids]
    adv = dev
    if scale == "std":
        sq = torch.bincount(ids, weights=dev * dev, minlength=num_groups)
        std = (sq / (count - 1).clamp(min=1)).sqrt()
        adv = dev / (std[ids] + eps)
    # Exact zeros for singletons and constant groups: rounding in the mean would otherwise
    # leave residues of order 1e-17 / eps.
    hi = torch.full((num_groups,), -math.inf, dtype=torch.float64).scatter_reduce(0, ids, s, "amax")
    lo = torch.full((num_groups,), math.inf, dtype=torch.float64).scatter_reduce(0, ids, s, "amin")
    flat = (count < 2) | (hi == lo)
    adv = torch.where(flat[ids], torch.zeros_like(adv), adv)
    return adv.to(out_dtype)


# --------------------------------------------------------------------------------------------
# Estimators: fn(samples, scale, eps) -> Tensor[N] (float32), one advantage per sample.

Estimator = Callable[[Sequence[Any], str, float], Tensor]
ADVANTAGE_ESTIMATORS: Registry[Estimator] = Registry("advantage estimator")
"""Estimators by name (``--data.rollout.estimator NAME``); each has ``samplings``."""


def register_estimator(name: str, samplings: Sequence[str] = SAMPLINGS,
                       group: Callable[[Any], Hashable] | None = None) -> Callable[[Estimator], Estimator]:
    """Decorator adding an estimator ``fn(samples, scale, eps) -> Tensor[N]`` to the registry,
    for the ``samplings`` its groups make sense in (a workflow may narrow them further with
    ``Workflow.estimators``); the function returns one advantage per sample. ``group(sample)``:
    the key of the group a sample's advantage is relative to, which a run's episode records show
    (None: not said).
    """
    bad = set(samplings) - set(SAMPLINGS)
    if bad or not samplings:
        raise ValueError(f"estimator {name!r}: samplings must be some of {SAMPLINGS}, got {list(samplings)}")

    def deco(fn: Estimator) -> Estimator:
        if name in ADVANTAGE_ESTIMATORS:
            raise ValueError(f"advantage estimator {name!r} is already registered")
        fn.samplings = tuple(samplings)  # type: ignore[attr-defined]
        fn.group = group  # type: ignore[attr-defined]
        return ADVANTAGE_ESTIMATORS.register(name)(fn)

    return deco


def group_of(estimator: str, sample: Any) -> Hashable | None:
    """The key of ``sample``'s group under ``estimator`` (None where the estimator does not say)."""
    key = getattr(ADVANTAGE_ESTIMATORS.get(estimator), "group", None)
    return None if key is None else key(sample)


def estimators_for(sampling: str) -> tuple[str, ...]:
    """The registered estimators that accept ``sampling``, by name."""
    return tuple(n for n in ADVANTAGE_ESTIMATORS if sampling in ADVANTAGE_ESTIMATORS.get(n).samplings)


def _rewards(samples: Sequence[Any]) -> Tensor:
    return torch.tensor([float(s.reward) for s in samples], dtype=torch.float64)


def _per_trajectory(samples: Sequence[Any]) -> tuple[Tensor, Tensor, list[Hashable]]:
    """(trajectory index of each sample, mean reward per trajectory, task of each trajectory)."""
    table: dict[tuple[Hashable, Hashable], int] = {}
    tasks: list[Hashable] = []
    idx = []
    for s in samples:
        key = (s.task_uid, s.traj_uid)
        if key not in table:
            table[key] = len(table)
            tasks.append(s.task_uid)
        idx.append(table[key])
    traj = torch.tensor(idx, dtype=torch.long)
    count = torch.bincount(traj, minlength=len(tasks)).to(torch.float64)
    score = torch.bincount(traj, weights=_rewards(samples), minlength=len(tasks)) / count
    return traj, score, tasks


def _by_task(s: Any) -> Hashable:
    return s.task_uid


def _by_agent(s: Any) -> Hashable:
    return (s.task_uid, s.agent)


def _by_node(s: Any) -> Hashable:
    return (s.task_uid, s.traj_uid, s.agent, s.turn)


# Parallel trajectories never share an (env, agent, turn) node (at_grpo's groups); a tree has one
# executed trajectory per task, so no trajectory-level groups (grpo, rloo).
@register_estimator("grpo", samplings=("parallel",), group=_by_task)
def _grpo(samples: Sequence[Any], scale: str, eps: float) -> Tensor:
    """Global baseline: one score per trajectory (its mean reward), grouped by task."""
    traj, score, tasks = _per_trajectory(samples)
    return group_advantages(score, tasks, scale, eps)[traj]


@register_estimator("grpo_step", group=_by_task)
def _grpo_step(samples: Sequence[Any], scale: str, eps: float) -> Tensor:
    """Global baseline at step level: each sample's own reward, grouped by task."""
    return group_advantages(_rewards(samples), [_by_task(s) for s in samples], scale, eps)


@register_estimator("drmas", group=_by_agent)
def _drmas(samples: Sequence[Any], scale: str, eps: float) -> Tensor:
    """Dr. MAS agent-wise baseline: each sample's own reward, grouped by (task, agent)."""
    return group_advantages(_rewards(samples), [_by_agent(s) for s in samples], scale, eps)


@register_estimator("at_grpo", samplings=("tree",), group=_by_node)
def _at_grpo(samples: Sequence[Any], scale: str, eps: float) -> Tensor:
    """AT-GRPO: each sample's own reward, grouped by (tree, agent, turn): a tree is one task's
    executed trajectory, whose every step's candidates are recorded under its ``traj_uid``.

    The task is part of the key as well, so two tasks can never share a group even if a
    trajectory id were reused across them.
    """
    return group_advantages(_rewards(samples), [_by_node(s) for s in samples], scale, eps)


@register_estimator("rloo", samplings=("parallel",), group=_by_task)
def _rloo(samples: Sequence[Any], scale: str, eps: float) -> Tensor:
    """Leave-one-out: trajectory score minus the mean of the other trajectories of its task.

    ``scale`` and ``eps`` are ignored: RLOO does not divide by a std.
    """
    traj, score, tasks = _per_trajectory(samples)
    centred = group_advantages(score, tasks, "none")
    ids = _group_ids(tasks, len(tasks))
    n = torch.bincount(ids).to(torch.float64)[ids]
    # s - mean(others) = n/(n-1) * (s - mean(all)); singletons already have 0.
    return (centred.to(torch.float64) * n / (n - 1).clamp(min=1))[traj]


def compute_advantages(
    samples: Sequence[Any], estimator: str, scale: str = "std", eps: float = 1e-6
) -> Tensor:
    """One advantage per sample (float32, aligned with ``samples``) from a registered estimator."""
    fn = ADVANTAGE_ESTIMATORS.get(estimator)  # a KeyError listing the registered ones
    if scale not in _SCALES:
        raise ValueError(f"scale must be one of {_SCALES}, got {scale!r}")
    if not samples:
        return torch.zeros(0, dtype=torch.float32)
    adv = fn(samples, scale, eps)
    if adv.shape != (len(samples),):
        raise ValueError(f"estimator {estimator!r} returned shape {tuple(adv.shape)}, "
                         f"expected ({len(samples)},)")
    return adv.to(torch.float32)


def baseline_inflation(samples: Sequence[Any]) -> dict[Hashable, float]:
    """How much one baseline per task (``grpo_step``) inflates each agent's advantages: per task
    group, ``sqrt(std_k^2 + (mean_k - mean)^2) / std`` for agent ``k`` (its rewards' mean and std
    against the group's pooled ones, population moments), averaged over the groups where the
    agent acts and the pooled std is not 0. It is the root mean square of agent ``k``'s advantages
    under that baseline, which Dr. MAS's per-agent groups bring back to 1; within a group the
    agents' squares, weighted by their sample shares, average to exactly 1."""
    by_task: dict[Hashable, dict[Hashable, list[float]]] = {}
    for s in samples:
        by_task.setdefault(s.task_uid, {}).setdefault(s.agent, []).append(float(s.reward))
    factors: dict[Hashable, list[float]] = {}
    for agents in by_task.values():
        pooled = [r for rs in agents.values() for r in rs]
        mean = sum(pooled) / len(pooled)
        var = sum((r - mean) ** 2 for r in pooled) / len(pooled)
        if var <= 0:
            continue
        for agent, rs in agents.items():
            second = sum((r - mean) ** 2 for r in rs) / len(rs)  # = std_k^2 + (mean_k - mean)^2
            factors.setdefault(agent, []).append(math.sqrt(second / var))
    return {agent: sum(f) / len(f) for agent, f in factors.items()}


def singleton_prompts(samples: Sequence[Any]) -> dict[tuple[Hashable, int], float]:
    """Per ``(agent, turn)``: the share of samples whose prompt no other sample of the same task
    shares at that agent and turn, i.e. samples that grouping by (task, agent, turn, prompt) would
    leave alone in their group, with no baseline to compare against (AT-GRPO's argument against
    trajectory-level groups in multi-turn teams). With parallel sampling, one sample per trajectory
    and step: no other trajectory of the task reached that prompt; with tree sampling the K
    candidates of a step share it (0)."""
    counts = Counter((s.task_uid, s.agent, s.turn, tuple(s.prompt_ids)) for s in samples)
    total: Counter = Counter()
    alone: Counter = Counter()
    for s in samples:
        total[s.agent, s.turn] += 1
        alone[s.agent, s.turn] += counts[s.task_uid, s.agent, s.turn, tuple(s.prompt_ids)] == 1
    return {key: alone[key] / n for key, n in total.items()}
