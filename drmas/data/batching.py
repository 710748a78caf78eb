"""Packing one policy's samples into training micro-batches (length-sorted, or grouped by shared
prompt prefixes), split over ranks."""

from __future__ import annotations

import math
from typing import Sequence

import torch

from drmas.algorithms.losses import AGGREGATIONS
from drmas.packing import group_by_prefix, pack_shared_prefixes, pad_samples, prefix_order
from drmas.records import BatchSpec, MicroBatch, Sample

__all__ = ["make_micro_batches", "policy_micro_batches", "shard_prefix_groups", "shard_samples"]


def shard_samples(samples: Sequence[Sample], world_size: int, prefix_sharing: bool = False,
                  micro_batch_size: int = 1) -> list[list[int]]:
    """Positions of ``samples`` per rank. Deterministic, so every rank computes the same split.

    Without prefix sharing: counts differ by at most one, and token counts (prompt plus
    response, what a forward pass costs) are balanced greedily, longest sample first to the least
    loaded rank. With it: :func:`shard_prefix_groups` (which needs the micro-batch size).
    """
    if prefix_sharing:
        return shard_prefix_groups(samples, world_size, micro_batch_size)
    cost = [len(s.prompt_ids) + len(s.response_ids) for s in samples]
    cap = math.ceil(len(samples) / world_size) if samples else 0
    shares: list[list[int]] = [[] for _ in range(world_size)]
    load = [0] * world_size
    for i in sorted(range(len(samples)), key=lambda i: (-cost[i], i)):
        rank = min((r for r in range(world_size) if len(shares[r]) < cap), key=lambda r: (load[r], r))
        shares[rank].append(i)
        load[rank] += cost[i]
    return shares


def shard_prefix_groups(samples: Sequence[Sample], world_size: int, micro_batch_size: int) -> list[list[int]]:
    """Positions of ``samples`` per rank, keeping samples that share a prompt prefix together
    (a task's tree candidates, its parallel trajectories' turns) and balancing the tokens that run
    once the ranks' micro-batches are packed.

    The samples, in prefix order (:func:`~drmas.packing.prefix_order`), are cut into
    ``world_size`` consecutive runs, each packed into micro-batches exactly as
    :func:`make_micro_batches` will pack it; each cut goes where the busier of the run before it
    and the average of the ranks after it runs the fewest tokens. A cut thus falls where it
    duplicates the least prefix for the balance it buys. Dealing samples one by one instead
    would scatter every group over the ranks and lose most of the sharing.
    """
    order = prefix_order(samples, range(len(samples)))
    if world_size == 1:
        return [order]
    n, m = len(order), micro_batch_size
    ordered = [samples[i] for i in order]
    chunk = lambda a, b: _packed_tokens(ordered[a:b])  # noqa: E731  (one micro-batch's tokens)
    full = [chunk(i, i + m) if i + m <= n else 0 for i in range(n)]
    after = [0] * (n + 1)  # after[k]: tokens of the run from k to the end, in micro-batches from k
    for k in range(n - 1, -1, -1):
        after[k] = full[k] + after[k + m] if k + m <= n else chunk(k, n)
    cuts = [0]
    for r in range(1, world_size):
        a, whole, best = cuts[-1], 0, None
        for k in range(a, n + 1):  # the run [a, k): whole micro-batches, then what is left of one
            if k - a >= m and (k - a) % m == 0:
                whole += full[k - m]
            start = a + (k - a) // m * m
            mine = whole + (chunk(start, k) if k > start else 0)
            key = (max(mine, after[k] / (world_size - r)), mine + after[k], k)
            best = key if best is None or key < best else best
        cuts.append(best[2])
    cuts.append(n)
    return [order[a:b] for a, b in zip(cuts, cuts[1:])]


