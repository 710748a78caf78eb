"""Where a run's rollouts come from, chosen once (``--data.rollout.staleness``): :class:`Synchronous`
(each iteration's rollout played on the latest weights, before its update) or :class:`Pipeline`
(rollouts played behind the update, by one worker thread that plays the rollouts handed to it,
in the order they came, each to its end). Both answer the same calls (``prepare``, ``drain``,
``state``, ``load``, ``stop``), so nothing else branches on the staleness.

One thread, not a pool: a rank's engines serve one rollout at a time (a second would only queue
behind the first in the engines), and the order of the rollouts' gathers on the background's
process group must be the same on every rank. The thread is a daemon: a rank that stops while a
rollout waits in a gather on another rank leaves, instead of waiting for the gather's timeout.
"""

from __future__ import annotations

import functools
import logging
import pickle
import queue
import threading
import time
from concurrent.futures import Future
from dataclasses import dataclass, field
from typing import Any, Callable

from drmas.data.rollout_config import rollout_seed
from drmas.ranks import at, mark_background
from drmas.records import RolloutResult

__all__ = ["Background", "Pipeline", "Played", "Synchronous"]

log = logging.getLogger(__name__)


@dataclass
class Played:
    """One iteration's rollout, gathered from every rank and checked, not yet scored."""

    iteration: int
    result: RolloutResult
    scalars: dict[str, float]
    rollout_s: float
    """Seconds from the first request to the checked, gathered samples."""
    finished_at: float | None = field(default=None, compare=False)
    """``time.perf_counter()`` when it finished (None once it went through a checkpoint)."""
    started_at: float | None = field(default=None, compare=False)
    """``time.perf_counter()`` when it started (None once it went through a checkpoint)."""
    busy: dict[str, float] = field(default_factory=dict, compare=False)
    """Seconds each policy's engine answered this rollout's requests (this rank's)."""

    def __getstate__(self) -> dict[str, Any]:  # a clock reading means nothing in another process
        return {**self.__dict__, "finished_at": None, "started_at": None}


class Background:
    """Plays submitted rollouts one after the other in a daemon thread; :meth:`wait` hands one over."""

    def __init__(self, name: str = "drmas-rollout") -> None:
        self.name = name
        self._jobs: queue.SimpleQueue = queue.SimpleQueue()
        self._futures: dict[int, Future] = {}
        self._thread: threading.Thread | None = None

    def submit(self, iteration: int, play: Callable[[], Played]) -> None:
        """Queue ``play`` (iteration ``iteration``'s rollout) behind those submitted before."""
        if iteration in self._futures:
            raise RuntimeError(f"the rollout of iteration {iteration} was submitted twice")
        future: Future = Future()
        self._futures[iteration] = future
        if self._thread is None:
            self._thread = threading.Thread(target=self._work, name=self.name, daemon=True)
            self._thread.start()
        self._jobs.put((future, play))

    def _work(self) -> None:
        mark_background()
        while (job := self._jobs.get()) is not None:
            future, play = job
            if future.set_running_or_notify_cancel():
                try:
                    future.set_result(play())
                except BaseException as err:  # handed to the main thread, raised where it waits
                    future.set_exception(err)
                finally:
                    at("")  # no wait of the background's left to name

    @property
    def submitted(self) -> list[int]:
        """The iterations queued or playing, in order."""
        return sorted(self._futures)

    def wait(self, iteration: int) -> Played:
        """Iteration ``iteration``'s rollout once it finished; what stopped it raised here."""
        return self._futures.pop(iteration).result()

    def stop(self) -> list[int]:
        """Drop the queued rollouts and let the thread end after the one playing, if any (it is not
        waited for); return the iterations that were queued or playing."""
        stopped = []
        for iteration, future in sorted(self._futures.items()):
            if not future.done():
                future.cancel()
                stopped.append(iteration)
        self._futures.clear()
        if self._thread is not None:
            self._jobs.put(None)
            self._thread = None
        return stopped


class Synchronous:
    """Each iteration's rollout played on the weights after the previous update, then trained on
    (``staleness`` 0): nothing plays behind the update, nothing is kept in a checkpoint."""

    staleness = 0
    behind = False
    """Whether rollouts play while the trainer updates."""
    last: int | None = None

    def prepare(self, rollouts: Any, backend: Any, iteration: int) -> Any:
        """Sync the weights, play this rank's share of the iteration's tasks (with its own seed, of the
        run's seed, the rank and the iteration: a rollout draws the same whether the run was resumed
        or not), gather and score them."""
        t0 = time.perf_counter()
        backend.sync_weights(seed=rollout_seed(rollouts.config.seed, backend.rank, iteration))
        timings = {"time/sync_s": time.perf_counter() - t0}
        return rollouts.finish(backend, rollouts.play(backend, iteration, iteration - 1), timings)

    def drain(self) -> dict[str, float]:
        return {}

    def state(self) -> dict[str, Any] | None:
        return None

    def load(self, state: dict[str, Any]) -> None:
        raise ValueError(f"the checkpoint was written with --data.rollout.staleness {state['staleness']} and "
                         "holds the rollouts played ahead; this run is synchronous (staleness 0). Resume "
                         "with the checkpoint's staleness")

    def stop(self) -> None:
        pass


