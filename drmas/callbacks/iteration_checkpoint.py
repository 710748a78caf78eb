"""A resumable checkpoint (``last.ckpt``) after every iteration, whatever ``save_top_k`` says,
written so that a kill at any moment leaves a loadable one; and what to resume from when a run
stops early (preemption, an outage, an engine failure)."""

from __future__ import annotations

import os
import shutil
import sys
import time
from typing import Literal

import lightning.pytorch as pl
import torch
from lightning.pytorch.callbacks import ModelCheckpoint
from lightning.pytorch.utilities.exceptions import SIGTERMException

from drmas.atomic import COMPLETE, publish_dir, recover_dir
from drmas.callbacks.contracts import IteratedModule, require
from drmas.ranks import at, portable
from drmas.watch import watch

__all__ = ["IterationCheckpoint", "partial_path", "recover_checkpoint"]


def partial_path(filepath: str) -> str:
    """Where a checkpoint is written before it is renamed to ``filepath``."""
    return os.path.join(os.path.dirname(filepath), f".{os.path.basename(filepath)}.partial")


def recover_checkpoint(filepath: str, move: bool) -> bool:
    """Whether a whole sharded checkpoint written for ``filepath`` waits under its temporary name
    (a kill came between its completion and its swap); ``move``: swap it into place (rank 0 only)."""
    partial = partial_path(filepath)
    if not move:
        return os.path.isfile(os.path.join(partial, COMPLETE))
    return recover_dir(partial, filepath)


def checkpoint_bytes(path: str) -> int:
    """A checkpoint's size on disk: its file, or every file of its directory (sharded)."""
    if not os.path.isdir(path):
        return os.path.getsize(path)
    return sum(os.path.getsize(os.path.join(d, f)) for d, _, files in os.walk(path) for f in files)


