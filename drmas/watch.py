"""The failure board and the heartbeat: each rank's watch thread, which ends its rank with another
rank's line (drmas.ranks says what the lines are and why there are three mechanisms).

Every key lives in the rendezvous store under this attempt's prefix (``drmas.ranks.attempt``).
Imports nothing of drmas but :mod:`drmas.ranks`.
"""

from __future__ import annotations

import datetime
import os
import sys
import threading
import time
from typing import Any, Callable

from drmas import ranks
from drmas.ranks import (_TIMEOUT, _TRANSPORT, _at, _prefix, collective_timeout_s, gather_timeout_s,
                         heartbeat_s, silent_ranks, stop_line, store_host, watch_state)

__all__ = ["Watch", "watch"]

_POLL_S, _ACK_S, _STORE_S = 1.0, 10.0, 30.0


class Watch:
    """This rank's view of the failure board: a thread that beats this rank's heartbeat and stops
    the process (exit 1, with the posted line) once another rank has posted a failure, another
    rank's heartbeat stopped, or the store's host (rank 0, or torchrun's agent) is gone. Started
    after the process group, on every rank; :meth:`stop` before ranks leave."""

    def __init__(self) -> None:
        self.store: Any = None
        self.rank, self.world = 0, 1
        self.side: Any = None
        self.objects: Any = None  # the gloo group of the object gathers and agreements
        self.behind: Any = None  # the same for the background rollout's gathers (a thread of its own)
        self._stop = threading.Event()
        self._ending = threading.Lock()
        self._failed = self._read = self._beat = ""
        self._posted = ""  # this rank's own failure line, once posted
        self._limit = 30.0
        self._last_words: list[Callable[[], None]] = []
        self._thread: threading.Thread | None = None

    def at_end(self, say: Callable[[], None]) -> None:
        """Run ``say`` (bounded work: a line, a flush) when the watch thread ends this rank for
        another rank's failure; the rank's own failures go through Lightning's exception hooks."""
        self._last_words.append(say)

    def start(self, rank: int, world: int) -> None:
        """Watch from now on (every rank, once its process group exists, before anything that can
        fail alone, model loading included)."""
        import torch.distributed as dist

        if world <= 1 or self.store is not None:
            return
        self.rank, self.world = rank, world
        self._limit = heartbeat_s()  # a bad value refused here, in the rank's own thread
        prefix = _prefix()
        self._failed, self._read, self._beat = f"{prefix}/failed", f"{prefix}/read", f"{prefix}/beat"
        self.side = dist.new_group(backend="gloo")  # for the monitored barrier, whatever the backend
        # object gathers wait for the slowest rank's rollout: a long bound of their own, on gloo
        # (an NCCL object gather pickles through the GPU and shares the tensor collectives' bound)
        self.objects = dist.new_group(backend="gloo", timeout=datetime.timedelta(seconds=gather_timeout_s()))
        # a rollout played in the background (--data.rollout.staleness) gathers while the main thread
        # agrees on the update's steps: on one group their collectives would interleave differently
        # on each rank; on two, each thread's run in its own fixed order
        self.behind = dist.new_group(backend="gloo", timeout=datetime.timedelta(seconds=gather_timeout_s()))
        host, port = os.environ.get("MASTER_ADDR"), os.environ.get("MASTER_PORT")
        try:  # a client of its own: the process group's store object is not shared across threads
            self.store = dist.TCPStore(host, int(port), world, is_master=False,
                                       timeout=datetime.timedelta(seconds=_STORE_S), wait_for_workers=False)
            for other in range(world):  # every count exists from here: one multi_get reads them all
                self.store.add(f"{self._beat}/{other}", 0)
        except Exception as err:  # e.g. no MASTER_ADDR: the agreements and the timeout still hold
            print(f"drmas: rank {rank}: no failure board ({type(err).__name__}: {err}); a rank that fails "
                  "inside a collective is noticed at the timeout", file=sys.stderr, flush=True)
            self.store = None
            return
        self._stop.clear()
        self._thread = threading.Thread(target=self._run, name="drmas-rank-watch", daemon=True)
        self._thread.start()

    def stop(self, wait: bool = True) -> None:
        """Stop watching: this rank is leaving or ending (its heartbeat stops, so it says so first).
        ``wait``: return once the watch thread has ended (a rank that leaves normally): a daemon
        thread still inside a store request when the interpreter exits aborts the process
        ("terminate called without an active exception", exit -6) as that request returns, after a
        run that finished. A rank that ends on a failure (:meth:`end`) goes by ``os._exit``, with no
        teardown: it does not wait (a store gone silent would hold it up to the store's timeout)."""
        if self.store is not None and not self._stop.is_set():
            try:
                self.store.set(f"{self._beat}/{self.rank}/left", "1")
            except Exception:
                pass
        self._stop.set()
        thread, self._thread = self._thread, None
        if wait and thread is not None and thread is not threading.current_thread():
            thread.join(_STORE_S + _POLL_S)  # a request outlives the store's timeout by no more

    def _run(self) -> None:
        limit = self._limit
        seen: dict[int, tuple[int, float]] = {}  # rank -> (its count, when it last changed, here)
        while not self._stop.wait(_POLL_S):
            try:
                self.store.add(f"{self._beat}/{self.rank}", 1)
                posted = self.store.check([self._failed])
                line = self.store.get(self._failed).decode() if posted else None
                if line is None:
                    line = self._silent(seen, limit)
            except Exception:
                host = store_host()
                if self._stop.is_set() or (self.rank == 0 and host == "rank 0"):
                    return
                if self._posted:  # the others read this rank's own line and left: end with it
                    ranks._exit(f"{self._posted}; rank {self.rank} stopped in {watch_state.what}")
                line = f"drmas: {host} is gone (the rendezvous store it hosts stopped answering) {_at()}"
            if line is None or line.startswith(f"drmas: rank {self.rank} "):
                continue
            if self._ending.acquire(blocking=False):
                self._acknowledge()
                for say in self._last_words:
                    try:
                        say()
                    except Exception:
                        pass
                ranks._exit(f"{line}; rank {self.rank} stopped in {watch_state.what}")

    def _counts(self) -> dict[int, int]:
        """The other ranks' heartbeat counts, in one request to the store (a poll costs the store two
        requests per rank, whatever the number of ranks)."""
        others = [r for r in range(self.world) if r != self.rank]
        return dict(zip(others, map(int, self.store.multi_get([f"{self._beat}/{r}" for r in others]))))

    def _left(self, other: int) -> bool:
        return self.store.check([f"{self._beat}/{other}/left"])

    def _silent(self, seen: dict[int, tuple[int, float]], limit: float) -> str | None:
        """The line for the first rank whose heartbeat stopped ``limit`` seconds ago (else None)."""
        now = time.monotonic()
        for other, count in self._counts().items():
            last = seen.get(other)
            if last is None or count != last[0]:
                seen[other] = (count, now)
            elif count > 0 and now - last[1] > limit and not self._left(other):
                line = (f"drmas: rank {other} stopped answering {_at()} (no heartbeat for {limit:.0f} s: "
                        "killed, out of memory, crashed or stopped; its log or the system's has the cause)")
                try:  # the first line posted stays; the others read this one
                    self.store.compare_set(self._failed, "", line)
                    line = self.store.get(self._failed).decode()
                except Exception:
                    pass
                return line
        return None

    def _not_beating(self, wait_s: float) -> list[int]:
        """The other ranks whose heartbeat does not move for ``wait_s`` seconds (a live rank's moves
        every second) and that did not leave on purpose."""
        try:
            before = self._counts()
            time.sleep(wait_s)
            after = self._counts()
            return [r for r in sorted(before) if after[r] == before[r] and not self._left(r)]
        except Exception:
            return []

    def _acknowledge(self) -> None:
        try:
            self.store.add(self._read, 1)
        except Exception:
            pass

    def post(self, err: BaseException) -> None:
        """Post ``err``'s line now, when it is this rank's own failure, without ending the rank: called
        as soon as the failure is known (before Lightning's teardown, whose collectives or engine
        closing could hold this rank), so the others end within a second. :meth:`end` follows."""
        if self.store is None:
            return
        line, own = stop_line(err, self.rank, None, None)
        if own:
            try:
                self.store.compare_set(self._failed, "", line)
                self._posted = line
            except Exception:
                pass

    def end(self, err: BaseException) -> None:
        """End this rank after ``err`` with its one line: post it when it is this rank's own
        failure (and wait up to 10 s for the others to read it), acknowledge another's."""
        if not self._ending.acquire(blocking=False):  # the watch thread is ending the process
            time.sleep(60)
        self.stop(wait=False)  # said first: a rank ending with a line of its own is not a silent one
        if self.store is None:  # not watching (yet): this rank as the process group knows it
            import torch.distributed as dist

            if dist.is_available() and dist.is_initialized():
                self.rank = dist.get_rank()
        board = None
        try:
            if self.store is not None and self.store.check([self._failed]):
                board = self.store.get(self._failed).decode()
                if board.startswith(f"drmas: rank {self.rank} "):  # this rank's own, posted early
                    board = None
        except Exception:
            pass
        silent = None
        if board is None and any(t in str(err) for t in _TIMEOUT) and self.side is not None:
            silent = silent_ranks(self.side, self.rank, min(10.0, collective_timeout_s()))
        elif board is None and any(t in str(err) for t in _TRANSPORT) and self.store is not None:
            silent = self._not_beating(5.0) or None
        line, own = stop_line(err, self.rank, board, silent)
        if own:
            import traceback

            traceback.print_exception(err)
        if self.store is not None:
            try:
                if own or silent:
                    self.store.compare_set(self._failed, "", line)  # the first failure posted stays
                    readers = self.world - 1 - len(silent or [])  # a frozen rank reads nothing
                    deadline = time.monotonic() + _ACK_S
                    while int(self.store.add(self._read, 0)) < readers and time.monotonic() < deadline:
                        time.sleep(0.2)
                else:
                    self._acknowledge()
            except Exception:
                pass
        ranks._exit(line)


watch = Watch()
