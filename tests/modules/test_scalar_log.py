"""ScalarLog: metrics.jsonl appended after a line a kill cut short keeps its next line whole, and
callback_metrics holds the current iteration's scalars only."""

from drmas.modules.scalar_log import ScalarLog
from drmas.records import METRICS_FILE
from drmas.plots import read_scalars


def test_a_resumed_run_appends_whole_lines_after_a_cut_one_and_drops_old_scores(tmp_path):
    (tmp_path / METRICS_FILE).write_text('{"iteration": 1, "val/avg@2": 0.5}\n{"iteration": 2, "val/av')
    log, published = ScalarLog(), {}
    log.open(str(tmp_path), rank_zero=True)
    log.write(published, [], {"val/avg@2": 0.25, "time/update_s": 1.0}, 2, rank_zero=True)
    assert set(published) == {"val/avg@2", "time/update_s"}
    log.write(published, [], {"time/update_s": 2.0}, 3, rank_zero=True)
    assert set(published) == {"time/update_s"} and float(published["time/update_s"]) == 2.0
    assert read_scalars(str(tmp_path)) == {"val/avg@2": [(1, 0.5), (2, 0.25)],
                                           "time/update_s": [(2, 1.0), (3, 2.0)]}
    other = ScalarLog()  # another rank: callback_metrics only, no file
    other.open(str(tmp_path / "rank1"), rank_zero=False)
    assert other.path is None and not (tmp_path / "rank1").exists()
