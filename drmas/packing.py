"""Laying samples out as token tensors: one right-padded row per sample (:func:`pad_samples`),
or shared prompt prefixes packed so that each runs once (:func:`pack_shared_prefixes`).

Pure functions over the record types, used by the micro-batch builder and by the trainer's
check that a model takes packed rows.

Shared-prefix packing: samples whose prompts start alike run their common prefix once.

In a multi-agent rollout prompts overlap heavily: tree candidates share their whole prompt, the
parallel trajectories of a task share the first turn's prompt, an agent's samples share its
system prompt. Packing a group as ``[prefix][rest_1][rest_2]...`` with a block attention mask
(each rest sees the prefix and itself) and position ids continuing from the prefix gives every
token the same context, hence the same log-prob and gradient as running each sample alone, while
the prefix is computed once; its gradient accumulates from every continuation.
"""

from __future__ import annotations

from typing import Sequence

import torch
from torch import Tensor

from drmas.records import Sample, PackedRows

__all__ = ["MIN_SHARED_TOKENS", "group_by_prefix", "pack_shared_prefixes", "pad_samples", "prefix_order"]

MIN_SHARED_TOKENS = 16
"""Shorter common prefixes are not worth a group."""


def pad_samples(samples: Sequence[Sample], pad_id: int) -> tuple[Tensor, Tensor, Tensor, Tensor]:
    """Right-padded ``input_ids``, ``attention_mask``, ``response_mask`` and engine log-probs of
    ``samples``, one row each, as long as the longest (response positions: see MicroBatch)."""
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


def _common(a: Sequence[int], b: Sequence[int], limit: int) -> int:
    n = 0
    while n < limit and a[n] == b[n]:
        n += 1
    return n


def prefix_order(samples: Sequence[Sample], indices: Sequence[int]) -> list[int]:
    """``indices`` ordered by their samples' tokens, so that shared prefixes are adjacent."""
    return sorted(indices, key=lambda i: (list(samples[i].prompt_ids), list(samples[i].response_ids), i))


def group_by_prefix(samples: Sequence[Sample],
                    min_shared: int = MIN_SHARED_TOKENS) -> list[tuple[int, list[int]]]:
    """``(prefix length, positions)`` of consecutive samples sharing a prompt prefix.

    A sample joins the current group when their common prompt prefix is at least ``min_shared``
    tokens and the group saves no fewer tokens with it than without it (a short match would
    shrink the prefix of the whole group). The prefix never reaches into a response.
    """
    groups: list[tuple[int, list[int]]] = []
    for i, s in enumerate(samples):
        if groups:
            length, members = groups[-1]
            shared = _common(samples[members[0]].prompt_ids, s.prompt_ids, min(length, len(s.prompt_ids)))
            if shared >= min_shared and len(members) * shared >= (len(members) - 1) * length:
                groups[-1] = (shared, members + [i])
                continue
        groups.append((len(s.prompt_ids), [i]))
    return groups


def pack_shared_prefixes(samples: Sequence[Sample], pad_id: int,
                         min_shared: int = MIN_SHARED_TOKENS) -> PackedRows | None:
    """The samples (in this order) packed by :func:`group_by_prefix`; None when no group has two
    samples (nothing to share)."""
    groups = group_by_prefix(samples, min_shared)
    if all(len(members) == 1 for _, members in groups):
        return None
    rows_ids, rows_pos, rows_seg = [], [], []
    where: dict[int, tuple[int, int, int]] = {}  # sample -> (row, prefix length, first column of its rest)
    for row, (length, members) in enumerate(groups):
        first = samples[members[0]]
        ids, pos, seg = list(first.prompt_ids[:length]), list(range(length)), [0] * length
        for k, i in enumerate(members, start=1):
            rest = list(samples[i].prompt_ids[length:]) + list(samples[i].response_ids)
            where[i] = (row, length, len(ids))
            ids += rest
            pos += range(length, length + len(rest))
            seg += [k] * len(rest)
        rows_ids.append(ids), rows_pos.append(pos), rows_seg.append(seg)
    width = max(len(r) for r in rows_ids)
    pad = lambda rows, value: torch.tensor([r + [value] * (width - len(r)) for r in rows], dtype=torch.long)  # noqa: E731
    rows, cols = [], []
    for i, s in enumerate(samples):  # response_mask order: sample by sample, position by position
        row, length, start = where[i]
        p, r = len(s.prompt_ids), len(s.response_ids)
        for t in range(p - 1, p + r - 1):  # logits at t predict token t + 1
            rows.append(row)
            cols.append(t if t < length else start + t - length)
    return PackedRows(pad(rows_ids, pad_id), pad(rows_pos, 0), pad(rows_seg, -1),
                      torch.tensor(rows, dtype=torch.long), torch.tensor(cols, dtype=torch.long))
