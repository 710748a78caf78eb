"""The process side of the agents endpoint: a worker that imports the user's episode function once
and plays one episode at a time, as the trainer asks, each with its own URL and key.

A worker is a fresh interpreter (:class:`drmas.children.Child`), so the function travels by
reference (:data:`EpisodeRef`), the way spawn-started multiprocessing finds a target, and is
imported with the user's import world (:func:`program_path`), never with drmas's own script
folders. This module imports nothing heavy (no torch, nothing of drmas but the child helper), so a
worker starts in about the time ``import openai`` takes.

The worker's environment points every client a program builds from it (``OPENAI_BASE_URL``,
``OPENAI_API_BASE``, ``OPENAI_API_KEY``: the openai package, LangChain, LlamaIndex, LiteLLM and so
DSPy and CrewAI; the openai module's own client through ``openai.base_url``/``api_key``) at the
worker's own address, which reaches the episode it plays now: a client built once per process
follows the worker from episode to episode. The client ``episode()`` is given has the episode's
own URL. Threads an episode leaves running are reported after its answer (the trainer then
replaces the worker), and DSPy's caches are off (they key on the prompt, not the endpoint, so they
would replay answers without a call).

Async episodes run on one event loop per worker that stays open until the worker ends: clients a
program leaves behind (a framework's default client) are then closed on a live loop, not on a
closed one (which prints "Event loop is closed" tracebacks).
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import gc
import importlib
import importlib.util
import inspect
import os
import signal
import sys
import threading
import time
import traceback
from multiprocessing.connection import Connection
from pathlib import Path
from typing import Any, Callable, Iterator

__all__ = ["EpisodeRef", "episode_ref", "importing_from", "load_episode", "program_path", "serve"]

EpisodeRef = tuple[str, str, str, str]
"""``(kind, where, qualname, folder)``: kind ``"module"`` (where = a module name) or ``"file"`` (a
path); folder is the program's own folder (a file's, or the folder a function's module was imported
from), ``""`` for a module named by a string (found through the working directory)."""

_NOT_IMPORTABLE = ("episodes run in worker processes, which import the function by its module path: "
                   "define it at the top level of a module, or give 'module:function' or "
                   "'path/to/file.py:function'")


def _resolve(obj: Any, qualname: str) -> Any:
    return functools.reduce(getattr, qualname.split("."), obj)


def _import_root(module: str) -> str:
    """The folder an imported module's top-level package was found in ("" when it has no file:
    a namespace package, a built-in)."""
    top = getattr(sys.modules.get(module.partition(".")[0]), "__file__", None)
    if not top:
        return ""
    folder = os.path.dirname(os.path.abspath(top))
    return os.path.dirname(folder) if os.path.basename(top).startswith("__init__.") else folder


def episode_ref(spec: str | Callable[..., Any]) -> EpisodeRef:
    """Where a worker finds the episode: from ``"module:function"``, ``"path/to/file.py:function"``
    or a function defined at the top level of a module (a lambda, a nested function or a callable
    object is refused: a fresh interpreter cannot import it)."""
    if isinstance(spec, str):
        if ":" not in spec:
            raise ValueError(f"episode must be 'module:function' or 'path/to/file.py:function', got {spec!r}")
        where, _, name = spec.rpartition(":")
        if where.endswith(".py"):
            path = Path(where)
            if not path.is_file():
                raise FileNotFoundError(f"episode {spec!r}: no such file {path}")
            return "file", str(path.resolve()), name, str(path.resolve().parent)
        return "module", where, name, ""
    if not callable(spec):
        raise ValueError(f"episode must be a function or 'module:function', got {spec!r:.80}")
    module, qualname = getattr(spec, "__module__", None), getattr(spec, "__qualname__", None)
    if not isinstance(module, str) or not isinstance(qualname, str) or "<" in qualname:
        raise ValueError(f"episode {spec!r:.80}: {_NOT_IMPORTABLE}")
    try:
        same = _resolve(sys.modules[module], qualname) is spec
    except (KeyError, AttributeError):
        same = False
    if not same:
        raise ValueError(f"episode {spec!r:.80}: {module}.{qualname} is not that function; {_NOT_IMPORTABLE}")
    if module == "__main__":  # a script's function: the worker loads the script, not as __main__
        main = getattr(sys.modules["__main__"], "__file__", None)
        if not main:
            raise ValueError(f"episode {spec!r:.80} is defined in an interactive session; {_NOT_IMPORTABLE}")
        return "file", str(Path(main).resolve()), qualname, str(Path(main).resolve().parent)
    return "module", module, qualname, _import_root(module)


def program_path(ref: EpisodeRef, cwd: str, environment: list[str]) -> list[str]:
    """The ``sys.path`` a program is imported with: its own folder first (as Python gives a script
    its folder), then the working directory (as ``python -m`` does), then ``environment`` (the
    interpreter's path: site-packages, ``PYTHONPATH``), each once."""
    out: list[str] = []
    for entry in (ref[3], cwd, *environment):
        if entry and entry not in out:
            out.append(entry)
    return out


@contextlib.contextmanager
def importing_from(path: list[str]) -> Iterator[None]:
    """``sys.path`` is ``path`` inside (the trainer's import of a program to check it)."""
    saved = list(sys.path)
    sys.path[:] = path
    try:
        yield
    finally:
        sys.path[:] = saved


def load_episode(ref: EpisodeRef) -> Callable[..., Any]:
    """The function a reference names, imported from the current ``sys.path`` (the worker's is
    :func:`program_path`); a file is loaded under a private module name, so code under its
    ``if __name__ == "__main__":`` does not run."""
    kind, where, qualname, _ = ref
    shown = f"{where}:{qualname}"
    if kind == "file":
        name = f"drmas_episode_{abs(hash(where))}"
        module = sys.modules.get(name)
        if module is None:
            module_spec = importlib.util.spec_from_file_location(name, where)
            module = importlib.util.module_from_spec(module_spec)
            sys.modules[name] = module
            try:
                module_spec.loader.exec_module(module)
            except BaseException:
                del sys.modules[name]
                raise
    else:
        try:
            module = importlib.import_module(where)
        except ModuleNotFoundError as err:
            raise ModuleNotFoundError(f"episode {shown!r}: cannot import {where!r} ({err}); run from the "
                                      "folder that holds it, or give a file path "
                                      "(path/to/file.py:function)") from err
    try:
        fn = _resolve(module, qualname)
    except AttributeError:
        fn = None
    if not callable(fn):
        raise ValueError(f"episode {shown!r}: {where} has no function {qualname!r}")
    return fn


def _play(fn: Callable[..., Any], loop: asyncio.AbstractEventLoop, job: dict[str, Any]) -> Any:
    import openai

    kwargs = dict(base_url=job["base_url"], api_key=job["key"], max_retries=0, timeout=job["timeout_s"])
    if not inspect.iscoroutinefunction(fn):
        with openai.OpenAI(**kwargs) as client:
            return fn(job["task"], client)

    async def play() -> Any:
        async with openai.AsyncOpenAI(**kwargs) as client:
            return await fn(job["task"], client)

    try:
        return loop.run_until_complete(play())
    finally:  # what the program left running is cancelled, as asyncio.run would, on a loop left open
        left = [t for t in asyncio.all_tasks(loop) if not t.done()]
        for task in left:
            task.cancel()
        if left:
            loop.run_until_complete(asyncio.gather(*left, return_exceptions=True))
        gc.collect()  # clients dropped by the program close now, while their loop runs


def _point_clients_at(url: str, key: str) -> None:
    """Every client a program builds from the environment reaches this worker's address."""
    import openai

    for name in ("OPENAI_BASE_URL", "OPENAI_API_BASE"):
        os.environ[name] = url
    os.environ["OPENAI_API_KEY"] = key
    openai.base_url, openai.api_key = url.rstrip("/") + "/", key  # the module client joins paths to it


def _caches_off() -> None:
    """DSPy's caches off, once the program has imported it."""
    dspy = sys.modules.get("dspy")
    if dspy is not None and hasattr(dspy, "configure_cache"):
        dspy.configure_cache(enable_disk_cache=False, enable_memory_cache=False)


def _idle_pool_thread(thread: threading.Thread) -> bool:
    """Whether ``thread`` is a thread pool's worker waiting for work (the event loop's default
    executor, LiteLLM's callback pool: kept for later use, running nothing of the episode)."""
    frame = sys._current_frames().get(thread.ident)
    return (frame is not None and frame.f_code.co_name == "_worker"
            and frame.f_code.co_filename.endswith(os.path.join("concurrent", "futures", "thread.py")))


def _lingering(before: set[threading.Thread], grace_s: float = 0.5) -> list[str]:
    """Threads started during the episode that are still running ``grace_s`` later (thread pools'
    idle workers are not: they run nothing until asked)."""
    deadline = time.monotonic() + grace_s
    left = []
    for t in threading.enumerate():
        if t in before or t is threading.current_thread():
            continue
        t.join(max(0.0, deadline - time.monotonic()))
        if t.is_alive() and not _idle_pool_thread(t):
            left.append(t.name)
    return left


def serve(fd: str) -> None:
    """A worker's life (started by :class:`drmas.children.Child`): the hello, then episodes until
    the trainer closes the connection."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # a Ctrl-C is the trainer's to handle; it ends us
    conn = Connection(int(fd))
    hello = conn.recv()
    sys.path[:] = hello["sys_path"]
    os.chdir(hello["cwd"])
    try:
        # first: a client the program builds when its module is imported reaches the worker too
        _point_clients_at(hello["worker_url"], hello["worker_key"])  # imports openai, once per worker
        fn = load_episode(tuple(hello["episode"]))
    except BaseException:  # noqa: BLE001 - whatever the user's module raised, told to the trainer
        conn.send({"load_error": traceback.format_exc()})
        return
    conn.send({"ready": os.getpid()})
    loop = asyncio.new_event_loop()
    asyncio.set_event_loop(loop)
    while True:
        try:
            job = conn.recv()
        except (EOFError, OSError):
            break
        _caches_off()
        before = set(threading.enumerate())
        try:
            reply = {"value": _play(fn, loop, job)}
        except BaseException:  # noqa: BLE001 - the user's code may raise anything; it fails this episode
            reply = {"error": traceback.format_exc()}
        try:
            conn.send(reply)  # at once: the episode's session ends, a call its threads make now gets 410
        except Exception as err:  # noqa: BLE001 - a return value pickle cannot send
            conn.send({"error": "its return value cannot be sent to the trainer: "
                                f"{type(err).__name__}: {err}"})
        conn.send({"lingering": _lingering(before)})  # before the next episode: the trainer waits for it
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(0)  # no interpreter teardown: nothing the program left behind runs on a closed loop
