"""One line per iteration in a log file: what a cluster job's output, ``nohup`` or CI shows between
a run's start and its summary (a terminal has the episode bar instead, ``drmas.data.progress``).

    iteration 3/5 | 41.2 s: rollout 7.1, sync 0.3, update 28.4 | reward/valid verifier 0.90/0.25,
    searcher -0.10/0.00 | val avg@2 0.125 | about 1 min 24 s left
"""

from __future__ import annotations

import re
import sys
import time
from typing import Any, Sequence

__all__ = ["IterationLines", "iteration_line"]

PHASES = ("rollout", "sync", "update")
AGENT = re.compile(r"^rollout/(?P<agent>[^/]+)/(?P<what>reward_mean|valid_ratio)$")
VALIDATION = re.compile(r"^val/(avg|pass)@\d+$")


def _duration(seconds: float) -> str:
    minutes, s = divmod(int(round(seconds)), 60)
    hours, m = divmod(minutes, 60)
    return f"{hours} h {m} min" if hours else f"{m} min {s} s" if m else f"{s} s"


def iteration_line(iteration: int, total: int | None, scalars: dict[str, float], wall_s: float,
                   left_s: float | None) -> str:
    """The line of ``iteration`` (of ``total``) from the scalars it logged and its wall time."""
    parts = [f"iteration {iteration}/{total if total is not None else '?'}"]
    phases = [f"{p} {scalars[f'time/{p}_s']:.1f}" for p in PHASES if f"time/{p}_s" in scalars]
    parts.append(f"{wall_s:.1f} s" + (f": {', '.join(phases)}" if phases else ""))
    agents: dict[str, dict[str, float]] = {}
    for tag, value in scalars.items():
        m = AGENT.match(tag)
        if m:
            agents.setdefault(m["agent"], {})[m["what"]] = value
    if agents:
        parts.append("reward/valid " + ", ".join(
            f"{a} {v.get('reward_mean', float('nan')):.2f}/{v.get('valid_ratio', float('nan')):.2f}"
            for a, v in sorted(agents.items())))
    validation = [f"{tag.removeprefix('val/')} {v:.3f}" for tag, v in sorted(scalars.items())
                  if VALIDATION.match(tag)]
    if validation:
        parts.append("val " + ", ".join(validation))
    if left_s is not None:
        parts.append(f"about {_duration(left_s)} left")
    return " | ".join(parts)


class IterationLines:
    """Prints :func:`iteration_line` at each iteration's end, where ``enabled`` (default: stdout is not
    a terminal); the time left is the mean wall time of the iterations so far times those to come."""

    def __init__(self, enabled: bool | None = None) -> None:
        self.enabled = not sys.stdout.isatty() if enabled is None else enabled
        self._last: float | None = None
        self._walls: list[float] = []

    def start(self) -> None:
        self._last = time.perf_counter()

    def end(self, iteration: int, total: int | None, history: Sequence[dict[str, Any]]) -> str | None:
        now = time.perf_counter()
        wall = now - (self._last if self._last is not None else now)
        self._last = now
        self._walls.append(wall)
        if not self.enabled:
            return None
        scalars: dict[str, float] = {}
        for entry in history:
            if entry.get("iteration") == iteration:
                scalars.update({k: v for k, v in entry.items() if k != "iteration"})
        recent = self._walls[1:] or self._walls  # the first carries the warm-up and the validation before
        left = None if total is None else max(0, total - iteration) * sum(recent) / len(recent)
        line = iteration_line(iteration, total, scalars, wall, left)
        print(line, flush=True)
        return line
