"""The rollout side without Lightning or a model: a scripted backend stands in for the trainer
(the contract is all ``Rollouts`` may use), a real workflow plays, and the prepared iteration is checked."""

import copy
import dataclasses
import threading
from dataclasses import dataclass, replace

import numpy as np
import pytest

from drmas.data.datamodule import RolloutDataModule
from drmas.data.rollouts import RolloutConfig, Rollouts
from drmas.workflows.base import Workflow
from drmas.workflows.math import SolverVerifierWorkflow
from drmas.workflows.search import SearchWorkflow
from drmas.records import BatchSpec, Completion, ScriptedGenerate
from drmas.data.rollout_config import ValidationConfig


class ScriptedBackend:
    """The trainer side of the contract: solver and verifier on two policies with different
    pad ids, micro-batch sizes and PPO epochs; completions come from ``fn(agent, i)``."""

    specs = {"p_solve": BatchSpec(pad_id=0, micro_batch_size=2, ppo_epochs=2),
             "p_check": BatchSpec(pad_id=5, micro_batch_size=4, ppo_epochs=1)}

    rank, world_size = 0, 1

    def __init__(self, fn):
        self.fn, self.iteration, self.syncs, self.logged, self.calls = fn, 0, 0, [], []

    def gather_objects(self, obj):
        return [obj]

    def engine_cache_stats(self):
        return (0, 0)  # a scripted engine keeps no prefix cache

    def engine_busy(self):
        return {}

    def bind_agents(self, agents):
        return {"solver": "p_solve", "verifier": "p_check"}

    def begin_iteration(self):
        self.iteration += 1
        return self.iteration

    def generate_fn(self, train):
        def generate(agent, prompts, n):
            self.calls.append((agent, len(prompts), n, train))
            # response lengths differ by candidate so micro-batches sort and pad visibly
            return [[Completion([7, 7, 7], [1] * (i + 1), [-0.5] * (i + 1), p.prefill + self.fn(agent, i),
                                "stop")
                     for i in range(n)] for p in prompts]

        return ScriptedGenerate(generate, train)

    def sync_weights(self, seed=None):
        self.syncs += 1

    def batch_spec(self, policy):
        return self.specs[policy]

    def log_scalars(self, metrics):
        self.logged.append(metrics)


@pytest.fixture(scope="module")
def workflow():
    return SolverVerifierWorkflow(max_turns=1)


def right_on_even(task):
    """Trajectories 0 and 2 of each task answer right, 1 and 3 wrong; one loop, no verifier."""
    return lambda agent, i: f"\\boxed{{{task.answer}}}" if i % 2 == 0 else "\\boxed{-1}"


def test_a_plan_scores_routes_and_packs_by_the_backends_specs(workflow):
    rollouts = Rollouts(workflow,
                        RolloutConfig(estimator="drmas", group_size=4, tasks_per_iteration=1, seed=3),
                        ValidationConfig(tasks=0))
    task = rollouts.sample_tasks(1)[0]
    backend = ScriptedBackend(right_on_even(task))
    plan = rollouts.prepare(backend, iteration=1)

    assert plan.iteration == 1 and backend.syncs == 1
    assert set(plan.timings) == {"time/sync_s", "time/rollout_s", "time/advantage_s"}
    assert backend.calls == [("solver", 1, 4, True)]  # the four trajectories share one request
    s = plan.samples
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


def test_the_engines_prefix_cache_hit_rate_is_that_of_the_rollout(workflow):
    class Cached(ScriptedBackend):
        served = [(900, 800), (200, 50), (1, 1)]  # before the rollout (validation), the rollout, after

        def engine_cache_stats(self):
            return self.served.pop(0)

    rollouts = Rollouts(workflow, RolloutConfig(group_size=2, tasks_per_iteration=1),
                        ValidationConfig(tasks=0))
    backend = Cached(lambda agent, i: "\\boxed{1}")
    assert rollouts.prepare(backend, iteration=1).scalars == {
        "rollout/prefix_cache_hit_rate": 0.25, "rollout/failed_actions": 0.0, "rollout/failed_episodes": 0.0,
        "rollout/nonfinite_rewards": 0.0, "rollout/grader_errors": 0.0}
    assert rollouts.prepare(ScriptedBackend(lambda agent, i: "\\boxed{1}"), iteration=1).scalars == {
        "rollout/failed_actions": 0.0, "rollout/failed_episodes": 0.0, "rollout/nonfinite_rewards": 0.0,
        "rollout/grader_errors": 0.0}


