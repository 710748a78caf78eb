"""How close each phase of an iteration runs to what this machine can do, measured in one run.

One of two jobs is played for ``--steps`` iterations (``--job``): ``w1``, W1's drmas run
(``bench/bench_w1.py``'s: SmolLM2-135M, 4 problems x 4 samples, <= 64 new tokens, ``grpo``), or
``main``, the README's main job (``recipes/search.py fit`` on the embedded default: three agents,
three turns, BM25 retrieval) without its validations. Then, in this process, on the same cores:

- **update**: the model FLOP/s of the update, 6 x parameters x tokens through the decoder (forward
  and backward; ``train/shared/tokens``, a shared prompt once) over ``time/update_s``, against the
  rate of a 2048 x 2048 x 2048 matmul loop in the run's compute dtype (bf16 under ``bf16-mixed``,
  else fp32);
- **sync**: the bytes of one weight transfer (every parameter in the engine's dtype) over
  ``time/sync_s``, against a plain copy of as many bytes into a shared-memory file;
- **rollout**: the tokens the run generated over ``time/rollout_s``, against vLLM's own
  ``LLM.generate`` on the same prompts: the run's recorded prompts (``episodes/``) replayed in an
  engine process built with the run's engine settings, each made to generate exactly the tokens
  it generated in the run, with the run's sampling settings, one call per turn and agent (a turn's
  prompts depend on the turn before). The engine's own seconds, without drmas's socket or log-probs.

Each ratio is the median over iterations 2 on (the first carries warm-up). No figure is asserted
anywhere; the printout names the machine.

    python bench/bench_limits.py [--job w1|main] [--steps 4] [--engine auto|hf|vllm]
                                 [--precision auto|bf16-mixed|32]
"""

from __future__ import annotations

import argparse
import glob
import os
import statistics
import sys
import tempfile
import time

import torch

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path[:0] = [ROOT, os.path.dirname(os.path.abspath(__file__))]

from bench_w1 import MODEL, drmas_run, recipe_run, resolved_precision, write_problems  # noqa: E402


def matmul_rate(dtype: torch.dtype, n: int = 2048, seconds: float = 5.0) -> float:
    """FLOP/s of an ``n``-cube matmul loop in ``dtype`` on this process's threads (after one warm-up)."""
    a, b = torch.randn(n, n, dtype=dtype), torch.randn(n, n, dtype=dtype)
    a @ b
    done, start = 0, time.perf_counter()
    while time.perf_counter() - start < seconds:
        a @ b
        done += 1
    return 2 * n**3 * done / (time.perf_counter() - start)


def shared_copy_rate(size: int, repeats: int = 5) -> float:
    """Bytes/s of copying ``size`` bytes from a tensor into a shared-memory file (the median copy)."""
    src = torch.empty(size, dtype=torch.uint8).random_()
    with tempfile.NamedTemporaryFile(dir="/dev/shm" if os.path.isdir("/dev/shm") else None) as f:
        dst = torch.from_file(f.name, shared=True, size=size, dtype=torch.uint8)
        dst.copy_(src)  # its pages are touched once before timing
        times = []
        for _ in range(repeats):
            start = time.perf_counter()
            dst.copy_(src)
            times.append(time.perf_counter() - start)
    return size / statistics.median(times)


def run_job(args: argparse.Namespace, out: str) -> tuple[dict[str, dict[int, float]], str, str]:
    """The job's run into ``out``: its scalars, the vLLM kernel build it loaded, and its log folder."""
    if args.job == "w1":
        data = os.path.join(out, "w1.jsonl")
        write_problems(data)
        s, kernels = drmas_run(args, data, out)
    else:
        s, kernels = recipe_run("search", [
            "--trainer.max_epochs", str(args.steps), "--model.engine", args.engine,
            *([] if args.precision == "auto" else ["--trainer.precision", args.precision]),
            "--data.validation.tasks", "0"], out)
    return s, kernels, os.path.dirname(glob.glob(os.path.join(out, "*", "version_*", "config.yaml"))[0])


