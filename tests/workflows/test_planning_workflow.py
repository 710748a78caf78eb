"""The planner / tool-user team on the puzzles, driven by a scripted engine: success, failure,
crashing and silent programs, malformed replies, and tree sampling's executed candidate."""

from collections import deque

import pytest
from scripted import Script

from drmas.algorithms import compute_advantages
from drmas.workflows.games import PlanningWorkflow


def shortest_plan(env):
    queue, seen = deque([(env, [])]), {env.observation}
    while queue:
        state, path = queue.popleft()
        if state.solved:
            return path
        for a in "UDLR":
            nxt = state.copy()
            if nxt.apply(a) and nxt.observation not in seen:
                seen.add(nxt.observation)
                queue.append((nxt, path + [a]))


@pytest.fixture
def wf():
    w = PlanningWorkflow(game="plan_path", size=4, max_turns=2, train_size=4, val_size=2, test_size=2)
    yield w
    w.close()


def test_a_tool_plan_copied_by_the_planner_solves_in_one_turn(wf):
    task = wf.tasks("train")[0]
    plan = ", ".join(shortest_plan(task.make()))
    script = Script(lambda agent, p, i: f"print('{plan}')\n```" if agent == "tool_user"
                    else f"{plan}</actions>")
    result = wf.rollout([task], script, n=1, sampling="parallel")
    (ep,) = result.episodes
    assert ep.success and ep.turns == 1
    # both agents made all the progress (local 1) and the team solved it (alpha 1 x team 1)
    assert sorted((s.agent, s.local_reward, s.reward) for s in result.samples) == [
        ("planner", 1.0, 2.0), ("tool_user", 1.0, 2.0)]
    assert f"It printed: {plan}" in script.prompts("planner")[0]  # the planner saw the program's output


def test_crashing_and_silent_programs_and_malformed_plans(wf):
    task = wf.tasks("train")[1]
    programs = iter(["raise SystemExit(3)\n```", "x = 1\n```"])  # crashes, then prints nothing
    script = Script(lambda agent, p, i: next(programs) if agent == "tool_user" else "</actions>")
    result = wf.rollout([task], script, n=1, sampling="parallel")
    (ep,) = result.episodes
    assert not ep.success and ep.turns == 2  # every turn played
    tool = [s for s in result.samples if s.agent == "tool_user"]
    plans = [s for s in result.samples if s.agent == "planner"]
    assert [s.local_reward for s in tool] == [-1.0, -1.0] and all(s.valid for s in tool)
    # an empty <actions></actions> is a malformed plan: no progress, the format penalty
    assert all(not s.valid and s.reward == pytest.approx(-0.1) for s in plans)
    assert ([p.split("It printed: ")[1].split("\n")[0] for p in script.prompts("planner")]
            == ["an error: exit code 3", "nothing"])


def test_a_plan_cut_at_the_output_cap_is_never_used(wf):
    """A program that prints the right plan, then floods its output: truncated, so a failed run."""
    task = wf.tasks("train")[0]
    plan = ", ".join(shortest_plan(task.make()))
    flood = f"print('{plan}')\nprint('x' * 200_000)\n```"
    script = Script(lambda agent, p, i: flood if agent == "tool_user" else "</actions>")
    result = wf.rollout([task], script, n=1, sampling="parallel")
    assert [s.local_reward for s in result.samples if s.agent == "tool_user"] == [-1.0, -1.0]
    assert script.prompts("planner")[0].split("It printed: ")[1].startswith("too much")


def test_illegal_moves_change_nothing_and_are_counted(wf):
    task = wf.tasks("train")[2]
    env = task.make()
    wall = next(a for a in "UDLR" if not env.copy().apply(a))
    script = Script(lambda agent, p, i: f"print('{wall}')\n```" if agent == "tool_user"
                    else f"{wall}, {wall}</actions>")
    result = wf.rollout([task], script, n=1, sampling="parallel")
    assert result.episodes[0].info["illegal"] == 4 and result.episodes[0].info["progress"] == 0.0
    # no progress; an illegal move makes the plan invalid (the format penalty); the program itself was fine
    assert {(s.agent, s.valid, round(s.reward, 6)) for s in result.samples} == {
        ("planner", False, -0.1), ("tool_user", True, 0.0)}


def test_plans_are_parsed_strictly(wf):
    task = wf.tasks("train")[0]
    plan = shortest_plan(task.make())
    loose = "".join(plan).lower() + " please"  # not the documented "U, R, R" format
    script = Script(lambda agent, p, i: f"print('{loose}')\n```" if agent == "tool_user"
                    else f"{loose}</actions>")
    result = wf.rollout([task], script, n=1, sampling="parallel")
    assert result.episodes[0].info["moves"] == 0  # nothing executed
    tool = next(s for s in result.samples if s.agent == "tool_user")
    assert tool.local_reward == -1.0  # its program printed no action list
    assert all(not s.valid for s in result.samples if s.agent == "planner")


def test_tree_executes_the_best_candidate_and_shows_its_board(wf):
    task = wf.tasks("train")[3]
    path = shortest_plan(task.make())
    assert len(path) >= 3

    def reply(agent, p, i):
        if agent == "tool_user":
            return "print('')\n```"
        # candidate 1 takes one good step; the others stand still
        return f"{path[0]}</actions>" if i == 1 else "</actions>"

    script = Script(reply)
    result = wf.rollout([task], script, n=3, sampling="tree")
    boards = [p.split("Board:\n")[1].split("\n")[:4] for p in script.prompts("tool_user")]
    after = task.make()
    after.step([path[0]])
    assert boards[1] == after.observation.split("\n")  # the second turn sees candidate 1's board
    adv = compute_advantages(result.samples, "at_grpo")
    got = {}
    for s, a in zip(result.samples, adv.tolist()):
        got.setdefault((s.agent, s.turn), []).append((round(s.reward, 4), a))
    # by hand, per (task, agent, turn): the tool user's three candidates score alike (advantage 0);
    # the planner's are low, high, low: deviations -d, 2d, -d over an unbiased std of sqrt(3) d,
    # so -1/sqrt(3), 2/sqrt(3), -1/sqrt(3). A group keyed without the turn would pool six
    # planner samples (-0.645, 1.291), one without the agent the tool user's -1s as well.
    low, high, z = -0.1, round(1 / 3, 4), 3 ** -0.5  # an empty plan is invalid; one good step of three
    planner = [(low, pytest.approx(-z, abs=1e-4)), (high, pytest.approx(2 * z, abs=1e-4)),
               (low, pytest.approx(-z, abs=1e-4))]
    assert got == {("tool_user", 0): [(-1.0, 0.0)] * 3, ("planner", 0): planner,
                   ("tool_user", 1): [(-1.0, 0.0)] * 3, ("planner", 1): planner}


def test_bad_settings_are_refused():
    with pytest.raises(ValueError, match="game must be one of"):
        PlanningWorkflow(game="chess")
    with pytest.raises(ValueError, match="plan_path size must be in 4..10, got 3"):
        PlanningWorkflow(size=3)
    sok = PlanningWorkflow(game="sokoban", size=6, boxes=2, train_size=2, val_size=1, test_size=1)
    assert [t.uid for t in sok.tasks("val")] == ["sokoban-6x2/2"] and "Push every box" in sok.prompt(
        "planner", sok.initial_state(sok.tasks("train")[0])).messages[-1][1]
