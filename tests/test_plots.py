"""drmas.plots: scalars read back from a run's metrics.jsonl or its event files (a resumed run's
later values win), PNGs drawn."""

import pytest
from torch.utils.tensorboard import SummaryWriter

from drmas.plots import main, plot_scalars, read_scalars


@pytest.fixture
def run(tmp_path):
    with SummaryWriter(str(tmp_path)) as w:
        for step in (1, 2, 3):
            w.add_scalar("rollout/success_rate", step / 10, step)
            w.add_scalar("rollout/a/reward_mean", -step, step)
            w.add_scalar("rollout/b/reward_mean", step, step)
    with SummaryWriter(str(tmp_path), filename_suffix=".resumed") as w:  # a resumed run rewrites step 3
        w.add_scalar("rollout/success_rate", 0.9, 3)
    return tmp_path


def test_read_scalars(run):
    s = read_scalars(str(run))
    assert [(x, round(y, 6)) for x, y in s["rollout/success_rate"]] == [(1, 0.1), (2, 0.2), (3, 0.9)]
    assert s["rollout/a/reward_mean"] == [(1, -1.0), (2, -2.0), (3, -3.0)]


def test_plot_scalars_with_globs(run, tmp_path, capsys):
    out = tmp_path / "curves.png"
    drawn = plot_scalars(str(run), ["rollout/success_rate", "rollout/*/reward_mean"], str(out), smooth=2)
    assert drawn == ["rollout/success_rate", "rollout/a/reward_mean", "rollout/b/reward_mean"]
    assert out.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    main([str(run), "rollout/a/*", "-o", str(tmp_path / "a.png")])
    assert "wrote" in capsys.readouterr().out and (tmp_path / "a.png").stat().st_size > 0


def test_unknown_tags_and_empty_dirs_are_named(run, tmp_path):
    with pytest.raises(ValueError, match="no scalar matches \\['val/\\*'\\]"):
        plot_scalars(str(run), ["val/*"], str(tmp_path / "x.png"))
    empty = tmp_path / "empty"
    empty.mkdir()
    with pytest.raises(FileNotFoundError, match="no metrics.jsonl or TensorBoard event file"):
        read_scalars(str(empty))


def test_the_runs_own_metrics_file_is_read_first(run):
    # metrics.jsonl (what drmas writes whatever the logger) wins over the events beside it; a resumed
    # run's later line for an iteration wins; a line cut by a kill is skipped
    (run / "metrics.jsonl").write_text(
        '{"iteration": 1, "rollout/success_rate": 0.5, "time/update_s": 2.0}\n'
        '{"iteration": 2, "rollout/success_rate": 0.6}\n'
        '{"iteration": 2, "rollout/success_rate": 0.7}\n'
        '{"iteration": 3, "rollout/succ')
    assert read_scalars(str(run)) == {"rollout/success_rate": [(1, 0.5), (2, 0.7)],
                                      "time/update_s": [(1, 2.0)]}
