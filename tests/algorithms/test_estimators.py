import math
import statistics
from types import SimpleNamespace

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from drmas.algorithms import ADVANTAGE_ESTIMATORS, compute_advantages, register_estimator
from drmas.algorithms.advantages import group_advantages


def S(task, traj, agent, turn, reward, **kw):
    return SimpleNamespace(task_uid=task, traj_uid=traj, agent=agent, turn=turn, reward=reward, **kw)


# One task, three trajectories, agents A and B; t1 has two A turns.
BATCH = [
    S("q", "t1", "A", 0, 1.0),
    S("q", "t1", "B", 0, 0.0),
    S("q", "t1", "A", 1, 2.0),  # t1 mean 1
    S("q", "t2", "A", 0, 0.0),
    S("q", "t2", "B", 0, 3.0),  # t2 mean 1.5
    S("q", "t3", "A", 0, 4.0),
    S("q", "t3", "B", 0, 1.0),  # t3 mean 2.5
]


def test_registry_has_the_documented_estimators():
    assert {"grpo", "grpo_step", "drmas", "at_grpo", "rloo"} <= set(ADVANTAGE_ESTIMATORS)


def test_grpo_uses_one_score_per_trajectory_and_broadcasts():
    adv = compute_advantages(BATCH, "grpo", eps=0.0)
    # trajectory means 1, 1.5, 2.5: mean 5/3, unbiased var 7/12
    std = math.sqrt(7 / 12)
    t1, t2, t3 = (-2 / 3) / std, (-1 / 6) / std, (5 / 6) / std
    assert torch.allclose(adv, torch.tensor([t1, t1, t1, t2, t2, t3, t3]), atol=1e-6)


def test_rloo_subtracts_the_mean_of_the_other_trajectories():
    adv = compute_advantages(BATCH, "rloo")
    # t1: 1 - (1.5 + 2.5)/2 = -1; t2: 1.5 - (1 + 2.5)/2 = -0.25; t3: 2.5 - (1 + 1.5)/2 = 1.25
    assert torch.allclose(adv, torch.tensor([-1, -1, -1, -0.25, -0.25, 1.25, 1.25]), atol=1e-6)


def test_grpo_step_uses_each_sample_in_one_task_group():
    r = [s.reward for s in BATCH]
    m, sd = statistics.mean(r), statistics.stdev(r)
    adv = compute_advantages(BATCH, "grpo_step", eps=0.0)
    assert torch.allclose(adv, torch.tensor([(x - m) / sd for x in r]), atol=1e-6)


def test_drmas_groups_by_task_and_agent():
    adv = compute_advantages(BATCH, "drmas", scale="none")
    # A: [1, 2, 0, 4] mean 7/4; B: [0, 3, 1] mean 4/3
    want = [1 - 7 / 4, 0 - 4 / 3, 2 - 7 / 4, 0 - 7 / 4, 3 - 4 / 3, 4 - 7 / 4, 1 - 4 / 3]
    assert torch.allclose(adv, torch.tensor(want), atol=1e-6)


def test_at_grpo_groups_by_tree_agent_turn_and_never_merges_tasks():
    batch = [
        # tree x (task q1): 3 candidates of A at turn 0, then 3 of B at turn 0
        S("q1", "x", "A", 0, 1.0), S("q1", "x", "A", 0, 0.0), S("q1", "x", "A", 0, 2.0),
        S("q1", "x", "B", 0, 5.0), S("q1", "x", "B", 0, 5.0), S("q1", "x", "B", 0, 8.0),
        # A at turn 1 of the same tree
        S("q1", "x", "A", 1, 0.0), S("q1", "x", "A", 1, 3.0),
        # another task reusing the trajectory id "x": must stay a separate group
        S("q2", "x", "A", 0, 10.0), S("q2", "x", "A", 0, 20.0),
    ]
    adv = compute_advantages(batch, "at_grpo", scale="none")
    want = [0, -1, 1, -1, -1, 2, -1.5, 1.5, -5, 5]
    assert torch.allclose(adv, torch.tensor(want, dtype=torch.float32), atol=1e-6)