def test_agents_on_two_policies_are_packed_apart_with_their_own_pad(workflow):
    wf = SolverVerifierWorkflow(max_turns=2)
    rollouts = Rollouts(wf, RolloutConfig(estimator="drmas", group_size=2, tasks_per_iteration=1),
                        ValidationConfig(tasks=0))
    task = rollouts.sample_tasks(1)[0]
    fn = lambda agent, i: f"\\boxed{{{task.answer}}}" if agent == "solver" else "approve</verify>"  # noqa: E731
    plan = rollouts.prepare(ScriptedBackend(fn), iteration=1)
    assert (sorted((x.agent, x.policy) for x in plan.samples)
            == [("solver", "p_solve")] * 2 + [("verifier", "p_check")] * 2)
    check = [m for m in plan.micro_batches if m.policy == "p_check"]
    # one PPO epoch, one batch of 4
    assert len(check) == 1 and check[0].step_after and check[0].ppo_epoch == 0
    assert (check[0].input_ids == 5).any() and not (check[0].input_ids == 0).any()
    # every sample is rewarded alike (right and approved): all advantages are exactly 0
    assert all(x.advantage == 0.0 for x in plan.samples)


def test_validation_gives_avg_and_pass_at_k_per_source(workflow):
    rollouts = Rollouts(workflow, RolloutConfig(), ValidationConfig(tasks=3, k=2))
    tasks = rollouts.val_task_list()
    answers = {workflow.prompt("solver", workflow.initial_state(t)): t.answer for t in tasks}
    backend, calls = ScriptedBackend(None), []

    def generate(agent, prompts, n):  # the first of each task's two samples is right
        calls.append(n)
        return [[Completion([1], [2], [-0.1], f"\\boxed{{{answers[p] if i == 0 else -1}}}") for i in range(n)]
                for p in prompts]

    backend.generate_fn = lambda train: ScriptedGenerate(generate, train)
    scalars = rollouts.validate(backend)
    source = tasks[0].source
    assert scalars == {"val/avg@2": 0.5, "val/pass@2": 1.0,
                       f"val/{source}/avg@2": 0.5, f"val/{source}/pass@2": 1.0,
                       # one loop: only the solver acts, right in half of the episodes
                       "val/success_rate": 0.5, "val/turns_mean": 1.0,
                       "val/solver/reward_mean": 0.5, "val/solver/valid_ratio": 1.0}
    assert calls == [2] and backend.syncs == 1
    # a smaller validation (the one before training, --data.validation.before_tasks): the first task of
    # each source alone, as the full one picks them; 0 plays nothing
    calls.clear()
    assert rollouts.val_task_list(limit=1) == tasks[:1] and rollouts.val_task_list(limit=5) == tasks
    small = rollouts.validate(backend, limit=1)
    assert small["val/avg@2"] == 0.5 and small["val/pass@2"] == 1.0 and calls == [2]
    assert len(rollouts.last_validation.episodes) == 2  # one task, k = 2
    assert rollouts.validate(backend, limit=0) == {} and backend.syncs == 2
    with pytest.raises(ValueError, match=r"validation.before_tasks must be >= 0 \(or unset\), got -1"):
        ValidationConfig(before_tasks=-1)