def _packed_tokens(chunk: Sequence[Sample]) -> int:
    """Tokens one micro-batch of these samples runs with shared prefixes packed."""
    return sum(length + sum(len(chunk[i].prompt_ids) + len(chunk[i].response_ids) - length for i in members)
               for length, members in group_by_prefix(chunk))


def make_micro_batches(
    samples: Sequence[Sample],
    policy: str,
    spec: BatchSpec,
    ppo_epoch: int = 0,
    rank: int = 0,
    world_size: int = 1,
) -> list[MicroBatch]:
    """Split one policy's samples into length-sorted micro-batches with loss scales; with
    several ranks, this rank's share of them (:func:`shard_samples`).

    For ``token-mean`` each micro-batch's loss is weighted by its share of the response tokens
    of all ranks, for the sequence-mean modes by its share of sequences, so that gradient
    accumulation over the micro-batches gives exactly the loss of the whole batch. With several
    ranks the scale is multiplied by ``world_size`` because sharded training averages the ranks'
    gradients, and every rank gets the same number of micro-batches: a rank with fewer samples
    runs zero-weight stand-in micro-batches (``stand_in=True``) so its passes stay in step.

    ``spec`` says how the policy packs (:class:`~drmas.records.BatchSpec`: pad id, micro-batch
    size, aggregation, and the three below; its ``ppo_epochs`` and ``trainable`` are the caller's).

    ``prefix_sharing``: samples are ordered by their tokens instead of their length, so that those
    sharing a prompt prefix fall into the same micro-batch, and each micro-batch carries them
    packed (:func:`~drmas.packing.pack_shared_prefixes`).

    ``attention_window``: a micro-batch is packed only when each sample's prompt plus response
    fits in it (a model attending within a sliding window; otherwise it runs whole samples).

    ``by_agent``: micro-batches hold one agent's samples each (``MicroBatch.agent`` set), so the
    trainer can measure each agent's gradient contribution; the loss scales are unchanged.
    """
    micro_batch_size, pad_id = spec.micro_batch_size, spec.pad_id
    by_tokens = AGGREGATIONS.get(spec.agg).weight == "tokens"
    prefix_sharing, by_agent, attention_window = spec.prefix_sharing, spec.by_agent, spec.attention_window
    if micro_batch_size < 1:
        raise ValueError(f"micro_batch_size must be >= 1, got {micro_batch_size}")
    if not 0 <= rank < world_size:
        raise ValueError(f"rank must be in [0, {world_size}), got {rank}")
    if by_agent and world_size > 1:
        raise ValueError("micro-batches split by agent (per-agent gradient norms) need one rank")
    real, shares = _shares(samples, spec, world_size)
    if not real:
        return []
    total_tokens = sum(len(samples[i].response_ids) for i in real)
    if prefix_sharing:
        order = prefix_order(samples, shares[rank])
    else:
        order = sorted(shares[rank],
                       key=lambda i: (len(samples[i].prompt_ids) + len(samples[i].response_ids), i))
    groups = [order]
    if by_agent:
        agents = list(dict.fromkeys(samples[i].agent for i in order))
        groups = [[i for i in order if samples[i].agent == a] for a in agents]
    out: list[MicroBatch] = []
    for group in groups:
        for start in range(0, len(group), micro_batch_size):
            idx = group[start : start + micro_batch_size]
            chunk = [samples[i] for i in idx]
            if by_tokens:  # the aggregation's own rule: a share of the tokens, or of the samples
                scale = sum(len(s.response_ids) for s in chunk) / total_tokens
            else:
                scale = len(chunk) / len(real)
            out.append(_micro_batch(chunk, idx, policy, pad_id, scale * world_size, ppo_epoch))
            if by_agent:
                out[-1].agent = chunk[0].agent
            if prefix_sharing and (attention_window is None or all(
                    len(s.prompt_ids) + len(s.response_ids) <= attention_window for s in chunk)):
                out[-1].packed = pack_shared_prefixes(chunk, pad_id)
    passes = (len(out) if world_size == 1
              else max(math.ceil(len(share) / micro_batch_size) for share in shares))
    while len(out) < passes:
        # index -1: never a real sample's slot among the kept old log-probs
        out.append(_micro_batch([samples[real[0]]], [-1], policy, pad_id, 0.0, ppo_epoch, stand_in=True))
    out[-1].step_after = True
    return out