def test_unknown_estimator_lists_known_ones():
    with pytest.raises(KeyError, match="unknown advantage estimator 'gae'.*at_grpo.*drmas.*grpo"):
        compute_advantages(BATCH, "gae")


def test_user_registered_estimator_is_used_and_duplicates_refused():
    @register_estimator("test_sign")
    def sign(samples, scale, eps):
        return torch.tensor([1.0 if s.reward > 1 else -1.0 for s in samples])

    try:
        assert compute_advantages(BATCH, "test_sign").tolist() == [-1, -1, 1, -1, 1, 1, -1]
        with pytest.raises(ValueError, match="already registered"):
            register_estimator("test_sign")(sign)
    finally:
        ADVANTAGE_ESTIMATORS.unregister("test_sign")


def test_non_finite_reward_is_a_clear_error():
    with pytest.raises(ValueError, match="finite"):
        compute_advantages(BATCH + [S("q", "t4", "A", 0, float("nan"))], "drmas")


# ---- three agents whose reward scales differ by 10x -----------------------------------------

def _three_agent_batch():
    """Two tasks x 4 trajectories of a verifier/searcher/answerer team with 1-3 turns.

    Reward scales: verifier ~0.1, searcher ~1, answerer ~10. Trajectories differ in how many
    times the verifier and searcher act, as in the search workflow.
    """
    g = torch.Generator().manual_seed(0)
    out = []
    for task in ("q1", "q2"):
        for j, turns in enumerate((1, 2, 3, 2)):
            traj = f"{task}-t{j}"
            for t in range(turns):
                out.append(S(task, traj, "verifier", t, 0.1 * torch.rand(1, generator=g).item()))
                if t < turns - 1:
                    out.append(S(task, traj, "searcher", t, 1.0 * torch.rand(1, generator=g).item() + 1))
            out.append(S(task, traj, "answerer", turns - 1, 10.0 * torch.rand(1, generator=g).item() - 5))
    return out


def _agent_stats(batch, adv):
    stats = {}
    for key in {(s.task_uid, s.agent) for s in batch}:
        a = adv[[i for i, s in enumerate(batch) if (s.task_uid, s.agent) == key]].double()
        stats[key] = (a.mean().item(), a.std().item())
    return stats


def test_drmas_normalises_each_agent_inside_each_task_and_global_baselines_do_not():
    batch = _three_agent_batch()
    for key, (mean, std) in _agent_stats(batch, compute_advantages(batch, "drmas")).items():
        assert abs(mean) < 1e-6 and abs(std - 1) < 1e-4, key
    # Step-level global baseline: the answerer's big rewards dominate the task statistics, so
    # the searcher's advantages are all shifted to one side and shrunk.
    step = _agent_stats(batch, compute_advantages(batch, "grpo_step"))
    assert max(abs(m) for m, _ in step.values()) > 0.3
    assert min(sd for _, sd in step.values()) < 0.1
    # Trajectory-level global baseline: every agent just copies its trajectory's advantage,
    # which is neither zero-mean nor unit-std per agent when agents act a different number of times.
    traj = _agent_stats(batch, compute_advantages(batch, "grpo"))
    assert max(abs(m) for m, _ in traj.values()) > 0.1


# ---- laws ------------------------------------------------------------------------------------

samples_st = st.lists(
    st.tuples(st.integers(0, 2), st.integers(0, 3), st.integers(0, 2), st.integers(0, 1),
              st.integers(-50, 50)),
    min_size=1,
    max_size=40,
)


def _mk(rows):
    return [S(f"q{t}", f"q{t}-{j}", f"a{a}", turn, float(r)) for t, j, a, turn, r in rows]


@settings(max_examples=100, deadline=None)
@given(samples_st, st.lists(st.tuples(st.floats(0.5, 100), st.floats(-100, 100)), min_size=3, max_size=3))
def test_drmas_is_invariant_to_per_agent_affine_rewards(rows, affine):
    batch = _mk(rows)
    moved = [
        S(s.task_uid, s.traj_uid, s.agent, s.turn,
          affine[int(s.agent[1])][0] * s.reward + affine[int(s.agent[1])][1])
        for s in batch
    ]
    a, b = compute_advantages(batch, "drmas"), compute_advantages(moved, "drmas")
    # eps enters as eps/std and eps/(a*std): a difference below 1e-4 for integer rewards
    assert torch.allclose(a, b, atol=1e-4)


