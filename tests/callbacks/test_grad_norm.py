"""GradNormSpikeMonitor against a real Trainer and a tiny manually optimised module."""

import math
import os

import lightning.pytorch as pl
import pytest
import torch
from lightning.pytorch.loggers import TensorBoardLogger
from tensorboard.backend.event_processing.event_accumulator import EventAccumulator
from torch.utils.data import DataLoader, TensorDataset

from drmas.callbacks import GradNormSpikeMonitor

PNG_MAGIC = b"\x89PNG\r\n\x1a\n"


class TinyPolicy(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.model = torch.nn.Linear(4, 1)
        self.tokenizer = None


class ScriptedNorms(pl.LightningModule):
    """Trains one linear layer per policy for real, but reports scripted grad norms.

    ``script[policy][u]`` is the norm reported at the u-th update overall (u counts across
    iterations, so a resumed run continues the script).
    """

    def __init__(self, script: dict[str, list[float]], batches_per_iteration: int = 1) -> None:
        super().__init__()
        self.automatic_optimization = False
        self.policies = torch.nn.ModuleDict({name: TinyPolicy() for name in script})
        self.script = script
        self.batches_per_iteration = batches_per_iteration
        self.iteration = 0

    def log_scalars(self, metrics: dict[str, float]) -> None:
        for lg in self.loggers:
            lg.log_metrics(metrics, step=self.iteration)

    def train_dataloader(self):
        x = torch.randn(self.batches_per_iteration, 4)
        return DataLoader(TensorDataset(x, x.sum(1, keepdim=True)), batch_size=1)

    def configure_optimizers(self):
        return [torch.optim.SGD(p.model.parameters(), lr=0.01) for p in self.policies.values()]

    def training_step(self, batch, batch_idx):
        x, y = batch
        u = self.iteration * self.batches_per_iteration + batch_idx
        norms = {}
        opts = self.optimizers()
        opts = opts if isinstance(opts, list) else [opts]  # Lightning unwraps a single optimiser
        for opt, (name, policy) in zip(opts, self.policies.items()):
            loss = torch.nn.functional.mse_loss(policy.model(x), y)
            opt.zero_grad()
            self.manual_backward(loss)
            torch.nn.utils.clip_grad_norm_(policy.model.parameters(), 1.0)
            reported = self.script[name][u]
            if math.isfinite(reported):
                opt.step()
            norms[name] = reported
        return {"grad_norms": norms}

    def on_train_epoch_end(self) -> None:
        self.iteration += 1

    def on_save_checkpoint(self, checkpoint) -> None:
        checkpoint["iteration"] = self.iteration

    def on_load_checkpoint(self, checkpoint) -> None:
        self.iteration = checkpoint["iteration"]


def make_trainer(tmp_path, max_epochs: int, callbacks) -> pl.Trainer:
    return pl.Trainer(
        accelerator="cpu",
        max_epochs=max_epochs,
        logger=TensorBoardLogger(tmp_path),
        enable_checkpointing=False,
        enable_progress_bar=False,
        enable_model_summary=False,
        log_every_n_steps=1,
        callbacks=callbacks,
    )


def scalars(log_dir: str, tag: str) -> list[tuple[int, float]]:
    acc = EventAccumulator(log_dir)
    acc.Reload()
    return [(e.step, e.value) for e in acc.Scalars(tag)]


SPIKY = [1, 1, 1, 1, 1, 1, 10, 1]
# NaN/inf are skipped and never count: at the 10 only four finite norms precede it (< min_history=5).
WITH_NAN = [1, 1, 1, 1, float("nan"), 10, float("inf"), 1]


def test_one_spike_logged_plotted_and_nan_ignored(tmp_path):
    monitor = GradNormSpikeMonitor()  # factor 3, window 20, min_history 5
    module = ScriptedNorms({"a": SPIKY, "b": WITH_NAN})
    trainer = make_trainer(tmp_path, max_epochs=8, callbacks=[monitor])
    trainer.fit(module)

    assert module.iteration == 8
    assert monitor.spikes["a"] == [(6, 10.0)]  # the 7th norm, at iteration 6
    assert monitor.spike_count("b") == 0
    assert monitor.skipped_count("b") == 2 and monitor.skipped_count("a") == 0
    assert [it for it, _ in monitor.history["a"]] == list(range(8))

    log_dir = trainer.log_dir
    assert scalars(log_dir, "train/a/grad_norm_spikes") == [(i, 0.0) for i in range(6)] + [(6, 1.0), (7, 1.0)]
    assert scalars(log_dir, "train/b/grad_norm_spikes") == [(i, 0.0) for i in range(8)]
    assert scalars(log_dir, "train/b/grad_norm_skipped") == [
        (0, 0.0), (1, 0.0), (2, 0.0), (3, 0.0), (4, 1.0), (5, 1.0), (6, 2.0), (7, 2.0)
    ]

    png = os.path.join(log_dir, "grad_norms.png")
    assert monitor.plot_path == png
    with open(png, "rb") as f:
        data = f.read()
    assert len(data) > len(PNG_MAGIC) and data.startswith(PNG_MAGIC)
    # No temporary files left next to it.
    assert not [n for n in os.listdir(log_dir) if n.startswith(".grad_norms")]


def test_several_updates_per_iteration_share_the_iteration(tmp_path):
    monitor = GradNormSpikeMonitor(min_history=2, window=3, plot=False)
    # 3 iterations x 2 updates; window 3 + min_history 2: the 5.0 follows [1, 1, 1] -> spike,
    # the 20.0 follows [1, 1, 5] (median 1) -> spike.
    module = ScriptedNorms({"p": [1, 1, 1, 5.0, 1, 20.0]}, batches_per_iteration=2)
    trainer = make_trainer(tmp_path, max_epochs=3, callbacks=[monitor])
    trainer.fit(module)
    assert [it for it, _ in monitor.history["p"]] == [0, 0, 1, 1, 2, 2]
    assert monitor.spikes["p"] == [(1, 5.0), (2, 20.0)]
    assert monitor.plot_path is None and not os.path.exists(os.path.join(trainer.log_dir, "grad_norms.png"))
    # The plot spreads the updates of one iteration inside it.
    assert monitor._x_positions("p") == [0.0, 0.5, 1.0, 1.5, 2.0, 2.5]


def test_spike_rule_uses_window_median_and_min_history():
    m = GradNormSpikeMonitor(factor=2.0, window=3, min_history=3, plot=False)
    seq = [1.0, 1.0, 2.5, 1.0, 10.0, 10.0, 10.0, 30.0]
    flags = [m.record("p", i, v) for i, v in enumerate(seq)]
    # 2.5 comes before min_history; 10 vs median(1, 2.5, 1)=1 spikes; the next 10 vs
    # median(2.5, 1, 10)=2.5 spikes; then median(1, 10, 10)=10 does not; 30 vs 10 spikes.
    assert flags == [False, False, False, False, True, True, False, True]


def test_zero_median_still_a_well_defined_rule():
    m = GradNormSpikeMonitor(min_history=1, window=2, plot=False)
    assert m.record("p", 0, 0.0) is False
    assert m.record("p", 1, 1e-9) is True  # anything above 3 x 0
    assert m.record("p", 2, float("nan")) is False


def test_state_dict_round_trip_keeps_counting():
    m = GradNormSpikeMonitor(plot=False)
    for i, v in enumerate(SPIKY + [float("nan")]):
        m.record("a", i, v)
    state = m.state_dict()
    restored = GradNormSpikeMonitor(plot=False)
    restored.load_state_dict(state)
    assert restored.spikes == m.spikes == {"a": [(6, 10.0)]}
    assert restored.skipped_count("a") == 1
    assert restored.history["a"][:8] == m.history["a"][:8] and math.isnan(restored.history["a"][8][1])
    assert restored.record("a", 9, 50.0) is True
    assert restored.spike_count("a") == 2


def test_resume_from_a_lightning_checkpoint_continues_the_count(tmp_path):
    script = {"a": SPIKY + [1, 30]}
    first = GradNormSpikeMonitor(plot=False)
    trainer = make_trainer(tmp_path, max_epochs=8, callbacks=[first])
    trainer.fit(ScriptedNorms(script))
    ckpt = str(tmp_path / "it8.ckpt")
    trainer.save_checkpoint(ckpt)

    second = GradNormSpikeMonitor()
    trainer = make_trainer(tmp_path, max_epochs=10, callbacks=[second])
    trainer.fit(ScriptedNorms(script), ckpt_path=ckpt)
    assert len(second.history["a"]) == 10
    assert second.spikes["a"] == [(6, 10.0), (9, 30.0)]
    assert scalars(trainer.log_dir, "train/a/grad_norm_spikes") == [(8, 1.0), (9, 2.0)]
    assert os.path.getsize(second.plot_path) > 0


@pytest.mark.parametrize(
    "kwargs", [{"factor": 0}, {"window": 0}, {"min_history": 0}, {"window": 3, "min_history": 4}]
)
def test_rejects_bad_arguments(kwargs):
    with pytest.raises(ValueError):
        GradNormSpikeMonitor(**kwargs)


def test_a_run_whose_every_norm_was_skipped_still_plots(tmp_path):
    # one iteration whose only step was non-finite: a log axis has nothing to place its ticks by
    monitor = GradNormSpikeMonitor()
    monitor.record("p", 1, float("nan"))
    with open(monitor.write_plot(str(tmp_path / "g.png")), "rb") as f:
        assert f.read().startswith(PNG_MAGIC)
