"""What ranks tell each other when one of them fails, and the bound on every wait between them.

Three mechanisms, from the cheapest:

* **Agreement** (:func:`portable`, :func:`raise_first`): where one rank can fail between
  collectives, the ranks gather their failures at the next one and every rank raises the lowest
  failed rank's exception there, instead of one rank raising while the others wait.
* **The failure board** (:class:`Watch`): a rank that fails anywhere else (inside a collective,
  where nothing can be agreed) posts one line in the rendezvous store and waits a moment for the
  others to read it; every rank's watch thread looks at the board each second and stops its rank
  with that line, whatever the rank is blocked in.
* **The timeout** (:func:`collective_timeout_s`): the process group's timeout, so a rank that
  never answers (frozen, hung) is given up on; the ranks that waited then name it through a
  monitored barrier on a side group.

Every rank ends with one line naming the failing rank and its error (:func:`stop_line`), not the
backend's transport error. Imports nothing of drmas.
"""

from __future__ import annotations

import datetime
import os
import pickle
import re
import sys
import threading
import time
from typing import Any, Callable, Sequence

__all__ = ["TIMEOUT_ENV", "Watch", "agree", "at", "collective_timeout_s", "portable", "raise_first",
           "silent_ranks", "stop_line", "watch", "watch_state"]

TIMEOUT_ENV = "DRMAS_COLLECTIVE_TIMEOUT_S"
_FAILED, _READ = "drmas/failed", "drmas/read"
_POLL_S, _ACK_S = 1.0, 10.0


def collective_timeout_s(on_gpu: bool | None = None) -> float:
    """The bound on every wait between ranks, in seconds: ``$DRMAS_COLLECTIVE_TIMEOUT_S`` (which
    ``--collective_timeout_s`` sets), else 1800 on GPUs and 300 on CPU."""
    value = os.environ.get(TIMEOUT_ENV, "").strip()
    if value:
        try:
            seconds = float(value)
        except ValueError:
            seconds = -1.0
        if not seconds > 0:
            raise ValueError(f"${TIMEOUT_ENV} (--collective_timeout_s) must be seconds > 0, got {value!r}")
        return seconds
    if on_gpu is None:
        import torch

        on_gpu = torch.cuda.is_available()
    return 1800.0 if on_gpu else 300.0


def portable(err: BaseException | None, rank: int) -> BaseException | None:
    """``err`` as another process can receive it: itself if it pickles, else a RuntimeError naming
    it; ``rank``: the rank it happened on, kept as ``failed_rank``."""
    if err is None:
        return None
    try:
        clone = pickle.loads(pickle.dumps(err))
    except Exception:
        clone = RuntimeError(f"{type(err).__name__}: {err}")
    clone.failed_rank = rank
    if hasattr(clone, "add_note"):  # Python 3.11+
        clone.add_note(f"(raised on rank {rank}; that rank's log has its traceback)")
    return clone


def raise_first(failures: Sequence[BaseException | None], rank: int, own: BaseException | None) -> None:
    """Raise, on every rank alike, the failure of the lowest failed rank (``failures``: every
    rank's :func:`portable` failure, gathered); this rank raises its own exception object when it
    is that rank, with its traceback. Nothing when no rank failed."""
    first = next((r for r, err in enumerate(failures) if err is not None), None)
    if first is None:
        return
    if first == rank and own is not None:
        raise own
    raise failures[first]


# ---- where each rank is, for the lines that name a wait ------------------------------------


class _Where:
    what = "start-up"
    iteration = 0


watch_state = _Where()


def at(what: str) -> None:
    """Name the wait (or the collective work) this rank enters; the line that reports a failure
    says where it came from."""
    watch_state.what = what


def agree(gather: Callable[[Any], list[Any]], rank: int, failure: BaseException | None) -> None:
    """A collective (``gather``: every rank's object in rank order): raise this rank's
    ``failure``, or another rank's, on every rank alike."""
    raise_first(gather(portable(failure, rank)), rank, failure)


# ---- the line every rank ends with -------------------------------------------------------------

_TRANSPORT = ("Connection closed by peer", "Connection reset by peer", "Broken pipe", "Socket closed",
              "NCCL communicator was aborted", "Connection refused")
_TIMEOUT = ("Timed out waiting", "timed out", "Watchdog caught collective operation timeout")


def _text(err: BaseException) -> str:
    lines = str(err).strip().splitlines()
    first = lines[0] if lines else ""
    return f"{type(err).__name__}: {first[:400]}"