def test_the_policy_swap_probe_answers_each_agent_with_the_other_policy():
    """Each policy is scripted to master its own role: right answers from p_solve on solver
    prompts, approvals from p_check. Swapped, the solver's prompts reach p_check: nothing solved."""
    wf = SolverVerifierWorkflow(max_turns=2)
    rollouts = Rollouts(wf, RolloutConfig(), ValidationConfig(tasks=3, k=2))
    tasks = rollouts.val_task_list()
    answers = {wf.prompt("solver", wf.initial_state(t)): t.answer for t in tasks}
    backend, routed = ScriptedBackend(None), []
    policy_of = backend.bind_agents(wf.agents)

    def generate(agent, prompts, n):
        policy = policy_of[agent]
        routed.append((agent, policy))
        text = {"p_solve": lambda p: f"\\boxed{{{answers.get(p, -1)}}}",
                "p_check": lambda p: "approve</verify>"}[policy]
        return [[Completion([1], [2], [-0.1], p.prefill + text(p)) for _ in range(n)] for p in prompts]

    backend.generate_fn = lambda train: ScriptedGenerate(generate, train)
    normal = rollouts.validate(backend)
    swapped = rollouts.validate(backend, swap=True)
    source = tasks[0].source
    assert normal["val/avg@2"] == 1.0 and {k: v for k, v in swapped.items() if "@" in k} == {
        "val_swapped/avg@2": 0.0, "val_swapped/pass@2": 0.0,
        f"val_swapped/{source}/avg@2": 0.0, f"val_swapped/{source}/pass@2": 0.0}
    assert swapped["val_swapped/solver/valid_ratio"] == 0.0 and normal["val/solver/valid_ratio"] == 1.0
    assert rollouts.swapped_agents() == {"solver": "verifier", "verifier": "solver"}
    # the solver's prompts went to p_check (called under the verifier's name), which never boxes an answer
    assert routed[:3] == [("solver", "p_solve"), ("verifier", "p_check"), ("verifier", "p_check")]

    shared = Rollouts(wf, RolloutConfig(), ValidationConfig(tasks=3, k=2))
    shared.agent_map = {"solver": "shared", "verifier": "shared"}
    with pytest.raises(ValueError, match="the policy-swap probe needs one policy per agent"):
        shared.swapped_agents()


def test_capabilities_are_refused_before_anything_runs():
    sv = SolverVerifierWorkflow()
    with pytest.raises(ValueError, match=r"SolverVerifierWorkflow does not support sampling='tree'; "
                                         r"it supports: parallel"):
        RolloutDataModule(sv, rollout=RolloutConfig(sampling="tree", estimator="at_grpo"))
    search = SearchWorkflow(max_turns=2)
    with pytest.raises(ValueError, match=r"estimator 'at_grpo' does not work "
                                         r".*use one of: drmas, grpo, grpo_step, rloo"):
        RolloutDataModule(search, rollout=RolloutConfig(sampling="parallel", estimator="at_grpo"))
    with pytest.raises(ValueError, match=r"estimator 'grpo' .*sampling='tree'"
                                         r".*use one of: at_grpo, drmas, grpo_step"):
        RolloutDataModule(search, rollout=RolloutConfig(sampling="tree", estimator="grpo"))
    with pytest.raises(ValueError, match="unknown estimator 'gae'; known: .*drmas"):
        RolloutDataModule(search, rollout=RolloutConfig(estimator="gae"))
    with pytest.raises(ValueError, match="sampling must be one of"):
        RolloutDataModule(search, rollout=RolloutConfig(sampling="beam"))


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

    def rollout(self, tasks, generate, *, n, sampling="parallel", seed=0, progress=None):
        raise AssertionError("not played in these tests")


def test_val_tasks_are_the_first_of_each_source_in_order():
    val = [Task("x0", "x"), Task("y0", "y"), Task("x1", "x"),
           Task("x2", "x"), Task("z0", "z"), Task("y1", "y")]
    assert ([t.uid for t in Rollouts(Listed(val), RolloutConfig(), ValidationConfig(tasks=2)).val_task_list()]
            == ["x0", "x1", "y0", "y1", "z0"])


def test_tasks_without_a_source_are_one_group():
    tasks = Rollouts(Listed([Task(f"q{i}") for i in range(5)]), RolloutConfig(),
                     ValidationConfig(tasks=3)).val_task_list()
    assert [t.uid for t in tasks] == ["q0", "q1", "q2"]


def test_a_task_type_without_a_source_is_refused_naming_the_workflow():
    class Bare:
        uid = "b0"

    rollouts = Rollouts(Listed([Bare()]), RolloutConfig(), ValidationConfig(tasks=3))
    with pytest.raises(TypeError, match=r"Listed.tasks\('val'\) gave a Bare without source: a task needs"):
        rollouts.val_task_list()
    with pytest.raises(TypeError, match=r"Listed.tasks\('train'\) gave a Bare without source"):
        rollouts.sample_tasks(1)


