"""The AT-GRPO reasoner / tool-user team driven by a scripted engine; programs run in the real sandbox."""

import pytest
from scripted import Script

from drmas.algorithms import compute_advantages
from drmas.workflows.math import ReasonerToolUserWorkflow
from drmas.workflows.math.reasoner_tool_user import parse_program, program_answer
from drmas.workflows.sandbox import SandboxSettings
from drmas.workflows.sandbox import Result


def program(printed: str) -> str:
    return f"x = {printed!r}\nprint(x)\n```"  # after the prefill "```python\n"


@pytest.fixture(scope="module")
def wf():
    w = ReasonerToolUserWorkflow(max_turns=2, alpha=1.0, format_penalty=0.1)
    yield w
    w.close()


@pytest.fixture(scope="module")
def task(wf):
    return wf.tasks("train")[0]


def rewards(res):
    return [(s.agent, s.turn, round(s.reward, 6)) for s in res.samples]


def test_parsers():
    assert parse_program("```python\nprint(1)\n```") == "print(1)"
    assert parse_program("```python\nprint(2)") == "print(2)"  # cut by the length limit: still runs
    assert parse_program("```python\n\n```") is None and parse_program("no code") is None
    assert program_answer(Result("a\n 7 \n\n", "", 0, False)) == "7"
    assert program_answer(Result("7\n", "boom", 1, False)) is None
    assert program_answer(Result("", "", 0, False)) is None
    assert program_answer(Result("7", "", None, True)) is None
    assert program_answer(Result("7\nxxxx", "", -9, False, truncated=True)) is None  # cut at the cap


def test_agreement_on_the_right_answer_ends_the_episode(wf, task):
    script = Script(lambda a, p, i: program(task.answer) if a == "tool_user"
                    else f"so \\boxed{{{task.answer}}}")
    res = wf.rollout([task], script, n=2)
    # tool +1 and reasoner 1 (local) plus alpha * team 1, for both trajectories; one turn each
    assert rewards(res) == [("tool_user", 0, 2.0), ("reasoner", 0, 2.0)] * 2
    assert all(e.success and e.turns == 1 and e.info["agreed"] for e in res.episodes)
    assert [c[2] for c in script.calls] == [2, 2]  # both trajectories share each first-turn prompt
    # the reasoner saw the program and what it printed in the same turn
    assert f"It printed {task.answer}." in script.prompts("reasoner")[0]


def test_disagreement_runs_every_turn_and_each_sees_the_other(wf, task):
    wrong = "-12345"

    def fn(agent, p, i):
        return program(wrong) if agent == "tool_user" else f"I think \\boxed{{{task.answer}}}"

    script = Script(fn)
    res = wf.rollout([task], script, n=1)
    # never agreeing: both turns are played; the final (reasoner's) answer is right, so team = 1
    # tool: wrong answer, local 0 -> 1; reasoner: right, local 1 -> 2
    assert rewards(res) == [("tool_user", 0, 1.0), ("reasoner", 0, 2.0),
                            ("tool_user", 1, 1.0), ("reasoner", 1, 2.0)]
    assert res.episodes[0].success and res.episodes[0].turns == 2 and not res.episodes[0].info["agreed"]
    tool_prompts = script.prompts("tool_user")
    assert "teammate" not in tool_prompts[0]
    assert f"\\boxed{{{task.answer}}}" in tool_prompts[1]  # the reasoner's turn-0 solution
    assert all(f"It printed {wrong}." in p for p in script.prompts("reasoner"))


def test_crashing_silent_and_missing_programs(wf, task):
    outputs = iter(["raise ValueError('boom')\n```", "y = 1\n```", "no code at all"])

    def fn(agent, p, i):
        if agent == "tool_user":
            text = next(outputs)
            return text if text != "no code at all" else "```"  # an empty block is no program
        return "I do not know"  # no box: invalid, wrong

    script = Script(fn)
    wf3 = ReasonerToolUserWorkflow(max_turns=3, alpha=1.0, format_penalty=0.1)
    try:
        res = wf3.rollout([task], script, n=1)
    finally:
        wf3.close()
    # tool: -1 (crash), -1 (prints nothing), -1 - 0.1 (no code); reasoner: 0 - 0.1 every turn; team 0
    assert rewards(res) == [("tool_user", 0, -1.0), ("reasoner", 0, -0.1), ("tool_user", 1, -1.0),
                            ("reasoner", 1, -0.1), ("tool_user", 2, -1.1), ("reasoner", 2, -0.1)]
    assert [s.valid for s in res.samples] == [True, False, True, False, False, False]
    reasoner_prompts = script.prompts("reasoner")
    assert "It printed an error: ValueError: boom." in reasoner_prompts[0]
    assert "It printed nothing." in reasoner_prompts[1]
    assert not res.episodes[0].success


