import math

import pytest
import torch

from drmas.metrics import AvgAtK, PassAtK, avg_at_k, pass_at_k


@pytest.mark.parametrize(
    ("n", "c", "k", "expected"),
    [
        (5, 2, 1, 0.4),  # pass@1 = c/n
        (5, 2, 2, 1 - 3 / 10),  # 1 - C(3,2)/C(5,2) = 0.7
        (5, 0, 3, 0.0),  # nothing correct
        (5, 5, 3, 1.0),  # everything correct
        (5, 3, 3, 1.0),  # n - c = 2 < k: every 3-subset holds a correct one
        (4, 1, 4, 1.0),  # k = n and one correct
        (10, 3, 5, 1 - math.comb(7, 5) / math.comb(10, 5)),
        (3, 1, 3, 1.0),
    ],
)
def test_pass_at_k_hand_values(n, c, k, expected):
    assert pass_at_k(n, c, k) == pytest.approx(expected, abs=1e-12)


def test_pass_at_k_large_n_matches_exact_binomials():
    # The product form must agree with exact integer binomials where the direct ratio is huge.
    n, c, k = 200, 7, 50
    exact = 1 - math.comb(n - c, k) / math.comb(n, k)
    assert pass_at_k(n, c, k) == pytest.approx(exact, rel=1e-12)


@pytest.mark.parametrize(("n", "c", "k"), [(2, 1, 3), (0, 0, 1), (5, 6, 1), (5, -1, 1), (5, 1, 0)])
def test_pass_at_k_rejects_bad_counts(n, c, k):
    with pytest.raises(ValueError):
        pass_at_k(n, c, k)


def test_avg_at_k_function():
    assert avg_at_k(2, 5) == pytest.approx(0.4)
    assert avg_at_k([2, 4, 0], [4, 4, 2]) == pytest.approx((0.5 + 1.0 + 0.0) / 3)
    assert avg_at_k(torch.tensor([1, 3]), torch.tensor([2, 4])) == pytest.approx(0.625)
    with pytest.raises(ValueError):
        avg_at_k([3], [2])
    with pytest.raises(ValueError):
        avg_at_k([1, 2], [4])


def test_pass_at_k_metric_accumulates_and_resets():
    m = PassAtK(k=2)
    m.update(torch.tensor([2, 0]), torch.tensor([5, 5]))  # 0.7, 0.0
    m.update(torch.tensor([5]), torch.tensor([5]))  # 1.0
    m.update(torch.tensor([4, 1]), torch.tensor([5, 3]))  # n-c=1<2 -> 1.0 ; 1 - C(2,2)/C(3,2) = 2/3
    expected = (0.7 + 0.0 + 1.0 + 1.0 + 2 / 3) / 5
    assert m.compute().item() == pytest.approx(expected, abs=1e-12)
    # Agrees with the scalar function task by task.
    per_task = [pass_at_k(n, c, 2) for n, c in [(5, 2), (5, 0), (5, 5), (5, 4), (3, 1)]]
    assert m.compute().item() == pytest.approx(sum(per_task) / 5, abs=1e-12)

    m.reset()
    m.update(torch.tensor([1]), torch.tensor([4]))
    assert m.compute().item() == pytest.approx(1 - math.comb(3, 2) / math.comb(4, 2))


def test_pass_at_1_equals_avg():
    c, n = torch.tensor([0, 1, 3, 7]), torch.tensor([8, 8, 8, 8])
    p, a = PassAtK(k=1), AvgAtK(k=8)
    p.update(c, n)
    a.update(c, n)
    assert p.compute().item() == pytest.approx(a.compute().item())


def test_pass_at_k_metric_rejects_too_few_samples_and_bad_counts():
    m = PassAtK(k=4)
    with pytest.raises(ValueError, match="at least k=4"):
        m.update(torch.tensor([1]), torch.tensor([3]))
    with pytest.raises(ValueError):
        m.update(torch.tensor([5]), torch.tensor([4]))
    with pytest.raises(ValueError):
        m.update(torch.tensor([1, 2]), torch.tensor([4]))
    with pytest.raises(ValueError):
        PassAtK(k=0)


def test_avg_at_k_metric_accumulates_and_resets():
    m = AvgAtK(k=4)
    m.update(torch.tensor([1, 4]), torch.tensor([4, 4]))
    m.update(torch.tensor([3.0]), torch.tensor([4.0]))  # float counts holding whole numbers are fine
    assert m.compute().item() == pytest.approx((0.25 + 1.0 + 0.75) / 3)
    m.reset()
    m.update(torch.tensor([0]), torch.tensor([4]))
    assert m.compute().item() == 0.0


def test_states_reduce_by_sum():
    m = PassAtK(k=1)
    assert m._reductions["score_sum"].__name__.endswith("sum")
    assert m._reductions["num_tasks"].__name__.endswith("sum")
    # Merging two metrics' states (what a cross-process sum does) gives the global mean.
    a, b = AvgAtK(k=2), AvgAtK(k=2)
    a.update(torch.tensor([1]), torch.tensor([2]))
    b.update(torch.tensor([2, 2, 0]), torch.tensor([2, 2, 2]))
    a.merge_state(b)
    assert a.compute().item() == pytest.approx((0.5 + 1 + 1 + 0) / 4)
