"""Packing one policy's samples into length-sorted training micro-batches, split over ranks."""

from __future__ import annotations

import math
from typing import Sequence

import torch
from torch import Tensor

from drmas.records import Experience, MicroBatch

__all__ = ["make_micro_batches", "shard_samples"]


def _pack(samples: Sequence[Experience], pad_id: int) -> tuple[Tensor, Tensor, Tensor, Tensor]:
    length = max(len(s.prompt_ids) + len(s.response_ids) for s in samples)
    b = len(samples)
    ids = torch.full((b, length), pad_id, dtype=torch.long)
    attn = torch.zeros((b, length), dtype=torch.long)
    resp = torch.zeros((b, length - 1), dtype=torch.bool)
    elp = torch.zeros((b, length - 1), dtype=torch.float32)
    for i, s in enumerate(samples):
        p, r = len(s.prompt_ids), len(s.response_ids)
        ids[i, : p + r] = torch.tensor(list(s.prompt_ids) + list(s.response_ids))
        attn[i, : p + r] = 1
        # logits at position t predict token t+1: response tokens p..p+r-1 come from p-1..p+r-2
        resp[i, p - 1 : p + r - 1] = True
        elp[i, p - 1 : p + r - 1] = torch.tensor(s.engine_logprobs[:r], dtype=torch.float32)
    return ids, attn, resp, elp


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
) -> list[MicroBatch]:
    """Split one policy's samples into length-sorted micro-batches with loss scales; with
    several ranks, this rank's share of them (:func:`shard_samples`).

    For ``token-mean`` each micro-batch's loss is weighted by its share of the response tokens
    of all ranks, for the sequence-mean modes by its share of sequences, so that gradient
    accumulation over the micro-batches gives exactly the loss of the whole batch. With several
    ranks the scale is multiplied by ``world_size`` because sharded training averages the ranks'
    gradients, and every rank gets the same number of micro-batches: a rank with fewer samples
    runs zero-weight padding micro-batches (``padding=True``) so its passes stay in step.
    """
    if micro_batch_size < 1:
        raise ValueError(f"micro_batch_size must be >= 1, got {micro_batch_size}")
    if not 0 <= rank < world_size:
        raise ValueError(f"rank must be in [0, {world_size}), got {rank}")
    real = [i for i, s in enumerate(samples) if not s.is_pad and s.response_ids]
    if not real:
        return []
    total_tokens = sum(len(samples[i].response_ids) for i in real)
    shares = [[real[j] for j in share] for share in shard_samples([samples[i] for i in real], world_size)]
    order = sorted(shares[rank], key=lambda i: (len(samples[i].prompt_ids) + len(samples[i].response_ids), i))
    out: list[MicroBatch] = []
    for start in range(0, len(order), micro_batch_size):
        idx = order[start : start + micro_batch_size]
        chunk = [samples[i] for i in idx]
        if agg == "token-mean":
            scale = sum(len(s.response_ids) for s in chunk) / total_tokens
        else:
            scale = len(chunk) / len(real)
        out.append(_micro_batch(chunk, idx, policy, pad_id, scale * world_size, ppo_epoch))
    passes = max(math.ceil(len(share) / micro_batch_size) for share in shares)
    while len(out) < passes:
        # index -1: never a real sample's slot among the kept old log-probs
        out.append(_micro_batch([samples[real[0]]], [-1], policy, pad_id, 0.0, ppo_epoch, padding=True))
    out[-1].step_after = True
    return out


def _micro_batch(chunk: list[Experience], idx: list[int], policy: str, pad_id: int, scale: float,
                 ppo_epoch: int, padding: bool = False) -> MicroBatch:
    ids, attn, resp, elp = _pack(chunk, pad_id)
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
