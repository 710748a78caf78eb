"""Run a recipe with faults injected at chosen iterations (a test tool, never used by drmas):

    python faulty.py FAULT[,FAULT@ITERATION...] ITERATION recipes/search.py fit ...

Each FAULT happens at ITERATION unless it names its own. $FAULT_RANK limits the faults to one
rank (default: every rank); the ranks Lightning starts run this script too (it hands them the
faults through $FAULTY_SPEC), so a fault can strike one rank of a sharded run. FAULT is one of
  kill_update     SIGKILL after the first micro-batch of ITERATION (in the middle of its update)
  sigterm_update  SIGTERM (what SLURM and Kubernetes send) at the same point; the wall time it
                  was sent is written to the file named by $FAULT_STAMP
  nan_loss        the first micro-batch of ITERATION gets NaN advantages (a non-finite loss)
  kill_ckpt       SIGKILL halfway through writing the bytes of ITERATION's last.ckpt
  kill_swap       SIGKILL of every rank once ITERATION's sharded last.ckpt is complete, before its swap
  kill_hf         SIGKILL halfway through writing a weights file of ITERATION's HF export
  sigterm_rollout SIGTERM at the rollout engine's first request of ITERATION
  engine_error    the rollout engine raises at its first request of ITERATION
  hold_rollout    the rollout played behind ITERATION's update (--data.rollout.staleness) waits
                  before its first request until the run ends: a fault in that update finds it
                  still playing, however fast the engine is
  hf_enospc       the HF export's weights file fails with ENOSPC (a full disk) at ITERATION
  step_error      the optimiser step raises (as an out-of-memory would) at ITERATION
  load_error      reading the policy's weights (FSDP: each rank its shards) fails with EIO; ITERATION 0
  sync_error      the HF engine's weight sync raises after copying 3 gathered tensors of ITERATION's
                  first sync (a lost engine mid-transfer)
  record_enospc   writing validation.jsonl fails with ENOSPC at ITERATION's validation
  backward_error  the first backward of ITERATION raises (inside the update's collectives: nothing
                  can be agreed there)
  freeze          SIGSTOP after the first micro-batch of ITERATION (a hung kernel, a stuck file system,
                  a paused VM); the pid is written to $FAULT_STAMP
  corrupt_transfer  the engine processes (vLLM's, the HF one) alter one tensor as it arrives, in every
                  weight transfer from the start (tests/recipes/corrupt_engine.py); ITERATION 0
$FAULT_ATTEMPT limits the faults to one attempt of a torchrun job ($TORCHELASTIC_RESTART_COUNT).
$FAULT_EXITS names a folder where each rank writes how and when it ended (rank<R>: exit code, time,
and the line drmas ended it with).
"""

from __future__ import annotations

import errno
import json
import os
import signal
import sys
import threading
import time

import torch

from fsspec.implementations.local import LocalFileOpener

import drmas.atomic
import drmas.ranks
import transformers.modeling_utils as modeling_utils
from drmas.modules.multi_agent import MultiAgentRL

if "FAULTY_SPEC" in os.environ:  # a rank Lightning started: sys.argv holds the recipe's arguments
    spec = json.loads(os.environ["FAULTY_SPEC"])
    faults, recipe, args = {k: v for k, v in spec["faults"].items()}, spec["recipe"], sys.argv[1:]
else:
    names, at, recipe, *args = sys.argv[1:]
    faults = {}
    for item in names.split(","):
        name, _, when = item.partition("@")
        faults[name] = int(when or at)
    os.environ["FAULTY_SPEC"] = json.dumps({"faults": faults, "recipe": recipe})
only_rank = os.environ.get("FAULT_RANK")
if os.environ.get("FAULT_ATTEMPT", os.environ.get("TORCHELASTIC_RESTART_COUNT", "0")) != os.environ.get(
        "TORCHELASTIC_RESTART_COUNT", "0"):
    faults = {}  # another attempt's faults: this one runs clean
state = {"iteration": 0, "trainer": None, "rank": int(os.environ.get("LOCAL_RANK", "0"))}


