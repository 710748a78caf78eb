"""The trainer's end of an engine process tells an engine at work from one that stopped: a request
answered while the process beats, however long it takes within --gather_timeout_s; one whose
process holds its interpreter (no beat) given up on after $DRMAS_ENGINE_HEARTBEAT_S, naming it.
A toy engine process (tests/engines/served_toy.py); the frozen vLLM engine is in test_engines.py."""

import os
import time

import pytest

from drmas.engines.served import EngineProcessError, ServedEngine

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
