import math

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from drmas.algorithms import group_advantages

EPS = 1e-6


def test_single_group_std_and_none():
    s = torch.tensor([1.0, 2.0, 3.0])
    # mean 2, unbiased std 1
    assert torch.allclose(group_advantages(s, ["g"] * 3), torch.tensor([-1.0, 0.0, 1.0]) / (1 + EPS))
    assert torch.equal(group_advantages(s, ["g"] * 3, scale="none"), torch.tensor([-1.0, 0.0, 1.0]))


def test_two_interleaved_groups():
    s = torch.tensor([0.0, 10.0, 2.0, 30.0])
    adv = group_advantages(s, ["a", "b", "a", "b"], eps=0.0)
    r = 1 / math.sqrt(2)  # both groups: deviations +-d with std d*sqrt(2)
    assert torch.allclose(adv, torch.tensor([-r, -r, r, r]), atol=1e-7)


def test_singletons_and_constant_groups_are_exactly_zero():
    s = torch.tensor([0.1, 0.1, 0.1, 5.0, 7.0, 7.0])
    adv = group_advantages(s, [0, 0, 0, 1, 2, 2])
    assert torch.equal(adv, torch.zeros(6))


def test_precomputed_integer_ids_match_hashable_keys():
    s = torch.tensor([3.0, 1.0, 4.0, 1.0, 5.0])
    keys = [("t", 7), ("t", 3), ("t", 7), ("t", 3), ("t", 7)]
    ids = torch.tensor([70, -3, 70, -3, 70])
    assert torch.equal(group_advantages(s, keys), group_advantages(s, ids))


def test_dtype_is_preserved_and_ints_become_float():
    assert group_advantages(torch.tensor([1.0, 2.0], dtype=torch.float64), [0, 0]).dtype == torch.float64
    assert group_advantages(torch.tensor([1, 2]), [0, 0]).dtype == torch.float32


@pytest.mark.parametrize(
    "scores,keys,kw,err",
    [
        (torch.tensor([1.0, 2.0]), [0], {}, "2 scores but 1 keys"),
        (torch.tensor([1.0, float("nan")]), [0, 0], {}, "finite"),
        (torch.tensor([1.0, float("inf")]), [0, 0], {}, "finite"),
        (torch.tensor([1.0, 2.0]), [0, 0], {"scale": "mad"}, "scale must be one of"),
        (torch.ones(2, 2), [0, 0], {}, "1-D"),
        (torch.tensor([1.0, 2.0]), torch.tensor([0, 0, 0]), {}, "2 scores but 3 group ids"),
    ],
)
def test_bad_input_is_a_clear_error(scores, keys, kw, err):
    with pytest.raises(ValueError, match=err):
        group_advantages(scores, keys, **kw)


def test_float_ids_are_refused():
    with pytest.raises(TypeError, match="integer"):
        group_advantages(torch.tensor([1.0, 2.0]), torch.tensor([0.0, 0.0]))


def test_empty_batch():
    assert group_advantages(torch.zeros(0), []).shape == (0,)


# ---- laws -----------------------------------------------------------------------------------

batches = st.lists(
    st.tuples(st.integers(0, 4), st.integers(-1000, 1000)), min_size=1, max_size=60
)


def _split(batch):
    keys = [k for k, _ in batch]
    scores = torch.tensor([float(v) for _, v in batch], dtype=torch.float64)
    return keys, scores


@settings(max_examples=200, deadline=None)
@given(batches, st.sampled_from(["std", "none"]))
def test_zero_mean_per_group(batch, scale):
    keys, scores = _split(batch)
    adv = group_advantages(scores, keys, scale=scale)
    for k in set(keys):
        idx = [i for i, kk in enumerate(keys) if kk == k]
        assert abs(adv[idx].sum().item()) < 1e-9 * max(1.0, scores.abs().max().item()) * len(idx)


@settings(max_examples=200, deadline=None)
@given(st.lists(st.tuples(st.integers(0, 3), st.integers(-1000, 1000)), min_size=2, max_size=60,
                unique_by=lambda t: t[1]))
def test_unit_std_per_group_with_distinct_scores(batch):
    keys, scores = _split(batch)
    adv = group_advantages(scores, keys)
    for k in set(keys):
        idx = [i for i, kk in enumerate(keys) if kk == k]
        if len(idx) >= 2:
            # distinct integers: std >= 0.7, so eps moves the std by < 2e-6
            assert abs(adv[idx].std().item() - 1.0) < 2e-6


@settings(max_examples=100, deadline=None)
@given(batches, st.randoms(use_true_random=False))
def test_permutation_invariance(batch, rnd):
    keys, scores = _split(batch)
    perm = list(range(len(keys)))
    rnd.shuffle(perm)
    adv = group_advantages(scores, keys)
    adv_p = group_advantages(scores[perm], [keys[i] for i in perm])
    assert torch.allclose(adv_p, adv[perm], atol=1e-12)
