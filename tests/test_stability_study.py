"""bench/stability.py's verdict table from hand-made finished runs: grad-norm quantiles, the
spike monitor's count per 100 steps, the mean inflation factor and the final val avg@k."""

import json
import os
import sys

from torch.utils.tensorboard import SummaryWriter

sys.path.insert(0, os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "bench"))

import stability  # noqa: E402


def finished_run(logs, norms, inflation, correct):
    """A run as the study leaves it: ``run.json`` finished, events and validation records in
    ``search/version_0``."""
    run_dir = logs / "search" / "version_0"
    w = SummaryWriter(str(run_dir))
    for step, v in enumerate(norms, start=1):
        w.add_scalar("train/shared/verifier/grad_norm", v, step)
        w.add_scalar("train/shared/grad_norm", 99.0, step)  # the policy's norm: not an agent's
    for step, v in enumerate(inflation, start=1):
        w.add_scalar("rollout/verifier/baseline_inflation", v, step)
    w.close()
    tasks = [{"uid": str(i), "source": "onehop", "correct": c} for i, c in enumerate(correct)]
    (run_dir / "validation.jsonl").write_text(
        json.dumps({"iteration": 0, "k": 2, "tasks": [{**t, "correct": 0} for t in tasks]}) + "\n"
        + json.dumps({"iteration": len(norms), "k": 2, "tasks": tasks}) + "\n")
    (logs / "run.json").write_text(json.dumps({"machine": "here", "precision": "32-true", "finished": "now"}))


def test_the_verdict_table_of_finished_runs(tmp_path, capsys):
    # grpo_step: seed 0 jumps to 4 after five steps at 1 (4 > 3 x median 1: one spike); seed 1's
    # 3 after five 2s is not one (3 < 6)
    finished_run(tmp_path / "grpo_step" / "seed0", [1, 1, 1, 1, 1, 4], [1.5, 1.5], [1, 1])
    finished_run(tmp_path / "grpo_step" / "seed1", [2, 2, 2, 2, 2, 3], [2.0, 2.0], [1, 1])
    finished_run(tmp_path / "drmas" / "seed0", [1] * 6, [1.0], [2, 2])
    finished_run(tmp_path / "drmas" / "seed1", [1] * 6, [1.0], [2, 2])
    stability.main(["--seeds", "0", "1", "--val_k", "2", "--out", str(tmp_path)])
    assert "4 of 4 runs finished before; 0 to run" in capsys.readouterr().out
    text = (tmp_path / "stability.md").read_text()
    # 12 norms 1,1,1,1,1,2,2,2,2,2,3,4: median 2, 90th percentile 2 + 0.9 x (3 - 2), max 4;
    # 1 spike in 12 steps; inflation mean of 1.5, 1.5, 2, 2; every question avg@2 0.5 in both seeds
    assert "| grpo_step | verifier | 2.000 | 2.900 | 4.000 | 8.3 | 1.75 | 0.500 [0.500, 0.500] |" in text
    assert "| drmas | verifier | 1.000 | 1.000 | 1.000 | 0.0 | 1.00 | 1.000 [1.000, 1.000] |" in text
    assert "searcher" not in text  # no agent without norms of its own
    assert "seeds [0, 1]; machine(s): here, 32-true" in text
    for png in ("grad_norms.png", "inflation.png"):
        assert (tmp_path / png).read_bytes()[:4] == b"\x89PNG"
    report = (tmp_path / "grpo_step" / "report.md").read_text()  # each estimator's full report
    assert ("| shared/verifier | 12 | 2.000 | 2.900 | 4.000 |" in report
            and "- `seed1/search/version_0`" in report)


def test_the_inflation_search_table_gives_each_agents_share_bound_and_factors(tmp_path, capsys):
    import inflation

    run_dir = tmp_path / "debate-1-round" / "debate" / "version_0"
    w = SummaryWriter(str(run_dir))
    for step, (judge, debaters, factor) in enumerate([(4, 12, 1.5), (4, 4, 1.2)], start=1):
        w.add_scalar("rollout/judge/samples", judge, step)
        w.add_scalar("rollout/debater_a/samples", debaters, step)
        w.add_scalar("rollout/judge/baseline_inflation", factor, step)
    w.close()
    (tmp_path / "debate-1-round" / "run.json").write_text(
        json.dumps({"machine": "here", "precision": "32-true", "finished": "now"}))
    inflation.main(["--only", "debate-1-round", "--out", str(tmp_path)])
    text = (tmp_path / "inflation.md").read_text()
    # the judge's share: 4/16 then 4/8, mean 0.375, bound 1/sqrt(0.375) = 1.63; one factor >= 1.3
    assert "| debate-1-round | judge | 0.38 | 1.63 | 1.50, 1.20 | 1.35 | 1 of 2 |" in text
    assert "| debate-1-round | debater_a | 0.62 | 1.26 | - | - | 0 of 0 |" in text
