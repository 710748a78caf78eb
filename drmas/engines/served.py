"""An engine in a process of its own, from the trainer's side: :class:`ServedEngine` (the rank that
starts the process and owns it: builds it, syncs its weights, closes it) and :class:`RemoteEngine`
(any other rank, connected to the process's address with the run's key: it generates only). Both
ask through :class:`EngineClient`: one request at a time, the answer awaited while the process
beats, its failure or its death named. The process's end, the request loop, is
:mod:`drmas.engines.service`; the vLLM engine and the HF engine that plays behind the update
(``--data.rollout.staleness``) are both served so.
"""

from __future__ import annotations

import os
import secrets
import socket
import subprocess
import sys
import threading
import time
from multiprocessing import AuthenticationError
from multiprocessing.connection import Client, Connection
from typing import Any, Sequence

from drmas.children import Child
from drmas.engines.base import Engine, check_request, per_prompt
from drmas.engines.service import BEAT
from drmas.ranks import env_seconds, gather_timeout_s
from drmas.records import Completion, GenerationSettings

__all__ = ["ENGINE_HOST_ENV", "EngineClient", "EngineProcessError", "HEARTBEAT_ENV", "RemoteEngine",
           "ServedEngine", "engine_heartbeat_s", "engine_host"]

HEARTBEAT_ENV = "DRMAS_ENGINE_HEARTBEAT_S"
ENGINE_HOST_ENV = "DRMAS_ENGINE_HOST"


def engine_heartbeat_s() -> float:
    """How long an engine process working on a request may send no heartbeat before the trainer
    stops it: ``$DRMAS_ENGINE_HEARTBEAT_S``, else 120 s (its beat runs in a thread of its own, so a
    build or a generation in native code that lets the interpreter go beats on)."""
    return env_seconds(HEARTBEAT_ENV, "", 120.0)


def engine_host() -> str:
    """Where an engine process takes other ranks' connections: ``$DRMAS_ENGINE_HOST``, else loopback
    when the job runs on one node, else this node's name as it resolves (the other nodes' ranks
    connect to it; a node whose name resolves to an unreachable address sets the variable)."""
    host = os.environ.get(ENGINE_HOST_ENV)
    if host:
        return host
    world = os.environ.get("WORLD_SIZE", "1")
    if os.environ.get("LOCAL_WORLD_SIZE", world) == world:
        return "127.0.0.1"
    try:
        return socket.gethostbyname(socket.getfqdn())
    except OSError:
        return "127.0.0.1"

# what a child of a rank must not read as its own: it is no rank of the job
RANK_VARIABLES = ("RANK", "LOCAL_RANK", "WORLD_SIZE", "LOCAL_WORLD_SIZE", "GROUP_RANK", "NODE_RANK",
                  "MASTER_ADDR", "MASTER_PORT")


class EngineProcessError(RuntimeError):
    """The engine process failed a request, or is gone."""


