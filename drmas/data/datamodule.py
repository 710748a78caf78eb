"""RolloutDataModule: each Lightning epoch, a rollout with the current weights becomes the data.

``train_dataloader`` is called once per epoch (the recipe sets
``reload_dataloaders_every_n_epochs=1``): it syncs the engines, plays a batch of tasks with the
workflow, computes advantages with the configured estimator, routes samples to the policy of
their agent, and returns that policy's micro-batches, one PPO epoch after another, with the
last micro-batch of each policy epoch flagged to run that policy's optimiser step.
"""

from __future__ import annotations

import random
import time
from collections import defaultdict
from typing import Any

import lightning as L
import torch
from torch.utils.data import DataLoader

from drmas.algorithms import ADVANTAGE_ESTIMATORS, compute_advantages
from drmas.data.experience import Experience, MicroBatch, make_micro_batches
from drmas.envs.base import RolloutResult, Workflow
from drmas.metrics import AvgAtK, PassAtK

__all__ = ["RolloutDataModule"]

SAMPLING_MODES = ("parallel", "tree")
# Estimators that make no sense in a mode: parallel trajectories never share an (env, agent,
# turn) group, and a tree has one executed trajectory per task.
_INCOMPATIBLE = {"parallel": {"at_grpo"}, "tree": {"grpo", "rloo"}}


def _identity(x: Any) -> Any:
    return x