def struck(fault: str) -> bool:
    """``fault`` is due now on this rank (for faults outside the module's methods)."""
    rank_ok = only_rank is None or int(only_rank) == state["rank"]
    return rank_ok and faults.get(fault) == state["iteration"]


def record_exit(code, line: str = "") -> None:
    if "FAULT_EXITS" in os.environ:  # how and when each rank ended: $FAULT_EXITS/rank<R>
        with open(os.path.join(os.environ["FAULT_EXITS"], f"rank{state['rank']}"), "w") as f:
            f.write(f"{code} {time.time()!r} {line}")


def due(fault: str, module) -> bool:
    """``fault`` was asked for, at this iteration, on this rank."""
    rank_ok = only_rank is None or int(only_rank) == module.global_rank
    return rank_ok and faults.get(fault) == module.iteration


def die() -> None:
    sys.stdout.flush()
    sys.stderr.flush()
    os.kill(os.getpid(), signal.SIGKILL)


step = MultiAgentRL.training_step


def training_step(self, batch, batch_idx):
    state["iteration"], state["trainer"] = self.iteration, self.trainer
    if due("nan_loss", self) and batch_idx == 0:
        batch.advantages = batch.advantages * float("nan")
    out = step(self, batch, batch_idx)
    if batch_idx == 0:
        if due("kill_update", self):
            die()
        if due("sigterm_update", self):
            if "FAULT_STAMP" in os.environ:
                with open(os.environ["FAULT_STAMP"], "w") as f:
                    f.write(repr(time.time()))
            os.kill(os.getpid(), signal.SIGTERM)
        if due("freeze", self):
            with open(os.environ["FAULT_STAMP"], "w") as f:
                f.write(str(os.getpid()))
            os.kill(os.getpid(), signal.SIGSTOP)
    return out


MultiAgentRL.training_step = training_step
begin = MultiAgentRL.begin_iteration


def begin_iteration(self):
    state["iteration"] = begin(self)  # from the rollout on: its weight sync included
    return state["iteration"]


MultiAgentRL.begin_iteration = begin_iteration

