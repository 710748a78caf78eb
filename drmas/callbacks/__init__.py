"""Training callbacks: gradient-norm spike monitor, resumable and Hugging Face checkpoints, rollout
statistics."""

from drmas.callbacks.grad_norm import GradNormSpikeMonitor
from drmas.callbacks.hf_checkpoint import HFCheckpoint
from drmas.callbacks.iteration_checkpoint import IterationCheckpoint
from drmas.callbacks.rollout_stats import RolloutStats

__all__ = ["GradNormSpikeMonitor", "HFCheckpoint", "IterationCheckpoint", "RolloutStats"]
