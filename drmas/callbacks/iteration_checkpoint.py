"""A resumable checkpoint (``last.ckpt``) after every iteration, whatever ``save_top_k`` says."""

from __future__ import annotations

from typing import Any

import lightning.pytorch as pl
from lightning.pytorch.callbacks import ModelCheckpoint

__all__ = ["IterationCheckpoint"]


class IterationCheckpoint(ModelCheckpoint):
    """``ModelCheckpoint`` whose ``last.ckpt`` is written at the end of every ``every_n_epochs``-th
    iteration and of the last one.

    Lightning 2.6 writes ``last`` at an epoch end only when a top-k checkpoint was saved in the
    same step, so with ``save_top_k=0`` (no metric to rank RL iterations by) it appeared only when
    the run ended, and a killed run lost all its progress. The file is written through a temporary
    file and renamed (Lightning's atomic save), so a kill during the write leaves the previous one.
    """

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self._last_written_epoch: int | None = None

    def on_train_epoch_end(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        super().on_train_epoch_end(trainer, pl_module)  # top-k files, when asked for
        epoch = trainer.current_epoch
        due = (self._every_n_epochs >= 1 and (epoch + 1) % self._every_n_epochs == 0) or (
            trainer.max_epochs is not None and epoch + 1 >= trainer.max_epochs)
        if (self.save_last and due and self._last_written_epoch != epoch
                and not trainer.fast_dev_run and not trainer.sanity_checking):
            self._save_last_checkpoint(trainer, self._monitor_candidates(trainer))

    def _save_last_checkpoint(self, trainer: pl.Trainer, monitor_candidates: dict) -> None:
        super()._save_last_checkpoint(trainer, monitor_candidates)
        if self.save_last:
            self._last_written_epoch = trainer.current_epoch
