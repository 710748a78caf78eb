"""The coder / tester team, driven by a scripted engine: rewards by the rules, turns, what each
agent sees, invalid replies, a task without a reference, and tree sampling's executed candidate."""

import pytest
from scripted import Script

from drmas.algorithms import compute_advantages
from drmas.workflows.code import CodeTask, CoderTesterWorkflow, TestCase, parse_test_cases
from drmas.workflows.sandbox import SandboxSettings

ADD = "a, b = map(int, input().split())\nprint(a + b)"
TASK = CodeTask("add-0", "Read two integers and print their sum.",
                tuple(TestCase(f"{a} {b}\n", f"{a + b}\n") for a, b in [(1, 2), (0, 0), (-5, 5), (7, 8)]),
                ADD, "t")
GOOD_TESTS = ("<input>\n2 3\n</input>\n<output>\n5\n</output>\n"
              "<input>\n1 1\n</input><output>2</output>\n</tests>")


def written_tests(pairs):
    return "".join(f"<input>\n{i}\n</input>\n<output>\n{o}\n</output>\n" for i, o in pairs) + "</tests>"


@pytest.fixture
def wf():
    w = CoderTesterWorkflow(max_turns=2, sandbox=SandboxSettings(time_limit_s=1.0, workers=2))
    yield w
    w.close()


def by(result, agent):
    return [s for s in result.samples if s.agent == agent]


def test_parse_test_cases():
    assert parse_test_cases(GOOD_TESTS) == [TestCase("2 3\n", "5\n"), TestCase("1 1\n", "2")]
    assert parse_test_cases("<input>1</input> no output") is None
    assert len(parse_test_cases(written_tests([(i, i) for i in range(10)]), limit=3)) == 3


def test_a_right_program_and_right_tests_solve_in_one_turn(wf):
    script = Script(lambda agent, p, i: ADD + "\n```" if agent == "coder" else GOOD_TESTS)
    result = wf.rollout([TASK], script, n=2, sampling="parallel")
    assert [(e.success, e.turns, e.team_reward) for e in result.episodes] == [(True, 1, 1.0)] * 2
    # coder: pass rate 1; tester: the reference passes both of its tests; team 1 x alpha 1
    assert sorted((s.agent, s.local_reward, s.reward) for s in result.samples) == [
        ("coder", 1.0, 2.0)] * 2 + [("tester", 1.0, 2.0)] * 2
    assert "A teammate's program:\n```python\n" + ADD in script.prompts("tester")[0]
    assert "2 3" not in script.prompts("coder")[0]  # golden tests are never shown


def test_a_wrong_program_is_caught_and_every_turn_is_played(wf):
    wrong = "a, b = map(int, input().split())\nprint(a * b)"
    # the second test (2, 2 -> 4) passes by chance; the first (2, 3 -> 5) does not
    script = Script(lambda agent, p, i: wrong + "\n```" if agent == "coder"
                    else written_tests([("2 3", 5), ("2 2", 4)]))
    result = wf.rollout([TASK], script, n=1, sampling="parallel")
    (ep,) = result.episodes
    assert not ep.success and ep.turns == 2 and ep.team_reward == 0.25  # 0 0 -> 0 passes, 1/4
    assert [s.local_reward for s in by(result, "coder")] == [0.25, 0.25]
    assert [s.local_reward for s in by(result, "tester")] == [1.0, 1.0]
    assert [s.reward for s in by(result, "tester")] == [1.25, 1.25]  # alpha x team 0.25 + local 1
    second_coder = script.prompts("coder")[1]
    assert "Your previous program:" in second_coder
    assert "input: 2 3 | expected: 5 | got: 6 | FAIL" in second_coder
    assert "input: 2 2 | expected: 4 | got: 4 | pass" in second_coder
    assert "What it printed on your previous tests:\ninput: 2 3" in script.prompts("tester")[1]


def test_wrong_expected_outputs_cost_the_tester(wf):
    # one right test, one wrong (the reference prints 5, the tester expects 6)
    script = Script(lambda agent, p, i: ADD + "\n```" if agent == "coder"
                    else written_tests([("1 1", 2), ("2 3", 6)]))
    result = wf.rollout([TASK], script, n=1, sampling="parallel")
    assert [s.local_reward for s in by(result, "tester")] == [0.5, 0.5]
    # the right program fails the wrong test, so the episode goes on; the team reward is 1 all the same
    assert result.episodes[0].turns == 2 and result.episodes[0].success


