"""Evaluation metrics for sampled answers: avg@k and pass@k.

Both take, per task, the number of samples drawn ``n`` and how many of them were correct ``c``.

- **avg@k** is the mean over tasks of ``c / n``: the expected accuracy of *one* sample. Its
  value does not depend on k; k only names the number of samples per task used to estimate it
  (``avg@8`` = 8 samples per task), so that reports say how much sampling stands behind them.
- **pass@k** is the probability that at least one of k samples is correct, estimated without
  bias from n >= k samples as ``1 - C(n-c, k) / C(n, k)`` per task (Chen et al., 2021), then
  averaged over tasks. The binomial ratio overflows for large n if computed directly, so it is
  evaluated as the product ``prod_{i=n-c+1}^{n} (1 - k / i)``.

The ``Metric`` classes keep only sums (score total and task count), reduced with ``sum`` across
processes, so each rank can update with its own tasks and ``compute`` returns the global mean.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch
from torch import Tensor
from torchmetrics import Metric

__all__ = ["AvgAtK", "PassAtK", "avg_at_k", "pass_at_k"]


def _check_counts(n: int, c: int) -> None:
    if n < 1:
        raise ValueError(f"number of samples n must be >= 1, got {n}")
    if not 0 <= c <= n:
        raise ValueError(f"number of correct samples c must be in [0, n={n}], got {c}")


def pass_at_k(n: int, c: int, k: int) -> float:
    """Unbiased pass@k of one task with ``n`` samples of which ``c`` are correct.

    Raises ``ValueError`` when ``n < k`` (the estimator needs at least k samples).
    """
    if k < 1:
        raise ValueError(f"k must be >= 1, got {k}")
    _check_counts(n, c)
    if n < k:
        raise ValueError(f"pass@{k} needs at least k={k} samples per task, got n={n}")
    if n - c < k:
        # Every k-subset contains a correct sample.
        return 1.0
    prod = 1.0
    for i in range(n - c + 1, n + 1):
        prod *= 1.0 - k / i
    return 1.0 - prod


def avg_at_k(num_correct: int | Sequence[int] | Tensor, num_samples: int | Sequence[int] | Tensor) -> float:
    """avg@k: mean over tasks of ``num_correct / num_samples`` (one task if given ints).

    k is not an argument: it only names the number of samples per task (see the module doc).
    """
    c = torch.as_tensor(num_correct).reshape(-1)
    n = torch.as_tensor(num_samples).reshape(-1)
    if c.shape != n.shape or c.numel() == 0:
        raise ValueError(f"need equal, non-empty shapes, got {tuple(c.shape)} and {tuple(n.shape)}")
    for ni, ci in zip(n.tolist(), c.tolist()):
        _check_counts(int(ni), int(ci))
    return float((c.double() / n.double()).mean())


def _validated(num_correct: Tensor, num_samples: Tensor) -> tuple[Tensor, Tensor]:
    c = torch.as_tensor(num_correct).reshape(-1)
    n = torch.as_tensor(num_samples, device=c.device).reshape(-1)
    if c.shape != n.shape:
        raise ValueError(f"num_correct and num_samples differ in shape: {tuple(c.shape)} vs {tuple(n.shape)}")
    if c.is_floating_point() and bool((c != c.round()).any()):
        raise ValueError("num_correct must hold whole numbers")
    if n.is_floating_point() and bool((n != n.round()).any()):
        raise ValueError("num_samples must hold whole numbers")
    if bool((n < 1).any()):
        raise ValueError("num_samples must be >= 1 for every task")
    if bool(((c < 0) | (c > n)).any()):
        raise ValueError("num_correct must lie in [0, num_samples] for every task")
    return c.long(), n.long()


class _MeanOverTasks(Metric):
    """Mean of a per-task score; states are sums so they reduce across processes by ``sum``."""

    is_differentiable = False
    higher_is_better = True
    full_state_update = False

    # float64 so that the running sum over many tasks does not lose the small per-task terms.
    score_sum: Tensor
    num_tasks: Tensor

    def __init__(self, k: int, **kwargs) -> None:
        super().__init__(**kwargs)
        if not isinstance(k, int) or k < 1:
            raise ValueError(f"k must be a positive int, got {k!r}")
        self.k = k
        self.add_state("score_sum", default=torch.tensor(0.0, dtype=torch.float64), dist_reduce_fx="sum")
        self.add_state("num_tasks", default=torch.tensor(0, dtype=torch.long), dist_reduce_fx="sum")

    def _scores(self, c: Tensor, n: Tensor) -> Tensor:
        raise NotImplementedError

    def update(self, num_correct: Tensor, num_samples: Tensor) -> None:
        """Add tasks: ``num_correct[t]`` correct out of ``num_samples[t]`` samples for task t."""
        c, n = _validated(num_correct, num_samples)
        if c.numel() == 0:
            return
        scores = self._scores(c, n)
        self.score_sum += scores.sum().to(self.score_sum)
        self.num_tasks += c.numel()

    def compute(self) -> Tensor:
        # 0 tasks gives nan (torchmetrics also warns that compute ran before update).
        return self.score_sum / self.num_tasks


class AvgAtK(_MeanOverTasks):
    """avg@k: mean over tasks of c/n, the expected accuracy of one sample.

    The value does not depend on ``k``; k names how many samples per task stand behind the
    estimate (report ``avg@8`` when drawing 8 samples per task).
    """

    def __init__(self, k: int, **kwargs) -> None:
        """
        Args:
            k: the number of samples per task this metric is reported for (a label only).
            **kwargs: passed to ``torchmetrics.Metric`` (e.g. ``sync_on_compute``).
        """
        super().__init__(k, **kwargs)

    def _scores(self, c: Tensor, n: Tensor) -> Tensor:
        return c.double() / n.double()


class PassAtK(_MeanOverTasks):
    """pass@k: mean over tasks of the unbiased estimate ``1 - C(n-c, k) / C(n, k)``.

    Every task needs ``n >= k`` samples, else ``update`` raises ``ValueError``.
    """

    def __init__(self, k: int, **kwargs) -> None:
        """
        Args:
            k: the number of attempts a task is allowed; every task needs at least k samples.
            **kwargs: passed to ``torchmetrics.Metric`` (e.g. ``sync_on_compute``).
        """
        super().__init__(k, **kwargs)

    def _scores(self, c: Tensor, n: Tensor) -> Tensor:
        k = self.k
        if bool((n < k).any()):
            raise ValueError(f"pass@{k} needs at least k={k} samples per task, got n={int(n.min())}")
        # Vectorised product over i in (n-c, n]: a [tasks, max_n] grid where factors outside
        # each task's range are 1. Tasks with n-c < k would include the factor at i = k (zero)
        # and negative ones below it; they are exactly 1 by definition, so set them directly.
        i = torch.arange(1, int(n.max()) + 1, device=n.device, dtype=torch.float64)
        in_range = (i[None, :] > (n - c)[:, None]) & (i[None, :] <= n[:, None])
        factors = torch.where(in_range, 1.0 - k / i[None, :], torch.ones((), dtype=torch.float64))
        scores = 1.0 - factors.prod(dim=1)
        return torch.where(n - c < k, torch.ones_like(scores), scores)
