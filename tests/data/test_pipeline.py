"""Rollouts played behind the update (``staleness`` N >= 1), with a scripted trainer: which weights
each rollout ran on, what each sample records, that a group never mixes weight versions, what a
checkpoint keeps, and where a failure behind the update surfaces."""

import threading
import time

import pytest

from drmas.data.background import Background, Pipeline
from drmas.data.datamodule import RolloutDataModule
from drmas.data.rollout_config import ValidationConfig
from drmas.data.rollouts import RolloutConfig, Rollouts
from drmas.modules.policy_generate import BusyClock
from drmas.records import Completion, ScriptedGenerate
from drmas.workflows.math import SolverVerifierWorkflow
from test_rollouts import ScriptedBackend


class VersionedBackend(ScriptedBackend):
    """A trainer whose weights have a version: :meth:`update` is one update (k-1 -> k), the engines
    serve the version of their last sync, and every completion's log-probs say which version
    generated it (``-version - 0.5``). Generating takes a while, so updates land mid-rollout."""

    def __init__(self, fn, delay=0.002):
        super().__init__(fn)
        self.weights, self.engine, self.delay, self.seeds, self.threads = 0, 0, delay, [], set()
        self.clocks = {}  # policy -> the BusyClock the trainer keeps per engine

    def sync_weights(self, seed=None):
        super().sync_weights(seed)
        self.engine = self.weights
        if seed is not None:
            self.seeds.append(seed)

    def reseed(self, seed):
        self.seeds.append(seed)

    def update(self):
        self.weights += 1

    def engine_busy(self):
        return {p: clock.take() for p, clock in self.clocks.items()}

    def generate_fn(self, train):
        def generate(agent, prompts, n):
            self.threads.add(threading.current_thread().name)
            served = self.engine
            with self.clocks.setdefault(self.bind_agents(None)[agent], BusyClock()):
                time.sleep(self.delay)
            return [[Completion([7, 7], [1] * (i + 1), [-served - 0.5] * (i + 1), self.fn(agent, i), "stop")
                     for i in range(n)] for _ in prompts]

        return ScriptedGenerate(generate, train)


def right_on_even(agent, i):
    return "\\boxed{1}" if i % 2 == 0 else "\\boxed{-1}"


def run(rollouts, backend, iterations):
    """What the trainer does: each iteration takes its rollout, updates, then drains."""
    plans, drains = [], []
    for _ in range(iterations):
        k = backend.begin_iteration()
        plans.append(rollouts.prepare(backend, k))
        backend.update()  # while the next rollout plays
        drains.append(rollouts.source.drain())
    return plans, drains


@pytest.mark.parametrize("staleness", [1, 2])
def test_iteration_k_trains_on_the_weights_after_update_k_minus_1_minus_n(staleness):
    rollouts = Rollouts(SolverVerifierWorkflow(max_turns=2),
                        RolloutConfig(staleness=staleness, group_size=4, tasks_per_iteration=3),
                        ValidationConfig(tasks=0))
    backend = VersionedBackend(right_on_even)
    plans, drains = run(rollouts, backend, 5)
    for k, plan in enumerate(plans, start=1):
        expected = max(0, k - 1 - staleness)
        assert plan.iteration == k
        # the version each sample records is the one its engine served, and the fixed lag's
        served = {-s.engine_logprobs[0] - 0.5 for s in plan.samples}
        assert served == {expected} and {s.version for s in plan.samples} == {expected}
        lag = min(k - 1, staleness)
        for policy in ("p_solve", "p_check"):
            assert plan.scalars[f"train/{policy}/staleness_max"] == lag
            assert plan.scalars[f"train/{policy}/staleness_mean"] == lag
    assert backend.threads == {"drmas-rollout"}  # every rollout played behind the trainer
    assert rollouts.source.background.submitted == [] and sorted(rollouts.source.ready) == list(
        range(6, 6 + staleness))
    engines = {f"train/{p}/engine_{w}_s" for p in ("p_solve", "p_check") for w in ("busy", "idle")}
    assert all(set(d) == {"time/trainer_wait_s", "time/engine_idle_s", *engines} and min(d.values()) >= 0
               for d in drains)
    # each engine answered at least one request (the turn's prompts together), of the delay
    assert all(d[f"train/{p}/engine_busy_s"] >= 0.002 for d in drains for p in ("p_solve", "p_check"))
    # the same draws as a synchronous run: each rollout reseeded from (seed, rank, its iteration)
    assert backend.seeds == list(range(1, 6 + staleness))


def test_no_rollout_is_played_past_the_last_iteration():
    rollouts = Rollouts(SolverVerifierWorkflow(max_turns=1),
                        RolloutConfig(staleness=2, group_size=2, tasks_per_iteration=1),
                        ValidationConfig(tasks=0))
    rollouts.source.last = 3
    backend = VersionedBackend(right_on_even)
    plans, _ = run(rollouts, backend, 3)
    assert [p.iteration for p in plans] == [1, 2, 3] and backend.seeds == [1, 2, 3]
    assert rollouts.source.ready == {} and rollouts.source.state()["staleness"] == 2


