import math

import pytest
import torch

from drmas.algorithms import LossConfig, aggregate, policy_loss, truncated_importance_weights


def _lp(ratios):
    """Log-probs whose ratio against old log-probs of 0 is exactly ``ratios``."""
    return torch.log(torch.tensor(ratios, dtype=torch.float64)).requires_grad_(True)


MASK = torch.tensor([[1, 1, 0], [1, 0, 0]])
ADV = torch.tensor([1.0, -3.0])


@pytest.mark.parametrize(
    "agg,want",
    [
        # ratio 1: per-token loss is -A: tokens -1, -1 (seq 1) and +3 (seq 2)
        ("token-mean", (-1 - 1 + 3) / 3),
        ("seq-mean-token-mean", (-1 + 3) / 2),
        ("seq-mean-token-sum-norm", (-2 / 3 + 3 / 3) / 2),  # token sums over T = 3
    ],
)
def test_aggregation_modes_on_hand_made_tensors(agg, want):
    lp = torch.zeros(2, 3)
    loss, m = policy_loss(lp, lp.clone(), ADV, MASK, LossConfig(agg=agg))
    assert loss.item() == pytest.approx(want)
    assert m["pg_loss"].item() == pytest.approx(want)
    assert m["ratio_mean"].item() == pytest.approx(1.0)
    assert m["clip_frac"].item() == 0.0


def test_seq_sum_norm_takes_a_constant_budget():
    v = torch.tensor([[1.0, 2.0, 0.0], [4.0, 0.0, 0.0]])
    assert (aggregate(v, MASK, "seq-mean-token-sum-norm", norm_len=10).item()
            == pytest.approx((3 / 10 + 4 / 10) / 2))


def test_sequences_without_tokens_do_not_dilute_sequence_means():
    v = torch.tensor([[2.0, 4.0], [9.0, 9.0]])
    mask = torch.tensor([[1, 1], [0, 0]])
    assert aggregate(v, mask, "seq-mean-token-mean").item() == pytest.approx(3.0)
    assert aggregate(v, mask, "token-mean").item() == pytest.approx(3.0)


def test_unknown_aggregation_is_refused():
    with pytest.raises(ValueError, match="agg must be one of"):
        aggregate(torch.zeros(1, 1), torch.ones(1, 1), "sum")


def test_clip_engages_exactly_past_the_bounds_and_zeroes_the_gradient():
    # positive advantage: 1 + clip_high = 1.2 is the bound
    lp = _lp([[1.19, 1.21, 1.0, 1.0]])
    mask = torch.ones(1, 4)
    loss, m = policy_loss(lp, torch.zeros(1, 4, dtype=torch.float64), torch.tensor([1.0]), mask)
    loss.backward()
    # d(-A r)/d logp = -A r per token, over 4 tokens; the clipped token has no gradient
    assert torch.allclose(lp.grad, torch.tensor([[-1.19, 0.0, -1.0, -1.0]], dtype=torch.float64) / 4)
    assert m["clip_frac_high"].item() == 0.25 and m["clip_frac_low"].item() == 0.0
    assert loss.item() == pytest.approx(-(1.19 + 1.2 + 1 + 1) / 4)

    # negative advantage: 1 - clip_low = 0.8 is the bound
    lp = _lp([[0.81, 0.79]])
    loss, m = policy_loss(lp, torch.zeros(1, 2, dtype=torch.float64), torch.tensor([-1.0]), torch.ones(1, 2))
    loss.backward()
    assert torch.allclose(lp.grad, torch.tensor([[0.81, 0.0]], dtype=torch.float64) / 2)
    assert m["clip_frac_low"].item() == 0.5 and m["clip_frac_high"].item() == 0.0

    # asymmetric bounds (DAPO clip-higher): 1.21 is inside 1 + 0.28
    lp = _lp([[1.21, 1.29]])
    _, m = policy_loss(lp, torch.zeros(1, 2, dtype=torch.float64), torch.tensor([1.0]), torch.ones(1, 2),
                       LossConfig(clip_high=0.28))
    assert m["clip_frac_high"].item() == 0.5


def test_a_ratio_moving_against_the_advantage_is_never_clipped():
    lp = _lp([[0.5, 2.0]])
    loss, m = policy_loss(lp, torch.zeros(1, 2, dtype=torch.float64), torch.tensor([1.0]), torch.ones(1, 2))
    loss.backward()
    # A > 0 and r < 0.8 keeps its gradient (pessimistic bound); r = 2 is clipped
    assert torch.allclose(lp.grad, torch.tensor([[-0.5, 0.0]], dtype=torch.float64) / 2)
    assert m["clip_frac"].item() == 0.5