def test_tree_scores_each_candidate_and_executes_the_best(wf, task):
    tool = ["raise SystemExit(3)\n```", program("-12345"), program(task.answer)]
    reason = ["no box here", "\\boxed{-12345}", f"\\boxed{{{task.answer}}}"]
    script = Script(lambda a, p, i: tool[i] if a == "tool_user" else reason[i])
    res = wf.rollout([task], script, n=3, sampling="tree", seed=0)
    # tool: -1 / 0 / +1 (no team term: a tool step never ends the episode); the correct program is
    # executed, so only the third reasoner agrees with it: 1 + alpha * 1; the second disagrees (0)
    assert rewards(res) == [("tool_user", 0, -1.0), ("tool_user", 0, 0.0), ("tool_user", 0, 1.0),
                            ("reasoner", 0, -0.1), ("reasoner", 0, 0.0), ("reasoner", 0, 2.0)]
    assert [c[2] for c in script.calls] == [3, 3]
    assert len({s.traj_uid for s in res.samples}) == 1
    assert res.episodes[0].success and res.episodes[0].turns == 1
    adv = compute_advantages(res.samples, "at_grpo")
    for g in (adv[:3], adv[3:]):  # agent-and-turn groups have zero mean
        assert float(g.sum()) == pytest.approx(0.0, abs=1e-6) and float(g[2]) > 0


def test_tree_state_advances_with_the_executed_candidate(wf, task):
    # turn 0: no agreement possible (the program prints 1, 2 or 3 and no reasoner says those);
    # the executed reasoner is the only valid one, and turn 1's tool prompt must quote it
    def fn(agent, p, i):
        if agent == "tool_user":
            return program(str(i + 1))
        if sum(a == "reasoner" for a, _, _ in script.calls) > 1:  # turn 1
            return f"\\boxed{{{task.answer}}}"
        return ["nothing", f"candidate-{i} \\boxed{{-777}}", "nothing"][i]

    script = Script(fn)
    res = wf.rollout([task], script, n=3, sampling="tree", seed=0)
    turn1_tool = script.prompts("tool_user")[1]
    assert "candidate-1 \\boxed{-777}" in turn1_tool and "candidate-0" not in turn1_tool
    assert sorted({(s.agent, s.turn) for s in res.samples}) == [
        ("reasoner", 0), ("reasoner", 1), ("tool_user", 0), ("tool_user", 1)]
    # on the last turn every reasoner candidate ends the episode: team term for the right ones
    last = [s for s in res.samples if s.agent == "reasoner" and s.turn == 1]
    assert [s.reward for s in last] == [2.0, 2.0, 2.0] and res.episodes[0].success


def test_bad_settings_are_refused(wf, task):
    with pytest.raises(ValueError, match="max_turns"):
        ReasonerToolUserWorkflow(max_turns=0)
    with pytest.raises(ValueError, match="sandbox workers must be >= 1"):
        ReasonerToolUserWorkflow(sandbox=SandboxSettings(workers=0))
    with pytest.raises(ValueError, match="tie_break"):
        ReasonerToolUserWorkflow(tie_break="best")
    with pytest.raises(ValueError, match="unknown agents"):
        ReasonerToolUserWorkflow(templates={"coder": None})
    with pytest.raises(ValueError, match="sampling"):
        wf.rollout([task], Script(lambda a, p, i: ""), n=1, sampling="beam")
    with pytest.raises(FileNotFoundError, match="nope.jsonl"):
        ReasonerToolUserWorkflow(val_file="nope.jsonl")


def test_the_workflow_plays_again_after_close(task):
    w = ReasonerToolUserWorkflow(max_turns=1)
    script = Script(lambda a, p, i: program(task.answer) if a == "tool_user" else f"\\boxed{{{task.answer}}}")
    for _ in range(2):  # close() frees the sandbox workers; the next rollout starts new ones
        assert [s.reward for s in w.rollout([task], script, n=1).samples] == [2.0, 2.0]
        w.close()
