"""Child processes that end with the run in every way a run can end.

An engine process (and an episode worker) must never outlive the trainer that started it: a
leftover engine holds device memory and CPU cores that the next run needs. :class:`Child` starts
``module:function`` in a fresh interpreter and covers each way the trainer can end:

- normal exit, an exception, ``sys.exit`` (a SIGTERM that drmas turns into exit 143): the
  children are closed at interpreter exit (``atexit``), SIGTERM first, SIGKILL after a grace;
- SIGKILL of the trainer, or any death that runs no Python: the kernel kills the child
  (``PR_SET_PDEATHSIG``, set by the child's bootstrap before it runs anything else; if the
  trainer already died by then, the child exits at once).

The death signal follows the *thread* that started the child: start children from a thread
that lives as long as they should (the main thread), never from a short-lived worker thread.

Threads and CPU binding are set explicitly per child (``threads``, ``cpus``): two ranks with two
engines each are four processes on the same cores, and each must know its share. Linux only
(``prctl``); this module imports nothing of drmas.
"""

from __future__ import annotations

import atexit
import ctypes
import importlib
import os
import signal
import subprocess
import sys
import threading
from collections.abc import Sequence

__all__ = ["Child", "close_all", "die_with_parent"]

_PR_SET_PDEATHSIG = 1
_CPUS_ENV = "DRMAS_CHILD_CPUS"
_THREAD_VARS = ("OMP_NUM_THREADS", "MKL_NUM_THREADS", "OPENBLAS_NUM_THREADS")

_live: set[Child] = set()
_lock = threading.Lock()


def die_with_parent(parent: int) -> None:
    """Ask the kernel to SIGKILL this process when its parent dies; exit now if ``parent`` is
    already gone (it died before this call, and this process was re-parented)."""
    libc = ctypes.CDLL(None, use_errno=True)
    if libc.prctl(_PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0) != 0:
        raise OSError(ctypes.get_errno(), "prctl(PR_SET_PDEATHSIG) failed")
    if os.getppid() != parent:
        os._exit(1)


class Child:
    """``module:function(*args)`` in a process of its own that ends with this one.

    ``threads``: the child's compute threads (OMP and BLAS pools); ``cpus``: the cores it may run
    on (``sched_setaffinity``, set before the target is imported); ``env``: more variables;
    ``unset``: variables of this process the child must not inherit; ``pass_fds``: file
    descriptors the child keeps open (a socket to talk over).
    """

    def __init__(self, target: str, args: Sequence[str] = (), *, name: str = "", threads: int | None = None,
                 cpus: Sequence[int] | None = None, env: dict[str, str] | None = None,
                 unset: Sequence[str] = (), pass_fds: Sequence[int] = ()) -> None:
        if ":" not in target:
            raise ValueError(f"target must be 'module:function', got {target!r}")
        if threads is not None and threads < 1:
            raise ValueError(f"threads must be >= 1, got {threads}")
        child_env = {k: v for k, v in os.environ.items() if k not in set(unset)}
        child_env.update(env or {})
        if threads is not None:
            child_env.update({var: str(threads) for var in _THREAD_VARS})
        if cpus is not None:
            if not cpus:
                raise ValueError("cpus must name at least one core")
            child_env[_CPUS_ENV] = ",".join(str(c) for c in cpus)
        self.name = name or target
        argv = [sys.executable, "-m", "drmas.children", str(os.getpid()), target, *args]
        self.proc = subprocess.Popen(argv, env=child_env, pass_fds=tuple(pass_fds))
        with _lock:
            _live.add(self)

    @property
    def pid(self) -> int:
        return self.proc.pid

    def alive(self) -> bool:
        return self.proc.poll() is None

    def close(self, grace_s: float = 10.0) -> int | None:
        """SIGTERM, then SIGKILL after ``grace_s``; returns the exit code. Safe to call twice."""
        if self.alive():
            self.proc.terminate()
            try:
                self.proc.wait(grace_s)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        with _lock:
            _live.discard(self)
        return self.proc.returncode


def close_all() -> None:
    """Close every child this process started and has not closed yet (also run at exit)."""
    with _lock:
        children = list(_live)
    for child in children:
        child.close()


atexit.register(close_all)


def _bootstrap(argv: Sequence[str]) -> None:
    parent, target, *args = argv
    die_with_parent(int(parent))  # first: nothing below may run once the parent is gone
    cpus = os.environ.get(_CPUS_ENV)
    if cpus:
        os.sched_setaffinity(0, {int(c) for c in cpus.split(",")})
    module, _, function = target.partition(":")
    getattr(importlib.import_module(module), function)(*args)


if __name__ == "__main__":
    _bootstrap(sys.argv[1:])
