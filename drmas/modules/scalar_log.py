"""Where a run's scalars go besides the module's ``history``: every logger and the log folder's
``metrics.jsonl`` (rank 0), and ``trainer.callback_metrics`` (every rank, the current iteration's
only), where Lightning's callbacks read them."""

from __future__ import annotations

import json
import os
from typing import Any, Sequence

import torch

from drmas.records import METRICS_FILE

__all__ = ["ScalarLog"]


class ScalarLog:
    """One run's scalar sinks. In ``trainer.callback_metrics`` (``ModelCheckpoint(monitor="val/avg@4")``,
    ``EarlyStopping``) a scalar logged at an earlier iteration (a validation that did not run at this
    one) is taken out when the next iteration logs, so nothing is judged on an old value."""

    def __init__(self) -> None:
        self.path: str | None = None  # METRICS_FILE, on rank 0 once fit starts
        self.keys: set[str] = set()  # of callback_metrics, the current iteration's
        self.step: int | None = None

    def open(self, log_dir: str | None, rank_zero: bool) -> None:
        """Append to ``log_dir``'s :data:`METRICS_FILE` from now on (rank 0); a line a kill cut short
        is closed first, so the next line stays whole (its readers skip the cut one)."""
        if not (log_dir and rank_zero):
            return
        os.makedirs(log_dir, exist_ok=True)
        self.path = os.path.join(log_dir, METRICS_FILE)
        if os.path.getsize(self.path) if os.path.exists(self.path) else 0:
            with open(self.path, "rb+") as f:
                f.seek(-1, os.SEEK_END)
                if f.read(1) != b"\n":
                    f.write(b"\n")

    def write(self, callback_metrics: dict[str, Any], loggers: Sequence[Any], metrics: dict[str, float],
              step: int, rank_zero: bool) -> None:
        if step != self.step:
            for key in self.keys:
                callback_metrics.pop(key, None)
            self.keys, self.step = set(), step
        callback_metrics.update({k: torch.tensor(float(v)) for k, v in metrics.items()})
        self.keys.update(metrics)
        if not rank_zero:
            return
        for logger in loggers:
            logger.log_metrics(metrics, step=step)
        if self.path:
            with open(self.path, "a") as f:
                f.write(json.dumps({"iteration": step, **{k: float(v) for k, v in metrics.items()}}) + "\n")