def test_a_tree_only_workflow_cannot_validate():
    class TreeOnly(Listed):
        samplings = ("tree",)

    with pytest.raises(ValueError, match="set --data.validation.tasks 0"):
        Rollouts(TreeOnly([]), RolloutConfig(sampling="tree", estimator="at_grpo"), ValidationConfig(tasks=4))
    tree_only = RolloutConfig(sampling="tree", estimator="at_grpo")
    assert Rollouts(TreeOnly([]), tree_only, ValidationConfig(tasks=0)).validation.tasks == 0


def test_several_ranks_need_fsdp_and_a_task_per_rank(workflow):
    import types

    from lightning.pytorch.strategies import DDPStrategy

    from drmas.modules.sharding import FSDP

    dm = RolloutDataModule(workflow, rollout=RolloutConfig(tasks_per_iteration=2),
                           validation=ValidationConfig(tasks=0))
    dm.trainer = types.SimpleNamespace(world_size=2, reload_dataloaders_every_n_epochs=1,
                                       strategy=DDPStrategy())
    with pytest.raises(ValueError,
                       match="training on 2 ranks needs --trainer.strategy fsdp, got DDPStrategy"):
        dm.setup("fit")
    dm.trainer = types.SimpleNamespace(world_size=3, reload_dataloaders_every_n_epochs=1, strategy=FSDP())
    with pytest.raises(ValueError, match=r"tasks_per_iteration \(2\) must be >= the number of ranks \(3\)"):
        dm.setup("fit")
    dm.trainer = types.SimpleNamespace(world_size=1, reload_dataloaders_every_n_epochs=3)
    with pytest.raises(ValueError, match="reload_dataloaders_every_n_epochs must be 1"):
        dm.setup("fit")


def _ranked_backends(world, generate):
    """``world`` backends whose ``gather_objects`` meet at a barrier, as ranks' collectives do."""
    slots, barrier = [None] * world, threading.Barrier(world)

    class Ranked(ScriptedBackend):
        def gather_objects(self, obj):
            slots[self.rank] = copy.deepcopy(obj)  # what pickling through a process group does
            barrier.wait()
            out = list(slots)
            barrier.wait()
            return out

    backends = []
    for rank in range(world):
        b = Ranked(None)
        b.rank, b.world_size, b.generate_fn = (
            rank, world, lambda train, b=b: ScriptedGenerate(generate(b), train))
        backends.append(b)
    return backends


def test_data_parallel_ranks_play_disjoint_tasks_and_train_like_one_process():
    wf = SolverVerifierWorkflow(max_turns=2)
    config = RolloutConfig(estimator="drmas", group_size=4, tasks_per_iteration=5, seed=1)
    make = lambda: Rollouts(wf, config, ValidationConfig(tasks=0))  # noqa: E731
    tasks = make().sample_tasks(1)

    def task_of(prompt):  # every prompt of an episode quotes its problem
        return next(t for t in tasks if any(t.problem in text for _, text in prompt.messages))

    def generate(backend):
        def gen(agent, prompts, n):
            # deterministic in (prompt, i): the same completions whichever rank asks
            backend.calls.extend(task_of(p).uid for p in prompts)
            if agent == "solver":
                return [[Completion([7] * (3 + j), [1] * (i + 1), [-0.5] * (i + 1),
                                    f"\\boxed{{{task_of(p).answer if i % 2 == 0 else -1}}}")
                         for i in range(n)]
                        for j, p in enumerate(prompts)]
            return [[Completion([7, 7], [2] * (i + 2), [-0.5] * (i + 2),
                                "approve</verify>" if i % 3 else "reject</verify>") for i in range(n)]
                    for p in prompts]
        return gen

    single = make().prepare(_ranked_backends(1, generate)[0], iteration=1)
    backends = _ranked_backends(2, generate)
    plans = [None, None]

    def play(rank):
        plans[rank] = make().prepare(backends[rank], iteration=1)

    threads = [threading.Thread(target=play, args=(r,)) for r in range(2)]
    [t.start() for t in threads]
    [t.join(timeout=120) for t in threads]

    # disjoint whole tasks per rank, all of them played
    played = [set(b.calls) for b in backends]
    assert not played[0] & played[1] and played[0] | played[1] == {t.uid for t in tasks}
    # the same advantages as one process playing the same completions, on every rank, not all 0
    key = lambda x: (x.task_uid, x.traj_uid, x.agent, x.turn)  # noqa: E731
    want = {key(x): x.advantage for x in single.samples}
    assert (any(abs(a) > 0.1 for a in want.values())
            and {x.agent for x in single.samples} == {"solver", "verifier"})
    for plan in plans:
        assert {key(x): x.advantage for x in plan.samples} == pytest.approx(want, abs=1e-6)
    # the ranks' passes line up one for one, and together train every sample once per PPO epoch
    steps = [[(m.policy, m.ppo_epoch, m.step_after) for m in plan.micro_batches] for plan in plans]
    assert steps[0] == steps[1]
    by_policy = {}
    for plan in plans:
        for m in plan.micro_batches:
            entry = by_policy.setdefault((m.policy, m.ppo_epoch), [[], 0.0])
            entry[0] += [] if m.stand_in else m.sample_index.tolist()
            entry[1] += m.loss_scale
            assert m.loss_scale == 0.0 if m.stand_in else m.loss_scale > 0
    for (policy, _), (trained, scale) in by_policy.items():
        n = sum(x.policy == policy for x in single.samples)
        assert sorted(trained) == list(range(n))
        assert scale == pytest.approx(2.0)  # each rank's share x 2: FSDP averages the two gradients


