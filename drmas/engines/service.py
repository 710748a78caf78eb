"""The engine process's end of a served engine: requests from the rank that started it (its owner,
over the socket it was started with) and from any other rank that connects to its address with the
run's key, answered by one loop in arrival order.

The protocol (:mod:`drmas.engines.served` is the asking end): a request is ``(method, kwargs)``;
the owner's first builds the server (``build``), every later one calls the server's method of that
name; the answer is ``("ok", result)`` or ``("error", message, traceback)``, and while a request
waits or runs its asker gets :data:`BEAT` once a second. A connecting rank first says who it is
(``("hello", {"client": ...})``, answered with the server's description) and may then ask only for
the server's ``batched`` methods (generation; weights, sleep and adapters are the owner's). The owner
closing its end (or dying: the process is killed with it, see :mod:`drmas.children`) ends the
process.

Several ranks' generations at once: whatever requests of a ``batched`` method (``generate``) wait
when the loop comes to the first of them are answered together by one call of the server's batched
method (vLLM: one ``generate`` over all their prompts, each with its own sampling settings), in
arrival order. Nothing waits for more to come: a request that arrives while the engine generates
joins the next batch. The other requests are answered one at a time, in arrival order.
"""

from __future__ import annotations

import os
import sys
import threading
import time
import traceback
from collections import Counter, deque
from multiprocessing.connection import Connection, Listener
from typing import Any, Callable, NoReturn

__all__ = ["BEAT", "serve"]

BEAT = "beat"
"""What an engine process sends once a second to each rank whose request waits or runs."""

OWNER = "owner"


class _Client:
    """One asking end: its connection, whether a request of it waits or runs, and a lock that keeps
    an answer and a beat from interleaving on the socket."""

    def __init__(self, conn: Connection, label: str) -> None:
        self.conn, self.label, self.busy, self.lock = conn, label, False, threading.Lock()

    def answer(self, reply: tuple[Any, ...]) -> None:
        with self.lock:
            self.busy = False
            try:
                self.conn.send(reply)
            except OSError:  # it is gone: its reader drops it
                pass


class _Hub:
    """The requests of every client in arrival order (readers put, the loop takes), the clients'
    heartbeats, and the counts a test or a log reads (``served``)."""

    def __init__(self, owner: Connection) -> None:
        self.queue: deque[tuple[_Client, str, dict[str, Any]]] = deque()
        self.ready = threading.Condition()
        self.clients: list[_Client] = []
        self.requests: Counter = Counter()  # client label -> requests answered
        self.batches: list[int] = []  # requests per call of a batched method
        self.owner = self._read(owner, OWNER)
        threading.Thread(target=self._beat, name="drmas-engine-heartbeat", daemon=True).start()

    def _read(self, conn: Connection, label: str) -> _Client:
        client = _Client(conn, label)
        self.clients.append(client)
        threading.Thread(target=self._reader, args=(client,), name=f"drmas-engine-{label}",
                         daemon=True).start()
        return client

    def _reader(self, client: _Client) -> None:
        while True:
            try:
                method, kwargs = client.conn.recv()
            except (EOFError, OSError):  # gone or closed: the owner's leaving ends the process
                if client is self.owner:
                    self._put(client, "close", {})
                self.clients.remove(client)
                return
            with client.lock:
                client.busy = method != "close"
            self._put(client, method, kwargs)

    def _put(self, client: _Client, method: str, kwargs: dict[str, Any]) -> None:
        with self.ready:
            self.queue.append((client, method, kwargs))
            self.ready.notify()

    def take(self, batched: Callable[[str], bool]) -> list[tuple[_Client, str, dict[str, Any]]]:
        """The next request, with every waiting request of the same method when it is batched."""
        with self.ready:
            while not self.queue:
                self.ready.wait()
            first = self.queue.popleft()
            if not batched(first[1]):
                return [first]
            same = [r for r in self.queue if r[1] == first[1]]
            for r in same:
                self.queue.remove(r)
            return [first, *same]

    def listen(self, host: str, key: bytes) -> tuple[str, int]:
        """Accept other ranks' connections on ``host`` (any port), those that prove ``key``."""
        listener = Listener((host, 0), authkey=key)
        threading.Thread(target=self._accept, args=(listener,), name="drmas-engine-listener",
                         daemon=True).start()
        return listener.address

    def _accept(self, listener: Listener) -> None:
        while True:
            try:
                conn = listener.accept()  # the key's challenge, both ways
                method, kwargs = conn.recv()
                if method != "hello":
                    raise ValueError(f"a connection's first request must be 'hello', got {method!r}")
            except Exception:  # a wrong key or a stray connection: refused, the engine goes on
                continue
            client = self._read(conn, str(kwargs.get("client", "?")))
            client.busy = True
            self._put(client, "hello", kwargs)

    def _beat(self) -> None:
        while True:
            time.sleep(1.0)
            for client in list(self.clients):
                with client.lock:
                    if client.busy:
                        try:
                            client.conn.send((BEAT,))
                        except OSError:
                            pass

    def counts(self) -> dict[str, Any]:
        return {"requests": dict(self.requests), "batches": list(self.batches)}


def _exit_now() -> NoReturn:
    """End the engine process without the interpreter's teardown: nothing in it is left to save once
    the trainer has closed it, and tearing down vLLM and torch took ~3.5 s on 2 CPU cores, paid by
    every run at its end (the trainer waits for the exit)."""
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(0)


def _error(err: BaseException) -> tuple[str, str, str]:
    return ("error", f"{type(err).__name__}: {err}", traceback.format_exc())


def serve(fd: str, build: Callable[..., tuple[Any, Any]]) -> None:
    """Answer requests until the owner closes its socket ``fd``: the owner's first builds the server
    (``build(**kwargs)`` -> the server and what the owner gets back; a ``listen`` entry
    ``{"host": ..., "key": ...}`` in them opens the server to other ranks, its address added to the
    answer as ``address``), each later one calls the server's method of its name."""
    hub = _Hub(Connection(int(fd)))
    server: Any = None
    info: Any = None
    batched = lambda method: server is not None and method in getattr(server, "batched", {})  # noqa: E731
    while True:
        requests = hub.take(batched)
        client, method, kwargs = requests[0]
        if method == "close":  # not answered: the asker has closed its end
            if client is hub.owner:
                _exit_now()
            continue
        if method not in ("hello", "served"):
            for c, _, _ in requests:
                hub.requests[c.label] += 1
        try:
            if batched(method):  # a batched method is open to every rank
                hub.batches.append(len(requests))
                results = getattr(server, server.batched[method])([kw for _, _, kw in requests])
                for (c, _, _), result in zip(requests, results):
                    c.answer(("ok", result))
                continue
            if server is None:
                listen = kwargs.pop("listen", None)
                server, info = build(**kwargs)
                if listen:
                    info = {**info, "address": hub.listen(listen["host"], listen["key"])}
                result = info
            elif method == "hello":
                result = info
            elif method == "served":
                result = hub.counts()
            elif client is not hub.owner:
                raise PermissionError(f"{method!r} is asked only by the rank that started this engine")
            else:
                result = getattr(server, method)(**kwargs)
            client.answer(("ok", result))
        except Exception as err:  # answered, not raised: the asker names the policy and decides
            reply = _error(err)
            for c, _, _ in requests:
                c.answer(reply)
        sys.stdout.flush()
