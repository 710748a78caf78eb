"""A logger other than TensorBoard: Lightning's WandbLogger, offline. The completions reach it as
W&B tables (its table API) with the values of the iteration's samples, and the scalars reach both
W&B and the run's metrics.jsonl, which the report and the plots read."""

import glob
import json
import os

import lightning as L
import pytest

from drmas.callbacks import RolloutStats
from drmas.data.datamodule import RolloutDataModule
from drmas.data.rollout_config import ValidationConfig
from drmas.data.rollouts import RolloutConfig
from drmas.data.tables import agent_table
from drmas.modules import MultiAgentRL, PolicyConfig
from drmas.modules.policy_config import PolicyGeneration
from drmas.plots import read_scalars
from drmas.records import GenerationSettings
from drmas.workflows.search import SearchWorkflow

wandb = pytest.importorskip("wandb")
pytestmark = pytest.mark.integration  # fits a model; W&B runs a service process of its own


def _tables(run: str, key: str) -> list[dict]:
    """The tables logged under ``key`` in an offline W&B run folder, in the order logged (a file's
    name holds W&B's own step, which counts every log call)."""
    paths = glob.glob(os.path.join(run, "files", "media", "table", f"{key}_*.table.json"))
    step = lambda p: int(os.path.basename(p)[len(key.rsplit("/", 1)[-1]) + 1:].split("_")[0])  # noqa: E731
    return [json.load(open(p)) for p in sorted(paths, key=step)]


def test_wandb_offline_gets_the_completions_as_tables_and_the_scalars(tmp_path, monkeypatch):
    monkeypatch.setenv("WANDB_SILENT", "true")
    logger = L.pytorch.loggers.WandbLogger(offline=True, save_dir=str(tmp_path), project="drmas-test")
    module = MultiAgentRL(policies={"shared": PolicyConfig(
        model="tiny-random", generation=PolicyGeneration(train=GenerationSettings(max_new_tokens=6)))},
        engine="hf")
    dm = RolloutDataModule(SearchWorkflow(max_turns=2),
                           rollout=RolloutConfig(group_size=2, tasks_per_iteration=2),
                           validation=ValidationConfig(tasks=1, k=1))
    trainer = L.Trainer(accelerator="cpu", max_epochs=1, reload_dataloaders_every_n_epochs=1, logger=logger,
                        callbacks=[RolloutStats()], enable_checkpointing=False, enable_progress_bar=False,
                        enable_model_summary=False, default_root_dir=tmp_path)
    trainer.fit(module, datamodule=dm)
    samples = dm.current.samples
    summary = dict(logger.experiment.summary)  # the last value of each key W&B was given
    wandb.finish()
    (run,) = glob.glob(str(tmp_path / "wandb" / "offline-run-*"))
    # per agent, the iteration's best, median and worst samples, as the TensorBoard tables show them
    for agent in sorted({s.agent for s in samples}):
        (table,) = _tables(run, f"completions/{agent}")  # one iteration
        expected = agent_table([s for s in samples if s.agent == agent])
        assert table["columns"] == expected.columns
        assert table["data"] == expected.rows  # each response whole, advantages as numbers
    answers = _tables(run, "validation/first_answers")
    assert len(answers) == 2  # before training and at the end
    assert answers[1]["columns"] == ["source", "task", "verdict", "agent", "turn", "response"]
    assert {row[2] for row in answers[1]["data"]} <= {"right", "wrong"} and answers[1]["data"]
    # the scalars: every tag of the run's metrics.jsonl (what the report and plots read) reached W&B
    # with its last value
    scalars = read_scalars(trainer.log_dir)
    assert {"rollout/success_rate", "train/shared/loss", "val/avg@1"} <= set(scalars)
    assert {tag: points[-1][1] for tag, points in scalars.items()} == pytest.approx(
        {tag: summary[tag] for tag in scalars}, nan_ok=True)
    assert [step for step, _ in scalars["val/avg@1"]] == [0, 1]
