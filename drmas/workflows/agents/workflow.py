"""The ``agents`` workflow: train a multi-agent program written against the OpenAI chat API,
unchanged. See docs/agents.md.

Each episode of a rollout runs the user's ``episode(task, client)`` in a worker process (one
episode at a time per worker), with an OpenAI client whose base URL and key are that episode's
own on the endpoint; the request's ``model`` names the agent, whose policy answers. Every
delivered completion is a sample (the agent's k-th call is its turn k); once the episode returns,
each sample's reward is ``alpha * team + local`` with the agent's local reward from the
episode's return value and the format penalty for a call that ended by length, as in every workflow.
An episode whose program raised is trained too: each of its calls gets ``failure_reward`` (what the
policy wrote can break a program, and dropping those episodes would never teach it otherwise);
episodes the infrastructure failed (a timeout, a lost worker) are dropped.
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import random
import sys
from collections import Counter
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, Sequence

from drmas.algorithms import sample_reward
from drmas.workflows.agents.dispatch import Dispatcher
from drmas.workflows.agents.episodes import EpisodeRun, failure_of, last_line, program_error
from drmas.workflows.agents.pool import WorkerPool
from drmas.workflows.agents.server import Endpoint
from drmas.workflows.base import WORKFLOWS, Workflow
from drmas.workflows.files import read_records
from drmas.checkout import without_drmas_folders
from drmas.episode_worker import episode_ref, importing_from, load_episode, program_path
from drmas.records import EpisodeResult, Sample, GenerateFn, RolloutResult

__all__ = ["EXAMPLE", "AgentsWorkflow", "ProgramError", "RowTask", "example_team", "read_tasks"]

log = logging.getLogger(__name__)


class ProgramError(RuntimeError):
    """Every episode raised the same error for ``same_failure_limit`` rollouts in a row: a bug in
    the program, not something the policy can learn away."""


@contextlib.contextmanager
def _client_environment():
    """An environment like a worker's while the program is imported here to check it (a program may
    build its clients at import, which needs a base URL and a key): an address nothing answers."""
    names = ("OPENAI_BASE_URL", "OPENAI_API_BASE", "OPENAI_API_KEY")
    saved = {k: os.environ.get(k) for k in names}
    os.environ.update(OPENAI_BASE_URL="http://127.0.0.1:9/v1", OPENAI_API_BASE="http://127.0.0.1:9/v1",
                      OPENAI_API_KEY="drmas-import-check")
    try:
        yield
    finally:
        for k, v in saved.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v


def _valid(rec: Any) -> bool:
    """A malformed call, or one cut at the policy's limit, is a format fault (one cut at the
    program's own ``max_tokens`` is not)."""
    return not rec.malformed and (rec.completion.finish_reason == "stop" or rec.own_cap)


@dataclass(frozen=True, eq=False)
class RowTask:
    """One row of a task file, handed to the episode unchanged."""

    uid: str
    row: dict[str, Any]
    source: str | None = None


def read_tasks(path: str) -> list[RowTask]:
    """Every row of a JSONL or parquet file; its uid is its ``id`` if it has one, else its index."""
    tasks = [RowTask(str(record["id"]) if "id" in record else str(i), record)
             for i, (_, record) in enumerate(read_records(Path(path)))]
    seen: set[str] = set()
    for t in tasks:
        if t.uid in seen:
            raise ValueError(f"{path}: the id {t.uid!r} is given to more than one row")
        seen.add(t.uid)
    if not tasks:
        raise ValueError(f"{path} holds no task")
    return tasks


EXAMPLE = Path(__file__).resolve().parent / "example_team"  # in the wheel; examples/agents/ links to it
_EXAMPLE_AGENTS = ("solver", "verifier")


def example_team(agents: Sequence[str] | None) -> tuple[str, list[str]]:
    """The example math team's episode (a path that resolves from any folder) and agents."""
    program = EXAMPLE / "math_team.py"
    if agents is not None and tuple(agents) != _EXAMPLE_AGENTS:
        raise ValueError(f"agents {list(agents)} given without an episode: the example team's agents are "
                         f"{list(_EXAMPLE_AGENTS)}; give your program as episode")
    return f"{program}:episode", list(_EXAMPLE_AGENTS)


