"""RolloutDataModule: Lightning's view of the rollout side; one Lightning epoch = one RL iteration.

``train_dataloader`` is called once per Lightning epoch (the recipe sets
``reload_dataloaders_every_n_epochs=1``): it starts the trainer's next iteration, asks
:class:`~drmas.data.rollouts.Rollouts` to prepare the iteration (rollout with the current
weights, advantages, micro-batches), keeps it as :attr:`RolloutDataModule.current` for the
callbacks, and serves the micro-batches in training order.

With several ranks (``--trainer.strategy fsdp``) every rank plays its own share of the tasks
and trains on its own share of the samples; see :mod:`drmas.data.rollouts`.

Validation runs here too, and only here: before the first iteration, every ``validation.every``
iterations and after the last. Lightning gives data modules no epoch hooks, so the data module
installs one small callback of its own for the end of each iteration; the trainer never calls
the data module.
"""

from __future__ import annotations

import json
import os
import time
from typing import Any

import lightning as L
import torch
from lightning.pytorch.strategies import ModelParallelStrategy
from torch.utils.data import DataLoader

from drmas import iteration as steps
from drmas.algorithms import group_of
from drmas.atomic import write_text
from drmas.data.episodes import EpisodeRecords, keep, policy_gaps, write_records
from drmas.data.tables import log_table, validation_table
from drmas.data.rollouts import RolloutBackend, RolloutConfig, Rollouts, ValidationConfig
from drmas.workflows.base import Workflow
from drmas.ranks import agree, at
from drmas.records import PreparedIteration

__all__ = ["VALIDATION_FILE", "RolloutDataModule"]

VALIDATION_FILE = "validation.jsonl"
"""Beside a run's event files: one line per validation, each val task's correct count of ``k``."""


def _identity(x: Any) -> Any:
    return x


