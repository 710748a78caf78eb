"""The search workflow driven by a scripted engine: routing, rewards, tree sampling, bad output."""

import pytest

from drmas.algorithms import compute_advantages
from drmas.workflows.base import ChatPrompt, Completion
from drmas.workflows.search import SearchWorkflow, contains_answer
from drmas.records import ScriptedGenerate


class Script(ScriptedGenerate):
    """A generate function whose responses come from ``fn(agent, prompt, i)`` (text after the prefill)."""

    def __init__(self, fn):
        super().__init__(fn)
        self.calls = []

    def __call__(self, agent, prompts, n):
        self.calls.append((agent, list(prompts), n))
        return [
            [Completion([7] * 4, [1, 2, 3], [-0.5] * 3, p.prefill + self.fn(agent, p, i), "stop")
             for i in range(n)]
            for p in prompts
        ]


def user_msg(p: ChatPrompt) -> str:
    return p.messages[-1][1]


@pytest.fixture(scope="module")
def wf():
    return SearchWorkflow(max_turns=3, topk=3)


@pytest.fixture(scope="module")
def task(wf):
    # a one-hop task whose entity name retrieves its answer
    for t in wf.tasks("train"):
        if t.hops == 1:
            hits = wf.retriever.search([t.entity], 3)[0]
            if contains_answer(" ".join(h.text for h in hits), t.answers):
                return t
    raise AssertionError("no retrievable one-hop task")


def happy(task):
    def fn(agent, p, i):
        has_info = "<information>" in user_msg(p)
        if agent == "verifier":
            return ("yes" if has_info else "no") + "</verify>"
        if agent == "searcher":
            return f"{task.entity}</search>"
        return f"{task.answers[0]}</answer>"

    return fn


def test_parallel_episode_routes_searches_and_answers(wf, task):
    script = Script(happy(task))
    res = wf.rollout([task], script, n=2, sampling="parallel")
    assert [e.success for e in res.episodes] == [True, True]
    assert [e.turns for e in res.episodes] == [2, 2]
    traj = [s for s in res.samples if s.traj_uid == res.episodes[0].traj_uid]
    assert ([(s.agent, s.turn) for s in traj]
            == [("verifier", 0), ("searcher", 0), ("verifier", 1), ("answerer", 1)])
    # team reward for every sample, no format penalty, role rewards off by default
    assert all(s.team_reward == 1.0 and s.local_reward == 0.0 and s.reward == 1.0 and s.valid for s in traj)
    # turn 0: both trajectories share the verifier prompt, so it is one request with n=2
    assert script.calls[0][0] == "verifier" and len(script.calls[0][1]) == 1 and script.calls[0][2] == 2
    # the turn-1 verifier prompt holds the executed search and its passages
    turn1 = [c for c in script.calls if c[0] == "verifier"][1][1][0]
    assert (f"<search>{task.entity}</search>" in user_msg(turn1)
            and contains_answer(user_msg(turn1), task.answers))
    assert traj[0].text.startswith("<verify>")  # the prefill is part of the parsed text


def test_role_rewards_and_alpha_in_parallel_mode(task):
    wf = SearchWorkflow(max_turns=3, role_rewards=True, alpha=0.5)
    res = wf.rollout([task], Script(happy(task)), n=1, sampling="parallel")
    # every action was right for its role: local 1, team 1 -> 0.5 * 1 + 1
    assert [s.reward for s in res.samples] == [1.5, 1.5, 1.5, 1.5]


