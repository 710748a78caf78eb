"""The rollout side of an RL iteration, in plain Python: play tasks, score, pack micro-batches, validate.

:class:`Rollouts` turns a workflow into one :class:`~drmas.records.PreparedIteration` per iteration:
it draws the iteration's tasks, plays them with the trainer's ``generate`` function, computes
advantages with the configured estimator, sets each sample's policy and packs every policy's
micro-batches, PPO epoch after PPO epoch. It also runs validation (``val/avg@k``,
``val/pass@k``). It talks to the trainer only through :class:`RolloutBackend`, so it runs and
is tested without Lightning or a model (a scripted ``generate`` will do).

With several data-parallel ranks each rank plays whole tasks (an advantage group never spans
ranks), then every rank gathers all ranks' samples and computes the same advantages from them,
so agent-wise statistics are those of the whole iteration, exactly as with one process; each
rank then trains on its token-balanced share (:func:`~drmas.data.batching.policy_micro_batches`).

Faults of the environment and of reward functions never become silent wrong advantages: a
sample whose reward is NaN or infinite is dropped before the advantages are computed (counted
in ``rollout/nonfinite_rewards``, with a warning); actions the environment failed to carry out
(a retrieval server down after its retries) are counted in ``rollout/failed_actions``, and when
more than ``max_failed_share`` of one agent's actions in an iteration failed the run stops with
:class:`OutageError` before training on the outage (the previous iteration's checkpoint stays
the one to resume from).
"""

from __future__ import annotations

import inspect
import random
import time
from collections import defaultdict
from typing import Any, Protocol, Sequence

import torch

from drmas.algorithms import compute_advantages
from drmas.data.background import Pipeline, Played, Synchronous
from drmas.data.batching import policy_micro_batches
from drmas.data.gathered import drop_nonfinite, gather, outcome_scalars
from drmas.data.progress import EpisodeBar, show_progress
from drmas.data.rerouted import Rerouted
from drmas.data.rollout_config import RolloutConfig, ValidationConfig, rollout_seed
from drmas.workflows.base import Workflow, check_tasks
from drmas.metrics import AvgAtK, PassAtK
from drmas.ranks import at
from drmas.records import BatchSpec, Sample, GenerateFn, MicroBatch, PreparedIteration, RolloutResult

__all__ = ["OutageError", "RolloutBackend", "RolloutConfig", "Rollouts", "ValidationConfig"]


class OutageError(RuntimeError):
    """Too many of an iteration's actions failed in the environment to train on it."""


class RolloutBackend(Protocol):
    """What the trainer offers the rollout side, and all the rollout side uses of it."""

    iteration: int
    """The RL iteration running now (0 before the first); the x-axis of every logged scalar."""
    rank: int
    """This process's data-parallel rank (0 with one process)."""
    world_size: int
    """Data-parallel ranks, each playing its own share of the tasks with its own engines."""

    def gather_objects(self, obj: Any, background: bool = False) -> list[Any]:
        """Every rank's ``obj`` in rank order (``[obj]`` with one process); a collective
        (``background``: the background rollout's, on a process group of its own)."""

    def bind_agents(self, agents: Sequence[str]) -> dict[str, str]:
        """Resolve and check the agent -> policy map for these agents; return it."""

    def begin_iteration(self) -> int:
        """Start the next iteration (before its rollout); return its number."""

    def generate_fn(self, train: bool) -> GenerateFn:
        """``generate(agent, prompts, n)`` routed to each agent's policy, with the policy's train
        or eval generation settings."""

    def sync_weights(self, seed: int | None = None) -> None:
        """Make the rollout engines serve the policies' current weights, and draw from ``seed``."""

    def reseed(self, seed: int) -> None:
        """Reseed the engines from ``seed`` (no weights move: the background rollout's start)."""

    def set_staleness(self, staleness: int) -> None:
        """Rollouts will lag ``staleness`` updates behind (0: synchronous), engines awake during the
        update; refuse the settings that cannot train so (a ValueError naming the setting)."""

    def engine_cache_stats(self) -> tuple[int, int]:
        """``(prompt tokens, of which from a prefix cache)`` of this rank's engines since the last call."""

    def engine_busy(self) -> dict[str, float]:
        """Seconds each policy's engine spent answering requests since the last call (requests that
        overlap count once)."""

    def batch_spec(self, policy: str) -> BatchSpec:
        """What packing this policy's samples into micro-batches needs (pad id, micro-batch size, PPO
        epochs)."""

    def log_scalars(self, metrics: dict[str, float]) -> None:
        """Log at the current iteration."""