class Preempted(SystemExit):
    """A SystemExit as Lightning's SIGTERMException is (module-level: it must pickle)."""


@pytest.mark.parametrize("failing", [{1: "engine"}, {0: "sigterm", 1: "engine"}])
def test_a_rank_whose_rollout_fails_still_meets_the_others_and_every_rank_raises_the_same(failing):
    """One rank's engine fails (or two ranks fail differently): nobody waits in the gather, and
    every rank raises the lowest failed rank's exception, its own traceback on that rank."""
    from drmas.engines import EngineError

    wf = SolverVerifierWorkflow(max_turns=1)

    def generate(backend):
        def gen(agent, prompts, n):
            kind = failing.get(backend.rank)
            if kind == "engine":
                raise EngineError(f"the hf engine of policy 'p' failed on rank {backend.rank}")
            if kind == "sigterm":
                raise Preempted(143)
            return [[Completion([7, 7], [2], [-0.5], "\\boxed{1}") for _ in range(n)] for _ in prompts]
        return gen

    backends = _ranked_backends(2, generate)
    raised = [None, None]

    def play(rank):
        try:
            Rollouts(wf, RolloutConfig(estimator="drmas", group_size=2, tasks_per_iteration=2),
                     ValidationConfig(tasks=0)).prepare(backends[rank], 1)
        except BaseException as err:
            raised[rank] = err

    threads = [threading.Thread(target=play, args=(r,)) for r in range(2)]
    [t.start() for t in threads]
    [t.join(timeout=60) for t in threads]
    assert not any(t.is_alive() for t in threads)  # nobody left waiting in the gather
    first = min(failing)
    want = Preempted if failing[first] == "sigterm" else EngineError
    assert all(isinstance(err, want) for err in raised), raised
    if want is EngineError:
        assert all(str(err) == "the hf engine of policy 'p' failed on rank 1" for err in raised)


def test_the_swap_probe_keeps_what_the_generate_function_answers():
    from drmas.data.rerouted import Rerouted

    class Generate(ScriptedGenerate):
        def settings(self, agent):
            return f"settings of {agent}"

        def prompt_tokens(self, agent, prompt):
            return len(agent)

        def tool_format(self, agent):
            return "hermes", agent

        def check_stop(self):
            raise Preempted("stop")

    swapped = Rerouted(Generate(lambda agent, prompts, n: [[agent] * n for _ in prompts], train=False),
                        {"solver": "verifier", "verifier": "solver"})
    assert swapped("solver", ["p"], 2) == [["verifier", "verifier"]] and swapped.train is False
    assert (swapped.settings("solver") == "settings of verifier"
            and swapped.prompt_tokens("verifier", None) == 6
            and swapped.tool_format("solver") == ("hermes", "verifier"))
    with pytest.raises(Preempted):
        swapped.check_stop()