class IterationCheckpoint(ModelCheckpoint):
    """``ModelCheckpoint`` whose ``last.ckpt`` is written at the end of every ``every_n_iterations``-th
    iteration and of the last one; with ``monitor``, also the ``save_top_k`` best iterations by a
    metric the run logs (``best-iter<K>.ckpt``), judged at each iteration that logged it: the
    validation scores exist only at the iterations that validated, and an iteration that did not is
    never ranked on an older score. A new best costs a second write of the same state.

    Lightning 2.6 writes ``last`` at an epoch end only when a top-k checkpoint was saved in the
    same step, so with ``save_top_k=0`` (no metric to rank RL iterations by) it appeared only when
    the run ended, and a killed run lost all its progress.

    Every checkpoint is written beside its target under a hidden name and renamed into place, so
    a kill during the write leaves the previous one whole. A sharded checkpoint (a directory) is
    synced to disk, marked whole, and exchanged with the previous one in one rename, so
    ``last.ckpt`` never goes missing; a kill between the mark and the swap leaves the new one
    complete under its hidden name, and ``--ckpt_path last`` moves it into place
    (:func:`recover_checkpoint`). (Lightning's own save moves a file from
    the system temp directory, which is a copy, not a rename, when that directory is on another
    file system than the checkpoints, as a node-local ``/tmp`` usually is.)

    When the run stops on an exception (SIGTERM included, see :class:`~drmas.modules.multi_agent.
    MultiAgentRL`), rank 0 prints the checkpoint to resume from and the iteration it holds.
    """

    def __init__(self, dirpath: str | None = None, every_n_iterations: int = 1, monitor: str | None = None,
                 mode: Literal["max", "min"] = "max", save_top_k: int = 1) -> None:
        """
        Args:
            dirpath: where the checkpoints go (default: ``checkpoints/`` in the run's log dir).
            every_n_iterations: write ``last.ckpt`` at the end of every this many iterations and of
                the last one (0 = never: the run cannot be resumed).
            monitor: a metric the run logs (e.g. ``val/avg@4``): keep the best iterations by it
                beside ``last.ckpt`` (default: none kept).
            mode: ``max`` (accuracy, reward) or ``min`` (a loss): which value is best.
            save_top_k: how many best iterations to keep (-1: every iteration that logged it).
        """
        if every_n_iterations < 0:
            raise ValueError(f"every_n_iterations must be >= 0, got {every_n_iterations}")
        if mode not in ("max", "min"):
            raise ValueError(f"mode must be 'max' or 'min', got {mode!r}")
        if monitor is not None and (save_top_k == 0 or save_top_k < -1):
            raise ValueError(f"save_top_k must be -1 or >= 1 with a monitor, got {save_top_k}")
        super().__init__(dirpath=dirpath, save_last=every_n_iterations > 0,
                         save_top_k=save_top_k if monitor else 0, monitor=monitor, mode=mode,
                         filename="best-iter{iteration:04d}", auto_insert_metric_name=False,
                         every_n_epochs=every_n_iterations)
        self._seen_monitor = False  # an iteration logged it (else the run's end says so)
        self._last_written_epoch: int | None = None
        self._timed = False  # the first save's size and time were printed
        self._saved_iteration: int | None = None  # the RL iteration in the last checkpoint this run wrote

    def on_train_epoch_end(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        # not ModelCheckpoint's: it ranks only at every_n_epochs and writes last only after a top-k
        if trainer.fast_dev_run or trainer.sanity_checking:
            return
        candidates = self._monitor_candidates(trainer)
        if self.monitor is not None and self.monitor in candidates:  # this iteration logged it
            self._seen_monitor = True
            self._save_topk_checkpoint(trainer, candidates)
        epoch = trainer.current_epoch
        due = (self._every_n_epochs >= 1 and (epoch + 1) % self._every_n_epochs == 0) or (
            trainer.max_epochs is not None and epoch + 1 >= trainer.max_epochs)
        if self.save_last and due and self._last_written_epoch != epoch:
            self._save_last_checkpoint(trainer, candidates)

    def _monitor_candidates(self, trainer: pl.Trainer) -> dict:
        candidates = super()._monitor_candidates(trainer)
        candidates["iteration"] = torch.tensor(getattr(trainer.lightning_module, "iteration", 0))
        return candidates

    def on_fit_end(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        if self.monitor is not None and not self._seen_monitor and trainer.is_global_zero:
            known = sorted(k for k in trainer.callback_metrics if k.startswith("val/")) or "none"
            print(f"IterationCheckpoint: no iteration logged {self.monitor!r}, so no best checkpoint was "
                  f"kept (the last iteration's validation metrics: {known}; validation runs every "
                  "--data.validation.every iterations)", file=sys.stderr, flush=True)

    def _save_last_checkpoint(self, trainer: pl.Trainer, monitor_candidates: dict) -> None:
        super()._save_last_checkpoint(trainer, monitor_candidates)
        if self.save_last:
            self._last_written_epoch = trainer.current_epoch
            self._saved_iteration = trainer.lightning_module.iteration

    def _save_checkpoint(self, trainer: pl.Trainer, filepath: str) -> None:
        # a fixed hidden name (the same on every rank, which all write into it when sharded)
        partial = partial_path(filepath)
        at("the checkpoint")
        start = time.perf_counter()
        if trainer.is_global_zero and os.path.lexists(partial):  # left by a kill: start it afresh
            shutil.rmtree(partial) if os.path.isdir(partial) else os.remove(partial)
        trainer.strategy.barrier("IterationCheckpoint.begin")
        super()._save_checkpoint(trainer, partial)  # every rank's shard is written when it returns
        failure = None
        if trainer.is_global_zero:
            try:
                if os.path.isdir(partial):  # sharded: a directory, marked whole, then swapped in
                    publish_dir(partial, filepath)
                else:
                    with open(partial, "rb") as f:
                        os.fsync(f.fileno())
                    os.replace(partial, filepath)
            except Exception as err:  # a full disk: every rank hears of it, none waits in a barrier
                failure = err
        agreed = trainer.strategy.broadcast(portable(failure, 0))
        if agreed is not None:
            raise failure if failure is not None else agreed
        self._last_checkpoint_saved = filepath
        if trainer.is_global_zero and not self._timed:  # once: what every later save will cost
            self._timed = True
            print(f"checkpoint: {checkpoint_bytes(filepath) / 1e9:.2f} GB written in "
                  f"{time.perf_counter() - start:.1f} s ({filepath}; --checkpoint.every_n_iterations "
                  f"{self._every_n_epochs} sets how often)", flush=True)

    def on_exception(self, trainer: pl.Trainer, pl_module: pl.LightningModule,
                     exception: BaseException) -> None:
        if trainer.is_global_zero:
            self.say_resume(pl_module, "preempted (SIGTERM)" if isinstance(exception, SIGTERMException)
                            else f"stopped by {type(exception).__name__}")

    def setup(self, trainer: pl.Trainer, pl_module: pl.LightningModule, stage: str) -> None:
        super().setup(trainer, pl_module, stage)
        require(pl_module, IteratedModule, "IterationCheckpoint")
        if trainer.is_global_zero:  # ended by another rank's failure: no exception reaches the hook above
            watch.at_end(lambda: self.say_resume(pl_module, "stopped by another rank's failure"))

    def say_resume(self, pl_module: pl.LightningModule, why: str) -> None:
        """The line that says where the run stopped and how to resume it."""
        iteration = pl_module.iteration
        path = self.last_model_path
        if path and os.path.exists(path):
            saved = self._saved_iteration
            held = "" if saved is None else f" (iteration {saved})"
            replay = ("" if saved is not None and saved >= iteration
                      else "; the unfinished iteration is played again from its start")
            resume = (f"the last checkpoint is {path}{held}; resume with --ckpt_path {path} "
                      f"(or --ckpt_path last){replay}")
        else:
            resume = "no checkpoint was written yet: a new run starts from the beginning"
        print(f"drmas: {why} during iteration {iteration}; {resume}", file=sys.stderr, flush=True)
