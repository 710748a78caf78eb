"""The rollout side without Lightning or a model: a scripted backend stands in for the trainer
(the contract is all ``Rollouts`` may use), a real workflow plays, and the plan is checked."""

from dataclasses import dataclass

import pytest

from drmas.data.datamodule import RolloutDataModule
from drmas.data.rollouts import Rollouts
from drmas.envs.base import Workflow
from drmas.envs.math import SolverVerifierWorkflow
from drmas.envs.search import SearchWorkflow
from drmas.records import BatchSpec, Completion


class ScriptedBackend:
    """The trainer side of the contract: solver and verifier on two policies with different
    pad ids, micro-batch sizes and PPO epochs; completions come from ``fn(agent, i)``."""

    specs = {"p_solve": BatchSpec(pad_id=0, micro_batch_size=2, ppo_epochs=2),
             "p_check": BatchSpec(pad_id=5, micro_batch_size=4, ppo_epochs=1)}

    def __init__(self, fn):
        self.fn, self.iteration, self.syncs, self.logged, self.calls = fn, 0, 0, [], []

    def bind_agents(self, agents):
        return {"solver": "p_solve", "verifier": "p_check"}

    def begin_iteration(self):
        self.iteration += 1
        return self.iteration

    def generate_fn(self, train):
        def generate(agent, prompts, n):
            self.calls.append((agent, len(prompts), n, train))
            # response lengths differ by candidate so micro-batches sort and pad visibly
            return [[Completion([7, 7, 7], [1] * (i + 1), [-0.5] * (i + 1), p.prefill + self.fn(agent, i), "stop")
                     for i in range(n)] for p in prompts]

        return generate

    def sync_weights(self):
        self.syncs += 1

    def batch_spec(self, policy):
        return self.specs[policy]

    def log_scalars(self, metrics):
        self.logged.append(metrics)


@pytest.fixture(scope="module")
def workflow():
    return SolverVerifierWorkflow(max_loops=1)


def right_on_even(task):
    """Trajectories 0 and 2 of each task answer right, 1 and 3 wrong; one loop, no verifier."""
    return lambda agent, i: f"\\boxed{{{task.answer}}}" if i % 2 == 0 else "\\boxed{-1}"


def test_a_plan_scores_routes_and_packs_by_the_backends_specs(workflow):
    rollouts = Rollouts(workflow, estimator="drmas", group_size=4, tasks_per_iteration=1, val_tasks=0, seed=3)
    task = rollouts.sample_tasks(1)[0]
    backend = ScriptedBackend(right_on_even(task))
    plan = rollouts.plan(backend, iteration=1)

    assert plan.iteration == 1 and backend.syncs == 1
    assert set(plan.timings) == {"time/sync_s", "time/rollout_s", "time/advantage_s"}
    assert backend.calls == [("solver", 1, 4, True)]  # the four trajectories share one request
    s = plan.experiences
    assert [x.policy for x in s] == ["p_solve"] * 4
    assert [x.reward for x in s] == [1.0, 0.0, 1.0, 0.0]
    # drmas: (r - 0.5) / unbiased std of {1, 0, 1, 0} = +-0.5 / sqrt(1/3)
    a = 0.5 / (1 / 3) ** 0.5
    assert [x.advantage for x in s] == pytest.approx([a, -a, a, -a], rel=1e-5)

    # p_solve: 2 PPO epochs of 2 micro-batches of 2, sorted by length; its step after each epoch
    mbs = plan.micro_batches
    assert [(m.policy, m.ppo_epoch, m.input_ids.shape[0], m.step_after) for m in mbs] == [
        ("p_solve", 0, 2, False), ("p_solve", 0, 2, True), ("p_solve", 1, 2, False), ("p_solve", 1, 2, True)]
    assert mbs[0].sample_index.tolist() == [0, 1] and mbs[1].sample_index.tolist() == [2, 3]
    assert mbs[0].advantages.tolist() == pytest.approx([a, -a], rel=1e-5)
    assert mbs[0].input_ids[0].tolist() == [7, 7, 7, 1, 0]  # padded with p_solve's pad id


