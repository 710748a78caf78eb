"""Pure-torch RL algorithms: advantage estimators, the policy loss, reward mixing.

Imports nothing from Lightning or the rest of drmas (but the neutral name registry), so it can
be reused and tested alone.
"""

from drmas.algorithms.advantages import (
    ADVANTAGE_ESTIMATORS,
    SAMPLINGS,
    baseline_inflation,
    compute_advantages,
    estimators_for,
    group_advantages,
    register_estimator,
)
from drmas.algorithms.losses import AGGREGATIONS, aggregate, policy_loss, truncated_importance_weights
from drmas.algorithms.rewards import invalid_action_penalty, mix_rewards, sample_reward



def __getattr__(name: str):
    if name in ("SAMPLING_MODES", "truncated_is_weights"):  # old names, read for one release (they warn)
        from drmas.algorithms import advantages, losses

        return getattr(advantages if name == "SAMPLING_MODES" else losses, name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


__all__ = [
    "ADVANTAGE_ESTIMATORS",
    "AGGREGATIONS",
    "SAMPLINGS",
    "aggregate",
    "baseline_inflation",
    "compute_advantages",
    "estimators_for",
    "group_advantages",
    "invalid_action_penalty",
    "mix_rewards",
    "policy_loss",
    "register_estimator",
    "sample_reward",
    "truncated_importance_weights",
]
