"""The code recipe (coder / tester on the embedded problems), as users run it, on the tiny
random model. (The vLLM engine serves every workflow alike, stop strings included: its recipe
runs are the search, games and math ones.)"""

import pytest
from recipe_runs import check_run, run_recipe

pytestmark = pytest.mark.integration  # runs the recipe in a process of its own

AGENTS = ("coder", "tester")


def run(tmp, *args):
    # the random model's rewards are mostly equal: the entropy bonus makes weights move
    return run_recipe("code", tmp, "--model.loss.entropy_coef", "0.01", *args)


def test_code_with_the_hf_engine_in_tree_mode_one_model_per_agent_and_the_swap_probe(tmp_path):
    policies = "{" + ", ".join(f"{a}: {{model: tiny-random, optim: {{lr: 1.0e-3}}}}" for a in AGENTS) + "}"
    run(tmp_path, "--model.engine", "hf", "--data.rollout.sampling", "tree", "--data.rollout.estimator",
        "at_grpo",
        "--model.policies", policies, "--data.validation.swap_probe", "true")
    s = check_run(tmp_path, AGENTS, policy="coder")
    assert "train/tester/grad_norm" in s
    # random tokens are never a passing program: no golden test passes, no episode succeeds
    assert all(-0.1 <= v <= 0.0 for v in s["rollout/coder/reward_mean"].values())  # 0, or -0.1 without code
    assert set(s["rollout/success_rate"].values()) == {0.0}
    # every validation is also played with the policies swapped (before training and at the end)
    assert sorted(s["val/drmas-code/avg@2"]) == sorted(s["val_swapped/drmas-code/avg@2"]) == [0, 2]


def test_a_coder_that_writes_the_reference_solution_passes_every_golden_test(tmp_path):
    """The oracle engine's coder writes each embedded problem's reference solution: every golden
    test passes (team reward 1, success), before and after training; the tester writes no test
    (invalid). A judge or a workflow that misread a run could not log these values."""
    from forked import run_script
    from recipe_runs import ROOT, TINY

    argv = [str(ROOT / "tests" / "recipes" / "oracle.py"), "code", "fit", *TINY, "--model.engine", "oracle",
            "--trainer.logger.init_args.save_dir", str(tmp_path / "runs"),
            "--model.loss.entropy_coef", "0.01"]
    proc = run_script(argv, cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr[-4000:]
    s = check_run(tmp_path, AGENTS)
    assert set(s["rollout/success_rate"].values()) == {1.0}
    assert set(s["val/drmas-code/avg@2"].values()) == {1.0}
    # the coder: alpha * team 1 + its own pass rate 1; the tester: team 1 + nothing - format penalty
    assert set(s["rollout/coder/reward_mean"].values()) == {2.0}
    assert set(s["rollout/tester/valid_ratio"].values()) == {0.0}
