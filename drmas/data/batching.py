"""Packing one policy's samples into length-sorted training micro-batches."""

from __future__ import annotations

from typing import Sequence

import torch
from torch import Tensor

from drmas.records import Experience, MicroBatch

__all__ = ["make_micro_batches"]


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


def make_micro_batches(
    samples: Sequence[Experience],
    policy: str,
    micro_batch_size: int,
    pad_id: int,
    agg: str = "token-mean",
    ppo_epoch: int = 0,
) -> list[MicroBatch]:
    """Split one policy's samples into length-sorted micro-batches with loss scales.

    For ``token-mean`` each micro-batch's loss is weighted by its share of response tokens,
    for the sequence-mean modes by its share of sequences, so that gradient accumulation over
    the micro-batches gives exactly the loss of the whole batch.
    """
    if micro_batch_size < 1:
        raise ValueError(f"micro_batch_size must be >= 1, got {micro_batch_size}")
    real = [i for i, s in enumerate(samples) if not s.is_pad and s.response_ids]
    order = sorted(real, key=lambda i: len(samples[i].prompt_ids) + len(samples[i].response_ids))
    total_tokens = sum(len(samples[i].response_ids) for i in order)
    out: list[MicroBatch] = []
    for start in range(0, len(order), micro_batch_size):
        idx = order[start : start + micro_batch_size]
        chunk = [samples[i] for i in idx]
        ids, attn, resp, elp = _pack(chunk, pad_id)
        if agg == "token-mean":
            scale = sum(len(s.response_ids) for s in chunk) / max(total_tokens, 1)
        else:
            scale = len(chunk) / max(len(order), 1)
        out.append(
            MicroBatch(
                policy=policy,
                input_ids=ids,
                attention_mask=attn,
                response_mask=resp,
                engine_logprobs=elp,
                advantages=torch.tensor([s.advantage for s in chunk], dtype=torch.float32),
                sample_index=torch.tensor(idx, dtype=torch.long),
                loss_scale=scale,
                ppo_epoch=ppo_epoch,
            )
        )
    if out:
        out[-1].step_after = True
    return out