def test_progress_is_part_of_the_rollout_contract_for_a_workflow_that_is_not_turn_based(capsys):
    """A bare Workflow with a progress bar shown: it gets the bar's function and reports each
    episode; one whose rollout takes no progress is refused when the rollouts are set up."""
    from drmas.records import EpisodeResult, RolloutResult, Sample

    class Coin(Listed):
        agents, seen = ("solver",), []

        def rollout(self, tasks, generate, *, n, sampling="parallel", seed=0, progress=None):
            Coin.seen.append(progress)
            episodes = [EpisodeResult(t.uid, f"{t.uid}#{j}", j == 0, 1, float(j == 0)) for t in tasks
                        for j in range(n)]
            for e in episodes:
                if progress is not None:
                    progress(e.success)
            return RolloutResult([Sample(e.task_uid, e.traj_uid, "solver", 0, "", [1], [2], [0.0],
                                         reward=e.team_reward) for e in episodes], episodes)

    tasks = [Task(f"q{i}") for i in range(2)]
    for shown in (True, False):
        rollouts = Rollouts(Coin(tasks), RolloutConfig(group_size=2, tasks_per_iteration=2, progress=shown),
                            ValidationConfig(tasks=0))
        rollouts.prepare(ScriptedBackend(lambda agent, i: "x"), iteration=1)
    shown_fn, hidden = Coin.seen
    assert callable(shown_fn) and hidden is None
    assert "iteration 1:" in capsys.readouterr().err  # the bar over the 4 episodes was shown

    class Old(Listed):
        def rollout(self, tasks, generate, *, n, sampling="parallel", seed=0):
            return RolloutResult([], [])

    with pytest.raises(TypeError, match=r"Old.rollout takes no progress argument"):
        Rollouts(Old(tasks), RolloutConfig(), ValidationConfig(tasks=0))



def test_each_sample_is_kept_as_a_record_with_its_terms_and_advantage(workflow, tmp_path):
    from drmas.algorithms import group_of
    from drmas.data.episodes import keep, policy_gaps, read_records, write_records
    from drmas.data.tables import agent_table, markdown

    config = RolloutConfig(estimator="drmas", group_size=4, tasks_per_iteration=1, seed=3)
    rollouts = Rollouts(workflow, config, ValidationConfig(tasks=0))
    task = rollouts.sample_tasks(1)[0]
    plan = rollouts.prepare(ScriptedBackend(right_on_even(task)), iteration=1)
    class Tokens:  # the text of token ids, as the records decode them
        def decode(self, ids):
            return f"prompt {ids}"

        def batch_decode(self, rows):
            return [f"<{ids[0]}>" for ids in rows]

    # the trainer's gaps of the first sample of p_solve: two tokens, trainer - engine -0.25 and 0.5
    first = plan.samples[0]
    diffs = np.array([-0.25, 0.5] + [0.0] * (len(first.response_ids) - 2), dtype=np.float16)
    path = write_records(str(tmp_path), "train", 1, plan.samples, plan.rollout.episodes,
                         {task.uid: "arithmetic"}, lambda agent: Tokens(),
                         policy_gaps(plan.samples, {("p_solve", 0): (0.125, diffs)}),
                         lambda s: group_of("drmas", s))
    assert path == str(tmp_path / "episodes" / "iter_000001.jsonl.gz")
    records = read_records(path)
    a = 0.5 / (1 / 3) ** 0.5  # drmas on rewards 1, 0, 1, 0: +-0.5 / their unbiased std
    assert [r["reward"] for r in records] == [1.0, 0.0, 1.0, 0.0]
    assert [r["advantage"] for r in records] == pytest.approx([a, -a, a, -a], rel=1e-5)
    assert [r["episode_success"] for r in records] == [True, False, True, False]
    for r, s in zip(records, plan.samples):
        assert (r["task"], r["trajectory"], r["agent"], r["policy"], r["turn"]) == (
            str(task.uid), str(s.traj_uid), "solver", "p_solve", 0)
        assert (r["split"], r["iteration"], r["source"], r["version"]) == ("train", 1, "arithmetic", 0)
        assert (r["candidate"], r["chosen"]) == (0, True)  # parallel: one candidate per step
        assert r["prompt"] == "prompt [7, 7, 7]" and r["response"] == s.text
        assert (r["prompt_tokens"], r["response_tokens"]) == (3, len(s.response_ids))
        assert (r["team_reward"], r["local_reward"], r["valid"]) == (s.team_reward, s.local_reward, True)
        assert r["role_reward"] == s.info["role_reward"] and r["failure"] is None
        assert r["group"] == str((task.uid, "solver")) and r["cut"] is False  # drmas: (task, agent)
    assert records[0]["logprob_gap"] == 0.125 and records[0]["token_logprob_diff"][:2] == [-0.25, 0.5]
    assert records[0]["tokens"] == [f"<{t}>" for t in first.response_ids]
    assert all(r["logprob_gap"] is r["tokens"] is r["token_logprob_diff"] is None for r in records[1:])
    # a cap keeps whole tasks, in the rollout's order
    two = plan.samples + [dataclasses.replace(s, task_uid="other") for s in plan.samples]
    assert len(keep(two, 5)) == 8 and len(keep(two, 4)) == 4 and keep(two, 0) == [] and keep(two, None) == two
    table = markdown(agent_table(plan.samples)).splitlines()
    assert table[0].startswith("| sample | advantage |")
    picked = [row.split(" | ")[:2] for row in table[2:]]
    assert picked == [["| best", f"{a:+.3f}"], ["| median", f"{-a:+.3f}"], ["| worst", f"{-a:+.3f}"]]


