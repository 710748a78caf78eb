"""bench/at_grpo.py from hand-made finished runs: the selection's criterion, the per-arm table
(samples trained per iteration, rollout success early and late, val avg@k and pass@k before and
after) and the parallel arm's share of singleton prompts by turn."""

import json
import os
import sys

import pytest
from torch.utils.tensorboard import SummaryWriter

sys.path.insert(0, os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "bench"))

import at_grpo  # noqa: E402


def finished_run(logs, iterations, success, samples, singles, first, last, k=2):
    """A run as the study leaves it: ``run.json`` finished, events and validation records in
    ``games/version_0``. ``first``/``last``: each val puzzle's correct count of k."""
    run_dir = logs / "games" / "version_0"
    w = SummaryWriter(str(run_dir))
    for step in range(1, iterations + 1):
        w.add_scalar("rollout/success_rate", success(step), step)
        w.add_scalar("rollout/planner/samples", samples, step)
        w.add_scalar("rollout/tool_user/samples", samples, step)
        w.add_scalar("rollout/planner/valid_ratio", success(step), step)  # the replies' tags: the success's
        w.add_scalar("rollout/planner/response_tokens_mean", 10 * success(step), step)
        w.add_scalar("rollout/tool_user/reward_mean", -success(step), step)
        w.add_scalar("rollout/planner/advantage_abs_mean", success(step) / 2, step)
        for turn, share in singles.items():
            w.add_scalar(f"rollout/planner/singleton_prompts_turn{turn}", share, step)
    w.close()
    def record(it, correct):
        tasks = [{"uid": str(i), "source": "plan_path-4", "correct": x} for i, x in enumerate(correct)]
        return {"iteration": it, "k": k, "tasks": tasks}

    (run_dir / "validation.jsonl").write_text(json.dumps(record(0, first)) + "\n"
                                              + json.dumps(record(iterations, last)) + "\n")
    (logs / "run.json").write_text(json.dumps({"machine": "here", "precision": "32-true", "finished": "now"}))


def test_selection_takes_the_first_candidate_that_meets_the_criterion(tmp_path, capsys):
    names = list(at_grpo.CANDIDATES)
    for arm in at_grpo.ARMS:  # the first candidate: 1 of 16 right (0.0625 < 0.125) in both arms
        finished_run(tmp_path / "select" / names[0] / arm, 15, lambda s: 0.0, 8, {}, [0] * 8, [1] + [0] * 7)
    # the second: GRPO 0.0625, AT-GRPO 2 of 16 (0.125, the threshold itself)
    finished_run(tmp_path / "select" / names[1] / "grpo", 15, lambda s: 0.0, 8, {}, [0] * 8, [1] + [0] * 7)
    finished_run(tmp_path / "select" / names[1] / "at_grpo", 15, lambda s: 0.0, 8, {}, [0] * 8, [2] + [0] * 7)
    at_grpo.main(["select", "--out", str(tmp_path)])
    text = (tmp_path / "selection.md").read_text()
    assert f"| {names[0]} | `{' '.join(at_grpo.CANDIDATES[names[0]])}` | 0.062 | 0.062 | no |" in text
    assert f"| {names[1]} |" in text and "| 0.125 | 0.062 | yes |" in text and names[2] not in text
    assert f"chosen: **{names[1]}**" in text and at_grpo.chosen_setting(str(tmp_path)) == names[1]


def test_the_table_of_both_arms_and_the_singleton_shares(tmp_path):
    (tmp_path / "selection.md").write_text(f"chosen: **{list(at_grpo.CANDIDATES)[0]}**\n")
    for seed in (0, 1):
        # AT-GRPO: success 0 for 5 iterations then 1; val 0 -> 2 of 2 on every puzzle
        finished_run(tmp_path / "at_grpo" / f"seed{seed}", 10, lambda s: float(s > 5), 10, {0: 0.0, 1: 0.0},
                     [0] * 4, [2] * 4)
        # GRPO: success 0.5 throughout; val 1 -> 1 of 2; half the turn-1 prompts alone
        finished_run(tmp_path / "grpo" / f"seed{seed}", 10, lambda s: 0.5, 7, {0: 0.0, 1: 0.5},
                     [1] * 4, [1] * 4)
    at_grpo.main(["--seeds", "0", "1", "--iterations", "10", "--val_k", "2", "--out", str(tmp_path)])
    text = (tmp_path / "at_grpo.md").read_text()
    # samples: both agents' counts summed per iteration; avg@2 0 -> 1 (gain +1 on every puzzle),
    # pass@2 0 -> 1
    assert ("| at_grpo | 20.0 | 0.000 -> 1.000 | 0.000 -> 1.000 [+1.000, +1.000] | "
            "0.000 -> 1.000 [+1.000, +1.000] |") in text
    assert "| grpo | 14.0 | 0.500 -> 0.500 | 0.500 -> 0.500 [+0.000, +0.000] | 1.000 -> 1.000" in text
    # last validation, paired by seed and puzzle: avg@2 1 - 0.5 on every puzzle, pass@2 1 - 1
    assert ("| AT-GRPO - GRPO, last validation [interval] | | | +0.500 [+0.500, +0.500] | "
            "+0.000 [+0.000, +0.000] |") in text
    # per run: iterations 1-5 -> 6-10 of the success (0 -> 1 in AT-GRPO's runs), 10x, halved, negated
    assert ("| at_grpo-seed1 | 0.000 -> 1.000 | 0.00 -> 1.00 | 0.00 -> 10.00 | 0.00 -> 0.50 | "
            "0.00 -> -1.00 |") in text
    assert "| grpo-seed0 | 0.500 -> 0.500 | 0.50 -> 0.50 | 5.00 -> 5.00 | 0.25 -> 0.25 | -0.50 -> -0.50 |" \
        in text
    assert "| planner, turn 0 | 0.000 |" in text and "| planner, turn 1 | 0.500 |" in text
    assert "machine(s): here, 32-true" in text
    assert (tmp_path / "curves.png").read_bytes()[:4] == b"\x89PNG"