class EngineClient:
    """Requests to an engine process and their answers: one at a time (whichever thread asks), each
    awaited while the process beats, bound by --gather_timeout_s, its failure or the process's death
    raised as :class:`EngineProcessError` naming :meth:`_what`. ``kind`` names the engine in messages
    ("the vLLM engine process of solver ...")."""

    kind = "engine"
    name = ""
    on_gpu = False
    conn: Connection | None = None
    _in_flight: str | None = None  # the request awaiting its answer, if any
    _serving = False  # the process has answered or beaten: its request loop (and heartbeat) runs
    seeded = False
    """Whether each generated prompt carries a seed of its own (:meth:`seed_prompts`): its draws then
    do not depend on which other ranks' requests the process answered beside or between this end's."""
    _seed = _drawn = 0

    def _what(self) -> str:
        raise NotImplementedError

    def _alive(self) -> bool:
        """Whether the process still runs, as far as this end can tell between beats."""
        return True

    def _stop(self) -> None:
        """Give up on a process that stopped answering."""

    def _gone(self) -> str:
        """How the process ended, for the message of a request it died during."""
        return "ended"

    def _call(self, method: str, **kwargs: Any) -> Any:
        return self._request(method, **kwargs)

    def seed_prompts(self, seed: int | None = None) -> None:
        """From now on send a seed with every prompt: the ``k``-th prompt since the last reseed (``seed``)
        draws from ``(seed, k)``. Per-policy pools turn it on for every engine another rank may ask."""
        self.seeded = True
        if seed is not None:
            self._seed, self._drawn = seed, 0

    def _generate(self, prompts: Sequence[Sequence[int]], n: int, params: GenerationSettings,
                  stops: Sequence[Sequence[str]] | None, max_new_tokens: Sequence[int] | None,
                  **extra: Any) -> tuple[list[list[Completion]], int, int]:
        """A ``generate`` request, checked and with each prompt's stops and budget: the completions
        and the (prompt, cached) token counts."""
        check_request(prompts, n, params)
        if not prompts:
            return [], 0, 0
        stops, budgets = per_prompt(prompts, params, stops, max_new_tokens)
        if self.seeded:
            extra["seeds"] = [(self._seed * 1_000_003 + self._drawn + i) % 2**31 for i in range(len(prompts))]
            self._drawn += len(prompts)
        return self._call("generate", prompts=[list(p) for p in prompts], n=n, params=params, stops=stops,
                          max_new_tokens=budgets, **extra)

    def _hang_up(self) -> None:
        """Say goodbye (the process ends with its owner's) and close this end."""
        if self.conn is not None:
            try:
                self.conn.send(("close", {}))
            except OSError:
                pass
            self.conn.close()
            self.conn = None

    def _request(self, method: str, **kwargs: Any) -> Any:
        """One request; its failure, or the process's death, raised here."""
        if self.conn is None:
            raise EngineProcessError(f"{self._what()} is closed")
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
            raise EngineProcessError(f"{self._what()} is closed")
        what = self._what()
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
                elif not self._alive():
                    raise EOFError
                now = time.monotonic()
                if last_beat is not None and now - last_beat > beat_s:  # stopped, or stuck holding the GIL
                    self._stop()
                    raise EngineProcessError(f"{what} stopped answering {method!r}: no heartbeat for "
                                             f"{beat_s:.0f} s (stopped, or stuck holding its interpreter; "
                                             f"${HEARTBEAT_ENV}); it was stopped")
                if now - start > bound:  # beating but hung: the other ranks would wait too
                    self._stop()
                    raise EngineProcessError(f"{what} did not answer {method!r} within {bound:.0f} s "
                                             "(--gather_timeout_s); it was stopped")
        except (EOFError, OSError) as err:
            raise EngineProcessError(f"{what} {self._gone()} during {method!r}") from err
        if status == "error":
            message, trace = reply
            raise EngineProcessError(f"{message} (in {what}; its traceback:\n{trace})")
        return reply[0]


