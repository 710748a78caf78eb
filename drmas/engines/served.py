"""An engine in a process of its own: the trainer's end (:class:`ServedEngine`: spawn the process,
one request at a time, its failure or death named) and the process's request loop (:func:`serve`).

The protocol: the trainer sends ``(method, kwargs)``; the first request builds the engine's server
(``build``), every later one calls the server's method of that name; the process answers
``("ok", result)`` or ``("error", message, traceback)``. The trainer closing its end (or dying: the
process is killed with it, see :mod:`drmas.children`) ends the process. The vLLM engine and the HF
engine that plays behind the update (``--data.rollout.staleness``) are both served so.
"""

from __future__ import annotations

import os
import socket
import subprocess
import sys
import threading
import time
import traceback
from multiprocessing.connection import Connection
from typing import Any, Callable, NoReturn, Sequence

from drmas.children import Child
from drmas.engines.base import Engine
from drmas.ranks import gather_timeout_s

__all__ = ["EngineProcessError", "ServedEngine", "serve"]

# what a child of a rank must not read as its own: it is no rank of the job
RANK_VARIABLES = ("RANK", "LOCAL_RANK", "WORLD_SIZE", "LOCAL_WORLD_SIZE", "GROUP_RANK", "NODE_RANK",
                  "MASTER_ADDR", "MASTER_PORT")


class EngineProcessError(RuntimeError):
    """The engine process failed a request, or is gone."""


class ServedEngine(Engine):
    """The trainer's end of an engine process (subclasses: what the requests are). ``kind`` names
    the engine in messages ("the vLLM engine process of solver ...")."""

    kind = "engine"
    conn: Connection | None = None
    process: Child | None = None
    _building = False
    _in_flight: str | None = None  # the request awaiting its answer, if any

    def _spawn(self, target: str, args: Sequence[str], name: str, cores: Sequence[int], env: dict[str, str],
               build: dict[str, Any], on_gpu: bool = False) -> None:
        """Start the process (``target``: ``module:function``, called with the socket's fd and
        ``args``) on ``cores`` and send the ``build`` request, answered in :meth:`ready`."""
        self.name, self.cores, self.on_gpu = name, list(cores), on_gpu
        ours, theirs = socket.socketpair()
        try:
            self.process = Child(target, [str(theirs.fileno()), *args], name=f"{self.kind} engine {name}",
                                 threads=len(self.cores), cpus=self.cores, env=env, unset=RANK_VARIABLES,
                                 pass_fds=[theirs.fileno()])
        finally:
            theirs.close()
        self.conn = Connection(ours.detach())
        self._lock = threading.Lock()  # one request at a time on the socket, whichever thread asks
        self.pid = self.process.pid
        self._building, self._info = True, {}
        self.conn.send(("build", build))

    def ready(self) -> None:
        """Wait until the engine process has built its engine (a failure raised here)."""
        with self._lock:
            if not self._building:
                return
            try:
                self._info = self._receive("build")
            except BaseException:
                self.close()
                raise
            finally:
                self._building = False
        self._built()

    def _built(self) -> None:
        """Called once the process answered its build (``self._info``: the server's description)."""

    def _call(self, method: str, **kwargs: Any) -> Any:
        """One request to the engine process; its failure, or its death, raised here."""
        self.ready()
        if self.conn is None:
            raise EngineProcessError(f"the {self.kind} engine process of {self.name} is closed")
        with self._lock:
            self._in_flight = method
            try:
                self.conn.send((method, kwargs))
            except OSError:
                pass  # it died: _receive names its exit
            try:
                return self._receive(method)
            finally:
                self._in_flight = None

    def _receive(self, method: str) -> Any:
        """The engine process's answer to ``method``."""
        if self.conn is None:
            raise EngineProcessError(f"the {self.kind} engine process of {self.name} is closed")
        what = f"the {self.kind} engine process of {self.name} (pid {self.pid})"
        bound, start = gather_timeout_s(self.on_gpu), time.monotonic()
        try:
            while not self.conn.poll(1.0):
                if not self.process.alive():
                    raise EOFError
                if time.monotonic() - start > bound:  # frozen or hung: the other ranks would wait too
                    self.process.close(grace_s=0)
                    raise EngineProcessError(f"{what} did not answer {method!r} within {bound:.0f} s "
                                             "(--gather_timeout_s); it was stopped")
            status, *reply = self.conn.recv()
        except (EOFError, OSError) as err:
            try:  # its end of the socket closes as it dies: reap it for the exit code
                code = self.process.proc.wait(timeout=10)
            except subprocess.TimeoutExpired:
                code = None
            raise EngineProcessError(f"{what} ended (exit code {code}) during {method!r}") from err
        if status == "error":
            message, trace = reply
            raise EngineProcessError(f"{message} (in the {self.kind} engine process of {self.name}; its "
                                     f"traceback:\n{trace})")
        return reply[0]

    def close(self) -> None:
        """End the engine process (it also ends with this process, however that ends). One still
        answering a request of another thread (a rollout behind the update, when the run stops) is
        stopped at once, and named, rather than waited for."""
        busy = self._in_flight
        if busy is not None and self.process is not None and self.process.alive():
            print(f"drmas: the {self.kind} engine process of {self.name} (pid {self.pid}) was stopped "
                  f"during {busy!r}", file=sys.stderr, flush=True)
            self.process.close(grace_s=0)
        if self.conn is not None:
            try:
                self.conn.send(("close", {}))
            except OSError:
                pass
            self.conn.close()
            self.conn = None
        if self.process is not None:
            if not self._building:  # built: it exits on "close"; building: at once
                try:
                    self.process.proc.wait(timeout=30.0)
                except subprocess.TimeoutExpired:
                    pass
            self.process.close()


def _exit_now() -> NoReturn:
    """End the engine process without the interpreter's teardown: nothing in it is left to save once
    the trainer has closed it, and tearing down vLLM and torch took ~3.5 s on 2 CPU cores, paid by
    every run at its end (the trainer waits for the exit)."""
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(0)


def serve(fd: str, build: Callable[..., tuple[Any, Any]]) -> None:
    """Answer requests on the socket ``fd`` until the trainer closes it: the first builds the server
    (``build(**kwargs)`` -> the server and what the trainer gets back), each later one calls the
    server's method of its name."""
    conn = Connection(int(fd))
    server = None
    while True:
        try:
            method, kwargs = conn.recv()
        except (EOFError, OSError):  # the trainer is gone or closed us
            _exit_now()
        if method == "close":  # not answered: the trainer has closed its end already
            _exit_now()
        try:
            if server is None:
                server, result = build(**kwargs)
            else:
                result = getattr(server, method)(**kwargs)
            reply: tuple[Any, ...] = ("ok", result)
        except Exception as err:  # answered, not raised: the trainer names the policy and decides
            reply = ("error", f"{type(err).__name__}: {err}", traceback.format_exc())
        try:
            conn.send(reply)
        except (BrokenPipeError, OSError):
            return
        sys.stdout.flush()
