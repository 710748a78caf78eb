"""Faults the rollout side survives or stops on, with real parts: the HTTP retriever against our
own server on loopback (with injected errors, hangs and slow answers), a closed port, a server
that answers garbage, and reward functions that return NaN or infinity."""

import math
import socket
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest

from drmas.algorithms import compute_advantages
from drmas.data.rollouts import OutageError, RolloutConfig, Rollouts
from drmas.workflows.math import SolverVerifierWorkflow
from drmas.workflows.search import HTTPRetriever, Retriever, SearchWorkflow
from drmas.workflows.search.retrieval import BM25Retriever
from drmas.workflows.search.server import serve
from drmas.records import BatchSpec, Completion, ScriptedGenerate
from drmas.data.rollout_config import ValidationConfig


class Faulty(Retriever):
    """BM25 behind the real server, misbehaving on request i as ``schedule[i]`` says: ``ok``,
    ``error`` (the server answers 500), ``hang`` (longer than the client's timeout), ``slow``
    (within it). Requests past the schedule are ``ok``."""

    needs_corpus = False

    def __init__(self, corpus, schedule=()):
        self.inner, self.schedule, self.calls = BM25Retriever(corpus), list(schedule), 0

    def search(self, queries, topk):
        mode = self.schedule[self.calls] if self.calls < len(self.schedule) else "ok"
        self.calls += 1
        if mode == "error":
            raise RuntimeError("index shard offline")
        if mode in ("hang", "slow"):
            time.sleep(1.0 if mode == "hang" else 0.1)
        return self.inner.search(queries, topk)


@pytest.fixture
def server():
    """``start(schedule) -> (url, faulty)``; every server is closed afterwards."""
    running = []

    def start(corpus, schedule=()):
        faulty = Faulty(corpus, schedule)
        srv, url = serve(faulty)
        running.append(srv)
        return url, faulty

    yield start
    for srv in running:
        srv.shutdown()
        srv.server_close()


def garbage_server():
    """A server answering every POST with 200 and an HTML page (a proxy's error page, say)."""

    class Handler(BaseHTTPRequestHandler):
        def do_POST(self):  # noqa: N802
            self.rfile.read(int(self.headers.get("Content-Length", "0")))
            body = b"<html>502 Bad Gateway</html>"
            self.send_response(200)
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, *args):
            pass

    srv = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    srv.daemon_threads = True
    threading.Thread(target=srv.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True).start()
    return srv, f"http://127.0.0.1:{srv.server_address[1]}/retrieve"


def closed_port_url():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return f"http://127.0.0.1:{s.getsockname()[1]}/retrieve"


def search_workflow(url, timeout_s=2.0, retries=1, max_turns=2):
    wf = SearchWorkflow(max_turns=max_turns, retriever="http", retriever_url=url)
    wf.retriever = HTTPRetriever(url, timeout_s=timeout_s, retries=retries, backoff_s=0.01)
    return wf


def searcher_actions(wf, n=3):
    """The searcher's actions for ``n`` episodes that each search their task's entity."""
    tasks = list(wf.tasks("train"))[:n]
    states = [wf.initial_state(t) for t in tasks]
    comps = [Completion([1], [2], [-0.1], f"<search>{t.entity}</search>", "stop") for t in tasks]
    return tasks, wf.evaluate("searcher", states, comps)


@pytest.mark.parametrize(("fault", "cause", "requests"), [
    ("error", "HTTP 500: RuntimeError: index shard offline", 2),  # retried once, then given up
    ("hang", "timed out", None),  # (the retry queues behind the hung request on the server)
    ("refused", "Connection", None),
    ("garbage", "malformed response", None),  # not JSON: a broken server, not retried
])
def test_a_search_that_still_fails_after_its_retries_is_a_failed_action(server, fault, cause, requests):
    corpus = list(SearchWorkflow().retriever.corpus)
    srv = None
    if fault == "refused":
        url, faulty = closed_port_url(), None
    elif fault == "garbage":
        srv, url = garbage_server()
        faulty = None
    else:
        url, faulty = server(corpus, [fault] * 10)
    try:
        wf = search_workflow(url, timeout_s=0.3)
        _, actions = searcher_actions(wf)
    finally:
        if srv is not None:
            srv.shutdown()
            srv.server_close()
    for a in actions:
        assert a.valid and a.role_reward == 0.0  # the searcher did its part: no format penalty
        assert a.value[1] == [] and url in a.failure and cause in a.failure
    if requests is not None:
        assert faulty.calls == requests  # one request for the three queries, plus its retry


def test_a_slow_answer_within_the_timeout_and_a_recovered_error_are_not_failures(server):
    corpus = list(SearchWorkflow().retriever.corpus)
    url, faulty = server(corpus, ["slow", "error", "ok"])
    wf = search_workflow(url, timeout_s=2.0, retries=1)
    tasks, actions = searcher_actions(wf)
    assert all(a.failure is None for a in actions)
    assert [a.value[1] for a in actions] == [[h.text for h in row] for row in
                                            faulty.inner.search([t.entity for t in tasks], wf.topk)]
    _, actions = searcher_actions(wf)  # the next request fails once, its retry succeeds
    assert all(a.failure is None and a.value[1] for a in actions) and faulty.calls == 3


