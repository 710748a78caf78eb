"""The shared turn loop on a toy workflow whose every reward is known in advance."""

from dataclasses import dataclass

import pytest
from scripted import Script

from drmas.workflows.base import PromptTemplate
from drmas.workflows.episode import Action, EpisodeState, TurnWorkflow


@dataclass(frozen=True)
class Task:
    uid: str
    target: int


@dataclass
class CountState(EpisodeState):
    total: int = 0


class Count(TurnWorkflow):
    """A proposer adds a digit to a running total, a closer says "stop" or "go"; the team wins
    when the total hits the target at a stop. Proposer role reward: the digit, scaled by 0.1."""

    agents = ("proposer", "closer")
    default_max_turns = 2

    def __init__(self, **kw):
        templates = {a: PromptTemplate(instruction=a + " {turn}") for a in self.agents}
        super().__init__(default_templates=templates, **kw)

    def tasks(self, split):
        return [Task("t", 3)]

    def initial_state(self, task):
        return CountState(task, "proposer")

    def prompt(self, agent, state):
        return self.templates[agent].render(turn=state.turn)

    def evaluate(self, agent, states, completions):
        if agent == "proposer":
            digits = [c.text.strip() for c in completions]
            return [Action(d.isdigit(), 0.1 * int(d) if d.isdigit() else 0.0,
                           value=int(d) if d.isdigit() else 0)
                    for d in digits]
        out = []
        for st, c in zip(states, completions):
            stop = c.text.strip() == "stop" or st.turn == self.max_turns - 1
            out.append(Action(c.text.strip() in ("stop", "go"), ends=stop,
                              team_reward=float(st.total == st.task.target)))
        return out

    def advance(self, agent, state, action):
        if agent == "proposer":
            state.total += action.value
            state.agent = "closer"
        elif action.ends:
            state.done = True
        else:
            state.turn += 1
            state.agent = "proposer"

    def team_reward(self, state):
        return float(state.total == state.task.target)


def by_turn(plan):
    """Completions from ``plan[agent][turn][i]``; the prompt says the turn."""
    return Script(lambda a, p, i: plan[a][int(p.messages[-1][1].split()[1])][i])


def test_tree_scores_candidates_on_their_own_and_executes_the_best():
    script = by_turn({"proposer": [["1", "x", "3"]], "closer": [["go", "stop", "???"]]})
    res = Count(alpha=2.0, format_penalty=0.5).rollout([Task("t", 3)], script, n=3, sampling="tree")
    rewards = [(s.agent, s.turn, round(s.reward, 6)) for s in res.samples]
    # proposer: role 0.1 * digit, "x" is invalid (-0.5); the best ("3") is executed: total 3;
    # closer at total 3: "stop" ends with team 1 -> 2 * 1; "go" does not end; "???" is invalid
    assert rewards == [("proposer", 0, 0.1), ("proposer", 0, -0.5), ("proposer", 0, 0.3),
                       ("closer", 0, 0.0), ("closer", 0, 2.0), ("closer", 0, -0.5)]
    assert res.episodes[0].success and res.episodes[0].turns == 1
    assert [c[2] for c in script.calls] == [3, 3] and {s.traj_uid for s in res.samples} == {"t#tree"}
    # each node's candidates in order, the executed one marked: "3", then "stop"
    assert [(s.candidate, s.chosen) for s in res.samples] == [(0, False), (1, False), (2, True),
                                                               (0, False), (1, True), (2, False)]


@pytest.mark.parametrize("role_rewards, expected",
                         [(False, [2.0, 2.0, 2.0, 2.0]), (True, [2.0, 2.0, 2.3, 2.0])])
def test_parallel_rewards_every_sample_with_the_episodes_team_reward(role_rewards, expected):
    # two turns: propose 0, go; propose 3, stop -> total 3 = target
    script = by_turn({"proposer": [["0"], ["3"]], "closer": [["go"], ["stop"]]})
    res = Count(alpha=2.0, role_rewards=role_rewards).rollout([Task("t", 3)], script, n=1)
    assert ([(s.agent, s.turn) for s in res.samples]
            == [("proposer", 0), ("closer", 0), ("proposer", 1), ("closer", 1)])
    assert [round(s.reward, 6) for s in res.samples] == expected
    assert all(s.team_reward == 1.0 for s in res.samples) and res.episodes[0].turns == 2


def test_identical_prompts_are_one_request_and_samplings_are_checked():
    script = Script(lambda a, p, i: "1" if a == "proposer" else "stop")
    res = Count().rollout([Task("a", 1), Task("b", 1)], script, n=2)
    assert [(c[0], len(c[1]), c[2]) for c in script.calls] == [("proposer", 1, 4), ("closer", 1, 4)]
    assert [e.traj_uid for e in res.episodes] == ["a#0", "a#1", "b#0", "b#1"]

    class ParallelOnly(Count):
        samplings = ("parallel",)

    with pytest.raises(ValueError, match="ParallelOnly plays parallel sampling only, not 'tree'"):
        ParallelOnly().rollout([Task("a", 1)], script, n=2, sampling="tree")
    with pytest.raises(ValueError, match=r"sampling must be one of \['parallel', 'tree'\]"):
        Count().rollout([Task("a", 1)], script, n=2, sampling="beam")
    with pytest.raises(ValueError, match="tie_break"):
        Count(tie_break="best")
    with pytest.raises(ValueError, match=r"templates for unknown agents \['judge'\]"):
        Count(templates={"judge": PromptTemplate("x")})
    with pytest.raises(ValueError, match="max_turns must be >= 1, got 0"):
        Count(max_turns=0)


def test_progress_is_told_each_episode_once_as_it_finishes(capsys):
    from drmas.data.progress import EpisodeBar

    # both play two turns (1, go; 1, stop): a's total 2 hits its target, b's misses 3
    script = Script(lambda a, p, i: "1" if a == "proposer"
                    else ("stop" if p.messages[-1][1] == "closer 1" else "go"))
    seen = []
    res = Count().rollout([Task("a", 2), Task("b", 3)], script, n=1, progress=seen.append)
    assert seen == [e.success for e in res.episodes] == [True, False]

    bar = EpisodeBar(total=2, desc="val", enabled=True)
    Count().rollout([Task("a", 2), Task("b", 3)], script, n=1, progress=bar)
    assert (bar.done, bar.solved) == (2, 1)
    bar.close()
    assert "val" in capsys.readouterr().err  # tqdm draws on stderr
    assert not EpisodeBar(total=2, desc="off", enabled=False).active


def test_max_turns_is_one_setting_with_each_domains_own_default():
    from drmas.workflows.debate import DebateWorkflow
    from drmas.workflows.math import SolverVerifierWorkflow

    assert (SolverVerifierWorkflow().max_turns, DebateWorkflow().max_turns, Count().max_turns) == (2, 1, 2)
    assert (SolverVerifierWorkflow(max_turns=3).max_turns, TurnWorkflow.default_max_turns) == (3, 4)
    with pytest.raises(ValueError, match="max_turns must be >= 1, got 0"):
        DebateWorkflow(max_turns=0)