def test_tree_sampling_advances_the_real_state_with_the_best_candidate(wf, task):
    wrong = "Zzyzx Qqq"
    plans = {
        ("verifier", 0): ["yes", "no", "no"],  # no info yet: "no" is the right routing
        ("searcher", 0): ["unrelated words", task.entity, "no closing tag"],
        ("verifier", 1): ["no", "yes", "yes"],  # now the answer is in the information
        ("answerer", 1): [wrong, task.answers[0], task.answers[0]],
    }
    closing = {"verifier": "</verify>", "searcher": "</search>", "answerer": "</answer>"}

    def fn(agent, p, i):
        turn = user_msg(p).count("<information>")
        text = plans[(agent, turn)][i]
        return text if text == "no closing tag" else text + closing[agent]

    script = Script(fn)
    res = wf.rollout([task], script, n=3, sampling="tree")
    s = res.samples
    assert ([(x.agent, x.turn) for x in s]
            == [("verifier", 0)] * 3 + [("searcher", 0)] * 3 + [("verifier", 1)] * 3 + [("answerer", 1)] * 3)
    assert len({x.traj_uid for x in s}) == 1
    # scores: verifier routing, searcher found-the-answer (-0.1 when malformed), answerer EM + alpha * team
    assert [x.reward for x in s] == [0, 1, 1, 0, 1, -0.1, 0, 1, 1, 0, 2, 2]
    # ties go to the lowest index: verifier candidate 1 ("no"), then searcher candidate 1 (the entity)
    turn1_prompt = user_msg([c for c in script.calls if c[0] == "verifier"][1][1][0])
    assert f"<search>{task.entity}</search>" in turn1_prompt and "unrelated words" not in turn1_prompt
    assert res.episodes[0].success and res.episodes[0].info["answer"] == task.answers[0]
    # all K candidates of a node form one at_grpo group
    adv = compute_advantages(s, "at_grpo", scale="none")
    assert adv[:3].tolist() == pytest.approx([-2 / 3, 1 / 3, 1 / 3])
    assert adv[3:6].tolist() == pytest.approx([-0.3, 0.7, -0.4])


def test_tree_keys_never_merge_two_tasks(wf):
    tasks = list(wf.tasks("train"))[:2]
    res = wf.rollout(tasks, Script(lambda a, p, i: "no</verify>" if a == "verifier" else "x</search>"),
                     n=2, sampling="tree")
    envs = {s.task_uid: {x.traj_uid for x in res.samples if x.task_uid == s.task_uid} for s in res.samples}
    assert len(envs) == 2 and all(len(v) == 1 for v in envs.values())
    assert envs[tasks[0].uid] != envs[tasks[1].uid]


def test_random_tie_break_is_seeded_and_only_picks_among_the_best(task):
    wf = SearchWorkflow(max_turns=2, tie_break="random")

    def fn(agent, p, i):
        return {"verifier": "no</verify>", "searcher": f"{task.entity} {i}</search>"}.get(agent, "x</answer>")

    def executed(seed):
        script = Script(fn)
        wf.rollout([task], script, n=4, sampling="tree", seed=seed)
        prompt = user_msg([c for c in script.calls if c[0] == "verifier"][1][1][0])
        return [i for i in range(4) if f"<search>{task.entity} {i}</search>" in prompt]

    picks = [executed(seed) for seed in range(8)]
    assert all(len(p) == 1 for p in picks)  # exactly one candidate was executed
    assert picks == [executed(seed) for seed in range(8)]  # the same seed breaks ties the same way
    assert len({p[0] for p in picks}) > 1  # different seeds break them differently


@pytest.mark.parametrize(
    "bad",
    ["I think the answer is yes", "yes", "x" * 10_000, "\udcff\x00\ufffd broken",
     "</verify><search></search>"],
    ids=["no-tags", "unclosed", "10k-chars", "non-utf8", "empty-tags"],
)
def test_malformed_output_is_an_invalid_action_with_a_penalty(wf, task, bad):
    res = wf.rollout([task], Script(lambda a, p, i: bad), n=1, sampling="parallel")
    # malformed verify = no; malformed search = nothing retrieved; last turn forces an answer
    assert [(s.agent, s.turn) for s in res.samples] == [
        ("verifier", 0), ("searcher", 0), ("verifier", 1), ("searcher", 1), ("verifier", 2), ("answerer", 2)
    ]
    assert all(not s.valid and s.reward == pytest.approx(-0.1) for s in res.samples)
    assert res.episodes[0].success is False and res.episodes[0].turns == 3


def test_bad_configuration_is_a_clear_error():
    with pytest.raises(ValueError, match="tie_break"):
        SearchWorkflow(tie_break="best")
    with pytest.raises(ValueError, match="unknown agents"):
        SearchWorkflow(templates={"planner": None})
    with pytest.raises(FileNotFoundError, match="nope.jsonl"):
        SearchWorkflow(train_file="nope.jsonl", val_file="nope.jsonl", test_file="nope.jsonl",
                       corpus_file="c.jsonl")
