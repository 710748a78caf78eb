"""The trainer's side of an episode: its state while a worker process plays it
(:mod:`drmas.workflows.agents.pool`) and what it returned, read.

An episode is ``episode(task: dict, client: openai.OpenAI) -> float | dict[str, float]`` (or an
``async def`` taking an ``openai.AsyncOpenAI``): a number is the team reward; a dict holds each
agent's local reward, optionally ``team`` (default 0), ``success`` (default: team > 0) and
``calls``: rewards of single calls by the id the client saw (``{response.id: reward}``).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any, Sequence

__all__ = ["EpisodeFailure", "EpisodeRun", "Outcome", "failure_of", "last_line", "program_error",
           "read_outcome"]


class EpisodeFailure(ValueError):
    """An episode returned something that is not a reward."""


@dataclass
class Outcome:
    """What an episode returned, read."""

    team: float
    local: dict[str, float] = field(default_factory=dict)
    success: bool = False
    calls: dict[str, float] = field(default_factory=dict)
    """Rewards of single calls, by response id: added to that call's local reward."""


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
    unknown = [k for k in value if k not in agents and k not in ("team", "success", "calls")]
    if unknown:
        raise EpisodeFailure(f"the episode returned rewards for {unknown}, which are not agents; the keys "
                             f"may be the agents ({', '.join(agents)}), 'team', 'success' and 'calls'")
    calls = value.get("calls", {})
    if not isinstance(calls, dict) or not all(isinstance(k, str) for k in calls):
        raise EpisodeFailure("'calls' must map response ids (the id of what the client got back) to rewards")
    calls = {k: _number(v, f"call {k!r}'s reward") for k, v in calls.items()}
    team = _number(value.get("team", 0.0), "'team'")
    local = {a: _number(v, f"agent {a!r}'s reward") for a, v in value.items() if a in agents}
    success = value.get("success", team > 0)
    if not isinstance(success, bool):
        raise EpisodeFailure(f"'success' must be True or False, got {success!r:.80}")
    return Outcome(team, local, success, calls)


class EpisodeRun:
    """One episode of a rollout: ``queued`` until a worker takes it, ``playing``, then ``ended``
    (with the value it returned, or ``error``: what ended it, said after the episode's id, e.g.
    ``"raised:\n<traceback>"``); ``timed_out`` once its deadline
    passed (its process is ended then)."""

    def __init__(self, task: Any, traj_uid: str, session: Any, base_url: str, timeout_s: float) -> None:
        self.task, self.traj_uid, self.session = task, traj_uid, session
        self.base_url, self.timeout_s = base_url, timeout_s
        self.state = "queued"
        self.value: Any = None
        self.error: str | None = None
        self.timed_out = False
        self.deadline = math.inf
        self.worker_pid: int | None = None

    def job(self) -> dict[str, Any]:
        """What a worker needs to play it (pickled: each episode gets its own copy of the task)."""
        return {"task": self.task.row, "base_url": self.base_url, "key": self.session.key,
                "timeout_s": self.timeout_s}

    @property
    def running(self) -> bool:
        return self.state == "playing" and not self.timed_out

    @property
    def done(self) -> bool:
        return self.state == "ended" or self.timed_out


def program_error(run: EpisodeRun) -> str | None:
    """The program's own failure, its traceback, when it raised (what the policy wrote can make a
    program raise: a reply that does not parse, a tool argument that fails validation); None for
    an episode that returned, timed out or lost its process (those are the infrastructure's)."""
    if run.timed_out or run.error is None or not run.error.startswith("raised:"):
        return None
    return run.error[len("raised:"):].strip()


def last_line(traceback: str) -> str:
    """A traceback's last line: the exception's type and message."""
    lines = [line for line in traceback.strip().splitlines() if line.strip()]
    return lines[-1].strip() if lines else ""


def failure_of(run: EpisodeRun, agents: Sequence[str], timeout_s: float) -> tuple[Outcome | None, str | None]:
    """``(outcome, None)`` for an episode that ended well, else ``(None, why)``."""
    if run.timed_out:
        return None, (f"episode {run.traj_uid} passed its timeout of {timeout_s:g} s "
                      f"(its process, pid {run.worker_pid}, was ended)")
    if run.error is not None:
        return None, f"episode {run.traj_uid} {run.error}"
    if not run.session.records:
        return None, f"episode {run.traj_uid} made no call to the endpoint (or none was delivered)"
    try:
        outcome = read_outcome(run.value, agents)
        stray = sorted(set(outcome.calls) - {r.response_id for r in run.session.records})
        if stray:
            raise EpisodeFailure(f"'calls' rewards {stray[0]!r}, which is no answer of this episode")
    except EpisodeFailure as err:
        return None, f"episode {run.traj_uid}: {err}"
    return outcome, None  # a NaN reward is the rollout's to drop and count, as in every workflow