def _shares(samples: Sequence[Sample], spec: BatchSpec, world_size: int) -> tuple[list[int], list[list[int]]]:
    """The samples with a response, and their positions per rank (:func:`shard_samples`)."""
    real = [i for i, s in enumerate(samples) if s.response_ids]
    shares = [[real[j] for j in share]
              for share in shard_samples([samples[i] for i in real], world_size, spec.prefix_sharing,
                                         spec.micro_batch_size)] if real else []
    return real, shares


def _passes(samples: Sequence[Sample], spec: BatchSpec, world_size: int) -> int:
    """How many micro-batches :func:`make_micro_batches` gives each of ``world_size`` ranks (without
    making them)."""
    _, shares = _shares(samples, spec, world_size)
    return max((math.ceil(len(share) / spec.micro_batch_size) for share in shares), default=0)


def policy_micro_batches(samples: Sequence[Sample], specs: dict[str, BatchSpec], rank: int,
                         world_size: int) -> list[MicroBatch]:
    """This rank's micro-batches of each policy in ``specs`` that it trains (every policy, or under
    per-policy pools those whose ``ranks`` hold it), PPO epoch by PPO epoch: a policy's samples are
    shared among its own ranks, whose sharding averages their gradients, so the loss scales are
    those of the whole batch whatever the layout."""
    per_policy: dict[str, list[Sample]] = {}
    for s in samples:
        per_policy.setdefault(s.policy, []).append(s)
    pools = {name: list(spec.ranks) if spec.ranks is not None else list(range(world_size))
             for name, spec in specs.items()}
    batches: list[MicroBatch] = []
    for ppo_epoch in range(max((spec.ppo_epochs for spec in specs.values()), default=0)):
        for name, spec in specs.items():
            pool = pools[name]
            if ppo_epoch < spec.ppo_epochs and per_policy.get(name) and rank in pool:
                batches += make_micro_batches(per_policy[name], name, spec, ppo_epoch, pool.index(rank),
                                              len(pool))
    if any(len(pool) != world_size for pool in pools.values()):
        # every rank runs as many passes as the busiest: pools train apart, but Lightning's loop
        # meets every rank before each micro-batch
        passes = [0] * world_size
        for name, spec in specs.items():
            if per_policy.get(name):
                count = _passes(per_policy[name], spec, len(pools[name])) * spec.ppo_epochs
                for r in pools[name]:
                    passes[r] += count
        batches += [_idle() for _ in range(max(passes) - len(batches))]
    return batches


def _idle() -> MicroBatch:
    empty = torch.zeros((0, 0), dtype=torch.long)
    return MicroBatch(policy="", input_ids=empty, attention_mask=empty, response_mask=empty.bool(),
                      engine_logprobs=empty.float(), advantages=torch.zeros(0), sample_index=torch.zeros(0),
                      loss_scale=0.0, idle=True)


def _micro_batch(chunk: list[Sample], idx: list[int], policy: str, pad_id: int, scale: float,
                 ppo_epoch: int, stand_in: bool = False) -> MicroBatch:
    ids, attn, resp, elp = pad_samples(chunk, pad_id)
    return MicroBatch(
        policy=policy,
        input_ids=ids,
        attention_mask=attn,
        response_mask=resp,
        engine_logprobs=elp,
        advantages=torch.tensor([s.advantage for s in chunk], dtype=torch.float32),
        sample_index=torch.tensor(idx, dtype=torch.long),
        loss_scale=scale,
        ppo_epoch=ppo_epoch,
        stand_in=stand_in,
    )