@WORKFLOWS.register("agents")
class AgentsWorkflow(Workflow):
    agents = _EXAMPLE_AGENTS  # the example team's, the default; an instance holds its program's own
    samplings = ("parallel",)
    why_not = {"tree": "tree sampling copies an episode at a turn to sample candidates from one state, "
                       "and an opaque program cannot be copied"}

    def __init__(
        self,
        episode: Any = None,
        agents: list[str] | None = None,
        train_file: str | None = None,
        val_file: str | None = None,
        test_file: str | None = None,
        val_share: float = 0.1,
        alpha: float = 1.0,
        format_penalty: float = 0.1,
        window_ms: float = 500.0,
        episode_timeout_s: float = 600.0,
        workers: int = 16,
        failure_reward: float = -1.0,
        same_failure_limit: int = 3,
        host: str = "127.0.0.1",
        advertise_host: str | None = None,
    ) -> None:
        """
        Args:
            episode: the program: ``"module:function"``, ``"path/to/file.py:function"`` or (in
                Python) a function defined at the top level of a module (workers import it by its
                module path) ``episode(task: dict, client: openai.OpenAI)`` (or ``async def``
                with ``openai.AsyncOpenAI``) returning the team reward, or a dict of per-agent
                local rewards with optional ``team`` and ``success`` keys. None, with no
                ``train_file`` either: the example math team (``examples/agents/math_team.py``,
                shipped in the package) with its agents, training and validation tasks.
            agents: the agent names; a request's ``model`` names one (e.g. ``[writer, critic]``).
            train_file: training tasks, JSONL or parquet; each row is handed to the episode as a dict.
            val_file: validation tasks, likewise (None: a held-apart share of ``train_file``; the
                example's own ``val.jsonl`` only when the example's tasks train).
            test_file: test tasks, likewise (for ``evaluate --split test``).
            val_share: the share of ``train_file`` held apart for validation when there is no
                ``val_file`` (at least one task; 0 = none: set ``--data.validation.tasks 0``).
            alpha: weight of the team reward in ``alpha * team + local``.
            format_penalty: the format term of a call that ended by length rather than by a stop
                (``-format_penalty`` in its local reward).
            window_ms: the longest a call waits for others to be batched with it.
            episode_timeout_s: an episode still running this long after it began fails: its process
                is ended and its URL answers 410.
            workers: episode worker processes, each playing one episode at a time (the most episodes
                in flight, so the largest batch the engine sees; each costs a Python process, about
                ``import openai`` and the program's own imports to start, once per run).
            failure_reward: the reward of every call of an episode whose program raised (no team
                term, no format penalty): below any reward a finished episode earns, so the policy
                learns away what broke the program.
            same_failure_limit: rollouts in a row in which every episode raised the same error
                before the run stops with it (:class:`ProgramError`): a bug in the program.
            host: the interface the endpoint listens on: loopback, or ``0.0.0.0`` for programs on
                other machines (every request still needs its episode's or worker's key).
            advertise_host: the host in the URLs programs are given (default: ``host``, or this
                machine's address when listening on every interface).
        """
        if episode is None and train_file is None:
            episode, agents = example_team(agents)
            train_file, val_file = str(EXAMPLE / "train.jsonl"), val_file or str(EXAMPLE / "val.jsonl")
        if not agents:
            raise ValueError("agents: name the agents of the program, e.g. [solver, verifier]")
        if len(set(agents)) != len(agents) or not all(isinstance(a, str) and a for a in agents):
            raise ValueError(f"agents must be distinct non-empty names, got {agents}")
        if episode is None:
            raise ValueError("episode: give the program as 'module:function' or 'path/to/file.py:function' "
                             "(the example team's tasks come only with the example team)")
        if train_file is None:
            raise ValueError("train_file: the training tasks of your program (JSONL or parquet, one task "
                             "per row) are needed; the example's tasks come only with the example team")
        if not 0.0 <= val_share < 1.0 or window_ms < 0 or episode_timeout_s <= 0 or workers < 1:
            raise ValueError("need 0 <= val_share < 1, window_ms >= 0, episode_timeout_s > 0 and "
                             f"workers >= 1; got {val_share}, {window_ms}, {episode_timeout_s}, {workers}")
        if same_failure_limit < 1:
            raise ValueError(f"same_failure_limit must be >= 1, got {same_failure_limit}")
        self.agents = tuple(agents)
        self.episode = episode_ref(episode)
        # the user's import world, never drmas's script folders (recipes/own_agents.py would be
        # imported as the Agents SDK's `agents`): in the check below and in every worker
        self.cwd = os.getcwd()
        self.import_path = program_path(self.episode, self.cwd, without_drmas_folders(sys.path))
        if isinstance(episode, str):  # its errors now, in this process, rather than in every worker
            with _client_environment(), importing_from(self.import_path):
                load_episode(self.episode)
        self.workers = workers
        self.alpha, self.format_penalty = alpha, format_penalty
        self.window_s, self.timeout_s = window_ms / 1000.0, episode_timeout_s
        self.failure_reward, self.same_failure_limit = float(failure_reward), same_failure_limit
        self._same_failure: tuple[str, int] = ("", 0)  # the error every episode raised, rollouts in a row
        self._splits = self._read_splits(train_file, val_file, test_file, val_share)
        self.host, self.advertise_host = host, advertise_host
        self._endpoint: Endpoint | None = None
        self._pool: WorkerPool | None = None
        self._rollouts = 0

    @staticmethod
    def _read_splits(train_file: str, val_file: str | None, test_file: str | None,
                     val_share: float) -> dict[str, list[RowTask]]:
        train = read_tasks(train_file)
        splits = {"train": train, "val": read_tasks(val_file) if val_file else [],
                  "test": read_tasks(test_file) if test_file else []}
        if not val_file and val_share > 0:
            if len(train) < 2:
                raise ValueError(f"{train_file} has {len(train)} task: too few to hold some apart for "
                                 "validation (give val_file, or val_share 0 with --data.validation.tasks 0)")
            held = set(random.Random(0).sample(range(len(train)), max(1, round(val_share * len(train)))))
            splits["val"] = [t for i, t in enumerate(train) if i in held]
            splits["train"] = [t for i, t in enumerate(train) if i not in held]
            log.warning("agents workflow: %d of the %d tasks of %s held apart for validation (val_share=%g), "
                        "%d left to train on", len(held), len(train), train_file, val_share,
                        len(splits["train"]))
        return splits

    def tasks(self, split: str) -> Sequence[RowTask]:
        if split not in self._splits:
            raise KeyError(f"unknown split {split!r}; known: {sorted(self._splits)}")
        if not self._splits[split] and split != "val":
            raise ValueError(f"no {split} tasks: give {split}_file")
        return self._splits[split]

    def rollout(self, tasks: Sequence[RowTask], generate: GenerateFn, *, n: int, sampling: str = "parallel",
                seed: int = 0, progress: Callable[[bool], None] | None = None) -> RolloutResult:
        if sampling not in self.samplings:
            raise ValueError("the agents workflow plays parallel sampling only: "
                             f"{self.why_not.get(sampling, sampling)}")
        if self._endpoint is None:
            self._endpoint = Endpoint(self.agents, self.host, self.advertise_host)
            self._endpoint.start()
        endpoint = self._endpoint
        training = generate.train
        known = {a: generate.settings(a) for a in self.agents}
        settings = None if any(v is None for v in known.values()) else known
        contexts = {a: generate.context_length(a) for a in self.agents}
        self._rollouts += 1
        runs = []
        for i, (task, j) in enumerate((t, j) for t in tasks for j in range(n)):
            session = endpoint.open_session(f"r{self._rollouts}-e{i}", i, settings, training, contexts)
            runs.append(EpisodeRun(task, f"{task.uid}#{j}", session, endpoint.base_url(session),
                                   self.timeout_s))
        if self._pool is None:
            self._pool = WorkerPool(self.episode, self.import_path, self.cwd, self.workers, endpoint)
        pool, started, recycled = self._pool, self._pool.started, self._pool.recycled
        late, unknown = endpoint.late_calls, endpoint.unknown_agents
        dispatcher = Dispatcher(endpoint.inbox, generate, self.window_s)
        try:
            pool.ensure(len(runs))
            dispatcher.run(runs, lambda: pool.schedule(runs, self.timeout_s),
                           on_end=None if progress is None else lambda r: progress(self._ended_well(r)))
        finally:
            for run in runs:
                endpoint.end_session(run.session)
            pool.abandon()  # a rollout that stopped early: its episodes still playing are void
        result = self._results(runs)
        self._program_failures(result, runs)
        result.counts.update(dispatcher.counts)
        result.counts["endpoint/unknown_agents"] = float(endpoint.unknown_agents - unknown)
        result.counts["endpoint/generation_overrides"] = float(sum(r.session.overrides for r in runs))
        result.counts["endpoint/workers_started"] = float(pool.started - started)
        result.counts["endpoint/workers_recycled"] = float(pool.recycled - recycled)
        result.counts["endpoint/late_calls"] = (result.counts.get("endpoint/late_calls", 0.0)
                                                + float(endpoint.late_calls - late))
        return result

    def _ended_well(self, run: EpisodeRun) -> bool:
        outcome, why = failure_of(run, self.agents, self.timeout_s)
        return why is None and outcome.success

    def _results(self, runs: Sequence[EpisodeRun]) -> RolloutResult:
        samples, episodes = [], []
        for run in runs:
            outcome, why = failure_of(run, self.agents, self.timeout_s)
            records = run.session.records
            program = program_error(run)
            if program is not None:  # the program raised: every call it made gets failure_reward
                samples += [self._sample(run, rec, 0.0, self.failure_reward, self.failure_reward)
                            for rec in records]
                episodes.append(EpisodeResult(run.task.uid, run.traj_uid, False, len(records), 0.0,
                                              {"program_failure": program}))
                continue
            if why is not None:  # the infrastructure's failure: none of its samples is trained
                episodes.append(EpisodeResult(run.task.uid, run.traj_uid, False, len(records), 0.0,
                                              {"failure": why}))
                continue
            for rec in records:
                own = outcome.local.get(rec.agent, 0.0) + outcome.calls.get(rec.response_id, 0.0)
                local, reward = sample_reward(outcome.team, own, _valid(rec), self.alpha, self.format_penalty)
                samples.append(self._sample(run, rec, outcome.team, local, reward))
            episodes.append(EpisodeResult(run.task.uid, run.traj_uid, outcome.success, len(records),
                                          outcome.team))
        return RolloutResult(samples, episodes)

    @staticmethod
    def _sample(run: EpisodeRun, rec: Any, team: float, local: float, reward: float) -> Sample:
        c = rec.completion
        # the call as the program made it, for the episode records (drmas.data.episodes)
        extra = [json.loads(f) if f else {} for f in rec.fields] or [{} for _ in rec.messages]
        messages = [{"role": role, "content": content, **more}
                    for (role, content), more in zip(rec.messages, extra)]
        return Sample(task_uid=run.task.uid, traj_uid=run.traj_uid, agent=rec.agent, turn=rec.turn, policy="",
                      prompt_ids=c.prompt_ids, response_ids=c.response_ids, engine_logprobs=c.logprobs,
                      text=c.text, valid=_valid(rec), team_reward=team, local_reward=local, reward=reward,
                      cut=c.finish_reason == "length",
                      info={"call": rec.call, "messages": messages, "tool_calls": rec.tool_calls})

    def _program_failures(self, result: RolloutResult, runs: Sequence[EpisodeRun]) -> None:
        """Count the episodes whose program raised and say the most common error in one line; stop
        the run when every episode raised the same error ``same_failure_limit`` rollouts in a row."""
        raised = [e.info["program_failure"] for e in result.episodes if "program_failure" in e.info]
        result.counts["endpoint/program_failures"] = float(len(raised))
        if not raised:
            self._same_failure = ("", 0)
            return
        errors = Counter(last_line(t) for t in raised)
        common, times = errors.most_common(1)[0]
        log.warning("agents workflow: %d of %d episodes raised (trained with failure_reward %g); "
                    "most common, %d times: %s", len(raised), len(runs), self.failure_reward, times, common)
        if len(raised) < len(runs) or len(errors) > 1:
            self._same_failure = ("", 0)
            return
        before, streak = self._same_failure
        self._same_failure = (common, streak + 1 if before == common else 1)
        if self._same_failure[1] >= self.same_failure_limit:
            raise ProgramError(
                f"every episode of the last {self.same_failure_limit} rollouts raised the same error, a bug "
                f"in the program rather than something to learn (same_failure_limit); one of them:\n"
                f"{raised[0]}")

    def scalars(self, counts: dict[str, float]) -> dict[str, float]:
        """The endpoint's requests, its mean batch (samples per engine call), the requests that
        asked for sampling other than the policy's and those the chat template rejected, and the
        worker processes started (the first rollout's, then one per lost worker)."""
        calls = counts.get("endpoint/engine_calls", 0.0)
        out = {k: counts.get(k, 0.0) for k in ("endpoint/requests", "endpoint/generation_overrides",
                                               "endpoint/template_errors", "endpoint/workers_started",
                                               "endpoint/workers_recycled", "endpoint/late_calls",
                                               "endpoint/program_failures", "endpoint/unknown_agents",
                                               "endpoint/ignored_fields", "endpoint/structured_outputs")}
        if out["endpoint/requests"]:  # per request: how often the agents call tools, and get it wrong
            for k in ("endpoint/tool_calls", "endpoint/tool_call_errors"):
                out[k] = counts.get(k, 0.0) / out["endpoint/requests"]
        if calls:
            out["endpoint/batch_size_mean"] = counts.get("endpoint/samples", 0.0) / calls
        return out

    def close(self) -> None:
        if self._pool is not None:
            self._pool.close()
            self._pool = None
        if self._endpoint is not None:
            self._endpoint.close()
            self._endpoint = None