class ServedEngine(EngineClient, Engine):
    """The owner's end of an engine process (subclasses: what the requests are): it starts the
    process, which takes other ranks' connections at :attr:`address` with :attr:`key`."""

    process: Child | None = None
    _building = False
    address: tuple[str, int] | None = None
    """Where other ranks reach the process (:class:`RemoteEngine`), once built."""

    def _what(self) -> str:
        return f"the {self.kind} engine process of {self.name} (pid {self.pid})"

    def _alive(self) -> bool:
        return self.process is not None and self.process.alive()

    def _stop(self) -> None:
        if self.process is not None:
            self.process.close(grace_s=0)

    def _gone(self) -> str:
        try:  # its end of the socket closes as it dies: reap it for the exit code
            code = self.process.proc.wait(timeout=10) if self.process is not None else None
        except subprocess.TimeoutExpired:
            code = None
        return f"ended (exit code {code})"

    def _spawn(self, target: str, args: Sequence[str], name: str, cores: Sequence[int], env: dict[str, str],
               build: dict[str, Any], on_gpu: bool = False) -> None:
        """Start the process (``target``: ``module:function``, called with the socket's fd and
        ``args``) on ``cores`` and send the ``build`` request, answered in :meth:`ready`."""
        self.name, self.cores, self.on_gpu = name, list(cores), on_gpu
        self.key = secrets.token_bytes(32)  # the run's secret for this engine: sent over the private socket
        ours, theirs = socket.socketpair()
        try:
            self.process = Child(target, [str(theirs.fileno()), *args], name=f"{self.kind} engine {name}",
                                 threads=len(self.cores), cpus=self.cores, env=env, unset=RANK_VARIABLES,
                                 pass_fds=[theirs.fileno()])
        finally:
            theirs.close()
        self.conn = Connection(ours.detach())
        self._lock = threading.Lock()
        self.pid = self.process.pid
        self._building, self._info = True, {}
        self.conn.send(("build", {**build, "listen": {"host": engine_host(), "key": self.key}}))

    def ready(self) -> None:
        """Wait until the engine process has built its engine (a failure raised here)."""
        with self._lock:
            if not self._building:
                return
            try:
                self._info = self._receive("build")
                self.address = tuple(self._info.pop("address"))
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
        return self._request(method, **kwargs)

    def reseed(self, seed: int) -> None:
        """The process's own generator (its unseeded requests' draws), and this end's per-prompt seeds
        when it sends them."""
        self._call("reseed", seed=seed)
        if self.seeded:
            self.seed_prompts(seed)

    def served(self) -> dict[str, Any]:
        """What the process answered so far: requests per asker (``owner``, or the label a
        :class:`RemoteEngine` gave), and how many requests each call of a batched method answered."""
        return self._call("served")

    def close(self) -> None:
        """End the engine process (it also ends with this process, however that ends). One still
        answering a request of another thread (a rollout behind the update, when the run stops) is
        stopped at once, and named, rather than waited for."""
        busy = self._in_flight
        if busy is not None and self.process is not None and self.process.alive():
            print(f"drmas: the {self.kind} engine process of {self.name} (pid {self.pid}) was stopped "
                  f"during {busy!r}", file=sys.stderr, flush=True)
            self.process.close(grace_s=0)
        self._hang_up()
        if self.process is not None:
            if not self._building:  # built: it exits on "close"; building: at once
                try:
                    self.process.proc.wait(timeout=30.0)
                except subprocess.TimeoutExpired:
                    pass
            self.process.close()


class RemoteEngine(EngineClient, Engine):
    """Another rank's engine process, reached at its address with its key: this rank's requests to
    it generate (weights, sleep and adapters are its owner's). Its draws come from seeds this end
    sends with each request (set by :meth:`reseed`, one per prompt, counted on), so what a rank
    samples does not depend on which other ranks' requests the engine answered in the same batch."""

    def __init__(self, address: tuple[str, int], key: bytes, name: str, owner: int, client: str,
                 kind: str = "engine") -> None:
        """``name``: the policy (or shared base) the engine serves; ``owner``: the rank that started
        it; ``client``: who asks, as the engine counts it (e.g. ``rank 0``)."""
        self.address, self.name, self.owner, self.kind = tuple(address), name, owner, kind
        self._lock = threading.Lock()
        try:
            self.conn = Client(self.address, authkey=key)
        except (OSError, AuthenticationError) as err:
            raise EngineProcessError(f"{self._what()} cannot be reached: {type(err).__name__}: {err} "
                                     "(another run's key, or the engine ended)") from err
        self.info = self._request("hello", client=client)
        self.seed_prompts(0)

    def _what(self) -> str:
        host, port = self.address
        return f"the {self.kind} engine process of {self.name} on rank {self.owner} ({host}:{port})"

    def _stop(self) -> None:
        self.close()

    def _gone(self) -> str:
        return "ended (its connection closed)"

    def reseed(self, seed: int) -> None:
        self.seed_prompts(seed)

    def generate(self, prompts: Sequence[Sequence[int]], n: int, params: GenerationSettings,
                 stops: Sequence[Sequence[str]] | None = None,
                 max_new_tokens: Sequence[int] | None = None) -> list[list[Completion]]:
        result, prompt_tokens, cached = self._generate(prompts, n, params, stops, max_new_tokens)
        self.prompt_tokens += prompt_tokens
        self.cached_tokens += cached
        return result

    def sync_weights(self, weights: Any) -> None:
        raise EngineProcessError(f"{self._what()} takes its weights from rank {self.owner}, which owns it")

    def close(self) -> None:
        self._hang_up()
