"""The debate recipe as users run it, on tiny-random: three agents logged and trained."""

import pytest
from recipe_runs import check_run, run_recipe

pytestmark = pytest.mark.integration  # runs the recipe in a process of its own


def test_the_debate_recipe_trains_three_agents(tmp_path):
    # the random model's rewards are all equal (advantages 0): the entropy bonus makes weights move
    run_recipe("debate", tmp_path, "--model.engine", "hf", "--model.loss.entropy_coef", "0.01")
    s = check_run(tmp_path, ("debater_a", "debater_b", "judge"))
    # a random model writes no box and no verdict: everyone pays the format penalty, nobody wins
    # (the rewards by the rules are tests/workflows/test_debate.py's)
    for agent in ("debater_a", "debater_b", "judge"):
        assert all(abs(v + 0.1) < 1e-6 for v in s[f"rollout/{agent}/reward_mean"].values()), agent
