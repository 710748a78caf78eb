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

from drmas.registry import old_names


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

__getattr__ = old_names(__name__, {"SAMPLING_MODES": ("SAMPLINGS", lambda: SAMPLINGS),
                                   "truncated_is_weights": ("truncated_importance_weights",
                                                            lambda: truncated_importance_weights)})
