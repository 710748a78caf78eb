"""The debate recipe as users run it, on tiny-random: three agents logged and trained, on the
rigged run the regression values come from (scripted well-formed and malformed replies)."""

import pytest
from recipe_runs import check_run

pytestmark = pytest.mark.integration  # runs the recipe in a process of its own

AGENTS = ("debater_a", "debater_b", "judge")


def test_the_debate_recipe_trains_three_agents(rigged):
    tmp, _ = rigged("debate")
    s = check_run(tmp, AGENTS)  # logged, validated, exported, and the weights moved
    # every agent's rewards differ within its groups, so each is trained with its own advantages
    # (the rewards by the rules are tests/workflows/test_debate.py's; the run's values are pinned in
    # test_regression.py)
    for agent in AGENTS:
        assert min(s[f"rollout/{agent}/advantage_abs_mean"].values()) > 0.3, agent