def rollout_limit(log_dir: str, iterations: list[int]) -> dict[int, tuple[float, int]]:
    """Per iteration, the seconds and tokens of vLLM's bare ``generate`` on the run's recorded prompts
    (see the module docstring), in a vLLM engine process of the run's engine settings; one policy."""
    import yaml
    from transformers import AutoTokenizer

    from drmas.data.episodes import episodes_path, read_records
    from drmas.engines.vllm import VLLMEngine, VLLMSettings
    from drmas.models import resolve_model_path
    from drmas.records import GenerationSettings

    with open(os.path.join(log_dir, "config.yaml")) as f:
        model_cfg = yaml.safe_load(f)["model"]
    (policy,) = model_cfg["policies"].values()
    path = resolve_model_path(policy["model"])
    sampling = GenerationSettings(**{k: v for k, v in policy["generation"]["train"].items()
                                     if k in ("temperature", "top_p", "top_k")})
    settings = {**model_cfg["engine_settings"], **(policy.get("engine_settings") or {})}
    tokenizer = AutoTokenizer.from_pretrained(path)
    engine = VLLMEngine(path, VLLMSettings(**settings))
    limits, differ = {}, 0
    try:
        for k in iterations:
            records = read_records(episodes_path(log_dir, "train", k))
            seconds, tokens = 0.0, 0
            for step in sorted({(r["turn"], r["agent"]) for r in records}):  # agents in name order
                mine = [r for r in records if (r["turn"], r["agent"]) == step]
                prompts = [tokenizer.encode(r["prompt"], add_special_tokens=False) for r in mine]
                differ += sum(len(p) != r["prompt_tokens"] for p, r in zip(prompts, mine))
                took, made = engine.timed_generate(prompts, [r["response_tokens"] for r in mine], sampling)
                seconds, tokens = seconds + took, tokens + made
            limits[k] = (seconds, tokens)
    finally:
        engine.close()
    if differ:
        print(f"rollout: {differ} recorded prompt(s) re-encoded to another length than the run's", flush=True)
    return limits


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--job", default="w1", choices=("w1", "main"))
    p.add_argument("--steps", type=int, default=4)
    p.add_argument("--engine", default="auto", choices=("auto", "hf", "vllm"))
    p.add_argument("--precision", default="auto", choices=("auto", "bf16-mixed", "32"))
    args = p.parse_args()
    from drmas.hardware import machine
    from drmas.models.shapes import config_shape

    with tempfile.TemporaryDirectory() as tmp:
        s, kernels, log_dir = run_job(args, tmp)
        later_its = sorted(s["time/update_s"])[1:] or sorted(s["time/update_s"])
        limits = rollout_limit(log_dir, later_its) if kernels.startswith("_C") else {}
    precision = resolved_precision(args.precision)
    dtype = torch.bfloat16 if precision.startswith("bf16") else torch.float32
    parameters = config_shape(MODEL).parameters
    later = lambda tag: [s[tag][k] for k in later_its]  # noqa: E731
    update_s, sync_s = statistics.median(later("time/update_s")), statistics.median(later("time/sync_s"))
    tokens = statistics.median(later("train/shared/tokens"))
    achieved = 6 * parameters * tokens / update_s
    peak = matmul_rate(dtype)
    transfer = parameters * torch.empty((), dtype=dtype).element_size()
    copy = shared_copy_rate(transfer)
    job = "W1 (SmolLM2-135M, 4 x 4 samples, <= 64 tokens)" if args.job == "w1" else \
        "the main job (recipes/search.py fit, no validation)"
    print(f"machine: {machine()}")
    print(f"{job}: drmas, {args.steps} iterations, engine {args.engine} (vLLM kernels: {kernels}), precision "
          f"{precision}, {parameters / 1e6:.1f}M parameters, {torch.get_num_threads()} threads here; "
          f"medians of iterations {later_its[0]}-{later_its[-1]}")
    print(f"update: {tokens:.0f} tokens through the decoder in {update_s:.2f} s = "
          f"{achieved / 1e9:.1f} GFLOP/s (6 x parameters x tokens) against a "
          f"{str(dtype).removeprefix('torch.')} 2048^3 matmul's "
          f"{peak / 1e9:.1f} GFLOP/s: {achieved / peak:.0%}")
    print(f"sync: {transfer / 1e6:.0f} MB in {sync_s:.2f} s = {transfer / sync_s / 1e9:.2f} GB/s against a "
          f"shared-memory copy's {copy / 1e9:.2f} GB/s: {transfer / sync_s / copy:.0%}")
    if not limits:
        print(f"rollout: no vLLM engine in this run (kernels: {kernels}), so no bare vLLM generate to set it "
              "against")
        return
    rollout_s = statistics.median(later("time/rollout_s"))
    bare_s = statistics.median(limits[k][0] for k in later_its)
    made = statistics.median(limits[k][1] for k in later_its)
    print(f"rollout: {made:.0f} tokens generated in {rollout_s:.2f} s = {made / rollout_s:.0f} tokens/s "
          f"against vLLM's bare generate of the same prompts and lengths in {bare_s:.2f} s = "
          f"{made / bare_s:.0f} tokens/s: {bare_s / rollout_s:.0%}")


if __name__ == "__main__":
    main()