def test_a_config_replaces_the_chosen_setting_in_a_study_of_its_own(tmp_path):
    config = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "configs",
                          "qwen3_8b.yaml")
    with pytest.raises(SystemExit) as refused:  # the default folder holds the CPU study: no mixing
        at_grpo.main(["--config", config])
    assert refused.value.code == 2
    run = at_grpo.arm_run("grpo", ["--config", config], 0, str(tmp_path), 10, 2, 5, None)
    # no CPU candidate's flags; the arm's flags after the config's, so they override its tree
    assert run.args[:6] == ["--config", config, *at_grpo.ARMS["grpo"]] and run.precision is None
    assert at_grpo.TURNS not in run.args and "--data.rollout.group_size" not in run.args
    for arm in at_grpo.ARMS:  # no selection.md is needed
        finished_run(tmp_path / arm / "seed0", 10, lambda s: 0.5, 8, {}, [1] * 4, [1] * 4)
    at_grpo.main(["--config", config, "--seeds", "0", "--iterations", "10", "--val_k", "2",
                  "--out", str(tmp_path)])
    assert f"setting qwen3_8b.yaml (`--config {config}`)" in (tmp_path / "at_grpo.md").read_text()


@pytest.mark.integration  # a model's generate and the sandbox
def test_replies_are_sampled_from_a_runs_last_weights_and_cut_where_a_rollout_cuts(tmp_path):
    """The tiny random model's text is noise; what is asserted is the form every reply takes in a
    rollout: each begins with its template's prefill and holds no stop string (a cut made on the
    prefill would leave the tool user's replies empty)."""
    import shutil

    from drmas.models.loading import resolve_model_path

    run_dir = tmp_path / "games" / "version_0"
    shutil.copytree(resolve_model_path("tiny-random"), run_dir / "hf" / "iter_3" / "shared")
    (run_dir / "hf" / "latest").write_text("iter_3\n")
    (run_dir / "config.yaml").write_text(  # the run's own settings, as Lightning saved them
        "data: {workflow: {init_args: {game: plan_path, size: 4}}}\n"
        "model: {policies: {shared: {generation: {train: {temperature: 0.7, max_new_tokens: 16}}}}}\n")
    text = at_grpo.replies(str(run_dir), puzzles=2, samples=2)
    tools = [line for line in text.splitlines() if line.startswith("- tool user: ")]
    plans = [line for line in text.splitlines() if line.startswith("- planner (after the first program")]
    assert len(tools) == 4 and len(plans) == 4 and "hf/iter_3/shared" in text
    opened = ("- tool user: `'```python\\n", '- tool user: `"```python\\n')  # the repr's quotes
    assert all(line.startswith(opened) for line in tools)
    assert all("`'<actions>" in line or '`"<actions>' in line for line in plans)
    assert all("</actions>" not in line for line in plans) and all(line.count("```") == 1 for line in tools)


def test_replies_of_runs_whose_weights_are_gone_are_kept_by_section():
    """replies.md is split at its ``## run`` headings, each section whole (code fences and ``#``
    inside a section are not headings), so a machine without a run's weights keeps that run's text."""
    text = ("## at_grpo-seed0\n\nReplies of `a`:\n\n```\nG..#\n```\n- tool user: `'x'`\n\n"
            "## grpo-seed0\n\nReplies of `b`:\n# not a heading\n")
    assert at_grpo.sections(text) == {
        "at_grpo-seed0": "## at_grpo-seed0\n\nReplies of `a`:\n\n```\nG..#\n```\n- tool user: `'x'`",
        "grpo-seed0": "## grpo-seed0\n\nReplies of `b`:\n# not a heading"}
    assert at_grpo.sections("no heading\n") == {}
