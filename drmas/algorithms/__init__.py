"""Pure-torch RL algorithms: advantage estimators, the policy loss, reward mixing.

Imports nothing from Lightning or the rest of drmas (but the neutral name registry), so it can
be reused and tested alone.
"""

from drmas.algorithms.advantages import (
    ADVANTAGE_ESTIMATORS,
    SAMPLING_MODES,
    baseline_inflation,
    compute_advantages,
    estimators_for,
    group_advantages,
    register_estimator,
)
from drmas.algorithms.losses import AGGREGATIONS, aggregate, policy_loss, truncated_is_weights
from drmas.algorithms.rewards import invalid_action_penalty, mix_rewards, sample_reward

__all__ = [
    "ADVANTAGE_ESTIMATORS",
    "AGGREGATIONS",
    "SAMPLING_MODES",
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
    "truncated_is_weights",
]
