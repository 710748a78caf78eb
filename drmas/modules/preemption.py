"""Stopping a run on SIGTERM so that every rank stops together, at a point where nothing is half
done, and exits 143.

Lightning 2.6's own handler is not safe with several ranks: it runs a ``broadcast`` inside the
signal handler on whichever rank was signalled (a collective the other ranks never join), and
its per-batch check broadcasts rank 0's flag only, so a signal that reaches rank 1 alone leaves
rank 1 stopping while rank 0 waits in the next collective until the process group's timeout.

drmas replaces that handler with one that only records the signal (no collective, nothing that
could block). Each rank then looks at its own flag at two kinds of places, and the ranks agree
there: before each rollout request (the rank stops playing and joins the rollout's gather with
its stop, so every rank learns of it in that gather), and at the start of each micro-batch (one
small all-reduce of the flag). Checkpoints and weight syncs are never interrupted: a signal
that arrives during one is acted on at the next request or micro-batch.
"""

from __future__ import annotations

import logging
import signal
from typing import Any

import torch
from lightning.pytorch.utilities.exceptions import SIGTERMException

__all__ = ["StopSignal"]

log = logging.getLogger(__name__)


class StopSignal:
    """This rank's record of a SIGTERM, and the rank-wide agreement on it."""

    def __init__(self) -> None:
        self.requested = False
        """This rank received SIGTERM."""

    def install(self, trainer: Any) -> None:
        """Take over the trainer's SIGTERM handling: Lightning registers its handlers right before
        the fit loop runs, from the connector's ``_sigterm_notifier_fn``, which is therefore
        replaced on this trainer's connector (``trainer.received_sigterm`` stays False, so
        Lightning's own checks never fire)."""
        trainer._signal_connector._sigterm_notifier_fn = self._on_signal

    def _on_signal(self, signum: int, frame: Any) -> None:
        if not self.requested:
            log.warning("received %s: stopping at the next rollout request or micro-batch",
                        signal.Signals(signum).name)
        self.requested = True

    def raise_if_requested(self) -> None:
        """On this rank alone (before a rollout request): raise if the signal came."""
        if self.requested:
            raise SIGTERMException

    def raise_if_any(self, world_size: int, device: torch.device, group: Any = None) -> None:
        """A collective (every rank of ``group``, of ``world_size`` ranks, calls it at the same
        point; None: every rank, on the device): raise on every rank if any rank received the signal."""
        if world_size > 1:
            flag = torch.tensor([float(self.requested)], device=device if group is None else "cpu")
            torch.distributed.all_reduce(flag, op=torch.distributed.ReduceOp.MAX, group=group)
            self.requested = bool(flag.item() > 0)
        self.raise_if_requested()
