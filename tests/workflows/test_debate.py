"""The debate: the verdict decides the debaters' rewards at the episode's end (zero-sum or not),
the judge is rewarded for a right pick; rewards by hand for every case, with a scripted engine."""

import pytest
from scripted import Script

from drmas.data.rollouts import RolloutConfig, Rollouts
from drmas.workflows.debate import DebateWorkflow, parse_verdict
from drmas.workflows.math import MathTask

TASK = MathTask("t0", "Tom has 2 apples and buys 3 more. How many apples does he have?", "5", "s")
RIGHT, WRONG = "2 + 3 = 5.\n\\boxed{5}", "2 x 3 = 6.\n\\boxed{6}"


def play(verdict, a=RIGHT, b=WRONG, **kwargs):
    script = Script(lambda agent, p, i: {"debater_a": a, "debater_b": b, "judge": verdict}[agent])
    result = DebateWorkflow(**kwargs).rollout([TASK], script, n=1)
    return {(s.agent, s.turn): (s.valid, s.local_reward, s.reward) for s in result.samples}, result, script


def test_the_verdict_decides_the_debaters_rewards():
    rewards, result, _ = play("A</verdict>")
    # team: the chosen answer (A's 5) is right; A wins +1, B loses -1, the judge's pick is right (+1)
    assert rewards == {("debater_a", 0): (True, 1.0, 2.0), ("debater_b", 0): (True, -1.0, 0.0),
                       ("judge", 0): (True, 1.0, 2.0)}
    assert result.episodes[0].success and result.episodes[0].info == {"verdict": "A", "answer": "5"}
    rewards, result, _ = play("B</verdict>")
    assert rewards == {("debater_a", 0): (True, -1.0, -1.0), ("debater_b", 0): (True, 1.0, 1.0),
                       ("judge", 0): (True, 0.0, 0.0)}
    assert not result.episodes[0].success
    rewards, _, _ = play("B</verdict>", zero_sum=False, alpha=0.5)
    assert rewards[("debater_a", 0)] == (True, 0.0, 0.0) and rewards[("debater_b", 0)] == (True, 1.0, 1.0)


def test_no_verdict_and_no_box_get_the_format_penalty_and_no_final_reward():
    rewards, _, _ = play("I cannot decide")
    assert rewards == {("debater_a", 0): (True, 0.0, 0.0), ("debater_b", 0): (True, 0.0, 0.0),
                       ("judge", 0): (False, pytest.approx(-0.1), pytest.approx(-0.1))}
    rewards, _, _ = play("A</verdict>", a="it is five")  # A chosen but boxed nothing: no answer, team 0
    assert rewards[("debater_a", 0)] == (False, pytest.approx(0.9), pytest.approx(0.9))
    assert rewards[("judge", 0)] == (True, 0.0, 0.0)


def test_rounds_show_each_debater_the_others_last_argument():
    rewards, result, script = play("A</verdict>", max_turns=2)
    assert sorted(rewards) == [("debater_a", 0), ("debater_a", 1), ("debater_b", 0), ("debater_b", 1),
                               ("judge", 1)]
    # the final reward on every sample
    assert all(r[2] == 2.0 for k, r in rewards.items() if k[0] == "debater_a")
    a_prompts, b_prompts = script.prompts("debater_a"), script.prompts("debater_b")
    assert "Debater B says" not in a_prompts[0] and f"Debater B says:\n{WRONG}" in a_prompts[1]
    assert f"Debater A says:\n{RIGHT}" in b_prompts[0]
    judge = script.prompts("judge")[0]
    assert f"Debater A says:\n{RIGHT}" in judge and f"Debater B says:\n{WRONG}" in judge


def test_parse_verdict_and_tree_refused_with_the_reason():
    assert (parse_verdict("<verdict>b </verdict>") == "B"
            and parse_verdict("<verdict>A</verdict> because") == "A")
    assert parse_verdict("<verdict>maybe</verdict>") is None
    with pytest.raises(ValueError, match="tree candidates are scored before any verdict exists"):
        Rollouts(DebateWorkflow(), RolloutConfig(sampling="tree", estimator="at_grpo"))
    with pytest.raises(ValueError, match="max_turns must be >= 1"):
        DebateWorkflow(max_turns=0)
