"""FSDP2 over 2 CPU processes (gloo): one step, each rank training its own share of the batch,
equals the unsharded step, with the chunked response-only log-probs and packed shared prefixes
on both sides."""

import subprocess
import sys
from pathlib import Path

import pytest
import torch

pytestmark = pytest.mark.integration  # spawns 2 ranks (gloo) in processes of their own

SCRIPT = Path(__file__).with_name("fsdp_step.py")


def run(tmp_path, *flags):
    out = tmp_path / f"out{'-'.join(flags)}.pt"
    proc = subprocess.run([sys.executable, str(SCRIPT), str(out), *flags], cwd=tmp_path, capture_output=True,
                          text=True, timeout=600)
    assert proc.returncode == 0, proc.stderr[-4000:]
    return torch.load(out, weights_only=True)


def test_a_sharded_step_equals_the_unsharded_one(tmp_path):
    single, sharded = run(tmp_path), run(tmp_path, "--shard")
    assert sharded["sharded"] and not single["sharded"]  # the 2-process run really was sharded
    assert sharded["read"] == {"p": "slices"} and single["read"] == {}  # each rank read only its rows
    # response-only chunked log-probs in both
    assert sharded["chunk_tokens"] == single["chunk_tokens"] == 1024
    assert sharded["packed"] >= 1 and single["packed"] >= 2  # shared prefixes packed in both
    # each rank trained its own share: together every sample once, in equal numbers of passes,
    # one of them a zero-weight padding pass
    (whole,), ranks = single["shares"], sharded["shares"]
    real = [sorted(i for idx, pad in rank for i in idx if not pad) for rank in ranks]
    assert sorted(real[0] + real[1]) == sorted(i for idx, _ in whole for i in idx) == list(range(8))
    assert len(ranks[0]) == len(ranks[1]) and sum(pad for rank in ranks for _, pad in rank) == 1
    assert single["version"] == sharded["version"] == 1
    # generation cannot follow a sharded model's collectives: the engine has its own copy, synced exactly
    assert sharded["engine_copy"] and not single["engine_copy"]
    assert sharded["engine_diff"] == single["engine_diff"] == 0.0
    # same loss, the same global (not per-shard) grad norm, the same updated weights
    assert abs(sharded["loss"] - single["loss"]) <= 1e-6 * max(1.0, abs(single["loss"]))
    assert abs(sharded["grad_norm"] - single["grad_norm"]) <= 1e-5 * single["grad_norm"]
    assert single["grad_norm"] > 0.5  # above grad_clip: clipping by the global norm is exercised
    # Weights after one AdamW step (lr 1e-2, no weight decay): the first step moves an element by
    # lr * g / (|g| + eps), whose slope at g ~ eps is lr / eps = 1e6, so an element whose gradient
    # is near zero turns the last-bit difference of the sharded reduction into a visible one. The
    # elements the step moved by at least 0.99 lr (|g| >= 99 eps) are well-conditioned: those must
    # agree to 1e-6; they are 18% of all elements (most of the tied 49,152-row embedding gets
    # tiny gradients), and 99.9% of all elements agree to 1e-6 (a wrong sharded step breaks both).
    moved = agree = total = 0
    for name, w in single["weights"].items():
        step = (w - single["initial"][name]).abs()
        firm = step >= 0.99e-2
        diff = (sharded["weights"][name] - w).abs()
        assert float(torch.where(firm, diff, 0.0).max()) <= 1e-6, name
        assert float(diff.max()) <= 2e-2, name  # never more than one step's width apart
        moved, agree, total = moved + int(firm.sum()), agree + int((diff <= 1e-6).sum()), total + diff.numel()
    assert moved >= 0.1 * total and agree >= 0.999 * total, (moved, agree, total)
