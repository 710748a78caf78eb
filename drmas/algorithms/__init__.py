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
    group_of,
    register_estimator,
    singleton_prompts,
)
from drmas.algorithms.losses import (AGGREGATIONS, LOSSES, LossConfig, aggregate, policy_loss,
                                     register_aggregation, register_loss, truncated_importance_weights)
from drmas.algorithms.rewards import format_term, mix_rewards, sample_reward

__all__ = [
    "ADVANTAGE_ESTIMATORS",
    "AGGREGATIONS",
    "LOSSES",
    "LossConfig",
    "SAMPLINGS",
    "aggregate",
    "baseline_inflation",
    "compute_advantages",
    "estimators_for",
    "format_term",
    "group_advantages",
    "group_of",
    "mix_rewards",
    "policy_loss",
    "register_aggregation",
    "register_estimator",
    "register_loss",
    "sample_reward",
    "singleton_prompts",
    "truncated_importance_weights",
]
