"""Running a real recipe as users do (its own process, ``python recipes/<name>.py fit ...``; forked
from a pre-imported interpreter, see ``tests/forked.py``) and reading back what it wrote."""

from __future__ import annotations

import glob
import math
import os
import subprocess
from pathlib import Path

import pytest
import torch
from tensorboard.backend.event_processing.event_accumulator import EventAccumulator
from transformers import AutoModelForCausalLM

from drmas.checkout import recipe_script
from drmas.models import resolve_model_path
from drmas.report import read_validations
from forked import run_script

ROOT = Path(__file__).resolve().parents[2]
TINY = ["--config", str(ROOT / "configs/tiny_random.yaml")]


def run_recipe(recipe: str, tmp: Path, *args: str, check: bool = True) -> subprocess.CompletedProcess:
    argv = [recipe_script(recipe), "fit", *TINY,
            "--trainer.logger.init_args.save_dir", str(tmp / "runs"), *args]
    proc = run_script(argv, cwd=tmp)
    if check and proc.returncode != 0:
        raise AssertionError(f"recipe failed ({proc.returncode}):\n"
                             f"{proc.stdout[-3000:]}\n{proc.stderr[-6000:]}")
    return proc


RIGGED_ARGS = ("--model.engine", "rigged", "--trainer.precision", "32-true",
               "--model.policies.shared.generation.train.max_new_tokens", "48")
"""A rigged run (``rigged.py``): scripted replies whose rewards differ within every group."""
RIGGED_RUNS = {r: (r, (), "0") for r in ("search", "math", "code", "games", "debate", "agents")}
"""Each rigged run: its recipe, its extra arguments and its behaviour policy's drift in nats per
token (``DRMAS_RIG_DRIFT``). The off-policy run drifts and takes two PPO epochs."""
RIGGED_RUNS["math-off-policy"] = ("math", ("--model.policies.shared.update.ppo_epochs", "2",
                                           "--model.policies.shared.optim.lr", "3e-3"), "0.05")


def rigged_run(run: str, tmp: Path) -> subprocess.CompletedProcess:
    """One of :data:`RIGGED_RUNS` into ``tmp`` (the ``rigged`` fixture shares each per session)."""
    recipe, extra, drift = RIGGED_RUNS[run]
    argv = [str(ROOT / "tests" / "recipes" / "rigged.py"), recipe, "fit", *TINY, *RIGGED_ARGS, *extra,
            "--trainer.logger.init_args.save_dir", str(tmp / "runs")]
    env = {**os.environ, "DRMAS_RIG_DRIFT": drift}
    proc = run_script(argv, cwd=tmp, env=env)
    if proc.returncode != 0:
        raise AssertionError(f"rigged run {run} failed ({proc.returncode}):\n{proc.stderr[-6000:]}")
    return proc


def run_dir(tmp: Path) -> str:
    return sorted(glob.glob(str(tmp / "runs/*/version_*")))[-1]


def scalars(run: str) -> dict[str, dict[int, float]]:
    """Every scalar tag as {step: value}; ``_text`` holds the text (tensor) tags, ``_images`` the images."""
    files = glob.glob(os.path.join(run, "events.out.tfevents.*"))
    ea = EventAccumulator(files[0], size_guidance={"scalars": 0, "tensors": 0, "images": 0})
    ea.Reload()
    out = {t: {e.step: e.value for e in ea.Scalars(t)} for t in ea.Tags()["scalars"]}
    out["_text"] = {t: 0 for t in ea.Tags()["tensors"]}
    out["_images"] = {t: 0 for t in ea.Tags()["images"]}
    return out


def check_run(tmp: Path, agents: tuple[str, ...], iterations: int = 2, policy: str = "shared") -> dict:
    """The scalars every run must log, finite, on the iteration axis; the final HF checkpoint
    reloads with transformers and its weights moved."""
    d = run_dir(tmp)
    s = scalars(d)
    required = [f"train/{policy}/{k}" for k in ("grad_norm", "grad_norm_spikes", "loss", "clip_frac")]
    required += [f"rollout/{a}/{k}" for a in agents for k in ("reward_mean", "valid_ratio")]
    required += ["rollout/success_rate", "rollout/turns_mean", "val/avg@2", "val/pass@2"]
    for tag in required:
        assert tag in s, f"missing TensorBoard tag {tag}"
        assert all(math.isfinite(v) for v in s[tag].values()), (tag, s[tag])
    assert sorted(s["rollout/success_rate"]) == list(range(1, iterations + 1))  # x-axis = RL iteration
    assert sorted(s["val/avg@2"]) == [0, iterations]  # before training and at the end
    # each question's result, beside the events: its averages are the logged ones
    records = read_validations(d)
    assert sorted(records) == [0, iterations]
    for step, record in records.items():
        assert record["k"] == 2
        scores = [t["correct"] / 2 for t in record["tasks"]]
        assert sum(scores) / len(scores) == pytest.approx(s["val/avg@2"][step])
        for source in {t["source"] for t in record["tasks"]} - {None}:
            mine = [t["correct"] / 2 for t in record["tasks"] if t["source"] == source]
            assert sum(mine) / len(mine) == pytest.approx(s[f"val/{source}/avg@2"][step])
    assert {f"completions/{a}/text_summary" for a in agents} <= set(s["_text"])
    assert os.path.getsize(os.path.join(d, "grad_norms.png")) > 0
    # what a user sees first in TensorBoard: no hp_metric placeholder, the grad-norm picture
    # under Images, a per-agent layout under Custom Scalars
    assert "hp_metric" not in s and "grad_norms" in s["_images"]
    assert "custom_scalars__config__" in s["_text"]

    saved = AutoModelForCausalLM.from_pretrained(os.path.join(d, "hf", f"iter_{iterations}", policy))
    start = AutoModelForCausalLM.from_pretrained(resolve_model_path("tiny-random"))
    moved = [n for (n, a), (_, b) in zip(saved.state_dict().items(), start.state_dict().items())
             if not torch.equal(a, b)]
    assert moved, "no weight changed"
    return s


def engine_processes(proc: subprocess.CompletedProcess) -> dict[tuple[int, str], tuple[str, int, int]]:
    """The start-up line of every vLLM engine: ``(rank, policy) -> (device, process, trainer)``."""
    import re

    found = {}
    line = r"^\[rank (\d+)\] vLLM engine of policy (\S+): (\S+), process (\d+) \(trainer (\d+)\)"
    for m in re.finditer(line, proc.stdout, re.M):
        found[int(m[1]), m[2]] = (m[3], int(m[4]), int(m[5]))
    return found


def assert_engines_in_processes_of_their_own(proc: subprocess.CompletedProcess, expected: set) -> None:
    """Each expected ``(rank, policy)`` engine was built once, in a process neither the trainer's nor
    another engine's, on the CPU."""
    found = engine_processes(proc)
    assert set(found) == expected, found
    pids = [pid for _, pid, _ in found.values()]
    trainers = {trainer for _, _, trainer in found.values()}
    assert len(set(pids)) == len(pids) and not trainers & set(pids)
    assert {device for device, _, _ in found.values()} == {"cpu"}


def assert_engine_logprobs_match(s: dict, policies, iterations) -> None:
    """After each sync the trainer's log-probs of the tokens the engine drew equal the engine's
    (fp32 on both sides; stale or wrongly loaded weights would be far off)."""
    for p in policies:
        for it in iterations:
            gap = s[f"train/{p}/engine_logprob_gap_max"]
            assert gap[it] <= 1e-3, (p, it, gap)