class Rollouts:
    """One workflow's rollouts and validation, played as ``config`` and ``validation`` say."""

    def __init__(self, workflow: Workflow, config: RolloutConfig = RolloutConfig(),  # noqa: B008 (frozen)
                 validation: ValidationConfig = ValidationConfig()) -> None:  # noqa: B008 (frozen)
        """The workflow's declared samplings and estimators, and its rollout's signature, are checked
        here, before anything runs."""
        sampling, estimator = config.sampling, config.estimator
        name = type(workflow).__name__
        params = inspect.signature(workflow.rollout).parameters
        if "progress" not in params and not any(p.kind is p.VAR_KEYWORD for p in params.values()):
            raise TypeError(f"{name}.rollout takes no progress argument: the Workflow.rollout contract is "
                            "rollout(tasks, generate, *, n, sampling, seed, progress=None), progress being "
                            "None or a function to call with each episode's success as it finishes")
        if sampling not in workflow.samplings:
            why = f" ({workflow.why_not[sampling]})" if sampling in workflow.why_not else ""
            raise ValueError(f"{name} does not support sampling={sampling!r}{why}; it supports: "
                             f"{', '.join(workflow.samplings)}")
        if estimator not in workflow.estimators(sampling):
            raise ValueError(
                f"estimator {estimator!r} does not work with sampling={sampling!r} in {name}; "
                f"use one of: {', '.join(workflow.estimators(sampling))}"
            )
        if validation.tasks and "parallel" not in workflow.samplings:
            raise ValueError(f"validation plays k independent trajectories per task (parallel sampling), "
                             f"which {name} does not support: set --data.validation.tasks 0")
        self.workflow, self.config, self.validation = workflow, config, validation
        self.agent_map: dict[str, str] = {}
        self.last_validation: RolloutResult | None = None
        """The samples and episodes of the last :meth:`validate` (every rank's)."""
        self.source: Synchronous | Pipeline = (Pipeline(config.staleness) if config.staleness
                                               else Synchronous())
        """Where the iterations' rollouts come from, chosen once: played before each update, or ahead in
        the background (``staleness`` >= 1)."""

    def bind(self, backend: RolloutBackend) -> None:
        """Resolve the workflow's agents to the backend's policies (errors name the agent)."""
        self.agent_map = backend.bind_agents(self.workflow.agents)

    # ---- training rollouts ------------------------------------------------------------------

    def sample_tasks(self, iteration: int) -> list[Any]:
        """The iteration's tasks: drawn without replacement, the same ones for the same seed."""
        tasks = check_tasks(self.workflow.tasks("train"), self.workflow, "train")
        rng = random.Random(self.config.seed * 1_000_003 + iteration)
        return rng.sample(tasks, min(self.config.tasks_per_iteration, len(tasks)))

    def check_ranks(self, world_size: int) -> None:
        """Refuse a rank count some rank would have no task for."""
        if self.config.tasks_per_iteration < world_size:
            raise ValueError(f"tasks_per_iteration ({self.config.tasks_per_iteration}) must be >= the number "
                             f"of ranks ({world_size}): each rank plays whole tasks")

    def prepare(self, backend: RolloutBackend, iteration: int) -> PreparedIteration:
        """Sync the weights, play this rank's share of the iteration's tasks, gather every rank's
        samples, score them, and pack this rank's micro-batches. With ``staleness`` N >= 1 the
        rollout was played in the background on older weights (:class:`~drmas.data.background.Pipeline`)."""
        if not self.agent_map:
            self.bind(backend)
        return self.source.prepare(self, backend, iteration)

    def play(self, backend: RolloutBackend, iteration: int, version: int, background: bool = False) -> Played:
        """Play this rank's share of the iteration's tasks on the engines' weights (those after
        ``version`` updates), gather every rank's samples and check them. ``background``: in the
        pipeline's thread, which reseeds the engines itself and gathers on a process group of its own."""
        seed = rollout_seed(self.config.seed, backend.rank, iteration)
        if background:
            backend.reseed(seed)
        t1 = time.perf_counter()
        mine = self.sample_tasks(iteration)[backend.rank :: backend.world_size]
        backend.engine_cache_stats()  # from here on: this rollout's requests only
        backend.engine_busy()
        local, failure = self._play(backend, f"iteration {iteration}", mine, backend.generate_fn(train=True),
                                    self.config.group_size, self.config.sampling, seed)
        at("the rollout's gather")
        result, (prompt, cached) = gather(backend, local, failure, backend.engine_cache_stats(), background)
        scalars = self.check_failures(result, f"iteration {iteration}")
        scalars.update(self.workflow.scalars(result.counts))
        result, scalars["rollout/nonfinite_rewards"] = drop_nonfinite(result, iteration)
        for s in result.samples:
            s.policy, s.version = self.agent_map[s.agent], version
        if prompt:
            scalars["rollout/prefix_cache_hit_rate"] = cached / prompt
        end = time.perf_counter()
        return Played(iteration, result, scalars, end - t1, end, t1, backend.engine_busy())

    def finish(self, backend: RolloutBackend, played: Played, timings: dict[str, float]) -> PreparedIteration:
        """Advantages (the whole rollout is one weight version, so each group is) and this rank's
        micro-batches of a played rollout; ``train/<policy>/staleness_*`` when rollouts lag."""
        t2 = time.perf_counter()
        samples, k = played.result.samples, played.iteration
        adv = compute_advantages(samples, self.config.estimator, self.config.scale)
        for s, a in zip(samples, adv.tolist()):
            s.advantage = a
        scalars = dict(played.scalars)
        if self.config.staleness:
            lags: dict[str, list[int]] = defaultdict(list)
            for s in samples:
                lags[s.policy].append(k - 1 - s.version)
            for name, lag in lags.items():
                if backend.batch_spec(name).trainable:  # a frozen policy's weights never age
                    scalars[f"train/{name}/staleness_mean"] = sum(lag) / len(lag)
                    scalars[f"train/{name}/staleness_max"] = float(max(lag))
        timings = {**timings, "time/rollout_s": played.rollout_s,
                   "time/advantage_s": time.perf_counter() - t2}
        return PreparedIteration(k, played.result, self.micro_batches(samples, backend), timings, scalars)

    def check_failures(self, result: RolloutResult, where: str, prefix: str = "rollout") -> dict[str, float]:
        """``<prefix>/failed_actions`` (and per agent, where any failed) and ``<prefix>/failed_episodes``
        (episodes whose ``info`` holds a ``failure``: none of their samples is trained);
        :class:`OutageError` when more than ``max_failed_share`` of one agent's actions, or of the
        episodes, failed."""
        broken = [e.info["failure"] for e in result.episodes if "failure" in e.info]
        if broken and len(broken) > self.config.max_failed_share * len(result.episodes):
            raise OutageError(
                f"{where}: {len(broken)} of {len(result.episodes)} episodes failed, more than "
                f"max_failed_share={self.config.max_failed_share} allows; stopping. "
                f"The first failure:\n{broken[0]}")
        total: dict[str, int] = defaultdict(int)
        failed: dict[str, list[str]] = defaultdict(list)
        for s in result.samples:
            total[s.agent] += 1
            if "failure" in s.info:
                failed[s.agent].append(s.info["failure"])
        scalars = {f"{prefix}/failed_actions": float(sum(map(len, failed.values()))),
                   f"{prefix}/failed_episodes": float(len(broken))}
        for agent, why in failed.items():
            scalars[f"{prefix}/{agent}/failed_actions"] = float(len(why))
            if len(why) > self.config.max_failed_share * total[agent]:
                raise OutageError(
                    f"{where}: {len(why)} of {total[agent]} {agent} actions failed in the environment, "
                    f"more than max_failed_share={self.config.max_failed_share} allows; stopping rather "
                    f"than training on an outage. Last failure: {why[-1]}")
        return scalars

    def _play(self, backend: RolloutBackend, desc: str, tasks: Sequence[Any], generate: GenerateFn, n: int,
              sampling: str, seed: int) -> tuple[RolloutResult, BaseException | None]:
        """The workflow's rollout of this rank's ``tasks``, with a progress bar over its episodes
        where one is shown; and what stopped it, if anything did (a SIGTERM, an engine failure):
        raised only once every rank has heard of it, in :func:`~drmas.data.gathered.gather`."""
        if not tasks:
            return RolloutResult([], []), None
        bar = EpisodeBar(len(tasks) * (n if sampling == "parallel" else 1), desc,
                         show_progress(self.config.progress, backend.rank))
        try:
            return self.workflow.rollout(tasks, generate, n=n, sampling=sampling, seed=seed,
                                         progress=bar if bar.active else None), None
        except BaseException as err:  # SIGTERM is a SystemExit
            return RolloutResult([], []), err
        finally:
            bar.close()

    def micro_batches(self, samples: Sequence[Sample], backend: RolloutBackend) -> list[MicroBatch]:
        """This rank's micro-batches of each policy it trains (every policy, or those whose pool holds
        this rank), PPO epoch by PPO epoch; a policy only ever sees its agents' samples, and its last
        micro-batch of each PPO epoch carries its optimiser step."""
        specs = {name: spec for name in dict.fromkeys(self.agent_map.values())
                 if (spec := backend.batch_spec(name)).trainable}  # a frozen policy's samples only count
        return policy_micro_batches(samples, specs, backend.rank, backend.world_size)

    # ---- validation -------------------------------------------------------------------------

    def val_task_list(self, split: str = "val", limit: int | None = None) -> list[Any]:
        """The first ``validation.tasks`` tasks of each source of the split (tasks without a ``source``
        attribute form one source); ``limit``: fewer of each."""
        count = self.validation.tasks if limit is None else min(limit, self.validation.tasks)
        per_source: dict[Any, list[Any]] = defaultdict(list)
        for t in check_tasks(self.workflow.tasks(split), self.workflow, split):
            group = per_source[t.source or None]
            if len(group) < count:
                group.append(t)
        return [t for group in per_source.values() for t in group]

    def swapped_agents(self) -> dict[str, str]:
        """The policy-swap probe: agent -> the agent whose policy answers its prompts instead.
        Each agent's policy moves to the next agent (two agents trade); needs one policy per agent."""
        agents = list(self.workflow.agents)
        if len({self.agent_map[a] for a in agents}) != len(agents):
            raise ValueError(f"the policy-swap probe needs one policy per agent, got agents -> policies "
                             f"{self.agent_map} (give --model.policies one entry per agent)")
        return {a: agents[(i + 1) % len(agents)] for i, a in enumerate(agents)}

    def validate_all(self, backend: RolloutBackend, split: str = "val",
                     swap_probe: bool = False, limit: int | None = None) -> dict[str, float]:
        """:meth:`validate`, then (``swap_probe``) the same with the policies swapped; the scalars
        of both. :attr:`last_validation` keeps the first's samples. ``limit``: fewer tasks of each
        source (:meth:`val_task_list`)."""
        scalars = self.validate(backend, split=split, limit=limit)
        played = self.last_validation
        if scalars and swap_probe:
            scalars.update(self.validate(backend, swap=True, split=split, limit=limit))
            self.last_validation = played
        return scalars

    @torch.no_grad()
    def validate(self, backend: RolloutBackend, swap: bool = False, split: str = "val",
                 limit: int | None = None) -> dict[str, float]:
        """``val/avg@k`` and ``val/pass@k`` over the val tasks, plus ``val/<source>/avg@k`` and
        ``val/<source>/pass@k`` per source when the tasks name one, ``val/success_rate``,
        ``val/turns_mean`` and per agent ``val/<agent>/reward_mean`` and ``valid_ratio`` ({} with
        ``validation.tasks`` 0). ``swap``: the policy-swap probe (:meth:`swapped_agents`), under
        ``val_swapped/``. ``split``: another split (``test``: under ``test/``)."""
        if not self.validation.tasks:
            return {}
        if not self.agent_map:
            self.bind(backend)
        tasks = self.val_task_list(split, limit)
        if not tasks:
            return {}
        # the same draws at every validation
        backend.sync_weights(seed=rollout_seed(self.config.seed, backend.rank, -1))
        mine = tasks[backend.rank :: backend.world_size]
        top = f"{split}_swapped" if swap else split
        generate = backend.generate_fn(train=False)
        if swap:
            generate = Rerouted(generate, self.swapped_agents())
        local, failure = self._play(backend, f"{top} ({split})" if swap else split, mine, generate,
                                    self.validation.k, "parallel", 0)
        at(f"the {split} rollout's gather")
        result, _ = gather(backend, local, failure)
        self.last_validation = result
        # only when some failed
        failures = {k: v for k, v in self.check_failures(result, top, top).items() if v}
        correct: dict[str, int] = defaultdict(int)
        for ep in result.episodes:
            correct[ep.task_uid] += int(ep.success)
        groups: dict[str, list[Any]] = {top: tasks}
        for t in tasks:
            if t.source:
                groups.setdefault(f"{top}/{t.source}", []).append(t)
        scalars = failures
        for prefix, group in groups.items():
            c = torch.tensor([correct[t.uid] for t in group])
            k = self.validation.k
            n = torch.full_like(c, k)
            avg, pas = AvgAtK(k), PassAtK(k)
            avg.update(c, n)
            pas.update(c, n)
            scalars[f"{prefix}/avg@{k}"] = float(avg.compute())
            scalars[f"{prefix}/pass@{k}"] = float(pas.compute())
        scalars.update(outcome_scalars(result, top))
        return scalars