class SearchBackend:
    """The trainer side for the search team: one shared policy; the verifier always says no,
    so every episode of ``max_turns`` turns searches ``max_turns - 1`` times."""

    rank, world_size, iteration = 0, 1, 0

    def gather_objects(self, obj):
        return [obj]

    def engine_cache_stats(self):
        return (0, 0)

    def engine_busy(self):
        return {}

    def bind_agents(self, agents):
        return {a: "shared" for a in agents}

    def generate_fn(self, train):
        text = {"verifier": "no</verify>", "searcher": "capital</search>", "answerer": "Paris</answer>"}
        return ScriptedGenerate(lambda agent, prompts, n: [
            [Completion([5, 5], [1, 2], [-0.5, -0.5], p.prefill + text[agent], "stop") for _ in range(n)]
            for p in prompts], train)

    def sync_weights(self, seed=None):
        pass

    def batch_spec(self, policy):
        return BatchSpec(pad_id=0, micro_batch_size=64, ppo_epochs=1)

    def log_scalars(self, metrics):
        pass


def test_some_failed_searches_are_counted_and_the_iteration_trains_on(server):
    # 2 tasks x 2 trajectories, 3 turns: two search rounds of 4 queries, one request each; the
    # first request fails with its retry, the second succeeds: 4 of 8 searches failed (= half)
    corpus = list(SearchWorkflow().retriever.corpus)
    url, _ = server(corpus, ["error", "error"])
    rollouts = Rollouts(search_workflow(url, max_turns=3), RolloutConfig(group_size=2, tasks_per_iteration=2),
                        ValidationConfig(tasks=0))
    plan = rollouts.prepare(SearchBackend(), iteration=1)
    searches = [s for s in plan.samples if s.agent == "searcher"]
    failed = [s for s in searches if "failure" in s.info]
    assert len(searches) == 8 and len(failed) == 4 and {s.turn for s in failed} == {0}
    assert (plan.scalars["rollout/failed_actions"] == 4
            and plan.scalars["rollout/searcher/failed_actions"] == 4)
    assert all(s.valid for s in failed)  # no format penalty for the server's fault
    assert sum(m.input_ids.shape[0] for m in plan.micro_batches) == len(plan.samples)  # all trained on


def test_an_outage_stops_the_run_before_training(server):
    corpus = list(SearchWorkflow().retriever.corpus)
    url, _ = server(corpus, ["error", "error"])
    strict = Rollouts(search_workflow(url, max_turns=3),
                      RolloutConfig(group_size=2, tasks_per_iteration=2, max_failed_share=0.4),
                      ValidationConfig(tasks=0))
    with pytest.raises(OutageError,
                       match=r"iteration 1: 4 of 8 searcher actions failed .* max_failed_share=0.4") as e:
        strict.prepare(SearchBackend(), iteration=1)
    assert "HTTP 500" in str(e.value) and url in str(e.value)
    # the server down for good: every search fails, even at the default share of one half
    down = Rollouts(search_workflow(closed_port_url()), RolloutConfig(group_size=2, tasks_per_iteration=2),
                    ValidationConfig(tasks=2, k=1))
    with pytest.raises(OutageError, match="4 of 4 searcher actions failed"):
        down.prepare(SearchBackend(), iteration=1)
    with pytest.raises(OutageError, match=r"^val: (\d+) of \1 searcher actions failed"):  # validation too
        down.validate(SearchBackend())
    with pytest.raises(ValueError, match="max_failed_share must be in"):
        Rollouts(SolverVerifierWorkflow(), RolloutConfig(max_failed_share=1.5))


class Poisoned(SolverVerifierWorkflow):
    """The solver/verifier team whose reward function breaks on one task."""

    def __init__(self, bad_uid, value):
        super().__init__(max_turns=1)
        self.bad_uid, self.value = bad_uid, value

    def team_reward(self, state):
        return self.value if state.task.uid == self.bad_uid else super().team_reward(state)


@pytest.mark.parametrize("value", [float("nan"), float("inf"), -float("inf")])
def test_samples_with_a_nonfinite_reward_are_dropped_and_counted(value):
    clean = Rollouts(SolverVerifierWorkflow(max_turns=1),
                     RolloutConfig(group_size=4, tasks_per_iteration=2, seed=1), ValidationConfig(tasks=0))
    bad, good = clean.sample_tasks(1)

    class Backend(SearchBackend):
        def bind_agents(self, agents):
            return {a: "shared" for a in agents}

        def generate_fn(self, train):  # trajectories 0 and 2 right, 1 and 3 wrong, on both tasks
            def gen(agent, prompts, n):
                return [[Completion([5], [1], [-0.5], p.prefill + (
                    f"\\boxed{{{good.answer if good.problem in p.messages[-1][1] else bad.answer}}}"
                    if i % 2 == 0 else "\\boxed{-12345}"), "stop") for i in range(n)] for p in prompts]
            return ScriptedGenerate(gen, train)

    rollouts = Rollouts(Poisoned(bad.uid, value), RolloutConfig(group_size=4, tasks_per_iteration=2, seed=1),
                        ValidationConfig(tasks=0))
    plan = rollouts.prepare(Backend(), iteration=1)
    assert plan.scalars["rollout/nonfinite_rewards"] == 4  # the broken task's four trajectories
    assert {s.task_uid for s in plan.samples} == {good.uid}
    assert all(math.isfinite(s.reward) and math.isfinite(s.advantage) for s in plan.samples)
    # the kept samples' advantages are exactly those of the clean samples alone
    expected = compute_advantages(plan.samples, "drmas", "std").tolist()
    assert [s.advantage for s in plan.samples] == pytest.approx(expected)
    assert sorted(s.reward for s in plan.samples) == [0.0, 0.0, 1.0, 1.0]
    assert sum(m.input_ids.shape[0] for m in plan.micro_batches) == 4