@settings(max_examples=60, deadline=None)
@given(samples_st, st.randoms(use_true_random=False),
       st.sampled_from(sorted(["grpo", "grpo_step", "drmas", "at_grpo", "rloo"])))
def test_every_estimator_is_permutation_invariant(rows, rnd, name):
    batch = _mk(rows)
    perm = list(range(len(batch)))
    rnd.shuffle(perm)
    a = compute_advantages(batch, name)
    b = compute_advantages([batch[i] for i in perm], name)
    assert torch.allclose(b, a[perm], atol=1e-6)


@settings(max_examples=60, deadline=None)
@given(samples_st)
def test_drmas_zero_mean_per_task_agent_group(rows):
    batch = _mk(rows)
    adv = compute_advantages(batch, "drmas")
    keys = [(s.task_uid, s.agent) for s in batch]
    ref = group_advantages(torch.tensor([s.reward for s in batch]), keys)
    assert torch.allclose(adv, ref)
    for k in set(keys):
        assert abs(adv[[i for i, kk in enumerate(keys) if kk == k]].sum().item()) < 1e-4


def _edge_batch(rewards):
    from drmas.records import Sample

    agents = ["a", "b"]
    return [Sample(f"t{i // 4}", f"t{i // 4}#{i % 2}", agents[i % 2], (i // 2) % 2, "p",
                       [1], [2], [0.0], reward=r) for i, r in enumerate(rewards)]


@pytest.mark.parametrize("estimator", sorted(ADVANTAGE_ESTIMATORS))
@pytest.mark.parametrize("scale", ["std", "none"])
@pytest.mark.parametrize("rewards", [[0.7] * 8, [1.0], [1e6, -1e6, 3e6, 2.5e6, -7e5, 1e6, 0.0, 4e6]],
                         ids=["all-equal", "single-sample", "1e6-scale"])
def test_every_estimator_is_finite_at_the_edges(estimator, scale, rewards):
    adv = compute_advantages(_edge_batch(rewards), estimator, scale)
    assert adv.shape == (len(rewards),) and torch.isfinite(adv).all()
    if len(set(rewards)) == 1:
        assert torch.equal(adv, torch.zeros_like(adv))  # nothing to prefer: no signal, no noise


def test_estimators_declare_the_samplings_they_accept():
    from drmas.algorithms import estimators_for

    assert {"drmas", "grpo", "grpo_step", "rloo"} <= set(estimators_for("parallel"))
    assert "at_grpo" not in estimators_for("parallel")
    assert {"at_grpo", "drmas", "grpo_step"} <= set(estimators_for("tree"))
    assert not {"grpo", "rloo"} & set(estimators_for("tree"))

    @register_estimator("test_tree_only", samplings=("tree",))
    def zeros(samples, scale, eps):
        return torch.zeros(len(samples))

    try:
        from drmas.data.rollouts import RolloutConfig, Rollouts
        from drmas.workflows.games import PlanningWorkflow

        wf = PlanningWorkflow(game="plan_path", size=4, train_size=2, val_size=1, test_size=1)
        with pytest.raises(ValueError,
                           match="estimator 'test_tree_only' does not work with sampling='parallel'"):
            Rollouts(wf, RolloutConfig(sampling="parallel", estimator="test_tree_only"))
        Rollouts(wf, RolloutConfig(sampling="tree",
                                   estimator="test_tree_only"))  # accepted where it declared it
        with pytest.raises(ValueError, match="samplings must be some of"):
            register_estimator("test_bad", samplings=("beam",))
        assert ("test_tree_only" in estimators_for("tree")
                and "test_tree_only" not in estimators_for("parallel"))
    finally:
        ADVANTAGE_ESTIMATORS.unregister("test_tree_only")
