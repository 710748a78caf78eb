"""W1: single-agent GRPO, drmas against TRL's GRPOTrainer, in one run on this machine.

The same task for both: SmolLM2-135M-Instruct, 8 generated arithmetic word problems (a JSONL
file written here), 4 problems x 4 samples per step, at most 64 new tokens, temperature 1, one
optimiser step per step, the drmas solver's prompt, reward 1 for a right boxed answer. drmas runs
``recipes/math_team.py fit`` with one solver loop and ``grpo`` (its defaults: the engine of
``--model.engine``, the precision the hardware suggests unless ``--precision`` says: bf16-mixed
where the CPU computes bf16 natively, else fp32); TRL runs ``GRPOTrainer`` on the CPU in fp32.
Printed: the machine (its CPU kind and the vLLM kernel build it selects), the build drmas's
engine loaded, each side's median seconds per step (the first step, with its warm-up, left out)
and the ratio. TRL is an optional extra: ``pip install .[bench]``.

    python bench/bench_w1.py [--steps 5] [--engine auto|hf|vllm] [--precision auto|bf16-mixed|32]
"""

from __future__ import annotations

import argparse
import glob
import json
import os
import statistics
import subprocess
import sys
import tempfile

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)
MODEL = "embedded:smollm2-135m-instruct"


def write_problems(path: str) -> None:
    from drmas.workflows.math.problems import arithmetic_word_problems

    with open(path, "w") as f:
        for t in arithmetic_word_problems(seed=0, train_size=8, val_size=0, test_size=0)["train"]:
            f.write(json.dumps({"problem": t.problem, "answer": t.answer}) + "\n")


def drmas_steps(args: argparse.Namespace, data: str, out: str) -> tuple[list[float], str]:
    """drmas's seconds per step, and the vLLM kernel build its engine loaded."""
    cmd = [sys.executable, os.path.join(ROOT, "recipes", "math_team.py"), "fit",
           "--config", os.path.join(ROOT, "configs", "smollm2_135m_cpu.yaml"),
           "--trainer.max_epochs", str(args.steps),
           *([] if args.precision == "auto" else ["--trainer.precision", args.precision]),
           "--trainer.logger.init_args.save_dir", out, "--checkpoint.every_n_iterations", "0",
           "--hf_checkpoint.dirpath", os.path.join(out, "hf"),
           "--model.engine", args.engine, "--model.policies.shared.update.micro_batch_size", "16",
           "--model.policies.shared.generation.train.temperature", "1.0",
           "--model.policies.shared.generation.train.max_new_tokens", "64",
           "--data.rollout.estimator", "grpo", "--data.rollout.group_size", "4",
           "--data.rollout.tasks_per_iteration", "4",
           "--data.validation.tasks", "0", "--data.workflow.init_args.max_turns", "1",
           "--data.workflow.init_args.train_file", data]
    proc = subprocess.run(cmd, check=True, cwd=out, stdout=subprocess.PIPE, text=True)
    engines = [line.rsplit("kernels ", 1)[1] for line in proc.stdout.splitlines()
               if " vLLM engine of policy " in line]
    kernels = ", ".join(sorted(set(engines))) or "none (HF engine)"
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    ea = EventAccumulator(glob.glob(os.path.join(out, "math", "version_*", "events.*"))[0],
                          size_guidance={"scalars": 0})
    ea.Reload()
    parts = [{e.step: e.value for e in ea.Scalars(f"time/{k}_s")} for k in ("sync", "rollout", "update")]
    return [sum(p[it] for p in parts) for it in sorted(parts[0])], kernels


TRL_SCRIPT = r"""
import json, sys, time, os
from datasets import Dataset
from transformers import TrainerCallback
from trl import GRPOConfig, GRPOTrainer
from drmas.workflows.math import SolverVerifierWorkflow
from drmas.workflows.math.grading import is_correct
from drmas.models import resolve_model_path

data, out, steps = sys.argv[1], sys.argv[2], int(sys.argv[3])
wf = SolverVerifierWorkflow(max_turns=1, train_file=data)
rows = []
for t in wf.tasks("train"):
    p = wf.prompt("solver", wf.initial_state(t))
    rows.append({"prompt": [{"role": r, "content": c} for r, c in p.messages], "answer": t.answer})

def reward(completions, answer, **kw):
    return [float(is_correct(c[0]["content"], a)) for c, a in zip(completions, answer)]

class Clock(TrainerCallback):
    def __init__(self): self.times = []
    def on_step_begin(self, *a, **k): self.t = time.perf_counter()
    def on_step_end(self, *a, **k): self.times.append(time.perf_counter() - self.t)

clock = Clock()
cfg = GRPOConfig(output_dir=out, per_device_train_batch_size=16, num_generations=4, max_completion_length=64,
                 temperature=1.0, learning_rate=1e-6, max_steps=steps, logging_steps=1, report_to=[],
                 use_cpu=True, bf16=False, save_strategy="no", seed=0, dataloader_num_workers=0)
trainer = GRPOTrainer(model=str(resolve_model_path("embedded:smollm2-135m-instruct")), reward_funcs=reward,
                      args=cfg, train_dataset=Dataset.from_list(rows), callbacks=[clock])
trainer.train()
print("STEPS", json.dumps(clock.times))
"""


def trl_steps(args: argparse.Namespace, data: str, out: str) -> list[float] | None:
    try:
        import trl  # noqa: F401
    except ImportError:
        print("TRL is not installed: pip install .[bench]  (or pip install trl)")
        return None
    proc = subprocess.run([sys.executable, "-c", TRL_SCRIPT, data, out, str(args.steps)], cwd=out,
                          capture_output=True, text=True, env={**os.environ, "PYTHONPATH": ROOT})
    if proc.returncode != 0:
        raise RuntimeError(f"TRL run failed:\n{proc.stderr[-3000:]}")
    line = next(ln for ln in proc.stdout.splitlines() if ln.startswith("STEPS "))
    return json.loads(line[len("STEPS "):])


def resolved_precision(precision: str) -> str:
    from drmas.hardware import default_precision

    return default_precision("cpu") if precision == "auto" else precision


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--steps", type=int, default=5)
    p.add_argument("--engine", default="auto", choices=("auto", "hf", "vllm"))
    p.add_argument("--precision", default="auto", choices=("auto", "bf16-mixed", "32"))
    args = p.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        data = os.path.join(tmp, "w1.jsonl")
        write_problems(data)
        os.makedirs(os.path.join(tmp, "trl")), os.makedirs(os.path.join(tmp, "drmas"))
        ours, kernels = drmas_steps(args, data, os.path.join(tmp, "drmas"))
        theirs = trl_steps(args, data, os.path.join(tmp, "trl"))
    med = lambda xs: statistics.median(xs[1:] if len(xs) > 1 else xs)  # noqa: E731
    from drmas.hardware import machine

    print(f"machine: {machine()}")
    print(f"W1: SmolLM2-135M, 4 problems x 4 samples, <= 64 new tokens, {args.steps} steps; "
          f"drmas engine {args.engine} (vLLM kernels loaded: {kernels}), "
          f"precision {resolved_precision(args.precision)}")
    print(f"drmas  median {med(ours):6.1f} s/step  (steps: {', '.join(f'{t:.1f}' for t in ours)})")
    if theirs:
        print(f"TRL    median {med(theirs):6.1f} s/step  (steps: {', '.join(f'{t:.1f}' for t in theirs)})")
        print(f"drmas / TRL: {med(ours) / med(theirs):.2f}x")


if __name__ == "__main__":
    main()
