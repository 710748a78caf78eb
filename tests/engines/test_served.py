"""The trainer's end of an engine process tells an engine at work from one that stopped: a request
answered while the process beats, however long it takes within --gather_timeout_s; one whose
process holds its interpreter (no beat) given up on after $DRMAS_ENGINE_HEARTBEAT_S, naming it.
A toy engine process (tests/engines/served_toy.py); the frozen vLLM engine is in test_engines.py."""

import os
import threading
import time

import pytest

from drmas.engines.served import EngineProcessError, RemoteEngine, ServedEngine

pytestmark = pytest.mark.integration

HERE = os.path.dirname(os.path.abspath(__file__))


class ToyEngine(ServedEngine):
    kind = "toy"

    def __init__(self):
        env = {"PYTHONPATH": os.pathsep.join([HERE, os.environ.get("PYTHONPATH", "")])}
        self._spawn("served_toy:serve", [], "toy", [0], env, {})

    def call(self, method, seconds):
        return self._call(method, seconds=seconds)

    def generate(self, *args):  # a toy: the requests above are all it answers
        raise NotImplementedError

    def sync_weights(self, weights):
        raise NotImplementedError


@pytest.fixture(scope="module")
def toy():
    engine = ToyEngine()
    yield engine
    engine.close()


def test_a_request_longer_than_the_heartbeat_bound_is_answered_while_the_process_beats(toy, monkeypatch):
    monkeypatch.setenv("DRMAS_ENGINE_HEARTBEAT_S", "1.5")
    start = time.monotonic()
    assert toy.call("wait", 4.0) == 4.0  # 2.7x the bound: its beats kept it
    assert time.monotonic() - start >= 4.0
    assert toy.call("wait", 0.0) == 0.0  # a beat left over from the last request is skipped


def test_a_beating_process_is_still_bound_by_the_gather_timeout(monkeypatch):
    engine = ToyEngine()
    try:
        engine.ready()
        monkeypatch.setenv("DRMAS_GATHER_TIMEOUT_S", "2")
        with pytest.raises(EngineProcessError, match=rf"toy engine process of toy \(pid {engine.pid}\) did "
                                                     r"not answer 'wait' within 2 s \(--gather_timeout_s\)"):
            engine.call("wait", 60.0)
    finally:
        engine.close()


def test_a_process_holding_its_interpreter_is_stopped_after_the_heartbeat_bound(monkeypatch):
    engine = ToyEngine()
    try:
        engine.ready()
        monkeypatch.setenv("DRMAS_ENGINE_HEARTBEAT_S", "2")
        start = time.monotonic()
        stopped = (rf"toy engine process of toy \(pid {engine.pid}\) stopped answering 'hold': "
                   r"no heartbeat for 2 s")
        with pytest.raises(EngineProcessError, match=stopped):
            engine.call("hold", 60.0)
        assert time.monotonic() - start < 10
        time.sleep(0.5)
        assert not engine.process.alive()  # stopped, not left holding a core
    finally:
        engine.close()


# ---- other ranks: the engine reached at its address with the run's key --------------------------

def remote(engine, client, key=None):
    return RemoteEngine(engine.address, key or engine.key, "toy", owner=0, client=client, kind="toy")


def test_other_ranks_requests_wait_behind_the_owners_and_are_answered_in_one_call(toy):
    toy.ready()
    before = toy.served()
    askers = {"rank 1": remote(toy, "rank 1"), "rank 2": remote(toy, "rank 2")}
    answers = {}
    owner = threading.Thread(target=lambda: answers.update(owner=toy.call("wait", 1.5)))
    owner.start()
    time.sleep(0.3)  # the process is busy with the owner's request
    threads = [threading.Thread(target=lambda k=k, r=r: answers.update({k: r._request("echo", value=k)}))
               for k, r in askers.items()]
    for t in threads:
        t.start()
    for t in [owner, *threads]:
        t.join()
    after = toy.served()
    for r in askers.values():
        r.close()
    assert answers == {"owner": 1.5, "rank 1": "rank 1", "rank 2": "rank 2"}
    assert after["batches"][len(before["batches"]):] == [2]  # both waited, then one call answered both
    assert after["requests"]["rank 1"] == after["requests"]["rank 2"] == 1
    assert after["requests"]["owner"] == before["requests"]["owner"] + 1


def test_another_rank_generates_only_and_a_wrong_key_is_refused_while_the_engine_goes_on(toy):
    toy.ready()
    other = remote(toy, "rank 1")
    try:
        with pytest.raises(EngineProcessError, match=r"PermissionError: 'wait' is asked only by the rank "
                                                     r"that started this engine \(in the toy engine process "
                                                     r"of toy on rank 0 \(127\.0\.0\.1:\d+\)"):
            other._request("wait", seconds=0.0)
        with pytest.raises(EngineProcessError, match=r"of toy on rank 0 \(127\.0\.0\.1:\d+\) cannot be "
                                                     r"reached: AuthenticationError"):
            remote(toy, "rank 2", key=b"another run's key")
        assert other._request("echo", value=3) == 3
        assert toy.call("wait", 0.0) == 0.0
    finally:
        other.close()


def test_an_engine_that_dies_is_named_to_the_other_ranks_with_its_owner_and_address():
    engine = ToyEngine()
    try:
        engine.ready()
        other = remote(engine, "rank 1")
        os.kill(engine.pid, 9)
        host, port = engine.address
        gone = rf"the toy engine process of toy on rank 0 \({host}:{port}\) ended \(its connection closed\)"
        with pytest.raises(EngineProcessError, match=gone + " during 'echo'"):
            other._request("echo", value=1)
    finally:
        engine.close()
