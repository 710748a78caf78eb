"""How a workflow is played: the data module's two groups of settings, ``--data.rollout`` (training
rollouts) and ``--data.validation``, each checked on its own (the checks that need the workflow
are :class:`~drmas.data.rollouts.Rollouts`')."""

from __future__ import annotations

from dataclasses import dataclass

from drmas.algorithms import ADVANTAGE_ESTIMATORS, SAMPLINGS

__all__ = ["RolloutConfig", "ValidationConfig", "rollout_seed"]


@dataclass(frozen=True)
class RolloutConfig:
    """How each iteration's rollout is played, and its advantages computed."""

    sampling: str = "parallel"
    """``parallel`` (``group_size`` trajectories per task) or ``tree`` (``group_size`` candidates
    per (env, agent, turn), the best executed)."""
    estimator: str = "drmas"
    """Advantage estimator: grpo, grpo_step, drmas, rloo (parallel), at_grpo (tree), or any
    registered name."""
    scale: str = "std"
    """``std`` (divide by the group std) or ``none`` (Dr. GRPO)."""
    group_size: int = 4
    """Trajectories per task (parallel) or candidates per node (tree)."""
    tasks_per_iteration: int = 4
    """Tasks drawn (without replacement within an iteration) per rollout."""
    staleness: int = 0
    """How many updates behind the rollouts' weights may be: 0 plays iteration k on the weights after
    update k-1 (synchronous, on-policy); N >= 1 plays it on those after update k-1-N, in the
    background during the updates before it, engines awake (docs/async.md)."""
    seed: int = 0
    """Seed of the task sampling and of the engines' draws (iteration k always draws the same)."""
    max_failed_share: float = 0.5
    """Stop the run (before training on it) when more than this share of one agent's actions in an
    iteration or a validation failed in the environment (a retrieval server down after its
    retries), or of the episodes; fewer are counted and trained on as failed actions."""
    progress: bool | None = None
    """A progress bar over the episodes of each rollout and validation (done / total, success rate
    so far); None: on in a terminal, off in logs."""
    log_completions_every: int = 1
    """Log one sample completion per agent as text every this many iterations (0 = never)."""

    def __post_init__(self) -> None:
        if self.sampling not in SAMPLINGS:
            raise ValueError(f"sampling must be one of {SAMPLINGS}, got {self.sampling!r}")
        if self.estimator not in ADVANTAGE_ESTIMATORS:
            raise ValueError(f"unknown estimator {self.estimator!r}; "
                             f"known: {', '.join(ADVANTAGE_ESTIMATORS)}")
        if self.staleness < 0:
            raise ValueError(f"staleness must be >= 0 (0: synchronous), got {self.staleness}")
        if self.group_size < 1 or self.tasks_per_iteration < 1:
            raise ValueError("group_size and tasks_per_iteration must be >= 1")
        if not 0.0 <= self.max_failed_share <= 1.0:
            raise ValueError(f"max_failed_share must be in [0, 1], got {self.max_failed_share}")
        if self.log_completions_every < 0:
            raise ValueError(f"log_completions_every must be >= 0, got {self.log_completions_every}")


@dataclass(frozen=True)
class ValidationConfig:
    """Which tasks validation plays, how often, and how many samples each."""

    tasks: int = 32
    """Validation tasks used: the first ones of the val split, per source when the tasks name
    their source (0 = no validation)."""
    k: int = 4
    """Samples per task, for ``val/avg@k`` and ``val/pass@k``."""
    every: int = 0
    """Validate every this many iterations (0 = only before training and at the end)."""
    before_training: bool = True
    """Validate the initial policies before the first iteration (the "before" numbers); off saves
    that evaluation when they are known, e.g. from a ``validate`` run on the same weights."""
    before_tasks: int | None = None
    """Tasks of the validation before training (the first of each source, as ``tasks`` picks them;
    at most ``tasks``); unset: ``tasks``. The GPU configs keep it small, so a run's first
    minutes are not spent validating; set it to ``tasks`` (or ``null``) for the full "before"
    numbers."""
    swap_probe: bool = False
    """Every validation also runs with the agents' policies swapped (each agent's prompts answered
    by the next agent's policy; two agents trade), logged under ``val_swapped/``: how much each
    policy specialised in its role. Needs one policy per agent; doubles validation's cost."""

    def __post_init__(self) -> None:
        if self.before_tasks is not None and self.before_tasks < 0:
            raise ValueError(f"validation.before_tasks must be >= 0 (or unset), got {self.before_tasks}")
        if self.tasks < 0 or self.k < 1 or self.every < 0:
            raise ValueError(f"validation needs tasks >= 0, k >= 1 and every >= 0, got {self.tasks}, "
                             f"{self.k}, {self.every}")


def rollout_seed(seed: int, rank: int, iteration: int) -> int:
    """The seed of one rank's rollout at ``iteration`` (-1: validation): the workflow's choices and
    the engines' sampling draw from it, so ranks draw differently, and a resumed run draws what the
    uninterrupted one drew."""
    return seed + iteration + 1_000_003 * rank
