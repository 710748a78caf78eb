"""The line a run prints per iteration into a log: its phases, each agent's reward and valid ratio,
validation where it ran, and the time left from the iterations after the first."""

from drmas.modules.iteration_line import IterationLines, iteration_line


def test_the_line_of_an_iteration():
    scalars = {"time/rollout_s": 7.14, "time/sync_s": 0.31, "time/update_s": 28.36, "time/episodes_s": 0.01,
               "rollout/verifier/reward_mean": 0.9, "rollout/verifier/valid_ratio": 0.25,
               "rollout/answerer/reward_mean": -0.1, "rollout/answerer/valid_ratio": 0.0,
               "val/avg@2": 0.125, "val/pass@2": 0.25, "val/synthetic-1hop/avg@2": 0.2,
               "train/shared/loss": 1.0}
    assert iteration_line(3, 5, scalars, 41.23, 84.0) == (
        "iteration 3/5 | 41.2 s: rollout 7.1, sync 0.3, update 28.4 | reward/valid answerer -0.10/0.00, "
        "verifier 0.90/0.25 | val avg@2 0.125, pass@2 0.250 | about 1 min 24 s left")
    assert iteration_line(1, None, {}, 2.0, None) == "iteration 1/? | 2.0 s"


def test_the_time_left_leaves_the_first_iteration_out(monkeypatch, capsys):
    clock = iter([0.0, 100.0, 110.0, 130.0, 140.0])  # iterations of 100 s (warm-up), 10 s and 20 s
    monkeypatch.setattr("drmas.modules.iteration_line.time.perf_counter", lambda: next(clock))
    lines = IterationLines(enabled=True)
    lines.start()
    history = [{"iteration": 1, "time/update_s": 1.0}, {"iteration": 2, "time/update_s": 2.0}]
    ends = [lines.end(k, 10, history) for k in (1, 2, 3)]
    assert [e.split(" | ")[-1] for e in ends] == ["about 15 min 0 s left", "about 1 min 20 s left",
                                                  "about 1 min 45 s left"]
    assert ends[1].startswith("iteration 2/10 | 10.0 s: update 2.0 |")
    assert capsys.readouterr().out.splitlines() == ends
    assert IterationLines(enabled=False).end(1, 10, history) is None