class Pipeline:
    """Rollouts N = ``staleness`` updates behind: iteration k trains on the rollout played on the
    weights after update k-1-N (after none while k <= N+1), which the background thread played
    during the updates before k. At iteration k's start the engines take the weights after update
    k-1 (nothing plays then: the pipeline was drained at k-1's end) and the rollout of k+N starts
    behind them; at k's end :meth:`drain` waits for it, so the checkpoint, validation and the next
    weight sync all find the engines idle. A rank's engines play one rollout at a time, so only one
    rollout overlaps each update whatever N is: N > 1 adds lag, not overlap."""

    behind = True

    def __init__(self, staleness: int) -> None:
        if staleness < 1:
            raise ValueError(f"a pipeline needs staleness >= 1, got {staleness}")
        self.staleness = staleness
        self.background = Background()
        self.ready: dict[int, Played] = {}
        """Played, not yet trained on: what a checkpoint keeps (:meth:`state`)."""
        self.last: int | None = None
        """The run's last iteration (``--trainer.max_epochs``): no rollout is played past it."""
        self._waited = 0.0

    def prepare(self, rollouts: Any, backend: Any, iteration: int) -> Any:
        """Iteration ``iteration``'s :class:`~drmas.records.PreparedIteration` (``rollouts``: the
        :class:`~drmas.data.rollouts.Rollouts` that plays and scores), with the rollouts up to
        ``iteration + staleness`` started behind it."""
        t0 = time.perf_counter()
        self._collect()  # nothing, but for an iteration that stopped before its drain
        backend.sync_weights()  # the weights after update k-1 (engines built at k = 1)
        t1 = time.perf_counter()
        last = iteration + self.staleness if self.last is None else min(self.last, iteration + self.staleness)
        for j in range(iteration, max(iteration, last) + 1):
            if j not in self.ready and j not in self.background.submitted:
                self.background.submit(j, functools.partial(rollouts.play, backend, j, iteration - 1,
                                                            background=True))
        if iteration in self.ready:
            played, self._waited = self.ready.pop(iteration), 0.0
        else:  # the first iteration (or the first resumed from a checkpoint without it)
            played = self.background.wait(iteration)
            self._waited = time.perf_counter() - t1
        return rollouts.finish(backend, played, {"time/sync_s": t1 - t0})

    def _collect(self) -> list[Played]:
        played = []
        for j in self.background.submitted:
            self.ready[j] = self.background.wait(j)
            played.append(self.ready[j])
        return played

    def drain(self) -> dict[str, float]:
        """Wait for every rollout started behind the update (the iteration's end); return
        ``time/trainer_wait_s`` (the trainer waiting on the engines this iteration),
        ``time/engine_idle_s`` (the engines idle, waiting on the trainer, since their rollout
        finished) and, per policy, ``train/<policy>/engine_busy_s`` (its engine answering the rollout
        played behind the update) and ``train/<policy>/engine_idle_s`` (from that rollout's start to
        now, the rest: waiting on the trainer, or on the other agents' engines and the
        environment)."""
        at("the background rollout (drain)")
        t0 = time.perf_counter()
        played = self._collect()
        now = time.perf_counter()
        finished = [p.finished_at for p in played if p.finished_at is not None]
        idle = max(0.0, now - max(finished)) if finished else 0.0
        waited, self._waited = self._waited + now - t0, 0.0
        out = {"time/trainer_wait_s": waited, "time/engine_idle_s": idle}
        for p in played:
            if p.started_at is not None:
                for policy, busy in p.busy.items():
                    out[f"train/{policy}/engine_busy_s"] = busy
                    out[f"train/{policy}/engine_idle_s"] = max(0.0, now - p.started_at - busy)
        return out

    def state(self) -> dict[str, Any] | None:
        """The rollouts played but not trained on (call after :meth:`drain`): a resumed run trains
        on them, instead of playing them again on weights it no longer has."""
        if self.background.submitted:
            raise RuntimeError(f"rollouts {self.background.submitted} still play: drain before a checkpoint")
        return {"staleness": self.staleness, "ready": pickle.dumps(self.ready)}

    def load(self, state: dict[str, Any]) -> None:
        if state["staleness"] != self.staleness:
            was = state["staleness"]
            raise ValueError(f"the checkpoint was written with --data.rollout.staleness {was}, "
                             f"this run has {self.staleness}: its rollouts were played on other weights. "
                             f"Resume with staleness {was}")
        self.ready = pickle.loads(state["ready"])

    def stop(self) -> None:
        """The run stops (a failure, a SIGTERM): drop what plays behind it, and say so."""
        stopped = self.background.stop()
        if stopped:
            log.warning("the background rollout of iteration(s) %s was stopped with the run (not trained "
                        "on; a resumed run plays it again from its checkpoint)", ", ".join(map(str, stopped)))
