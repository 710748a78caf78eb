"""drmas.iteration names one iteration's steps in order; a real run, every step instrumented, is
checked against that list, so the linear view cannot drift from the code."""

from __future__ import annotations

import functools
import re
import sys
from itertools import groupby
from pathlib import Path

import pytest

from drmas import iteration
from drmas.callbacks import HFCheckpoint, IterationCheckpoint, RolloutStats
from drmas.data import rollouts
from drmas.data.datamodule import RolloutDataModule
from drmas.modules import MultiAgentRL
from drmas.workflows.episode import TurnWorkflow

ROOT = Path(__file__).resolve().parents[1]

# each step of drmas.iteration.STEPS: the function whose call is that step
HOOKS = [
    ("begin", MultiAgentRL, "begin_iteration"),
    ("sync", MultiAgentRL, "sync_weights"),
    ("rollout", TurnWorkflow, "rollout"),
    ("advantages", rollouts, "compute_advantages"),
    ("micro_batches", rollouts, "policy_micro_batches"),
    ("rollout_scalars", RolloutStats, "on_train_epoch_start"),
    ("sleep", MultiAgentRL, "on_train_epoch_start"),
    ("update", MultiAgentRL, "training_step"),
    ("validate", RolloutDataModule, "validate"),
    ("export", HFCheckpoint, "save"),
    ("train_scalars", MultiAgentRL, "on_train_epoch_end"),
    ("checkpoint", IterationCheckpoint, "_save_checkpoint"),
]


@pytest.mark.integration
def test_a_run_plays_each_iteration_in_the_order_drmas_iteration_gives(tmp_path, monkeypatch, capsys):
    assert [step for step, _, _ in HOOKS] == list(iteration.STEPS)
    events: list[str] = []
    inside = []  # a validation plays a rollout of its own: its inner steps are not the iteration's

    def record(step, fn):
        @functools.wraps(fn)
        def wrapper(*args, **kwargs):
            if not inside:
                events.append(step)
            if step == "validate":
                inside.append(step)
            try:
                return fn(*args, **kwargs)
            finally:
                if step == "validate":
                    inside.pop()
        return wrapper

    for step, owner, name in HOOKS:
        monkeypatch.setattr(owner, name, record(step, getattr(owner, name)))
    from drmas.cli import run_recipe

    monkeypatch.setattr(sys, "argv", [str(ROOT / "recipes" / "search.py")])
    run_recipe("search", "search", str(ROOT / "configs/tiny_random.yaml"), args=[
        "fit", "--model.engine", "hf", "--trainer.max_epochs", "2", "--trainer.precision", "32-true",
        "--data.validation.every", "1", "--data.validation.tasks", "1", "--data.validation.k", "1",
        "--hf_checkpoint.every_n_iterations", "1",
        "--trainer.logger.init_args.save_dir", str(tmp_path / "runs")])
    played = [step for step, _ in groupby(events)]  # a step called several times in a row is one step
    one = list(iteration.STEPS)
    # the "before" validation, then each iteration in the documented order
    assert played == ["validate", *one, *one], played
    # the first checkpoint's size and write time, once (a GPU config's is ~100 GB: it sets how often)
    said = [line for line in capsys.readouterr().out.splitlines() if line.startswith("checkpoint: ")]
    assert len(said) == 1 and re.match(r"checkpoint: 0\.\d\d GB written in [\d.]+ s \(.*last\.ckpt; "
                                       r"--checkpoint\.every_n_iterations 1 sets how often\)$", said[0]), said