class RolloutDataModule(L.LightningDataModule):
    def __init__(self, workflow: Workflow, rollout: RolloutConfig = RolloutConfig(),  # noqa: B008 (frozen)
                 validation: ValidationConfig = ValidationConfig(),  # noqa: B008 (frozen)
                 episodes: EpisodeRecords = EpisodeRecords()) -> None:  # noqa: B008 (frozen)
        """
        Args:
            workflow: the multi-agent workflow (its tasks, agents, prompts and rewards), by
                registered name (``search``, ``math_solver_verifier``...) or class.
            rollout: how each iteration's rollout is played (``--data.rollout.group_size`` ...).
            validation: which tasks validation plays and how often (``--data.validation.k`` ...).
            episodes: which samples are kept as data in the run's ``episodes/`` folder
                (``--data.episodes.per_iteration`` ...; drmas.data.episodes).
        """
        super().__init__()
        self.rollouts = Rollouts(workflow, rollout, validation)
        self.validation = validation
        self.episodes = episodes
        self.current: PreparedIteration | None = None
        """The current iteration, prepared for training (None before the first rollout)."""
        self._current_started = False  # whether training on ``current`` has begun
        self._hook = _IterationHooks(self)

    @property
    def log_completions_every(self) -> int:
        return self.rollouts.config.log_completions_every

    def setup(self, stage: str) -> None:
        reload = self.trainer.reload_dataloaders_every_n_epochs
        if reload != 1:
            # with any other value Lightning reuses an old rollout: stale samples trained again
            raise ValueError(f"trainer.reload_dataloaders_every_n_epochs must be 1 (one rollout per "
                             f"iteration), got {reload}")
        world = self.trainer.world_size
        if world > 1:
            strategy = self.trainer.strategy
            if not isinstance(strategy, ModelParallelStrategy):
                # e.g. DDP: wraps the whole module, each policy's passes would not line up
                raise ValueError(f"training on {world} ranks needs --trainer.strategy fsdp, got "
                                 f"{type(strategy).__name__}")
            self.rollouts.check_ranks(world)
        if self._hook not in self.trainer.callbacks:
            # first, so validation is logged before the checkpoint of the iteration is written
            self.trainer.callbacks.insert(0, self._hook)
        backend = self._backend()
        backend.set_staleness(self.rollouts.config.staleness)
        last = self.trainer.max_epochs  # no rollout played past the last iteration
        self.rollouts.source.last = last if last is not None and last > 0 else None
        self.rollouts.bind(backend)
        if self.validation.swap_probe:
            self.rollouts.swapped_agents()  # one policy per agent, or an error before anything runs

    def teardown(self, stage: str) -> None:
        self.stop_background()
        self.rollouts.workflow.close()

    def stop_background(self) -> None:
        """Drop the rollouts playing behind the update (the run ends or failed)."""
        self.rollouts.source.stop()

    def state_dict(self) -> dict[str, Any]:
        """With ``staleness`` >= 1: the rollouts played ahead, not yet trained on."""
        ahead = self.rollouts.source.state()
        return {} if ahead is None else {"pipeline": ahead}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        if "pipeline" in state:
            self.rollouts.source.load(state["pipeline"])

    def _backend(self) -> RolloutBackend:
        return self.trainer.lightning_module

    def train_dataloader(self) -> DataLoader:
        # A prepared iteration nobody trained on yet is served again instead of being replaced:
        # on resume Lightning asks twice before the first resumed epoch starts, and a second
        # rollout would skip an iteration (and its random draws) that the uninterrupted run played.
        if self.current is None or self._current_started:
            backend = self._backend()
            if backend.iteration == 0 and self.validation.before_training:
                self.validate(self.validation.before_tasks)  # the "before" numbers, at step 0
            # steps 1-5 of the iteration (drmas.iteration: the whole iteration in order)
            self.current, self._current_started = steps.prepare(backend, self.rollouts), False
        # A loader draws a seed for its workers from torch's global generator when it starts; with
        # rollouts behind the update that draw would race the background's (a frozen policy's HF
        # engine samples from that generator in the background thread), so it draws from its own.
        rng = torch.Generator() if self.rollouts.source.behind else None
        return DataLoader(self.current.micro_batches, batch_size=None, shuffle=False, collate_fn=_identity,
                          generator=rng)

    def validate(self, limit: int | None = None) -> dict[str, float]:
        """Validate the current weights and log the scalars at the current iteration (``limit``:
        fewer tasks of each source)."""
        backend = self._backend()
        scalars = self.rollouts.validate_all(backend, swap_probe=self.validation.swap_probe, limit=limit)
        if scalars:
            backend.log_scalars(scalars)
            self._record_tasks(backend, limit)
            sources = {t.uid: t.source for t in self.rollouts.val_task_list("val", limit)}
            if backend.rank == 0 and self.rollouts.last_validation is not None:
                log_table(self.trainer, "validation/first_answers",
                          validation_table(self.rollouts.last_validation, sources), backend.iteration)
            if self.episodes.validation:
                self._write_episodes("val", backend.iteration, self.rollouts.last_validation, sources, None)
        return scalars

    def _write_episodes(self, split: str, iteration: int, result: Any, sources: dict[Any, Any],
                        limit: int | None) -> None:
        """Rank 0 keeps ``result``'s samples as records (:mod:`drmas.data.episodes`); a failure (a
        full disk) is heard by every rank."""
        backend = self._backend()
        log_dir = self.trainer.log_dir  # (a collective: every rank asks)
        failure, start = None, time.perf_counter()
        gaps = {}
        if split == "train":  # each rank's trained samples' log-prob gaps, on every rank
            mine = getattr(backend, "sample_gaps", None)
            for part in backend.gather_objects(dict(mine or {})):
                gaps.update(part)
            if mine is not None:
                mine.clear()
        if backend.rank == 0 and log_dir and result is not None:
            try:
                estimator = self.rollouts.config.estimator
                write_records(log_dir, split, iteration, keep(result.samples, limit), result.episodes,
                              sources, backend.generate_fn(train=False).tokenizer,
                              policy_gaps(result.samples, gaps),
                              (lambda s: group_of(estimator, s)) if split == "train" else None)
            except Exception as err:
                failure = err
        at(f"the {split} episode records")
        agree(backend.gather_objects, backend.rank, failure)
        if split == "train":  # what keeping them costs the iteration
            backend.log_scalars({"time/episodes_s": time.perf_counter() - start})

    def _record_tasks(self, backend: RolloutBackend, limit: int | None = None) -> None:
        """Append each val task's correct count to ``<log dir>/validation.jsonl`` (rank 0): what a
        bootstrap over questions (``python -m drmas.report``) needs, which the scalars average away.
        A resumed run that validates an iteration again appends it again; readers keep the last."""
        log_dir = self.trainer.log_dir
        failure = None
        if backend.rank == 0 and log_dir and self.rollouts.last_validation is not None:
            try:
                self._write_tasks(backend, log_dir, limit)
            except Exception as err:  # a full disk: every rank hears of it (agreed)
                failure = err
        at("the validation record")
        agree(backend.gather_objects, backend.rank, failure)

    def _write_tasks(self, backend: RolloutBackend, log_dir: str, limit: int | None = None) -> None:
        result = self.rollouts.last_validation
        correct: dict[str, int] = {}
        for ep in result.episodes:
            correct[ep.task_uid] = correct.get(ep.task_uid, 0) + int(ep.success)
        tasks = [{"uid": t.uid, "source": t.source or None, "correct": correct.get(t.uid, 0)}
                 for t in self.rollouts.val_task_list("val", limit)]
        line = json.dumps({"iteration": backend.iteration, "k": self.validation.k, "tasks": tasks})
        path = os.path.join(log_dir, VALIDATION_FILE)
        before = open(path).read() if os.path.exists(path) else ""
        write_text(path, before + line + "\n")  # whole or not at all: a kill never leaves half a line

    def _iteration_end(self, trainer: L.Trainer) -> None:
        backend = self._backend()
        iteration = backend.iteration
        drained = self.rollouts.source.drain()  # validation, the checkpoint and the next sync: engines idle
        if drained:
            backend.log_scalars(drained)
        trained = self.current
        if trained is not None and self.episodes.per_iteration != 0:  # after its update, as trained
            sources = {t.uid: t.source for t in self.rollouts.sample_tasks(trained.iteration)}
            self._write_episodes("train", trained.iteration, trained.rollout, sources,
                                 self.episodes.per_iteration)
        final = trainer.max_epochs is not None and iteration >= trainer.max_epochs
        if final or (self.validation.every and iteration % self.validation.every == 0):
            self.validate()


class _IterationHooks(L.Callback):
    """The data module's epoch hooks: its current iteration is in training; validation when due."""

    def __init__(self, dm: RolloutDataModule) -> None:
        self.dm = dm

    def on_train_epoch_start(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        self.dm._current_started = True

    def on_train_epoch_end(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        self.dm._iteration_end(trainer)

    def on_exception(self, trainer: L.Trainer, pl_module: L.LightningModule, err: BaseException) -> None:
        self.dm.stop_background()
