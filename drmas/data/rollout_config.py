"""How a workflow is played: the rollout settings the data module and :class:`~drmas.data.rollouts.Rollouts`
share, checked on their own (the checks that need the workflow are ``Rollouts``')."""

from __future__ import annotations

from dataclasses import dataclass

from drmas.algorithms import ADVANTAGE_ESTIMATORS, SAMPLINGS

__all__ = ["RolloutConfig", "rollout_seed"]


@dataclass(frozen=True)
class RolloutConfig:
    """How a workflow is played for training and validation (the data module's settings of the
    same names, documented in full on :class:`~drmas.data.datamodule.RolloutDataModule`)."""

    sampling: str = "parallel"
    """``parallel`` or ``tree``."""
    estimator: str = "drmas"
    """A registered advantage estimator."""
    scale: str = "std"
    """``std`` or ``none`` (Dr. GRPO)."""
    group_size: int = 4
    """Trajectories per task (parallel) or candidates per node (tree)."""
    tasks_per_iteration: int = 4
    """Tasks drawn per rollout."""
    val_tasks: int = 32
    """Validation tasks per source (0 = no validation)."""
    val_k: int = 4
    """Samples per validation task."""
    seed: int = 0
    """Seed of the task sampling."""
    progress: bool | None = None
    """A progress bar over the episodes (None: in a terminal)."""
    max_failed_share: float = 0.5
    """Past this share of an agent's actions (or of the episodes) failing, the run stops."""

    def __post_init__(self) -> None:
        if self.sampling not in SAMPLINGS:
            raise ValueError(f"sampling must be one of {SAMPLINGS}, got {self.sampling!r}")
        if self.estimator not in ADVANTAGE_ESTIMATORS:
            raise ValueError(f"unknown estimator {self.estimator!r}; "
                             f"known: {', '.join(ADVANTAGE_ESTIMATORS)}")
        if self.group_size < 1 or self.tasks_per_iteration < 1:
            raise ValueError("group_size and tasks_per_iteration must be >= 1")
        if self.val_tasks < 0 or self.val_k < 1:
            raise ValueError(f"val_tasks must be >= 0 and val_k >= 1, got {self.val_tasks}, {self.val_k}")
        if not 0.0 <= self.max_failed_share <= 1.0:
            raise ValueError(f"max_failed_share must be in [0, 1], got {self.max_failed_share}")


def rollout_seed(seed: int, rank: int, iteration: int) -> int:
    """The seed of one rank's rollout at ``iteration`` (-1: validation): the workflow's choices and
    the engines' sampling draw from it, so ranks draw differently, and a resumed run draws what the
    uninterrupted one drew."""
    return seed + iteration + 1_000_003 * rank
