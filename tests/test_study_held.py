"""bench/study.py runs each run in one process at a time: a second study of the same folder stops
with the holder's pid and leaves the run's logs alone."""

import json
import os
import sys

import pytest

sys.path.insert(0, os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "bench"))

from study import Run, Study, StudyStopped, held  # noqa: E402


def test_a_run_held_by_another_study_stops_this_one_and_keeps_its_logs(tmp_path):
    run = Run("grpo-seed1", "games", [], str(tmp_path / "grpo" / "seed1"), 30)
    os.makedirs(run.run_dir)
    # started, and no checkpoint yet: unheld, a study would remove these logs and start it again
    (tmp_path / "grpo" / "seed1" / "run.json").write_text(json.dumps({"precision": "32-true"}))
    (tmp_path / "grpo" / "seed1" / "stdout.log").write_text("iteration 1\n")
    holder = rf"grpo-seed1 is being run by another process \(pid {os.getpid()}\)"
    with held(run), pytest.raises(StudyStopped, match=holder):
        Study([run]).run_all()
    assert (tmp_path / "grpo" / "seed1" / "stdout.log").read_text() == "iteration 1\n"
    with held(run):  # released with its holder
        pass