def stop_line(err: BaseException, rank: int, board: str | None, silent: list[int] | None) -> tuple[str, bool]:
    """The line rank ``rank`` ends with after ``err``, and whether ``err`` is this rank's own
    failure (whose traceback it shows). ``board``: a failure another rank posted; ``silent``: the
    ranks that did not answer a monitored barrier (None: not asked)."""
    at = _at()
    failed = getattr(err, "failed_rank", None)
    if failed is not None and failed != rank:  # agreed: the same exception raised on every rank
        return f"drmas: rank {failed} failed {at}: {_text(err)}; every rank stopped", False
    message = str(err)
    if any(t in message for t in _TRANSPORT) or any(t in message for t in _TIMEOUT):
        if board:
            return f"{board}; rank {rank} stopped in {watch_state.what}", False
        if any(t in message for t in _TIMEOUT):
            who = (f"rank{'s' if len(silent) > 1 else ''} {', '.join(map(str, silent))} did not answer "
                   "(frozen, hung or lost)" if silent else "no rank could be named")
            return (f"drmas: rank {rank} waited {collective_timeout_s():.0f} s in {watch_state.what} {at} "
                    f"and gave up (--collective_timeout_s); {who}"), False
        return (f"drmas: rank {rank} lost another rank in {watch_state.what} {at} (its process ended "
                "without saying why; its log has the cause)"), False
    return f"drmas: rank {rank} failed {at} in {watch_state.what}: {_text(err)}", True


def silent_ranks(group: Any, rank: int, timeout_s: float) -> list[int] | None:
    """The ranks that do not pass a monitored barrier on ``group`` (a gloo side group) within
    ``timeout_s``; None when it cannot tell."""
    import torch.distributed as dist

    try:
        dist.monitored_barrier(group=group, timeout=datetime.timedelta(seconds=timeout_s),
                               wait_all_ranks=True)
        return []
    except Exception as err:
        found = re.search(r"Ranks? ([\d, ]+) failed to pass monitoredBarrier", str(err))
        if found:
            return [int(r) for r in found.group(1).replace(" ", "").split(",") if r]
        return [0] if rank != 0 else None  # the other ranks wait on rank 0 alone


# ---- the failure board --------------------------------------------------------------------------


class Watch:
    """This rank's view of the failure board: a thread that stops the process (exit 1, with the
    posted line) once another rank has posted a failure, or once rank 0, which hosts the store,
    is gone. Started after the process group, on every rank; :meth:`stop` before ranks leave."""

    def __init__(self) -> None:
        self.store: Any = None
        self.rank, self.world = 0, 1
        self.side: Any = None
        self._stop = threading.Event()
        self._ending = threading.Lock()

    def start(self, rank: int, world: int) -> None:
        import torch.distributed as dist

        if world <= 1 or self.store is not None:
            return
        self.rank, self.world = rank, world
        self.side = dist.new_group(backend="gloo")  # for the monitored barrier, whatever the backend
        host, port = os.environ.get("MASTER_ADDR"), os.environ.get("MASTER_PORT")
        try:  # a client of its own: the process group's store object is not shared across threads
            self.store = dist.TCPStore(host, int(port), world, is_master=False,
                                       timeout=datetime.timedelta(seconds=30), wait_for_workers=False)
        except Exception as err:  # e.g. no MASTER_ADDR: the agreements and the timeout still hold
            print(f"drmas: rank {rank}: no failure board ({type(err).__name__}: {err}); a rank that fails "
                  "inside a collective is noticed at the timeout", file=sys.stderr, flush=True)
            return
        self._stop.clear()
        threading.Thread(target=self._run, name="drmas-rank-watch", daemon=True).start()

    def stop(self) -> None:
        self._stop.set()

    def _run(self) -> None:
        while not self._stop.wait(_POLL_S):
            try:
                posted = self.store.check([_FAILED])
                line = self.store.get(_FAILED).decode() if posted else None
            except Exception:
                if self._stop.is_set() or self.rank == 0:
                    return
                line = f"drmas: rank 0 is gone (the store it hosts stopped answering) {_at()}"
            if line is None or line.startswith(f"drmas: rank {self.rank} "):
                continue
            if self._ending.acquire(blocking=False):
                self._acknowledge()
                _exit(f"{line}; rank {self.rank} stopped in {watch_state.what}")

    def _acknowledge(self) -> None:
        try:
            self.store.add(_READ, 1)
        except Exception:
            pass

    def end(self, err: BaseException) -> None:
        """End this rank after ``err`` with its one line: post it when it is this rank's own
        failure (and wait up to 10 s for the others to read it), acknowledge another's."""
        if not self._ending.acquire(blocking=False):  # the watch thread is ending the process
            time.sleep(60)
        self._stop.set()
        board = None
        try:
            if self.store is not None and self.store.check([_FAILED]):
                board = self.store.get(_FAILED).decode()
        except Exception:
            pass
        silent = None
        if board is None and any(t in str(err) for t in _TIMEOUT) and self.side is not None:
            silent = silent_ranks(self.side, self.rank, min(10.0, collective_timeout_s()))
        line, own = stop_line(err, self.rank, board, silent)
        if own:
            import traceback

            traceback.print_exception(err)
        if self.store is not None:
            try:
                if own or silent:
                    self.store.compare_set(_FAILED, "", line)  # the first failure posted stays
                    readers = self.world - 1 - len(silent or [])  # a frozen rank reads nothing
                    deadline = time.monotonic() + _ACK_S
                    while int(self.store.add(_READ, 0)) < readers and time.monotonic() < deadline:
                        time.sleep(0.2)
                else:
                    self._acknowledge()
            except Exception:
                pass
        _exit(line)


def _at() -> str:
    return f"during iteration {watch_state.iteration}"


def _exit(line: str) -> None:
    print(line, file=sys.stderr, flush=True)
    sys.stdout.flush()
    os._exit(1)


watch = Watch()