def test_agents_on_two_policies_are_packed_apart_with_their_own_pad(workflow):
    wf = SolverVerifierWorkflow(max_loops=2)
    rollouts = Rollouts(wf, estimator="drmas", group_size=2, tasks_per_iteration=1, val_tasks=0)
    task = rollouts.sample_tasks(1)[0]
    fn = lambda agent, i: f"\\boxed{{{task.answer}}}" if agent == "solver" else "approve</verify>"  # noqa: E731
    plan = rollouts.plan(ScriptedBackend(fn), iteration=1)
    assert sorted((x.agent, x.policy) for x in plan.experiences) == [("solver", "p_solve")] * 2 + [("verifier", "p_check")] * 2
    check = [m for m in plan.micro_batches if m.policy == "p_check"]
    assert len(check) == 1 and check[0].step_after and check[0].ppo_epoch == 0  # one PPO epoch, one batch of 4
    assert (check[0].input_ids == 5).any() and not (check[0].input_ids == 0).any()
    # every sample is rewarded alike (right and approved): all advantages are exactly 0
    assert all(x.advantage == 0.0 for x in plan.experiences)


def test_validation_gives_avg_and_pass_at_k_per_source(workflow):
    rollouts = Rollouts(workflow, val_tasks=3, val_k=2)
    tasks = rollouts.val_task_list()
    answers = {workflow.prompt("solver", workflow.initial_state(t)): t.answer for t in tasks}
    backend, calls = ScriptedBackend(None), []

    def generate(agent, prompts, n):  # the first of each task's two samples is right
        calls.append(n)
        return [[Completion([1], [2], [-0.1], f"\\boxed{{{answers[p] if i == 0 else -1}}}") for i in range(n)]
                for p in prompts]

    backend.generate_fn = lambda train: generate
    scalars = rollouts.validate(backend)
    source = tasks[0].source
    assert scalars == {"val/avg@2": 0.5, "val/pass@2": 1.0, f"val/{source}/avg@2": 0.5, f"val/{source}/pass@2": 1.0}
    assert calls == [2] and backend.syncs == 1


def test_capabilities_are_refused_before_anything_runs():
    sv = SolverVerifierWorkflow()
    with pytest.raises(ValueError, match=r"SolverVerifierWorkflow does not support sampling='tree'; it supports: parallel"):
        RolloutDataModule(sv, sampling="tree", estimator="at_grpo")
    search = SearchWorkflow(max_turns=2)
    with pytest.raises(ValueError, match=r"estimator 'at_grpo' does not work .*use one of: drmas, grpo, grpo_step, rloo"):
        RolloutDataModule(search, sampling="parallel", estimator="at_grpo")
    with pytest.raises(ValueError, match=r"estimator 'grpo' .*sampling='tree'.*use one of: at_grpo, drmas, grpo_step"):
        RolloutDataModule(search, sampling="tree", estimator="grpo")
    with pytest.raises(ValueError, match="unknown estimator 'gae'; known: .*drmas"):
        RolloutDataModule(search, estimator="gae")
    with pytest.raises(ValueError, match="sampling must be one of"):
        RolloutDataModule(search, sampling="beam")


@dataclass(frozen=True)
class Task:
    uid: str
    source: str | None = None


class Listed(Workflow):
    agents = ("a",)

    def __init__(self, val):
        self.val = val

    def tasks(self, split):
        return self.val

    def rollout(self, tasks, generate, *, n, mode="parallel", seed=0):
        raise AssertionError("not played in these tests")


def test_val_tasks_are_the_first_of_each_source_in_order():
    val = [Task("x0", "x"), Task("y0", "y"), Task("x1", "x"), Task("x2", "x"), Task("z0", "z"), Task("y1", "y")]
    assert [t.uid for t in Rollouts(Listed(val), val_tasks=2).val_task_list()] == ["x0", "x1", "y0", "y1", "z0"]


def test_tasks_without_a_source_are_one_group():
    tasks = Rollouts(Listed([Task(f"q{i}") for i in range(5)]), val_tasks=3).val_task_list()
    assert [t.uid for t in tasks] == ["q0", "q1", "q2"]


def test_a_tree_only_workflow_cannot_validate():
    class TreeOnly(Listed):
        modes = ("tree",)

    with pytest.raises(ValueError, match="set val_tasks 0"):
        Rollouts(TreeOnly([]), sampling="tree", estimator="at_grpo", val_tasks=4)
    assert Rollouts(TreeOnly([]), sampling="tree", estimator="at_grpo", val_tasks=0).val_tasks == 0


def test_several_ranks_are_refused_until_rollouts_are_data_parallel(workflow):
    import types

    dm = RolloutDataModule(workflow, val_tasks=0)
    dm.trainer = types.SimpleNamespace(world_size=2, reload_dataloaders_every_n_epochs=1)
    with pytest.raises(NotImplementedError, match="rollouts on 2 ranks are not supported yet"):
        dm.setup("fit")
    dm.trainer = types.SimpleNamespace(world_size=1, reload_dataloaders_every_n_epochs=3)
    with pytest.raises(ValueError, match="reload_dataloaders_every_n_epochs must be 1"):
        dm.setup("fit")