class RolloutDataModule(L.LightningDataModule):
    def __init__(
        self,
        workflow: Workflow,
        sampling: str = "parallel",
        estimator: str = "drmas",
        scale: str = "std",
        group_size: int = 4,
        tasks_per_iteration: int = 4,
        val_tasks: int = 32,
        val_k: int = 4,
        val_every: int = 0,
        log_completions_every: int = 1,
        seed: int = 0,
    ) -> None:
        """
        Args:
            workflow: the multi-agent workflow (its tasks, agents, prompts and rewards).
            sampling: ``parallel`` (``group_size`` trajectories per task) or ``tree``
                (``group_size`` candidates per (env, agent, turn), the best executed).
            estimator: advantage estimator: grpo, grpo_step, drmas, rloo (parallel), at_grpo
                (tree), or any registered name.
            scale: ``std`` (divide by the group std) or ``none`` (Dr. GRPO).
            group_size: trajectories per task (parallel) or candidates per node (tree).
            tasks_per_iteration: tasks drawn (without replacement within an iteration) per rollout.
            val_tasks: validation tasks used: the first ones of the val split, per source when the
                tasks name their source (0 = no validation).
            val_k: samples per validation task for ``val/avg@k`` and ``val/pass@k``.
            val_every: validate every this many iterations (0 = only before training and at the end).
            log_completions_every: log one sample completion per agent as text every this many
                iterations (0 = never).
            seed: seed of the task sampling (iteration k always draws the same tasks).
        """
        super().__init__()
        if sampling not in SAMPLING_MODES:
            raise ValueError(f"sampling must be one of {SAMPLING_MODES}, got {sampling!r}")
        if estimator not in ADVANTAGE_ESTIMATORS:
            raise ValueError(f"unknown estimator {estimator!r}; known: {', '.join(sorted(ADVANTAGE_ESTIMATORS))}")
        if estimator in _INCOMPATIBLE[sampling]:
            raise ValueError(
                f"estimator {estimator!r} does not work with sampling={sampling!r}: "
                "use at_grpo with tree sampling, and grpo/grpo_step/drmas/rloo with parallel sampling"
            )
        if group_size < 1 or tasks_per_iteration < 1:
            raise ValueError("group_size and tasks_per_iteration must be >= 1")
        self.workflow = workflow
        self.sampling, self.estimator, self.scale = sampling, estimator, scale
        self.group_size, self.tasks_per_iteration = group_size, tasks_per_iteration
        self.val_tasks, self.val_k, self.val_every = val_tasks, val_k, val_every
        self.log_completions_every, self.seed = log_completions_every, seed
        self.last_rollout: RolloutResult | None = None
        self.last_timing: dict[str, float] = {}

    # ---- training data ------------------------------------------------------------------------

    def setup(self, stage: str) -> None:
        module = self.trainer.lightning_module
        module.bind_agents(self.workflow.agents)

    def teardown(self, stage: str) -> None:
        self.workflow.close()

    def sample_tasks(self, iteration: int) -> list[Any]:
        tasks = list(self.workflow.tasks("train"))
        rng = random.Random(self.seed * 1_000_003 + iteration)
        return rng.sample(tasks, min(self.tasks_per_iteration, len(tasks)))

    def train_dataloader(self) -> DataLoader:
        module = self.trainer.lightning_module
        if module.iteration == 0:
            self.validate(module)  # "before" numbers, at step 0
        module.begin_iteration()
        t0 = time.perf_counter()
        module.sync_engines()
        t1 = time.perf_counter()
        result = self.workflow.rollout(
            self.sample_tasks(module.iteration), module.make_generate(train=True),
            n=self.group_size, mode=self.sampling, seed=self.seed + module.iteration,
        )
        t2 = time.perf_counter()
        for s in result.experiences:
            s.policy = module.policy_of(s.agent)
        adv = compute_advantages(result.experiences, self.estimator, self.scale)
        for s, a in zip(result.experiences, adv.tolist()):
            s.advantage = a
        t3 = time.perf_counter()
        batches = self.route(result.experiences, module)
        self.last_rollout = result
        self.last_timing = {"time/sync_s": t1 - t0, "time/rollout_s": t2 - t1, "time/advantage_s": t3 - t2}
        return DataLoader(batches, batch_size=None, shuffle=False, collate_fn=_identity)

    def route(self, samples: list[Experience], module) -> list[MicroBatch]:
        """Each policy's micro-batches, epoch by epoch; a policy only ever sees its agents' samples."""
        per_policy: dict[str, list[Experience]] = defaultdict(list)
        for s in samples:
            per_policy[s.policy].append(s)
        agg = module.loss_kwargs["agg"]
        batches: list[MicroBatch] = []
        max_epochs = max(p.config.ppo_epochs for p in module.policies.values())
        for epoch in range(max_epochs):
            for name, policy in module.policies.items():
                if epoch < policy.config.ppo_epochs and per_policy.get(name):
                    pad = policy.tokenizer.pad_token_id
                    batches += make_micro_batches(per_policy[name], name, policy.config.micro_batch_size, pad, agg, epoch)
        return batches

    # ---- validation ---------------------------------------------------------------------------

    def maybe_validate(self, module, final: bool) -> None:
        if final or (self.val_every and module.iteration % self.val_every == 0):
            self.validate(module)

    def val_task_list(self) -> list[Any]:
        """The first ``val_tasks`` tasks of each source of the val split (tasks without a
        ``source`` attribute form one source)."""
        per_source: dict[Any, list[Any]] = defaultdict(list)
        for t in self.workflow.tasks("val"):
            group = per_source[getattr(t, "source", None)]
            if len(group) < self.val_tasks:
                group.append(t)
        return [t for group in per_source.values() for t in group]

    @torch.no_grad()
    def validate(self, module) -> dict[str, float]:
        """``val/avg@k`` and ``val/pass@k`` over the val tasks, and ``val/<source>/avg@k`` and
        ``val/<source>/pass@k`` per source when the tasks name one; logged at the current iteration."""
        if not self.val_tasks:
            return {}
        tasks = self.val_task_list()
        module.sync_engines()
        result = self.workflow.rollout(tasks, module.make_generate(train=False), n=self.val_k, mode="parallel")
        correct: dict[str, int] = defaultdict(int)
        for ep in result.episodes:
            correct[ep.task_uid] += int(ep.success)
        groups: dict[str, list[Any]] = {"val": tasks}
        for t in tasks:
            if getattr(t, "source", None) is not None:
                groups.setdefault(f"val/{t.source}", []).append(t)
        scalars = {}
        for prefix, group in groups.items():
            c = torch.tensor([correct[t.uid] for t in group])
            n = torch.full_like(c, self.val_k)
            avg, pas = AvgAtK(self.val_k), PassAtK(self.val_k)
            avg.update(c, n)
            pas.update(c, n)
            scalars[f"{prefix}/avg@{self.val_k}"] = float(avg.compute())
            scalars[f"{prefix}/pass@{self.val_k}"] = float(pas.compute())
        module.log_scalars(scalars)
        return scalars
