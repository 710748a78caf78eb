"""The Dr. MAS solver/verifier loop driven by a scripted engine: routing, feedback, rewards."""

import pytest
from scripted import Script

from drmas.workflows.math.solver_verifier import SolverVerifierWorkflow, parse_verdict


@pytest.fixture(scope="module")
def wf():
    return SolverVerifierWorkflow(max_turns=2, alpha=1.0, format_penalty=0.1)


def test_parse_verdict():
    assert parse_verdict("<verify>approve</verify> fine") == (True, "fine")
    assert parse_verdict("<verify> Reject </verify>\n wrong sum") == (False, "wrong sum")
    assert parse_verdict("<verify>maybe</verify>") is None and parse_verdict("approve") is None


def test_approved_right_answer_ends_after_one_loop(wf):
    task = wf.tasks("train")[0]
    script = Script(lambda a, p, i: f"so \\boxed{{{task.answer}}}" if a == "solver"
                    else "approve</verify> ok")
    res = wf.rollout([task], script, n=2)
    assert [(s.agent, s.turn) for s in res.samples] == [("solver", 0), ("verifier", 0)] * 2
    assert all(s.reward == 1.0 and s.valid for s in res.samples)
    assert [e.success for e in res.episodes] == [True, True] and res.episodes[0].turns == 1
    assert script.calls[0][2] == 2  # both trajectories share the first solver prompt


def test_rejection_feeds_back_and_the_last_loop_is_unchecked(wf):
    task = wf.tasks("train")[0]

    def fn(agent, p, i):
        if agent == "verifier":
            return "reject</verify> the sum is off"
        # first attempt wrong, second (after feedback) right
        return f"\\boxed{{{task.answer}}}" if "rejected" in p.messages[-1][1] else "\\boxed{-1}"

    script = Script(fn)
    res = wf.rollout([task], script, n=1)
    assert [(s.agent, s.turn) for s in res.samples] == [("solver", 0), ("verifier", 0), ("solver", 1)]
    second_prompt = [c for c in script.calls if c[0] == "solver"][1][1][0].messages[-1][1]
    assert "the sum is off" in second_prompt and "\\boxed{-1}" in second_prompt
    # the final answer is right, so every sample gets the team reward, the verifier's too
    assert [s.reward for s in res.samples] == [1.0, 1.0, 1.0]


def test_malformed_outputs_are_penalised_and_wrong_answers_get_no_team_reward(wf):
    task = wf.tasks("train")[0]
    res = wf.rollout([task], Script(lambda a, p, i: "I am not sure" if a == "solver" else "hmm"), n=1)
    assert ([(s.agent, s.valid) for s in res.samples]
            == [("solver", False), ("verifier", False), ("solver", False)])
    assert all(s.reward == pytest.approx(-0.1) for s in res.samples)
    assert res.episodes[0].success is False


def test_tree_mode_and_bad_settings_are_refused(wf):
    with pytest.raises(ValueError, match="parallel sampling only"):
        wf.rollout(wf.tasks("train")[:1], Script(lambda a, p, i: ""), n=2, sampling="tree")
    with pytest.raises(ValueError, match="max_turns"):
        SolverVerifierWorkflow(max_turns=0)
    with pytest.raises(FileNotFoundError, match="nope.jsonl"):
        SolverVerifierWorkflow(train_file="nope.jsonl", val_file="nope.jsonl", test_file="nope.jsonl")



def test_a_grader_that_fails_is_a_counted_failed_episode_and_past_a_share_stops_the_run(wf, monkeypatch):
    """A math-verify API change (a TypeError inside the grader) must not read as "every answer is
    wrong": the episode fails, ``rollout/grader_errors`` counts it, and the outage rule stops a run
    where too many do."""
    from drmas.data.rollouts import OutageError, RolloutConfig, Rollouts, ValidationConfig
    from drmas.workflows.math import grading

    tasks = wf.tasks("train")[:2]
    script = Script(lambda a, p, i: "so \\boxed{7}" if a == "solver" else "approve</verify> ok")
    real = grading.verify

    def broken_for_the_first(gold, pred, **kw):
        if str(tasks[0].answer) in str(gold):
            raise TypeError("verify() got an unexpected keyword argument 'timeout_seconds'")
        return real(gold, pred, **kw)

    grading._clear_caches()
    monkeypatch.setattr(grading, "verify", broken_for_the_first)
    res = wf.rollout(tasks, script, n=2)
    why = [e.info.get("failure", "") for e in res.episodes]
    assert all("the grader failed: math-verify's verify failed: TypeError" in w for w in why[:2])
    assert why[2:] == ["", ""] and res.counts == {"grader_errors": 2.0}
    assert {s.traj_uid for s in res.samples} == {e.traj_uid for e in res.episodes[2:]}  # none of it trained
    assert wf.scalars(res.counts) == {"rollout/grader_errors": 2.0}
    # an unparseable answer is still just wrong, not an error
    monkeypatch.setattr(grading, "verify", real)
    assert grading.same_answer("\\frac{", "1") is False
    config = RolloutConfig(group_size=2, tasks_per_iteration=2, max_failed_share=0.25)
    rollouts = Rollouts(wf, config, ValidationConfig(tasks=0))
    with pytest.raises(OutageError, match=r"2 of 4 episodes failed(.|\n)*the grader failed"):
        rollouts.check_failures(res, "iteration 1")
