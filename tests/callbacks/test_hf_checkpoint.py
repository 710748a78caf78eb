"""HFCheckpoint on a real Trainer training the tiny random Llama with manual optimisation."""

import copy
import os

import lightning.pytorch as pl
import pytest
import torch
from lightning.pytorch.loggers import TensorBoardLogger
from torch.utils.data import DataLoader, TensorDataset
from transformers import AutoModelForCausalLM, AutoTokenizer

from drmas.callbacks import HFCheckpoint
from drmas.models import load_causal_lm


@pytest.fixture(scope="module")
def tiny():
    return load_causal_lm("tiny-random")


class Policy(torch.nn.Module):
    """What HFCheckpoint reads of a policy (drmas.callbacks.contracts.ExportedPolicy)."""

    def __init__(self, model, tokenizer) -> None:
        super().__init__()
        self.model = model
        self.tokenizer = tokenizer
        self.adapter, self.trainable = None, True


class TinyLM(pl.LightningModule):
    """Two policies (copies of the tiny model) trained on random tokens, one Adam each.

    ``increment_in`` chooses where the iteration counter advances during the epoch: when the
    rollout (the epoch's data) is built, as MultiAgentRL does, or in a training step.
    """

    def __init__(self, model, tokenizer, increment_in: str = "train_dataloader") -> None:
        super().__init__()
        self.automatic_optimization = False
        self.policies = torch.nn.ModuleDict(
            {name: Policy(copy.deepcopy(model), tokenizer) for name in ("solver", "checker")}
        )
        self.policies.train()  # from_pretrained returns eval mode; Lightning warns about it
        self.increment_in = increment_in
        self.iteration = 0
        self.snapshots: dict[int, dict[str, dict[str, torch.Tensor]]] = {}

    def log_scalars(self, metrics: dict[str, float]) -> None:
        for lg in self.loggers:
            lg.log_metrics(metrics, step=self.iteration)

    def train_dataloader(self):
        if self.increment_in == "train_dataloader":
            self.iteration += 1
        ids = torch.randint(0, 1000, (2, 8))
        return DataLoader(TensorDataset(ids), batch_size=2)

    def configure_optimizers(self):
        return [torch.optim.Adam(p.model.parameters(), lr=1e-2) for p in self.policies.values()]

    def training_step(self, batch, batch_idx):
        (ids,) = batch
        norms = {}
        for opt, (name, policy) in zip(self.optimizers(), self.policies.items()):
            loss = policy.model(input_ids=ids, labels=ids).loss
            opt.zero_grad()
            self.manual_backward(loss)
            norms[name] = float(torch.nn.utils.clip_grad_norm_(policy.model.parameters(), 1.0))
            opt.step()
        if self.increment_in == "training_step":
            self.iteration += 1
        return {"grad_norms": norms}

    def on_train_epoch_end(self) -> None:
        self.snapshots[self.current_epoch + 1] = {
            name: {k: v.detach().clone() for k, v in p.model.state_dict().items()}
            for name, p in self.policies.items()
        }


def fit(tmp_path, module, max_epochs, callback) -> pl.Trainer:
    trainer = pl.Trainer(
        accelerator="cpu",
        max_epochs=max_epochs,
        logger=TensorBoardLogger(tmp_path),
        enable_checkpointing=False,
        enable_progress_bar=False,
        enable_model_summary=False,
        log_every_n_steps=1,
        reload_dataloaders_every_n_epochs=1,
        callbacks=[callback],
    )
    trainer.fit(module)
    return trainer


def assert_saved_weights_equal(path: str, expected: dict[str, torch.Tensor]) -> None:
    reloaded = AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32)
    state = reloaded.state_dict()
    assert set(state) == set(expected)
    for k, v in expected.items():
        assert torch.equal(state[k], v), k


@pytest.mark.parametrize("increment_in", ["train_dataloader", "training_step"])
def test_every_iteration_saves_reloadable_policies(tmp_path, tiny, increment_in):
    model, tok = tiny
    module = TinyLM(model, tok, increment_in=increment_in)
    callback = HFCheckpoint(every_n_iterations=1)
    trainer = fit(tmp_path, module, 2, callback)

    root = os.path.join(trainer.log_dir, "hf")
    # Exactly the two iteration dirs and `latest`: no temporaries, no duplicate save at the end.
    assert sorted(os.listdir(root)) == ["iter_1", "iter_2", "latest"]
    with open(os.path.join(root, "latest")) as f:
        assert f.read().strip() == "iter_2"
    assert callback.last_saved == 2 and callback.last_saved_path == os.path.join(root, "iter_2")

    for k in (1, 2):
        assert sorted(os.listdir(os.path.join(root, f"iter_{k}"))) == ["checker", "solver"]
        for name in ("solver", "checker"):
            assert_saved_weights_equal(os.path.join(root, f"iter_{k}", name), module.snapshots[k][name])
    # Training really moved the weights between the two saves.
    w1 = module.snapshots[1]["solver"]["model.embed_tokens.weight"]
    w2 = module.snapshots[2]["solver"]["model.embed_tokens.weight"]
    assert not torch.equal(w1, w2)

    reloaded_tok = AutoTokenizer.from_pretrained(os.path.join(root, "iter_2", "solver"))
    assert reloaded_tok.chat_template == tok.chat_template