if "kill_ckpt" in faults:
    write = LocalFileOpener.write

    def half_write(self, data):
        if state["iteration"] == faults["kill_ckpt"] and len(data) > 1000:
            write(self, data[: len(data) // 2])
            self.f.flush()
            die()
        return write(self, data)

    LocalFileOpener.write = half_write

if "kill_swap" in faults:
    replace_dir = drmas.atomic.replace_dir

    def killing_replace_dir(tmp, target):
        if state["iteration"] == faults["kill_swap"] and target.endswith("last.ckpt"):
            for proc in getattr(state["trainer"].strategy.launcher, "procs", []):  # the other ranks
                proc.kill()
                proc.wait()
            die()
        return replace_dir(tmp, target)

    drmas.atomic.replace_dir = killing_replace_dir

if "kill_hf" in faults:
    save_file = modeling_utils.safe_save_file

    def half_save(tensors, filename, metadata=None):
        if state["iteration"] == faults["kill_hf"]:
            save_file(tensors, filename, metadata=metadata)
            with open(filename, "r+b") as f:  # as far as a kill mid-write gets
                f.truncate(os.path.getsize(filename) // 2)
            die()
        return save_file(tensors, filename, metadata=metadata)

    modeling_utils.safe_save_file = half_save

if faults.keys() & {"engine_error", "sigterm_rollout", "hold_rollout"}:
    generate_fn = MultiAgentRL.generate_fn

    def failing_generate_fn(self, train):
        inner = generate_fn(self, train)
        module = self

        class Failing:  # the trainer's generate function, failing on cue
            train = inner.train
            settings, prompt_tokens, check_stop = inner.settings, inner.prompt_tokens, inner.check_stop
            tokenizer = inner.tokenizer

            def __call__(self, agent, prompts, n):
                behind = threading.current_thread() is not threading.main_thread()
                if due("hold_rollout", module) and self.train and behind:
                    threading.Event().wait()  # a daemon thread: it ends with the process
                if due("sigterm_rollout", module) and not state.get("sent"):
                    state["sent"] = True
                    os.kill(os.getpid(), signal.SIGTERM)
                elif due("engine_error", module):
                    engine = module.engines.engine(module.policy_of(agent))
                    engine.generate = lambda *a, **k: (_ for _ in ()).throw(
                    RuntimeError("CUDA error: device lost"))
                return inner(agent, prompts, n)

        return Failing()

    MultiAgentRL.generate_fn = failing_generate_fn

if "hf_enospc" in faults:
    full_disk_save = modeling_utils.safe_save_file

    def disk_full(tensors, filename, metadata=None):
        if struck("hf_enospc"):
            raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC), filename)
        return full_disk_save(tensors, filename, metadata=metadata)

    modeling_utils.safe_save_file = disk_full

if "step_error" in faults:
    adamw_step = torch.optim.AdamW.step

    def failing_step(self, *args, **kwargs):
        if struck("step_error"):
            raise RuntimeError("CUDA out of memory. Tried to allocate 2.00 GiB (injected)")
        return adamw_step(self, *args, **kwargs)

    torch.optim.AdamW.step = failing_step

if "load_error" in faults:
    from drmas.modules.policy import Policy

    load_weights = Policy.load_weights

    def failing_load(self, *args, **kwargs):
        if struck("load_error"):
            raise OSError(errno.EIO, "Input/output error (injected)",
                          f"{self.config.model}/model.safetensors")
        return load_weights(self, *args, **kwargs)

    Policy.load_weights = failing_load

if "sync_error" in faults:
    from drmas.engines.hf import HFEngine

    hf_sync = HFEngine.sync_weights

    def failing_sync(self, weights):
        if struck("sync_error") and not state.get("synced_badly"):
            state["synced_badly"] = True
            for _, (name, tensor) in zip(range(3), weights):
                self.model.state_dict()[name].copy_(tensor)
            raise RuntimeError("the engine was lost mid-transfer (injected)")
        return hf_sync(self, weights)

    HFEngine.sync_weights = failing_sync

if "record_enospc" in faults:
    import drmas.data.datamodule as datamodule

    record = datamodule.write_text

    def full_disk_record(path, text):
        if struck("record_enospc") and path.endswith("validation.jsonl"):
            raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC), path)
        return record(path, text)

    datamodule.write_text = full_disk_record

if "backward_error" in faults:
    backward = MultiAgentRL.manual_backward

    def failing_backward(self, loss, *args, **kwargs):
        if struck("backward_error"):
            raise RuntimeError("CUDA error: an illegal memory access was encountered (injected)")
        return backward(self, loss, *args, **kwargs)

    MultiAgentRL.manual_backward = failing_backward

drmas_exit = drmas.ranks._exit


def recording_exit(line: str) -> None:
    record_exit(1, line)
    drmas_exit(line)


drmas.ranks._exit = recording_exit

if "corrupt_transfer" in faults:
    from drmas.engines.served import ServedEngine

    spawn = ServedEngine._spawn

    def corrupt_spawn(self, target, args, name, cores, env, build, on_gpu=False):
        module = {"drmas.engines.vllm.process:serve": "corrupt_engine:serve_vllm",
                  "drmas.engines.hf_process:serve": "corrupt_engine:serve_hf"}[target]
        here = os.path.dirname(os.path.abspath(__file__))
        env = {**env, "PYTHONPATH": os.pathsep.join([here, os.environ.get("PYTHONPATH", "")])}
        return spawn(self, module, args, name, cores, env, build, on_gpu)

    ServedEngine._spawn = corrupt_spawn


# the recipe runs as __main__ with its own arguments; argv[0] stays this script (runpy would set
# it to the recipe's path), which is what Lightning starts again for the other ranks
sys.argv = [os.path.abspath(__file__), *args]
with open(recipe) as f:
    code = compile(f.read(), recipe, "exec")
try:
    exec(code, {"__name__": "__main__", "__file__": recipe, "__builtins__": __builtins__})
except SystemExit as stop:
    record_exit(stop.code)
    raise
