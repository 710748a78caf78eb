"""drmas.evaluation.load_weights: a fit checkpoint's policies come back exactly."""

import lightning as L
import pytest
import torch
from test_training_step import Fixed

from drmas.algorithms import LossConfig
from drmas.evaluation import load_weights
from drmas.modules import MultiAgentRL, PolicyConfig
from drmas.modules.policy_config import OptimSettings, PolicyGeneration
from drmas.records import GenerationSettings


def test_load_weights_restores_the_trained_policies(tmp_path):
    def module():
        torch.manual_seed(0)
        cfg = PolicyConfig(model="tiny-random", optim=OptimSettings(lr=1e-2),
                           generation=PolicyGeneration(
                               train=GenerationSettings(temperature=1.0, max_new_tokens=8)))
        return MultiAgentRL(policies={"p": cfg}, agents={"a": "p"}, engine="hf",
                            loss=LossConfig(importance_cap=None))

    trained = module()
    trainer = L.Trainer(accelerator="cpu", max_epochs=1, reload_dataloaders_every_n_epochs=1, logger=False,
                        enable_checkpointing=False, enable_progress_bar=False, enable_model_summary=False)
    trainer.fit(trained, datamodule=Fixed(trained, 4))
    trainer.save_checkpoint(tmp_path / "last.ckpt")
    fresh = module()
    assert load_weights(fresh, str(tmp_path / "last.ckpt")) == trained.iteration
    assert all(torch.equal(a, b) for a, b in zip(fresh.state_dict().values(), trained.state_dict().values()))
    assert fresh.policies["p"].version == trained.policies["p"].version == 1
    with pytest.raises(FileNotFoundError, match="no checkpoint at"):
        load_weights(fresh, str(tmp_path / "missing.ckpt"))
    with pytest.raises(ValueError, match="sharded"):
        load_weights(fresh, str(tmp_path))


class _Payload:
    """What a hostile checkpoint could hold: unpickling it would run code."""

    def __init__(self, marker):
        self.marker = marker

    def __reduce__(self):
        return (open, (self.marker, "w"))  # creates the marker file when unpickled


def test_a_checkpoint_that_would_run_code_is_refused_and_runs_none(tmp_path):
    marker = tmp_path / "ran"
    bad = tmp_path / "bad.ckpt"
    torch.save({"state_dict": {}, "drmas": {"iteration": 1, "versions": {}}, "x": _Payload(str(marker))}, bad)
    module = MultiAgentRL(policies={"p": PolicyConfig(model="tiny-random")}, engine="hf")
    with pytest.raises(ValueError, match="holds more than tensors and plain values"):
        load_weights(module, str(bad))
    assert not marker.exists()
