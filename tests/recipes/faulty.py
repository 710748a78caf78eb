"""Run a recipe with one fault injected at a chosen iteration (a test tool, never used by drmas):

    python faulty.py FAULT ITERATION recipes/search.py fit ...

FAULT is one of
  kill_update     SIGKILL after the first micro-batch of ITERATION (in the middle of its update)
  sigterm_update  SIGTERM (what SLURM and Kubernetes send) at the same point; the wall time it
                  was sent is written to the file named by $FAULT_STAMP
  kill_ckpt       SIGKILL halfway through writing the bytes of ITERATION's last.ckpt
  kill_hf         SIGKILL halfway through writing a weights file of ITERATION's HF export
  sigterm_rollout SIGTERM at the rollout engine's first request of ITERATION
  engine_error    the rollout engine raises at its first request of ITERATION
"""

from __future__ import annotations

import os
import runpy
import signal
import sys
import time

from fsspec.implementations.local import LocalFileOpener

import transformers.modeling_utils as modeling_utils
from drmas.modules.multi_agent import MultiAgentRL

fault, at, recipe, *args = sys.argv[1:]
at = int(at)
state = {"iteration": 0}


def die() -> None:
    sys.stdout.flush()
    sys.stderr.flush()
    os.kill(os.getpid(), signal.SIGKILL)


step = MultiAgentRL.training_step


def training_step(self, batch, batch_idx):
    state["iteration"] = self.iteration
    out = step(self, batch, batch_idx)
    if self.iteration == at and batch_idx == 0:
        if fault == "kill_update":
            die()
        if fault == "sigterm_update":
            with open(os.environ["FAULT_STAMP"], "w") as f:
                f.write(repr(time.time()))
            os.kill(os.getpid(), signal.SIGTERM)
    return out


MultiAgentRL.training_step = training_step

if fault == "kill_ckpt":
    write = LocalFileOpener.write

    def half_write(self, data):
        if state["iteration"] == at and len(data) > 1000:
            write(self, data[: len(data) // 2])
            self.f.flush()
            die()
        return write(self, data)

    LocalFileOpener.write = half_write

if fault == "kill_hf":
    save_file = modeling_utils.safe_save_file

    def half_save(tensors, filename, metadata=None):
        if state["iteration"] == at:
            save_file(tensors, filename, metadata=metadata)
            with open(filename, "r+b") as f:  # as far as a kill mid-write gets
                f.truncate(os.path.getsize(filename) // 2)
            die()
        return save_file(tensors, filename, metadata=metadata)

    modeling_utils.safe_save_file = half_save

if fault in ("engine_error", "sigterm_rollout"):
    generate_fn = MultiAgentRL.generate_fn

    def failing_generate_fn(self, train):
        inner = generate_fn(self, train)

        def generate(agent, prompts, n):
            if self.iteration == at and fault == "sigterm_rollout" and not state.get("sent"):
                state["sent"] = True
                os.kill(os.getpid(), signal.SIGTERM)
            elif self.iteration == at and fault == "engine_error":
                engine = self._engine(self.policy_of(agent))
                engine.generate = lambda *a, **k: (_ for _ in ()).throw(RuntimeError("CUDA error: device lost"))
            return inner(agent, prompts, n)

        return generate

    MultiAgentRL.generate_fn = failing_generate_fn

sys.argv = [recipe, *args]
runpy.run_path(recipe, run_name="__main__")
