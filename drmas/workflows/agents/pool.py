"""Episode workers: a pool of processes, each playing one episode at a time.

An episode runs in a process of its own (:mod:`drmas.episode_worker`, started as a
:class:`drmas.children.Child`, so it ends with the trainer), never in a thread of the trainer: a
program's process-global client (the Agents SDK's default client, a cached LangChain model)
then cannot carry one episode's calls into another's, a timed-out episode can be ended (its
process is killed), and a crash in user code (a segfault, ``os._exit``) fails that episode only.

Each worker also has an address of its own on the endpoint (in its environment, ``OPENAI_BASE_URL``
and the like), which reaches the episode it plays now: a client a program builds once per process
follows the worker from episode to episode. An episode's session ends when the episode does, so a
call from a thread it left running is answered 410; and since the worker's address would hand
such a call to the worker's next episode, a worker whose threads outlive its episode is ended and
replaced before it plays again (counted: ``endpoint/workers_recycled``).

The dispatcher drives the pool from the rollout's thread: :meth:`WorkerPool.schedule` ends the
episodes past their deadline, replaces dead workers and hands queued episodes to idle ones. A
thread per worker waits for its answers and wakes the dispatcher through the endpoint's inbox.
"""

from __future__ import annotations

import logging
import signal
import socket
import threading
import time
from multiprocessing.connection import Connection
from typing import Sequence

from drmas.children import Child
from drmas.workflows.agents.episodes import EpisodeRun
from drmas.workflows.agents.server import Endpoint
from drmas.episode_worker import EpisodeRef

__all__ = ["WorkerPool"]

log = logging.getLogger(__name__)

_READY_S = 300.0  # the longest a first start may take (a slow import of the user's program)


def _how_it_ended(code: int | None) -> str:
    if code is None:
        return "stopped answering"
    if code < 0:
        try:
            return f"was killed by {signal.Signals(-code).name}"
        except ValueError:
            return f"was killed by signal {-code}"
    return f"exited with code {code}"


class Worker:
    """One worker process and the thread that reads its answers."""

    def __init__(self, ref: EpisodeRef, path: list[str], cwd: str, endpoint: Endpoint, wid: str) -> None:
        ours, theirs = socket.socketpair()
        try:
            self.child = Child("drmas.episode_worker:serve", [str(theirs.fileno())],
                               name="drmas-episode-worker", threads=1, pass_fds=[theirs.fileno()])
        finally:
            theirs.close()
        # only the reader closes it (at EOF, once the process is gone): never under a blocked recv
        self.conn = Connection(ours.detach())
        self.wid, self.endpoint = wid, endpoint
        url, key = endpoint.add_worker(wid)
        self.conn.send({"episode": ref, "sys_path": path, "cwd": cwd,
                        "worker_url": url, "worker_key": key})
        self.run: EpisodeRun | None = None
        self.lingering: list[str] = []
        """Threads its last episode left running: the worker is replaced before it plays again."""
        self.checked = True
        """Whether the worker has said which threads its last episode left (it says so after the answer)."""
        self.ready = threading.Event()
        self.load_error: str | None = None
        self.dead = False
        self._inbox = endpoint.inbox
        self._lock = threading.Lock()
        self._thread = threading.Thread(target=self._read, daemon=True, name=f"drmas-worker-{self.child.pid}")
        self._thread.start()

    @property
    def idle(self) -> bool:
        return (not self.dead and self.checked and not self.lingering
                and (self.run is None or self.run.state == "ended"))

    def play(self, run: EpisodeRun, deadline: float) -> None:
        run.state, run.deadline, run.worker_pid = "playing", deadline, self.child.pid
        self.run, self.checked = run, False
        self.endpoint.assign(self.wid, run.session)
        try:
            self.conn.send(run.job())
        except OSError:  # the process died meanwhile (its reader may have ended already)
            self.dead = True
            self._end(run, f"could not begin: its worker process (pid {self.child.pid}) was gone")

    def _read(self) -> None:
        try:
            hello = self.conn.recv()
            self.load_error = hello.get("load_error")
            self.ready.set()
            while True:
                answer = self.conn.recv()
                if "lingering" in answer:
                    self.lingering, self.checked = answer["lingering"], True
                    continue
                self.run.value = answer.get("value")
                error = answer.get("error")
                self._end(self.run, None if error is None else f"raised:\n{error}")
        except (EOFError, OSError):
            pass
        self.conn.close()
        self.dead = True
        self.ready.set()
        try:
            code = self.child.proc.wait(5)
        except Exception:  # noqa: BLE001 - still running (a closed socket): say so
            code = None
        if self.run is not None:
            why = f"was lost: its worker process (pid {self.child.pid}) {_how_it_ended(code)} while it played"
            if self.load_error:
                why += f"; it could not load the episode:\n{self.load_error}"
            self._end(self.run, why)

    def _end(self, run: EpisodeRun, error: str | None) -> None:
        """Once per episode, from whichever thread sees its end first: its session ends with it."""
        with self._lock:
            if run.state == "ended":
                return
            run.error = error
            run.state = "ended"
        self.endpoint.assign(self.wid, None)
        self.endpoint.end_session(run.session)
        self._inbox.put(run)

    def kill(self) -> None:
        """End the process now (an episode past its timeout); its reader then sees EOF."""
        self.dead = True
        self.child.close(grace_s=0)

    def close(self) -> None:
        """End the process (SIGTERM, SIGKILL after a grace): a worker keeps nothing to save."""
        self.dead = True
        self.child.close(grace_s=2.0)


