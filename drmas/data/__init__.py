"""The rollout side: playing a workflow's tasks into one plan per iteration, validation, and
packing samples into micro-batches.

:mod:`drmas.data.rollouts` is plain Python (no Lightning) and talks to the trainer only through
:class:`~drmas.data.rollouts.RolloutBackend`; :mod:`drmas.data.datamodule` wraps it for Lightning.
"""

from drmas.data.batching import make_micro_batches
from drmas.data.rollouts import RolloutBackend, Rollouts

__all__ = ["RolloutBackend", "Rollouts", "make_micro_batches"]