def test_a_group_never_mixes_weight_versions_when_updates_land_mid_rollout():
    """Updates happen while the rollout plays (its generate calls are slow); the engines keep the
    weights of the sync, so every (task, agent) group is one version."""
    rollouts = Rollouts(SolverVerifierWorkflow(max_turns=2),
                        RolloutConfig(staleness=1, group_size=4, tasks_per_iteration=4),
                        ValidationConfig(tasks=0))
    backend = VersionedBackend(right_on_even, delay=0.01)
    k = backend.begin_iteration()
    rollouts.prepare(backend, k)
    for _ in range(3):  # three updates while iteration 2's rollout plays on version 0
        backend.update()
        time.sleep(0.005)
    rollouts.source.drain()
    k = backend.begin_iteration()
    plan = rollouts.prepare(backend, k)
    groups = {}
    for s in plan.samples:
        groups.setdefault((s.task_uid, s.agent), set()).add(-s.engine_logprobs[0] - 0.5)
    assert len(groups) >= 4 and all(v == {0} for v in groups.values())


def test_a_checkpoint_keeps_the_rollouts_played_ahead_and_a_resumed_run_trains_on_them():
    config = RolloutConfig(staleness=1, group_size=2, tasks_per_iteration=2)
    full = Rollouts(SolverVerifierWorkflow(max_turns=1), config, ValidationConfig(tasks=0))
    plans, _ = run(full, VersionedBackend(right_on_even), 4)

    part = Rollouts(SolverVerifierWorkflow(max_turns=1), config, ValidationConfig(tasks=0))
    backend = VersionedBackend(right_on_even)
    run(part, backend, 2)
    state = part.source.state()
    assert list(__import__("pickle").loads(state["ready"])) == [3]  # played on version 1, not trained
    resumed = Rollouts(SolverVerifierWorkflow(max_turns=1), config, ValidationConfig(tasks=0))
    resumed.source.load(state)
    restarted = VersionedBackend(right_on_even)
    restarted.iteration = restarted.weights = restarted.engine = 2  # what the checkpoint restores
    later, _ = run(resumed, restarted, 2)
    for a, b in zip(plans[2:], later):
        assert [(s.task_uid, s.agent, s.version, s.advantage) for s in a.samples] == [
            (s.task_uid, s.agent, s.version, s.advantage) for s in b.samples]
    with pytest.raises(ValueError, match="written with --data.rollout.staleness 1, this run has 2"):
        Pipeline(2).load(state)


def test_a_synchronous_run_refuses_a_checkpoint_with_rollouts_played_ahead():
    dm = RolloutDataModule(SolverVerifierWorkflow(max_turns=1), RolloutConfig(), ValidationConfig(tasks=0))
    assert dm.state_dict() == {}
    with pytest.raises(ValueError, match="staleness 1 and holds the rollouts .* this run is synchronous"):
        dm.load_state_dict({"pipeline": {"staleness": 1, "ready": b""}})


def test_a_failure_behind_the_update_is_raised_where_the_trainer_waits():
    calls = []

    def second_rollout_fails(agent, i):  # one request of 2 candidates per rollout
        calls.append(i)
        if len(calls) > 2:
            raise RuntimeError("device lost")
        return right_on_even(agent, i)

    rollouts = Rollouts(SolverVerifierWorkflow(max_turns=1),
                        RolloutConfig(staleness=1, group_size=2, tasks_per_iteration=1),
                        ValidationConfig(tasks=0))
    backend = VersionedBackend(second_rollout_fails)
    rollouts.prepare(backend, backend.begin_iteration())  # iteration 2's rollout plays behind, and fails
    with pytest.raises(RuntimeError, match="device lost"):
        rollouts.source.drain()


def test_stopping_drops_the_queued_rollouts_and_says_so(caplog):
    bg, gate = Background(), threading.Event()
    bg.submit(1, gate.wait)
    bg.submit(2, lambda: 2)
    pipeline = Pipeline(1)
    pipeline.background = bg
    pipeline.stop()
    gate.set()
    assert "background rollout of iteration(s) 1, 2 was stopped" in caplog.text
    with pytest.raises(RuntimeError, match="submitted twice"):
        bg.submit(3, lambda: 3), bg.submit(3, lambda: 3)


def test_staleness_is_checked():
    with pytest.raises(ValueError, match="staleness must be >= 0"):
        RolloutConfig(staleness=-1)


def test_an_engines_busy_time_counts_overlapping_requests_once(monkeypatch):
    from drmas.modules import policy_generate

    now = [0.0]
    monkeypatch.setattr(policy_generate.time, "perf_counter", lambda: now[0])
    clock = BusyClock()
    with clock:  # 0-4 s, with a second request 1-3 s inside it: 4 s busy, not 6
        now[0] = 1.0
        with clock:
            now[0] = 3.0
        now[0] = 4.0
    now[0] = 10.0  # idle 4-10
    with clock:
        now[0] = 11.0
        assert clock.take() == 5.0  # 4 + the second in flight so far
        now[0] = 12.5
    assert clock.take() == 1.5 and clock.take() == 0.0