def test_missing_code_and_tests_are_invalid_with_the_penalty(wf):
    # the prefill opens the code block: an empty one is no program
    script = Script(lambda agent, p, i: "```" if agent == "coder" else "no tests here")
    result = wf.rollout([TASK], script, n=1, sampling="parallel")
    assert all(not s.valid for s in result.samples)
    assert [s.reward for s in result.samples] == pytest.approx([-0.1] * 4)
    assert "A teammate wrote no program yet." in script.prompts("tester")[0]


def test_a_crashing_program_and_a_task_without_reference(wf):
    task = CodeTask("add-1", TASK.question, TASK.tests, None, "t")
    script = Script(lambda agent, p, i: "raise SystemExit(2)\n```" if agent == "coder" else GOOD_TESTS)
    result = wf.rollout([task], script, n=1, sampling="parallel")
    assert [s.local_reward for s in result.samples] == [0.0] * 4  # no reference: the tester earns 0
    assert all(s.valid for s in result.samples)
    assert "got: error: exit code 2 | FAIL" in script.prompts("coder")[1]


def test_tree_executes_the_best_candidate(wf):
    wrong = "print(0)"

    def reply(agent, p, i):
        if agent == "coder":
            return (ADD if i == 2 else wrong) + "\n```"
        return GOOD_TESTS

    script = Script(reply)
    result = wf.rollout([TASK], script, n=3, sampling="tree")
    coders = by(result, "coder")
    assert [s.local_reward for s in coders] == [0.5, 0.5, 1.0]  # print(0) passes "0 0" and "-5 5"
    assert ADD in script.prompts("tester")[0]  # the tester sees candidate 2's program
    (ep,) = result.episodes
    assert ep.success and ep.turns == 1  # candidate 2 passes the tester's tests: done
    adv = compute_advantages(result.samples, "at_grpo")
    groups = {}
    for s, a in zip(result.samples, adv.tolist()):
        groups.setdefault((s.traj_uid, s.agent, s.turn), []).append(a)
    assert all(abs(sum(g)) < 1e-6 for g in groups.values()) and adv.abs().sum() > 0


def test_bad_settings_are_refused():
    with pytest.raises(ValueError, match="max_turns must be >= 1"):
        CoderTesterWorkflow(max_turns=0)
    with pytest.raises(ValueError, match="max_tests in 1..64, got 16 and 0"):
        CoderTesterWorkflow(max_tests=0)
    with pytest.raises(ValueError, match="max_golden_tests must be >= 0"):
        CoderTesterWorkflow(max_golden_tests=-1)
    with pytest.raises(FileNotFoundError, match="train data 'missing.jsonl'"):
        CoderTesterWorkflow(train_file="missing.jsonl")


@pytest.mark.integration  # three sandbox runs of 134 tests, twice (5 s)
def test_the_largest_settings_judge_every_test_in_runs_of_at_most_64():
    """70 golden tests and a tester's 64: the coder's second turn judges 134 tests (three sandbox
    runs); training caps the golden tests at max_golden_tests, validation judges all of them."""
    many = CodeTask("add-70", TASK.question, tuple(TestCase(f"{a} 1\n", f"{a + 1}\n") for a in range(70)),
                    ADD, "t")
    # a program right on the first 65 golden tests only: a cap at 64 could not tell it from a right one
    almost = "a, b = map(int, input().split())\nprint(a + b if a < 65 else 0)\n```"
    tests = written_tests([(f"{a} 2", a + 2) for a in range(63)] + [("70 2", 72)])  # the last one fails
    script = Script(lambda agent, p, i: almost if agent == "coder" else tests)
    wf = CoderTesterWorkflow(max_turns=2, sandbox=SandboxSettings(time_limit_s=1.0, workers=2),
                             max_golden_tests=0, max_tests=64)
    capped = CoderTesterWorkflow(max_turns=2, sandbox=SandboxSettings(time_limit_s=1.0, workers=2),
                                 max_golden_tests=64, max_tests=64)
    try:
        result = wf.rollout([many], script, n=1)
        assert [s.local_reward for s in by(result, "coder")] == [65 / 70] * 2
        assert result.episodes[0].turns == 2  # the tester's 64 tests were run at the second turn too
        assert [s.local_reward for s in by(capped.rollout([many], script, n=1), "coder")] == [1.0] * 2
        script.train = False  # validation: every golden test, whatever the training cap
        assert [s.local_reward for s in by(capped.rollout([many], script, n=1), "coder")] == [65 / 70] * 2
    finally:
        wf.close()
        capped.close()
