"""Per-policy pools: each policy's ranks as a layout names them, and the layouts refused before any
model loads, each in one line naming the policy."""

import subprocess
import sys
from pathlib import Path

import pytest
import torch

from drmas.models.lora import LoraSettings
from drmas.modules.policy_config import PolicyConfig
from drmas.modules.pools import engine_askers, holdings, pooled, refuse, resolve_pools


def team(**ranks):
    return {name: PolicyConfig(model="tiny-random", ranks=r) for name, r in ranks.items()}


def test_lists_counts_and_the_default_every_rank():
    assert resolve_pools(team(a=None, b=None), 4) == {"a": (0, 1, 2, 3), "b": (0, 1, 2, 3)}
    assert not pooled(resolve_pools(team(a=None, b=None), 4), 4)
    # counts laid out one after another; a list as given (sorted, once each)
    assert resolve_pools(team(a=2, b=2), 4) == {"a": (0, 1), "b": (2, 3)}
    assert resolve_pools(team(a=[3, 1, 3], b=None), 4) == {"a": (1, 3), "b": (0, 1, 2, 3)}
    pools = resolve_pools(team(solver=2, checker=2, judge=4), 4)  # overlapping: judge on every rank
    assert pools == {"solver": (0, 1), "checker": (2, 3), "judge": (0, 1, 2, 3)} and pooled(pools, 4)


@pytest.mark.parametrize("ranks, world, message", [
    ({"a": [0, 2], "b": None}, 2, r"policy 'a': ranks \[0, 2\] name rank\(s\) \[2\] outside the world of 2 "
                                  r"rank\(s\) \(0-1\)"),
    ({"a": 3, "b": None}, 2, r"policy 'a': ranks: 3 asks for more ranks than the world's 2"),
    ({"a": [], "b": None}, 2, r"policy 'a' has no ranks: give it at least one"),
])
def test_a_layout_outside_the_world_or_without_ranks_is_refused(ranks, world, message):
    with pytest.raises(ValueError, match=message):
        resolve_pools(team(**ranks), world)


def test_adapters_sharing_one_base_must_share_one_pool():
    lora = LoraSettings(share_base=True)
    configs = {"a": PolicyConfig(model="tiny-random", lora=lora, ranks=[0]),
               "b": PolicyConfig(model="tiny-random", lora=lora, ranks=[1])}
    with pytest.raises(ValueError, match=r"share one base model must share one pool, got a: \[0\], b: \[1\]"):
        resolve_pools(configs, 2)
    configs["b"].ranks = [0]
    assert resolve_pools(configs, 2) == {"a": (0,), "b": (0,)}


# ---- training on pools: 2 ranks (gloo), the same fixed batch in both layouts -----------------------

SCRIPT = Path(__file__).with_name("pools_step.py")


@pytest.mark.integration  # 2 ranks in processes of their own, both layouts in one launch (~16 s)
def test_pools_hold_only_their_policy_update_at_once_and_step_as_the_shared_layout(tmp_path):
    proc = subprocess.run([sys.executable, str(SCRIPT), str(tmp_path / "out")], cwd=tmp_path,
                          capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stderr[-4000:]
    shared, pooled = ([torch.load(tmp_path / f"out.{layout}.{r}", weights_only=True) for r in (0, 1)]
                      for layout in ("shared", "pooled"))
    # each rank holds its own policy whole and none of the other's; shared: half of each
    assert [r["held"] for r in pooled] == [{"A": 3227968, "B": 0}, {"A": 0, "B": 3227968}]
    assert [r["held"] for r in shared] == [{"A": 1613984, "B": 1613984}] * 2
    assert [r["versions"] for r in pooled] == [{"A": 1}, {"B": 1}]
    (start0, end0), (start1, end1) = pooled[0]["span"], pooled[1]["span"]
    assert start0 < end1 and start1 < end0  # the two updates ran at the same time
    # the same loss and global grad norm per policy as the shared layout: the loss scales of the whole
    # batch were kept (a wrong scale shows here and in the moments; Adam's first step hides it)
    for name, rank in (("A", 0), ("B", 1)):
        ours, theirs = pooled[rank], shared[0]
        assert ours["loss"][name] == pytest.approx(theirs["loss"][name], rel=1e-6)
        assert ours["grad_norm"][name] == pytest.approx(theirs["grad_norm"][name], rel=1e-5)
        for param, (avg, sq) in theirs["moments"][name].items():
            got_avg, got_sq = ours["moments"][name][param]
            assert float((got_avg - avg).abs().max()) <= 1e-6 and float((got_sq - sq).abs().max()) <= 1e-6
        # weights: to 1e-6 where the step is well-conditioned (moved by >= 0.99 lr; see test_fsdp.py for
        # why AdamW's first step turns last-bit differences of near-zero gradients into visible ones)
        firm_total = total = 0
        for param, w in theirs["weights"][name].items():
            diff = (ours["weights"][name][param] - w).abs()
            grad = theirs["moments"][name][param][0] / 0.1  # the first exp_avg is (1 - beta1) g
            firm = grad.abs() >= 99 * 1e-8  # |g| >= 99 eps: the step moved the element by >= 0.99 lr
            assert float(torch.where(firm, diff, 0.0).max()) <= 1e-6, param
            assert float(diff.max()) <= 2e-2, param
            firm_total, total = firm_total + int(firm.sum()), total + diff.numel()
        assert firm_total >= 0.1 * total


def test_pools_under_a_strategy_that_does_not_shard_or_wider_than_the_tasks_are_refused_in_one_line():
    pools = resolve_pools(team(a=[0], b=[1]), 2)
    with pytest.raises(ValueError) as err:
        refuse(pools, False)
    assert str(err.value) == ("per-policy pools (a: [0], b: [1]) cannot run here: they shard each "
                              "policy over its own ranks: use --trainer.strategy fsdp")
    refuse(pools, True)
    wide = resolve_pools(team(a=4, b=[0]), 4)
    with pytest.raises(ValueError) as err:
        refuse(wide, True, tasks=3)
    assert str(err.value) == (
        "per-policy pools (a: [0, 1, 2, 3], b: [0]): the pool of 'a' has 4 ranks and an iteration plays 3 "
        "task(s): give it at most 3 ranks, or raise --data.rollout.tasks_per_iteration")
    refuse(wide, True, tasks=4)


def test_each_device_plans_the_policies_it_holds_and_each_engine_the_ranks_that_ask_it():
    # search's team on 8 GPUs: 2 + 2 + 4; overlapping pools on 4 ranks
    pools = resolve_pools(team(verifier=2, searcher=2, answerer=4), 8)
    assert holdings(pools, 8) == {("verifier",): (0, 1), ("searcher",): (2, 3), ("answerer",): (4, 5, 6, 7)}
    # a rank outside a pool asks its pool's (rank mod size)-th rank: four ranks per engine of a pool of 2
    assert engine_askers(pools, 8) == {"verifier": 4, "searcher": 4, "answerer": 2}
    overlap = resolve_pools(team(a=[0, 1, 2], b=[2, 3]), 4)
    assert holdings(overlap, 4) == {("a",): (0, 1), ("a", "b"): (2,), ("b",): (3,)}
    # b's engines: rank 2 answers ranks 0 (0 mod 2 -> 2) and 2; rank 3 answers 1 (1 mod 2 -> 3) and 3
    assert engine_askers(overlap, 4) == {"a": 2, "b": 2}  # a's rank 0 answers itself and rank 3
    assert engine_askers(resolve_pools(team(a=None), 4), 4) == {"a": 1}  # the shared layout: its own
