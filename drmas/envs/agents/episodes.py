"""The user's side of the endpoint: loading their episode function, playing it in a thread of
its own with an OpenAI client pointed at its episode's URL, and reading what it returned.

An episode is ``episode(task: dict, client: openai.OpenAI) -> float | dict[str, float]`` (or an
``async def`` taking an ``openai.AsyncOpenAI``): a number is the team reward; a dict holds each
agent's local reward, optionally ``team`` (default 0) and ``success`` (default: team > 0).
"""

from __future__ import annotations

import asyncio
import copy
import importlib
import importlib.util
import inspect
import os
import sys
import threading
import traceback
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Sequence

__all__ = ["EpisodeFailure", "EpisodeRun", "Outcome", "failure_of", "load_episode", "read_outcome"]


class EpisodeFailure(ValueError):
    """An episode returned something that is not a reward."""


def load_episode(spec: str | Callable[..., Any]) -> Callable[..., Any]:
    """The episode function: a callable, ``"package.module:function"`` (imported with the working
    directory on the path, as ``python -m`` would) or ``"path/to/file.py:function"``."""
    if callable(spec):
        return spec
    if not isinstance(spec, str) or ":" not in spec:
        raise ValueError(f"episode must be 'module:function' or 'path/to/file.py:function', got {spec!r}")
    where, _, name = spec.rpartition(":")
    if where.endswith(".py"):
        path = Path(where)
        if not path.is_file():
            raise FileNotFoundError(f"episode {spec!r}: no such file {path}")
        mod_name = f"drmas_episode_{abs(hash(str(path.resolve())))}"
        module_spec = importlib.util.spec_from_file_location(mod_name, path)
        module = importlib.util.module_from_spec(module_spec)
        sys.modules[mod_name] = module
        module_spec.loader.exec_module(module)
    else:
        if os.getcwd() not in sys.path:
            sys.path.insert(0, os.getcwd())
        try:
            module = importlib.import_module(where)
        except ModuleNotFoundError as err:
            raise ModuleNotFoundError(f"episode {spec!r}: cannot import {where!r} ({err}); run from the "
                                      "folder that holds it, or give a file path "
                                      "(path/to/file.py:function)") from err
    fn = getattr(module, name, None)
    if not callable(fn):
        raise ValueError(f"episode {spec!r}: {where} has no function {name!r}")
    return fn


@dataclass
class Outcome:
    """What an episode returned, read."""

    team: float
    local: dict[str, float] = field(default_factory=dict)
    success: bool = False


def _number(value: Any, what: str) -> float:
    if isinstance(value, (bool, int, float)):
        return float(value)
    try:
        import numpy as np

        if isinstance(value, np.generic) and np.ndim(value) == 0:
            return float(value)
    except ImportError:  # pragma: no cover
        pass
    raise EpisodeFailure(f"{what} must be a number, got {type(value).__name__} {value!r:.80}")


def read_outcome(value: Any, agents: Sequence[str]) -> Outcome:
    """The team reward, per-agent local rewards and success of an episode's return value."""
    if not isinstance(value, dict):
        team = _number(value, "an episode's return value (the team reward, or a dict of rewards)")
        return Outcome(team, {}, team > 0)
    unknown = [k for k in value if k not in agents and k not in ("team", "success")]
    if unknown:
        raise EpisodeFailure(f"the episode returned rewards for {unknown}, which are not agents; the keys "
                             f"may be the agents ({', '.join(agents)}), 'team' and 'success'")
    team = _number(value.get("team", 0.0), "'team'")
    local = {a: _number(v, f"agent {a!r}'s reward") for a, v in value.items() if a in agents}
    success = value.get("success", team > 0)
    if not isinstance(success, bool):
        raise EpisodeFailure(f"'success' must be True or False, got {success!r:.80}")
    return Outcome(team, local, success)


class EpisodeRun:
    """One episode played in a daemon thread; when it ends (or raises) it puts itself in
    ``inbox`` so the dispatcher wakes. A timed-out run's thread is left to end by itself."""

    def __init__(self, fn: Callable[..., Any], task: Any, traj_uid: str, session: Any,
                 base_url: str, key: str, timeout_s: float, inbox: Any) -> None:
        self.fn, self.task, self.traj_uid, self.session = fn, task, traj_uid, session
        self.value: Any = None
        self.error: str | None = None
        self.timed_out = False
        self.ended = False
        self.deadline = 0.0
        # each episode its own copy: one that edits its task cannot change its group's others
        self._args = (copy.deepcopy(task.row), base_url, key, timeout_s)
        self._inbox = inbox
        self._thread = threading.Thread(target=self._play, daemon=True, name=f"drmas-episode-{session.id}")

    def start(self, deadline: float) -> None:
        self.deadline = deadline
        self._thread.start()

    def _play(self) -> None:
        row, base_url, key, timeout_s = self._args
        try:
            self.value = _call(self.fn, row, base_url, key, timeout_s)
        except BaseException:  # noqa: BLE001 - the user's code may raise anything; it fails this episode only
            self.error = traceback.format_exc()
        finally:
            self.ended = True
            self._inbox.put(self)

    @property
    def running(self) -> bool:
        return not self.ended and not self.timed_out


def _call(fn: Callable[..., Any], row: dict[str, Any], base_url: str, key: str, timeout_s: float) -> Any:
    import openai

    kwargs = dict(base_url=base_url, api_key=key, max_retries=0, timeout=timeout_s)
    if inspect.iscoroutinefunction(fn):
        async def play() -> Any:
            async with openai.AsyncOpenAI(**kwargs) as client:
                return await fn(row, client)

        return asyncio.run(play())
    with openai.OpenAI(**kwargs) as client:
        return fn(row, client)


def failure_of(run: EpisodeRun, agents: Sequence[str], timeout_s: float) -> tuple[Outcome | None, str | None]:
    """``(outcome, None)`` for an episode that ended well, else ``(None, why)``."""
    if run.timed_out:
        return None, (f"episode {run.traj_uid} passed its timeout of {timeout_s:g} s "
                      "(its thread was left to end)")
    if run.error is not None:
        return None, f"episode {run.traj_uid} raised:\n{run.error}"
    if not run.session.records:
        return None, f"episode {run.traj_uid} made no call to the endpoint (or none was delivered)"
    try:
        outcome = read_outcome(run.value, agents)
    except EpisodeFailure as err:
        return None, f"episode {run.traj_uid}: {err}"
    return outcome, None  # a NaN reward is the rollout's to drop and count, as in every domain