def test_per_policy_pools_give_each_policy_its_own_ranks_with_the_whole_batchs_loss_scales():
    """Pools {p_solve: [0], p_check: [1]} (and p_solve on both for the overlapping case): a rank
    gets micro-batches only of the policies whose pool holds it, the policy's pool together trains
    each of its samples once per PPO epoch, and the scales add up to the pool's size (its sharding
    averages the pool's gradients)."""
    wf = SolverVerifierWorkflow(max_turns=2)
    config = RolloutConfig(estimator="drmas", group_size=4, tasks_per_iteration=4, seed=1)

    def generate(backend):
        def gen(agent, prompts, n):
            text = "\\boxed{-1}" if agent == "solver" else "reject</verify>"
            return [[Completion([7] * 3, [1] * (i + 1), [-0.5] * (i + 1), text) for i in range(n)]
                    for _ in prompts]
        return gen

    for pools in ({"p_solve": (0,), "p_check": (1,)}, {"p_solve": (0, 1), "p_check": (1,)}):
        backends = _ranked_backends(2, generate)
        for b in backends:
            b.specs = {name: replace(spec, ranks=pools[name]) for name, spec in ScriptedBackend.specs.items()}
        plans = [None, None]

        def play(rank, backends=backends, plans=plans):
            plans[rank] = Rollouts(wf, config, ValidationConfig(tasks=0)).prepare(backends[rank], iteration=1)

        threads = [threading.Thread(target=play, args=(r,)) for r in range(2)]
        [t.start() for t in threads]
        [t.join(timeout=120) for t in threads]
        # as many passes on each rank (idle ones where its pools have less to train): Lightning's loop
        # meets every rank before each
        counts = [len(p.micro_batches) for p in plans]
        assert counts[0] == counts[1] and any(m.idle for p in plans for m in p.micro_batches)
        assert all(m.idle for p in plans for m in p.micro_batches if not m.policy)
        for name, pool in pools.items():
            n = sum(x.policy == name for x in plans[0].samples)
            for epoch in range(ScriptedBackend.specs[name].ppo_epochs):
                mine = [[m for m in plans[r].micro_batches if m.policy == name and m.ppo_epoch == epoch]
                        for r in range(2)]
                assert [bool(m) for m in mine] == [r in pool for r in range(2)]
                trained = sorted(i for ms in mine for m in ms if not m.stand_in
                                 for i in m.sample_index.tolist())
                assert trained == list(range(n)) and n > 0
                assert sum(m.loss_scale for ms in mine for m in ms) == pytest.approx(len(pool))
