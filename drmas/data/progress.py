"""A progress bar over the episodes of a rollout or a validation: done / total and the success
rate so far. Shown in a terminal (stderr is a TTY) on rank 0, off in logs and CI unless asked."""

from __future__ import annotations

import sys
from typing import Any

__all__ = ["EpisodeBar", "show_progress"]


def show_progress(setting: bool | None, rank: int = 0) -> bool:
    """``setting`` True/False, or None: on rank 0 when stderr is a terminal."""
    if setting is not None:
        return setting and rank == 0
    return rank == 0 and sys.stderr.isatty()


class EpisodeBar:
    """Counts finished episodes (call it with each one's success); a tqdm bar when ``enabled``."""

    def __init__(self, total: int, desc: str, enabled: bool) -> None:
        self.done = self.solved = 0
        self._bar: Any = None
        if enabled:
            from tqdm.auto import tqdm

            self._bar = tqdm(total=total, desc=desc, unit="episode", leave=False, dynamic_ncols=True)

    @property
    def active(self) -> bool:
        return self._bar is not None

    def __call__(self, success: bool) -> None:
        self.done += 1
        self.solved += bool(success)
        if self._bar is not None:
            self._bar.update(1)
            self._bar.set_postfix(success=f"{self.solved / self.done:.2f}", refresh=False)

    def close(self) -> None:
        if self._bar is not None:
            self._bar.close()
            self._bar = None
