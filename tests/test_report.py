"""drmas.report: values read back from event files, means and bootstrap intervals over runs."""

import json
import os

from torch.utils.tensorboard import SummaryWriter

from drmas.report import bootstrap_interval, main, read_validations, two_level_interval


def write_run(path, val, reward, grad):
    w = SummaryWriter(str(path))
    for step, v in val.items():
        w.add_scalar("val/avg@2", v, step)
        w.add_scalar("val/onehop/avg@2", v / 2, step)
    for step, r in reward.items():
        w.add_scalar("rollout/solver/reward_mean", r, step)
        w.add_scalar("train/shared/grad_norm", grad[step], step)
        w.add_scalar("train/shared/grad_norm_max", 99.0, step)  # not a norm of its own
        w.add_scalar("time/rollout_s", 2.0, step)
    w.close()


def test_the_report_of_two_runs(tmp_path):
    write_run(tmp_path / "a", {0: 0.0, 2: 0.5}, {1: -0.1, 2: 0.3}, {1: 1.0, 2: 3.0})
    write_run(tmp_path / "b", {0: 0.0, 2: 0.3}, {1: -0.1, 2: 0.1}, {1: 2.0, 2: 4.0})
    main([str(tmp_path / "a"), str(tmp_path / "b"), "-o", str(tmp_path / "out")])
    text = (tmp_path / "out" / "report.md").read_text()
    # the mean of 0.5 and 0.3, and the bootstrap of two runs: means of {0.3, 0.3}, {0.3, 0.5}, {0.5, 0.5}
    assert "| val/avg@2 | 2 | 0.400 | [0.300, 0.500] | 2 |" in text
    assert "| val/onehop/avg@2 | 2 | 0.200 | [0.150, 0.250] | 2 |" in text
    assert "| rollout/solver/reward_mean | 1 | -0.100 | 2 | 0.200 |" in text
    # grad norms 1, 2, 3, 4: median 2.5, 90th percentile 3.7 (linear), max 4; the max tag is not one
    assert "| shared | 4 | 2.500 | 3.700 | 4.000 |" in text and "grad_norm_max" not in text
    assert "| rollout | 2.00 | 4 |" in text
    for png in ("validation.png", "agents.png"):
        assert os.path.getsize(tmp_path / "out" / png) > 1000


def test_one_run_has_no_interval():
    assert bootstrap_interval([0.4]) is None
    low, high = bootstrap_interval([0.0, 1.0, 0.0, 1.0])
    assert 0.0 <= low < 0.5 < high <= 1.0


def test_the_two_level_interval_holds_seeds_and_questions():
    # every question of every run scores 0.5: nothing varies
    assert two_level_interval([[0.5] * 4] * 3) == (0.5, 0.5)
    # runs that always score 1 or 0: a draw of two runs is (1, 1) or (0, 0) a quarter of the time each
    assert two_level_interval([[1.0] * 3, [0.0] * 3]) == (0.0, 1.0)
    # one run: the questions alone; one question of one run: nothing to draw
    low, high = two_level_interval([[0.0, 1.0, 0.0, 1.0]])
    assert 0.0 <= low < 0.5 < high <= 1.0
    assert two_level_interval([[1.0]]) is None


def test_a_report_from_recorded_questions_bootstraps_them(tmp_path):
    for name in ("a", "b"):  # the logged means: 0.5 overall, 0.25 on onehop (its questions: 1 and 0 of 2)
        write_run(tmp_path / name, {0: 0.0, 2: 0.5}, {1: 0.0, 2: 0.0}, {1: 1.0, 2: 1.0})
        lines = [{"iteration": 0, "k": 2, "tasks": []},  # replaced by a second record (a resumed run)
                 {"iteration": 0, "k": 2, "tasks": [{"uid": str(i), "source": "onehop" if i < 2 else "twohop",
                                                      "correct": 0} for i in range(4)]},
                 {"iteration": 2, "k": 2, "tasks": [{"uid": str(i), "source": "onehop" if i < 2 else "twohop",
                                                      "correct": c} for i, c in enumerate((1, 0, 2, 1))]}]
        (tmp_path / name / "validation.jsonl").write_text("".join(json.dumps(r) + "\n" for r in lines))
    assert sorted(read_validations(str(tmp_path / "a"))) == [0, 2]
    main([str(tmp_path / "a"), str(tmp_path / "b"), "-o", str(tmp_path / "out")])
    text = (tmp_path / "out" / "report.md").read_text()
    # the runs agree, but the questions differ: the interval comes from the questions
    row = next(line for line in text.splitlines() if line.startswith("| val/avg@2 | 2 |"))
    low, high = (float(x) for x in row.split("[")[1].split("]")[0].split(", "))
    assert low < 0.5 < high and row.endswith("q | 2 |")
    # onehop's question scores are 0.5 and 0: a draw's mean is 0 (or 0.5) when all four picks are
    # 0 (or 0.5), 1/16 > 2.5% of the time
    assert "| val/onehop/avg@2 | 2 | 0.250 | [0.000, 0.500] q | 2 |" in text
    assert "| val/avg@2 | 0 | 0.000 | [0.000, 0.000] q | 2 |" in text


def test_agents_are_shown_over_windows_of_iterations(tmp_path):
    steps = range(1, 13)  # rewards 1..12: the first five average 3, the last five (8-12) 10
    write_run(tmp_path / "a", {0: 0.0}, {i: float(i) for i in steps}, {i: 1.0 for i in steps})
    main([str(tmp_path / "a"), "-o", str(tmp_path / "out")])
    assert ("| rollout/solver/reward_mean | 1-5 | 3.000 | 8-12 | 10.000 |"
            in (tmp_path / "out" / "report.md").read_text())


def test_the_intervals_are_the_normal_ones_where_the_law_says_and_repeat_for_a_seed():
    # 400 questions, half right: the mean's 95% interval is 0.5 -+ 1.96 sqrt(0.25 / 400) = 0.5 -+ 0.049
    values = [0.0, 1.0] * 200
    low, high = bootstrap_interval(values)
    assert abs(low - 0.451) < 0.01 and abs(high - 0.549) < 0.01
    again = bootstrap_interval(values, seed=3)
    assert again == bootstrap_interval(values, seed=3) != bootstrap_interval(values)
    # three runs that agree: the questions' spread over three times the questions, 0.5 -+ 0.028
    low, high = two_level_interval([values] * 3)
    assert abs(low - 0.472) < 0.01 and abs(high - 0.528) < 0.01
    assert two_level_interval([values] * 3, seed=3) == two_level_interval([values] * 3, seed=3)
