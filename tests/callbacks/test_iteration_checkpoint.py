"""IterationCheckpoint's settings: refused where they cannot work, and a monitor no iteration
logged said at the end (the best iterations kept by a metric: tests/recipes/test_search_recipe.py)."""

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
