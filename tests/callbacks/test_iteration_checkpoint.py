"""IterationCheckpoint's settings: refused where they cannot work, a monitor no iteration logged
said at the end, the summary's lines (the best iterations kept by a metric in a run:
tests/recipes/test_search_recipe.py)."""

from types import SimpleNamespace

import pytest
import torch

from drmas.callbacks import IterationCheckpoint


@pytest.mark.parametrize("kwargs, message", [
    ({"every_n_iterations": -1}, "every_n_iterations must be >= 0, got -1"),
    ({"monitor": "val/avg@4", "mode": "best"}, "mode must be 'max' or 'min', got 'best'"),
    ({"monitor": "val/avg@4", "save_top_k": 0}, "save_top_k must be -1 or >= 1 with a monitor, got 0"),
])
def test_settings_that_cannot_work_are_refused(kwargs, message):
    with pytest.raises(ValueError, match=message):
        IterationCheckpoint(**kwargs)


def test_without_a_monitor_nothing_is_ranked_and_the_files_are_named_by_iteration():
    plain, ranked = IterationCheckpoint(), IterationCheckpoint(monitor="val/avg@4", save_top_k=2)
    assert (plain.save_top_k, plain.save_last) == (0, True)
    assert (ranked.save_top_k, ranked.mode, ranked.monitor) == (2, "max", "val/avg@4")
    assert ranked.format_checkpoint_name({"iteration": torch.tensor(7)}).endswith("best-iter0007.ckpt")


def test_a_monitor_no_iteration_logged_is_said_at_the_end(capsys):
    cb = IterationCheckpoint(monitor="val/avg@8")
    trainer = SimpleNamespace(is_global_zero=True, callback_metrics={"val/avg@4": torch.tensor(0.5)})
    cb.on_fit_end(trainer, None)
    assert capsys.readouterr().err == (
        "IterationCheckpoint: no iteration logged 'val/avg@8', so no best checkpoint was kept (the last "
        "iteration's validation metrics: ['val/avg@4']; validation runs every --data.validation.every "
        "iterations)\n")


def test_the_summary_names_the_best_checkpoint_once_it_has_a_score(tmp_path):
    from drmas.summary import format_summary

    cb = IterationCheckpoint(dirpath=str(tmp_path), monitor="val/avg@4")
    trainer = SimpleNamespace(log_dir=str(tmp_path), callbacks=[cb])
    module = SimpleNamespace(history=[])
    cb.last_model_path = str(tmp_path / "last.ckpt")
    cb.best_model_path = "/earlier/version_0/checkpoints/best-iter0002.ckpt"  # a resumed run: no score yet
    resume = f"resume with:      --ckpt_path {tmp_path}/last.ckpt"
    assert format_summary(module, trainer).splitlines()[1:] == [resume]
    cb.best_model_path, cb.best_model_score = str(tmp_path / "best-iter0004.ckpt"), torch.tensor(0.625)
    assert format_summary(module, trainer).splitlines()[1:] == [
        f"best checkpoint:  {tmp_path}/best-iter0004.ckpt (val/avg@4 = 0.625)", resume]