def test_dual_clip_bounds_the_loss_for_negative_advantages():
    lp = _lp([[4.0, 2.5]])
    old = torch.zeros(1, 2, dtype=torch.float64)
    loss, m = policy_loss(lp, old, torch.tensor([-1.0]), torch.ones(1, 2), LossConfig(dual_clip=3.0))
    loss.backward()
    # r = 4: min(max(4, 1.2), 3) = 3 with no gradient; r = 2.5: 2.5, gradient -A r = 2.5
    assert loss.item() == pytest.approx((3.0 + 2.5) / 2)
    assert torch.allclose(lp.grad, torch.tensor([[0.0, 2.5]], dtype=torch.float64) / 2)
    assert m["dual_clip_frac"].item() == 0.5
    with pytest.raises(ValueError, match="dual_clip must be > 1"):
        policy_loss(lp, old, torch.tensor([-1.0]), torch.ones(1, 2), LossConfig(dual_clip=1.0))
    with pytest.raises(ValueError, match=r"agg must be one of \['seq-mean-token-mean'"):
        LossConfig(agg="mean")
    with pytest.raises(ValueError, match="clip bounds must be non-negative"):
        LossConfig(clip_low=-0.1)


def test_masked_tokens_contribute_nothing():
    lp = torch.zeros(2, 3, requires_grad=True)
    loss, m = policy_loss(lp, torch.zeros(2, 3), ADV, MASK)
    loss.backward()
    assert (lp.grad[MASK == 0] == 0).all()

    wild = torch.zeros(2, 3)
    wild[MASK == 0] = 50.0  # huge ratios at masked positions
    for agg in ("token-mean", "seq-mean-token-mean", "seq-mean-token-sum-norm"):
        a, ma = policy_loss(wild, torch.zeros(2, 3), ADV, MASK, LossConfig(agg=agg))
        b, mb = policy_loss(torch.zeros(2, 3), torch.zeros(2, 3), ADV, MASK, LossConfig(agg=agg))
        assert a.item() == b.item()
        assert ma["ratio_max"].item() == mb["ratio_max"].item() == 1.0


def test_k3_kl_and_entropy_terms():
    lp = torch.zeros(1, 2)
    ref = torch.full((1, 2), math.log(2.0))  # ref - logp = log 2: k3 = 2 - log 2 - 1
    ent = torch.tensor([[0.5, 1.5]])
    base, _ = policy_loss(lp, lp, torch.tensor([1.0]), torch.ones(1, 2))
    loss, m = policy_loss(lp, lp, torch.tensor([1.0]), torch.ones(1, 2), LossConfig(kl_coef=0.1,
                                                                                    entropy_coef=0.01),
                          ref_logprobs=ref, entropy=ent)
    k3 = 1.0 - math.log(2.0)
    assert m["kl"].item() == pytest.approx(k3)
    assert m["entropy"].item() == pytest.approx(1.0)
    assert loss.item() == pytest.approx(base.item() + 0.1 * k3 - 0.01 * 1.0)


def test_approx_kl_between_old_and_new_policy():
    lp = torch.log(torch.tensor([[2.0]]))
    _, m = policy_loss(lp, torch.zeros(1, 1), torch.tensor([0.0]), torch.ones(1, 1))
    assert m["approx_kl"].item() == pytest.approx(2.0 - 1.0 - math.log(2.0))
    assert m["ratio_max"].item() == pytest.approx(2.0)


def test_truncated_importance_weights_scale_the_policy_gradient():
    trainer = torch.log(torch.tensor([[1.0, 1.0]]))
    engine = torch.log(torch.tensor([[2.0, 0.1]]))
    w = truncated_importance_weights(trainer, engine, cap=2.0)
    assert torch.allclose(w, torch.tensor([[0.5, 2.0]]))  # 10 is truncated to 2
    lp = torch.zeros(1, 2)
    loss, _ = policy_loss(lp, lp, torch.tensor([1.0]), torch.ones(1, 2), importance_weights=w)
    assert loss.item() == pytest.approx(-(0.5 + 2.0) / 2)


def test_shape_mismatch_is_a_clear_error():
    with pytest.raises(ValueError, match="same shape"):
        policy_loss(torch.zeros(2, 3), torch.zeros(2, 2), ADV, MASK)


