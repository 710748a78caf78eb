"""Per-policy pools: which trainer ranks hold each policy (``ranks`` of a policy's settings), and the
layouts refused before any model loads. Pure: no torch, no Lightning."""

from __future__ import annotations

from typing import Any, Mapping

__all__ = ["Pools", "engine_askers", "holdings", "pooled", "refuse", "resolve_pools"]

Pools = dict[str, tuple[int, ...]]
"""Policy -> the ranks that hold it, in rank order."""


def resolve_pools(configs: Mapping[str, Any], world_size: int) -> Pools:
    """Each policy's ranks: its ``ranks`` list; a count, laid out contiguously after the ranks the
    policies before it took (wrapping around the world); None, every rank. Refused in one line each:
    a rank outside the world, a policy without ranks (a frozen one too: its engines run there),
    policies sharing one LoRA base in different pools."""
    pools: Pools = {}
    cursor = 0
    for name, c in configs.items():
        ranks = c.ranks
        if ranks is None:
            pools[name] = tuple(range(world_size))
            continue
        if isinstance(ranks, int):
            if ranks > world_size:
                raise ValueError(f"policy {name!r}: ranks: {ranks} asks for more ranks than the world's "
                                 f"{world_size}")
            ranks = [(cursor + i) % world_size for i in range(ranks)]
            cursor = (cursor + len(ranks)) % world_size if world_size else 0
        outside = sorted({r for r in ranks if not 0 <= r < world_size})
        if outside:
            raise ValueError(f"policy {name!r}: ranks {list(c.ranks)} name rank(s) {outside} outside the "
                             f"world of {world_size} rank(s) (0-{world_size - 1})")
        if not ranks:  # a frozen policy too: its engines run on its ranks
            raise ValueError(f"policy {name!r} has no ranks: give it at least one (a frozen policy's "
                             "engines run on its ranks)")
        pools[name] = tuple(sorted(set(ranks)))
    shared = {name: pools[name] for name, c in configs.items() if c.share_base}
    if len(set(shared.values())) > 1:
        named = ", ".join(f"{n}: {list(r)}" for n, r in shared.items())
        raise ValueError(f"policies whose LoRA adapters share one base model must share one pool, got "
                         f"{named}")
    return pools


def refuse(pools: Pools, sharded: bool, tasks: int | None = None) -> None:
    """Refuse in one line (ValueError) per-policy pools under a strategy that does not shard, or a pool
    of more ranks than the ``tasks`` an iteration plays (some of its ranks would have nothing to
    train)."""
    layout = ", ".join(f"{n}: {list(r)}" for n, r in pools.items())
    if not sharded:
        raise ValueError(f"per-policy pools ({layout}) cannot run here: they shard each policy over its own "
                         "ranks: use --trainer.strategy fsdp")
    wide = [n for n, r in pools.items() if tasks is not None and len(r) > tasks]
    if wide:
        width = len(pools[wide[0]])
        raise ValueError(f"per-policy pools ({layout}): the pool of {wide[0]!r} has {width} ranks "
                         f"and an iteration plays {tasks} task(s): give it at most {tasks} ranks, or raise "
                         "--data.rollout.tasks_per_iteration")


def holdings(pools: Pools, world_size: int) -> dict[tuple[str, ...], tuple[int, ...]]:
    """Each set of policies some rank holds -> the ranks that hold exactly that set (a device's memory
    plan and its engines' share of the device are those of its set)."""
    out: dict[tuple[str, ...], tuple[int, ...]] = {}
    for rank in range(world_size):
        held = tuple(name for name, ranks in pools.items() if rank in ranks)
        out[held] = out.get(held, ()) + (rank,)
    return out


def engine_askers(pools: Pools, world_size: int) -> dict[str, int]:
    """Per policy, the most ranks whose calls one engine of its pool answers: each rank of the world
    asks the engine of its pool's ``(rank mod size)``-th rank, its own where it holds the policy."""
    out = {}
    for name, ranks in pools.items():
        asked = [r if r in ranks else ranks[r % len(ranks)] for r in range(world_size)]
        out[name] = max(asked.count(r) for r in ranks)
    return out


def pooled(pools: Pools, world_size: int) -> bool:
    """Whether any policy is held by fewer than every rank (else: today's shared layout)."""
    return any(len(r) != world_size for r in pools.values())
