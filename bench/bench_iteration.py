"""Where an iteration of the search main job goes: rollout, weight sync and update, in parallel and
tree mode, with the tokens the update ran and the share of this machine's matmul peak it reached.

Runs ``recipes/search.py fit`` with the main job's config (SmolLM2-135M, vLLM rollouts, the
precision the hardware suggests: bf16-mixed where bf16 is native, else fp32) for
``--iterations`` iterations per mode (no validation) and reports the last iteration's split (the
first carries warm-up). The peak is measured here first: square matmuls of ``--matmul`` rows
in fp32, and in bf16 where the update trains in it; the update is compared with the peak of the
dtype it trained in. The update's achieved FLOP rate counts 6 x parameters x tokens (forward and
backward; recomputation under gradient checkpointing is not counted).

    python bench/bench_iteration.py [--iterations 2] [--modes parallel tree] [--matmul 2048]
    python bench/bench_iteration.py --device cuda --model /path/to/hf_folder   # on one GPU, HF engine
        [--peak-tflops 989 --peak-name "H100/H200 SXM bf16 dense"]   # also against a named peak

Each mode ends with one line ``update <mode>: ... tokens/s ...``, which the device check collects.
"""

from __future__ import annotations

import argparse
import glob
import os
import subprocess
import sys
import tempfile
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)


def matmul_peak(n: int, dtype, device: str = "cpu") -> float:
    """FLOP/s of an n x n matmul in ``dtype`` on ``device`` (best of 5 after a warm-up; on a GPU
    each timing spans 10 matmuls between synchronisations)."""
    import torch

    a, b = (torch.randn(n, n, dtype=dtype, device=device) for _ in range(2))
    reps = 10 if device == "cuda" else 1
    sync = torch.cuda.synchronize if device == "cuda" else (lambda: None)
    a @ b
    best = float("inf")
    for _ in range(5):
        sync()
        t0 = time.perf_counter()
        for _ in range(reps):
            a @ b
        sync()
        best = min(best, (time.perf_counter() - t0) / reps)
    return 2 * n**3 / best


def one_mode(mode: str, iterations: int, out: str, model: str, device: str) -> dict[str, float]:
    extra = ["--data.rollout.sampling", "tree", "--data.rollout.estimator",
             "at_grpo"] if mode == "tree" else []
    extra += ["--model.policies.shared.model", model]
    if device == "cuda":  # vLLM is not assumed there: HF generate
        extra += ["--trainer.accelerator", "gpu", "--trainer.devices", "1", "--model.engine", "hf"]
    cmd = [sys.executable, os.path.join(ROOT, "recipes", "search.py"), "fit",
           "--trainer.max_epochs", str(iterations), "--data.validation.tasks", "0",
           "--checkpoint.every_n_iterations", "0", "--hf_checkpoint.dirpath", os.path.join(out, "hf"),
           "--trainer.logger.init_args.save_dir", out, *extra]
    subprocess.run(cmd, check=True, cwd=out, stdout=subprocess.DEVNULL)
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    ea = EventAccumulator(glob.glob(os.path.join(out, "search", "version_*", "events.*"))[0],
                          size_guidance={"scalars": 0})
    ea.Reload()
    last = lambda tag: ea.Scalars(tag)[-1].value  # noqa: E731
    return {k: last(f"time/{k}_s") for k in ("rollout", "sync", "update")} | {
        "samples": last("train/shared/samples"), "tokens": last("train/shared/tokens")}


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--iterations", type=int, default=2)
    p.add_argument("--modes", nargs="+", default=["parallel", "tree"], choices=("parallel", "tree"))
    p.add_argument("--matmul", type=int, default=None,
                   help="rows of the square peak matmul (2048; 8192 on a GPU)")
    p.add_argument("--device", choices=("cpu", "cuda"), default="cpu",
                   help="where the recipe trains; cuda: one GPU, HF engine, bf16 where native")
    p.add_argument("--model", default="embedded:smollm2-135m-instruct",
                   help="the shared policy: a name or an HF folder")
    p.add_argument("--peak-tflops", type=float, default=None,
                   help="also report the update against this peak (e.g. 989: H100/H200 SXM bf16 dense)")
    p.add_argument("--peak-name", default="the given peak", help="what --peak-tflops is")
    args = p.parse_args()
    import torch

    from drmas.hardware import bf16_is_native
    from drmas.models import load_causal_lm

    n = args.matmul or (8192 if args.device == "cuda" else 2048)
    parameters = sum(p.numel() for p in load_causal_lm(args.model)[0].parameters())
    trained = "bf16" if bf16_is_native(args.device) else "fp32"  # what an unset --trainer.precision picks
    # an emulated bf16 matmul of 2048 rows takes about a minute: measured only where it is used
    dtypes = {"fp32": torch.float32, **({"bf16": torch.bfloat16} if trained == "bf16" else {})}
    peak = {name: matmul_peak(n, dtype, args.device) for name, dtype in dtypes.items()}
    print(f"{parameters / 1e6:.0f}M parameters on {args.device}; matmul peak ({n}^2): "
          + ", ".join(f"{k} {v / 1e9:.1f} GFLOP/s" for k, v in peak.items())
          + f"; the update trains in {trained}")
    print(f"{'mode':9s} {'rollout s':>9s} {'sync s':>7s} {'update s':>8s} {'update %':>8s} {'samples':>7s} "
          f"{'tokens':>7s} {'GFLOP/s':>8s} {'of ' + trained + ' peak':>12s}")
    for mode in args.modes:
        with tempfile.TemporaryDirectory() as tmp:
            r = one_mode(mode, args.iterations, tmp, args.model, args.device)
        total = r["rollout"] + r["sync"] + r["update"]
        rate = 6 * parameters * r["tokens"] / r["update"]
        print(f"{mode:9s} {r['rollout']:9.1f} {r['sync']:7.1f} {r['update']:8.1f} "
              f"{100 * r['update'] / total:7.0f}% {r['samples']:7.0f} {r['tokens']:7.0f} "
              f"{rate / 1e9:8.1f} {rate / peak[trained]:11.0%}")
        named = (f", {rate / (args.peak_tflops * 1e12):.1%} of {args.peak_name} "
                 f"({args.peak_tflops:g} TFLOP/s)" if args.peak_tflops else "")
        print(f"update {mode}: {parameters / 1e6:.0f}M parameters, {r['tokens'] / r['update']:.0f} tokens/s, "
              f"{rate / 1e12:.2f} TFLOP/s, {rate / peak[trained]:.1%} of the measured {trained} matmul peak"
              f"{named}", flush=True)


if __name__ == "__main__":
    main()