@pytest.mark.parametrize("agg", ["token-mean", "seq-mean-token-mean", "seq-mean-token-sum-norm"])
@pytest.mark.parametrize("poison", [float("inf"), float("-inf"), float("nan")])
def test_inf_or_nan_at_masked_positions_poison_neither_loss_nor_gradient(agg, poison):
    torch.manual_seed(0)
    mask = torch.tensor([[1, 1, 0, 0], [1, 1, 1, 0]], dtype=torch.bool)
    clean = torch.randn(2, 4) - 1.0
    old = clean.detach() + 0.05 * torch.randn(2, 4)
    adv = torch.tensor([1.0, -0.5])

    def run(values, old_values, extra):
        lp = values.clone().requires_grad_(True)
        loss, _ = policy_loss(lp, old_values, adv, mask, LossConfig(agg=agg, entropy_coef=0.01, kl_coef=0.1),
                              entropy=extra, ref_logprobs=extra, importance_weights=extra.abs())
        loss.backward()
        return loss, lp.grad

    want, want_grad = run(clean, old, clean.detach())
    dirty = torch.where(mask, clean, torch.full_like(clean, poison))
    got, got_grad = run(dirty, torch.where(mask, old, torch.full_like(old, poison)), dirty.detach())
    assert torch.isfinite(got) and torch.isfinite(got_grad).all()
    assert torch.allclose(got, want) and torch.allclose(got_grad, want_grad)


def test_gspo_clips_one_length_normalised_ratio_per_sequence():
    mask = torch.tensor([[1, 1, 0], [1, 1, 1]])
    config = LossConfig(name="gspo", clip_low=0.1, clip_high=0.1)
    # equal token ratios within each sequence: GSPO is PPO-clip, values and gradients
    same = [[1.05, 1.05, 1.0], [2.0, 2.0, 2.0]]
    losses, grads = [], []
    for name in ("gspo", "ppo-clip"):
        lp = _lp(same)
        loss, _ = policy_loss(lp, torch.zeros(2, 3, dtype=torch.float64), ADV, mask,
                              LossConfig(name=name, clip_low=0.1, clip_high=0.1))
        loss.backward()
        losses.append(loss.item())
        grads.append(lp.grad)
    assert losses[0] == pytest.approx(losses[1]) and torch.allclose(grads[0], grads[1])
    # sequence 1: token ratios 1.2 and 1/1.2 have a geometric mean of 1, inside the clip range, where
    # PPO clips the first token; sequence 2: 1.5 and 1.5 and 1.5 (A < 0, above the range: kept)
    lp = _lp([[1.2, 1 / 1.2, 1.0], [1.5, 1.5, 1.5]])
    loss, m = policy_loss(lp, torch.zeros(2, 3, dtype=torch.float64), ADV, mask, config)
    # per token, token-mean over 5: seq 1 -A s = -1 twice; seq 2 max(3 * 1.5, 3 * 1.1) = 4.5, thrice
    assert loss.item() == pytest.approx((-1 - 1 + 3 * 4.5) / 5)
    assert m["clip_frac"].item() == 0.0  # a sequence ratio above the range with A < 0 is not clipped
    loss.backward()
    # d/dlogp of -A * s * exp(logp - sg logp): -A s per token (s = 1 in seq 1, 1.5 in seq 2)
    want = torch.tensor([[-1.0, -1.0, 0.0], [4.5, 4.5, 4.5]], dtype=torch.float64) / 5
    assert torch.allclose(lp.grad, want)
    with pytest.raises(ValueError, match="loss name must be one of"):
        LossConfig(name="ppo")


def test_a_registered_loss_and_aggregation_are_selected_by_name():
    from drmas.algorithms import AGGREGATIONS, LOSSES, register_aggregation, register_loss
    from drmas.data.batching import make_micro_batches
    from drmas.records import BatchSpec, Sample

    @register_loss("test-vanilla-pg")
    def vanilla(log_ratio, adv, mask, config):
        return -adv * log_ratio.exp(), {"seen": torch.tensor(1.0)}

    @register_aggregation("test-token-sum", weight="tokens")
    def token_sum(values, mask, norm_len):
        return values.sum()

    try:
        lp = _lp([[3.0, 0.5, 1.0], [2.0, 1.0, 1.0]])  # far outside any clip range: nothing clipped
        loss, m = policy_loss(lp, torch.zeros(2, 3, dtype=torch.float64), ADV, MASK,
                              LossConfig(name="test-vanilla-pg", agg="test-token-sum"))
        assert loss.item() == pytest.approx(-3.0 - 0.5 + 3 * 2.0) and m["seen"].item() == 1.0
        # the aggregation says how micro-batches add up: by tokens here (2 + 4 of 6)
        samples = [Sample("t", "t#0", "a", 0, "p", [1], [2, 3], [0.0, 0.0]),
                   Sample("t", "t#1", "a", 0, "p", [1], [2, 3, 4, 5], [0.0] * 4)]
        spec = BatchSpec(pad_id=0, micro_batch_size=1, agg="test-token-sum")
        batches = make_micro_batches(samples, "p", spec)
        assert sorted(b.loss_scale for b in batches) == pytest.approx([2 / 6, 4 / 6])
        with pytest.raises(ValueError, match="weight must be 'tokens' or 'sequences'"):
            register_aggregation("test-bad", weight="tokens-ish")
    finally:
        LOSSES.unregister("test-vanilla-pg")
        AGGREGATIONS.unregister("test-token-sum")
