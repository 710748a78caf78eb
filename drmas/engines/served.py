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
from drmas.ranks import env_seconds, gather_timeout_s

__all__ = ["BEAT", "EngineProcessError", "HEARTBEAT_ENV", "ServedEngine", "engine_heartbeat_s", "serve"]

HEARTBEAT_ENV = "DRMAS_ENGINE_HEARTBEAT_S"
BEAT = "beat"
"""What an engine process sends once a second while it works on a request (:class:`_Heartbeat`)."""


def engine_heartbeat_s() -> float:
    """How long an engine process working on a request may send no heartbeat before the trainer
    stops it: ``$DRMAS_ENGINE_HEARTBEAT_S``, else 120 s (its beat runs in a thread of its own, so a
    build or a generation in native code that lets the interpreter go beats on)."""
    return env_seconds(HEARTBEAT_ENV, "", 120.0)

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
    _serving = False  # the process has answered or beaten: its request loop (and heartbeat) runs

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
        bound, beat_s = gather_timeout_s(self.on_gpu), engine_heartbeat_s()
        # the beat starts with the request loop: while the process still imports, the first
        # request (the build) is bound by --gather_timeout_s alone
        start = time.monotonic()
        last_beat = start if self._serving else None
        try:
            while True:
                if self.conn.poll(1.0):
                    status, *reply = self.conn.recv()
                    self._serving = True
                    if status != BEAT:
                        break
                    last_beat = time.monotonic()
                elif not self.process.alive():
                    raise EOFError
                now = time.monotonic()
                if last_beat is not None and now - last_beat > beat_s:  # stopped, or stuck holding the GIL
                    self.process.close(grace_s=0)
                    raise EngineProcessError(f"{what} stopped answering {method!r}: no heartbeat for "
                                             f"{beat_s:.0f} s (stopped, or stuck holding its interpreter; "
                                             f"${HEARTBEAT_ENV}); it was stopped")
                if now - start > bound:  # beating but hung: the other ranks would wait too
                    self.process.close(grace_s=0)
                    raise EngineProcessError(f"{what} did not answer {method!r} within {bound:.0f} s "
                                             "(--gather_timeout_s); it was stopped")
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
    heart = _Heartbeat(conn)
    server = None
    while True:
        try:
            method, kwargs = conn.recv()
        except (EOFError, OSError):  # the trainer is gone or closed us
            _exit_now()
        if method == "close":  # not answered: the trainer has closed its end already
            _exit_now()
        heart.busy = True
        try:
            if server is None:
                server, result = build(**kwargs)
            else:
                result = getattr(server, method)(**kwargs)
            reply: tuple[Any, ...] = ("ok", result)
        except Exception as err:  # answered, not raised: the trainer names the policy and decides
            reply = ("error", f"{type(err).__name__}: {err}", traceback.format_exc())
        try:
            heart.send(reply)
        except (BrokenPipeError, OSError):
            return
        sys.stdout.flush()


class _Heartbeat:
    """A thread that sends :data:`BEAT` once a second while a request is being answered (only then:
    the trainer reads the socket only while it waits for an answer, and beats between requests would
    fill it), so the trainer tells an engine process at work from one that is stopped or stuck
    with the interpreter held (``SIGSTOP``, a native call that never returns and never lets go)."""

    def __init__(self, conn: Connection) -> None:
        self.conn, self.busy, self._lock = conn, False, threading.Lock()
        threading.Thread(target=self._beat, name="drmas-engine-heartbeat", daemon=True).start()

    def send(self, reply: tuple[Any, ...]) -> None:
        """Send a request's answer; no beat follows it until the next request."""
        with self._lock:
            self.busy = False
            self.conn.send(reply)

    def _beat(self) -> None:
        while True:
            time.sleep(1.0)
            with self._lock:
                if self.busy:
                    try:
                        self.conn.send((BEAT,))
                    except OSError:  # the trainer is gone: the request loop ends the process
                        return