class WorkerPool:
    """Up to ``size`` worker processes for the episodes of ``ref``; started on demand, kept across
    rollouts, closed with the workflow (or, at the latest, with the trainer)."""

    def __init__(self, ref: EpisodeRef, path: list[str], cwd: str, size: int, endpoint: Endpoint) -> None:
        if size < 1:
            raise ValueError(f"workers must be >= 1, got {size}")
        self.ref, self.size, self.endpoint = ref, size, endpoint
        self.path, self.cwd = path, cwd
        """The ``sys.path`` and working directory each worker imports the program with."""
        self.workers: list[Worker] = []
        self.started = self.recycled = 0

    def ensure(self, wanted: int) -> None:
        """Start workers up to ``min(wanted, size)`` and wait until each has imported the program;
        one that cannot is an error naming the worker's traceback."""
        new = [self._start() for _ in range(min(wanted, self.size) - len(self.workers))]
        if not new:
            return
        t0 = time.monotonic()
        for w in new:
            if not w.ready.wait(_READY_S):
                raise RuntimeError(f"an episode worker did not start within {_READY_S:g} s")
            if w.load_error or w.dead:
                self.close()
                raise RuntimeError("the episode could not be loaded in a worker process:\n"
                                   f"{w.load_error or 'the process ended before it said so'}")
        log.info("agents workflow: %d episode worker(s) started in %.1f s", len(new), time.monotonic() - t0)

    def _start(self) -> Worker:
        w = Worker(self.ref, self.path, self.cwd, self.endpoint, f"w{self.started}")
        self.workers.append(w)
        self.started += 1
        return w

    def schedule(self, runs: Sequence[EpisodeRun], timeout_s: float) -> None:
        """End the episodes past their deadline (their processes too), replace dead workers and give
        queued episodes to idle ones, in the rollout's order."""
        now = time.monotonic()
        for w in self.workers:
            run = w.run
            if run is not None and run.running and now > run.deadline:
                run.timed_out = True
                self.endpoint.assign(w.wid, None)
                self.endpoint.end_session(run.session)
                w.kill()
        for w in self.workers:  # threads its episode left running would call into the next one
            if w.lingering and not w.dead:
                log.info("agents workflow: worker pid %d replaced: its episode left threads running (%s)",
                         w.child.pid, ", ".join(w.lingering))
                w.kill()
                self.recycled += 1
        # a dead worker stays listed until its reader has ended its episode
        self.workers = [w for w in self.workers
                        if not w.dead or (w.run is not None and w.run.state == "playing")]
        queued = [r for r in runs if r.state == "queued"]
        idle = [w for w in self.workers if w.idle]
        while len(idle) < len(queued) and len(self.workers) < self.size:
            idle.append(self._start())
        for w, run in zip(idle, queued):
            w.play(run, now + timeout_s)

    def abandon(self) -> None:
        """End the workers still playing an episode (of a rollout that stopped early)."""
        for w in self.workers:
            if w.run is not None and w.run.state == "playing":
                w.kill()

    def close(self) -> None:
        for w in self.workers:
            w.close()
        self.workers = []