@pytest.mark.parametrize(
    ("every_n", "epochs", "expected"), [(0, 2, ["iter_2"]), (2, 3, ["iter_2", "iter_3"])]
)
def test_cadence_and_final_save(tmp_path, tiny, every_n, epochs, expected):
    model, tok = tiny
    module = TinyLM(model, tok)
    out = tmp_path / "exports"
    callback = HFCheckpoint(every_n_iterations=every_n, dirpath=str(out), save_tokenizer=False)
    fit(tmp_path, module, epochs, callback)

    assert sorted(os.listdir(out)) == expected + ["latest"]
    assert (out / "latest").read_text().strip() == expected[-1]
    final = out / expected[-1] / "solver"
    assert not (final / "tokenizer_config.json").exists()
    assert_saved_weights_equal(str(final), module.snapshots[epochs]["solver"])


def test_saving_the_same_iteration_again_replaces_it(tmp_path, tiny):
    model, tok = tiny
    out = tmp_path / "exports"
    first = TinyLM(model, tok)
    fit(tmp_path, first, 1, HFCheckpoint(dirpath=str(out)))
    second = TinyLM(model, tok)
    fit(tmp_path, second, 1, HFCheckpoint(dirpath=str(out)))

    assert sorted(os.listdir(out)) == ["iter_1", "latest"]
    assert_saved_weights_equal(str(out / "iter_1" / "checker"), second.snapshots[1]["checker"])


def test_lightning_calls_plain_callbacks_before_the_module_at_epoch_end(tmp_path):
    """The hook order the callback's docstring describes (fit_loop.py, _FitLoop.on_advance_end)."""
    calls = []

    class Probe(pl.Callback):
        def on_train_epoch_end(self, trainer, pl_module):
            calls.append("callback")

    class Module(pl.LightningModule):
        def __init__(self):
            super().__init__()
            self.layer = torch.nn.Linear(1, 1)

        def train_dataloader(self):
            return DataLoader(TensorDataset(torch.ones(1, 1)), batch_size=1)

        def training_step(self, batch, batch_idx):
            return self.layer(batch[0]).sum()

        def configure_optimizers(self):
            return torch.optim.SGD(self.parameters(), lr=0.1)

        def on_train_epoch_end(self):
            calls.append("module")

    trainer = pl.Trainer(
        accelerator="cpu",
        max_epochs=1,
        logger=False,
        enable_checkpointing=False,
        enable_progress_bar=False,
        enable_model_summary=False,
        callbacks=[Probe()],
    )
    trainer.fit(Module())
    assert calls == ["callback", "module"]


def test_rejects_negative_cadence():
    with pytest.raises(ValueError):
        HFCheckpoint(every_n_iterations=-1)


def test_the_export_gathers_and_writes_one_policy_at_a_time(tmp_path, tiny, monkeypatch):
    """Rank 0 holds one policy's full weights at a time (a team of 8B policies gathered at once
    would fill a node's host memory)."""
    import drmas.callbacks.hf_checkpoint as hf

    events = []
    gather, write = hf._full_state_dict, hf.HFCheckpoint._write_policy
    monkeypatch.setattr(hf, "_full_state_dict",
                        lambda model, keep: events.append("gather") or gather(model, keep))
    monkeypatch.setattr(hf.HFCheckpoint, "_write_policy",
                        lambda self, policy, full, out: events.append(f"write {os.path.basename(out)}")
                        or write(self, policy, full, out))
    model, tok = tiny
    ckpt = HFCheckpoint(dirpath=str(tmp_path / "hf"))
    trainer = pl.Trainer(max_epochs=1, callbacks=[ckpt], logger=False, enable_checkpointing=False,
                         enable_progress_bar=False, enable_model_summary=False)
    trainer.fit(TinyLM(model, tok))
    assert events == ["gather", "write solver", "gather", "write checker"]
    assert sorted(os.listdir(tmp_path / "hf" / "iter_1")) == ["checker", "solver"]
    assert [n for n in os.listdir(tmp_path / "hf") if n.startswith(".")] == []  # no temporary left


def test_a_module_without_what_the_callback_reads_is_refused_naming_it(tiny, tmp_path):
    model, tok = tiny
    module = TinyLM(model, tok)
    del module.iteration
    trainer = pl.Trainer(logger=False, enable_checkpointing=False, max_epochs=1)
    with pytest.raises(TypeError, match=r"HFCheckpoint reads iteration from TinyLM, which has none "
                                        r"\(drmas.callbacks.contracts.PolicyModule\)"):
        HFCheckpoint(dirpath=str(tmp_path)).setup(trainer, module, "fit")
    module.iteration = 0
    del module.policies["solver"].trainable
    with pytest.raises(TypeError, match="HFCheckpoint reads trainable from Policy"):
        HFCheckpoint(dirpath=str(tmp_path)).setup(trainer, module, "fit")
