"""Packing one policy's samples into training micro-batches (length-sorted, or grouped by shared
prompt prefixes), split over ranks."""

from __future__ import annotations

import math
from typing import Sequence

import torch

from drmas.packing import pack_shared_prefixes, pad_samples, prefix_order
from drmas.records import Experience, MicroBatch

__all__ = ["make_micro_batches", "shard_samples"]


def shard_samples(samples: Sequence[Experience], world_size: int) -> list[list[int]]:
    """Positions of ``samples`` per rank: counts differ by at most one, and token counts (prompt
    plus response, what a forward pass costs) are balanced greedily, longest sample first to the
    least loaded rank. Deterministic, so every rank computes the same split."""
    cost = [len(s.prompt_ids) + len(s.response_ids) for s in samples]
    cap = math.ceil(len(samples) / world_size) if samples else 0
    shares: list[list[int]] = [[] for _ in range(world_size)]
    load = [0] * world_size
    for i in sorted(range(len(samples)), key=lambda i: (-cost[i], i)):
        rank = min((r for r in range(world_size) if len(shares[r]) < cap), key=lambda r: (load[r], r))
        shares[rank].append(i)
        load[rank] += cost[i]
    return shares


def make_micro_batches(
    samples: Sequence[Experience],
    policy: str,
    micro_batch_size: int,
    pad_id: int,
    agg: str = "token-mean",
    ppo_epoch: int = 0,
    rank: int = 0,
    world_size: int = 1,
    prefix_sharing: bool = False,
    by_agent: bool = False,
) -> list[MicroBatch]:
    """Split one policy's samples into length-sorted micro-batches with loss scales; with
    several ranks, this rank's share of them (:func:`shard_samples`).

    For ``token-mean`` each micro-batch's loss is weighted by its share of the response tokens
    of all ranks, for the sequence-mean modes by its share of sequences, so that gradient
    accumulation over the micro-batches gives exactly the loss of the whole batch. With several
    ranks the scale is multiplied by ``world_size`` because sharded training averages the ranks'
    gradients, and every rank gets the same number of micro-batches: a rank with fewer samples
    runs zero-weight padding micro-batches (``padding=True``) so its passes stay in step.

    ``prefix_sharing``: samples are ordered by their tokens instead of their length, so that those
    sharing a prompt prefix fall into the same micro-batch, and each micro-batch carries them
    packed (:func:`~drmas.packing.pack_shared_prefixes`).

    ``by_agent``: micro-batches hold one agent's samples each (``MicroBatch.agent`` set), so the
    trainer can measure each agent's gradient contribution; the loss scales are unchanged.
    """
    if micro_batch_size < 1:
        raise ValueError(f"micro_batch_size must be >= 1, got {micro_batch_size}")
    if not 0 <= rank < world_size:
        raise ValueError(f"rank must be in [0, {world_size}), got {rank}")
    if by_agent and world_size > 1:
        raise ValueError("micro-batches split by agent (per-agent gradient norms) need one rank")
    real = [i for i, s in enumerate(samples) if not s.is_pad and s.response_ids]
    if not real:
        return []
    total_tokens = sum(len(samples[i].response_ids) for i in real)
    shares = [[real[j] for j in share] for share in shard_samples([samples[i] for i in real], world_size)]
    if prefix_sharing:
        order = prefix_order(samples, shares[rank])
    else:
        order = sorted(shares[rank], key=lambda i: (len(samples[i].prompt_ids) + len(samples[i].response_ids), i))
    groups = [order]
    if by_agent:
        agents = list(dict.fromkeys(samples[i].agent for i in order))
        groups = [[i for i in order if samples[i].agent == a] for a in agents]
    out: list[MicroBatch] = []
    for group in groups:
        for start in range(0, len(group), micro_batch_size):
            idx = group[start : start + micro_batch_size]
            chunk = [samples[i] for i in idx]
            if agg == "token-mean":
                scale = sum(len(s.response_ids) for s in chunk) / total_tokens
            else:
                scale = len(chunk) / len(real)
            out.append(_micro_batch(chunk, idx, policy, pad_id, scale * world_size, ppo_epoch))
            if by_agent:
                out[-1].agent = chunk[0].agent
            if prefix_sharing:
                out[-1].packed = pack_shared_prefixes(chunk, pad_id)
    passes = len(out) if world_size == 1 else max(math.ceil(len(share) / micro_batch_size) for share in shares)
    while len(out) < passes:
        # index -1: never a real sample's slot among the kept old log-probs
        out.append(_micro_batch([samples[real[0]]], [-1], policy, pad_id, 0.0, ppo_epoch, padding=True))
    out[-1].step_after = True
    return out


def _micro_batch(chunk: list[Experience], idx: list[int], policy: str, pad_id: int, scale: float,
                 ppo_epoch: int, padding: bool = False) -> MicroBatch:
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
        padding=padding,
    )
