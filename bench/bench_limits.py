"""How close W1's phases run to what this machine can do, measured in one run.

W1's drmas run (``bench/bench_w1.py``'s: SmolLM2-135M, 4 problems x 4 samples, <= 64 new tokens,
``grpo``) is played for ``--steps`` iterations; then, in this process, on the same cores:

- **update**: the model FLOP/s of the update, 6 x parameters x tokens through the decoder (forward
  and backward; ``train/shared/tokens``, a shared prompt once) over ``time/update_s``, against the
  rate of a 2048 x 2048 x 2048 matmul loop in the run's compute dtype (bf16 under ``bf16-mixed``,
  else fp32);
- **sync**: the bytes of one weight transfer (every parameter in the engine's dtype) over
  ``time/sync_s``, against a plain copy of as many bytes into a shared-memory file.

The rollout's limit (bare vLLM ``generate`` on the run's recorded prompts) is not measured yet.
Each ratio is the median over steps 2 on (the first carries warm-up). No figure is asserted
anywhere; the printout names the machine.

    python bench/bench_limits.py [--steps 4] [--engine auto|hf|vllm] [--precision auto|bf16-mixed|32]
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import tempfile
import time

import torch

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path[:0] = [ROOT, os.path.dirname(os.path.abspath(__file__))]

from bench_w1 import MODEL, drmas_run, resolved_precision, write_problems  # noqa: E402


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


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--steps", type=int, default=4)
    p.add_argument("--engine", default="auto", choices=("auto", "hf", "vllm"))
    p.add_argument("--precision", default="auto", choices=("auto", "bf16-mixed", "32"))
    args = p.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        data = os.path.join(tmp, "w1.jsonl")
        write_problems(data)
        s, kernels = drmas_run(args, data, tmp)
    from drmas.hardware import machine
    from drmas.models.shapes import config_shape

    precision = resolved_precision(args.precision)
    dtype = torch.bfloat16 if precision.startswith("bf16") else torch.float32
    parameters = config_shape(MODEL).parameters
    later = lambda tag: [v for it, v in sorted(s[tag].items())][1:] or list(s[tag].values())  # noqa: E731
    update_s, sync_s = statistics.median(later("time/update_s")), statistics.median(later("time/sync_s"))
    tokens = statistics.median(later("train/shared/tokens"))
    achieved = 6 * parameters * tokens / update_s
    peak = matmul_rate(dtype)
    transfer = parameters * torch.empty((), dtype=dtype).element_size()
    copy = shared_copy_rate(transfer)
    print(f"machine: {machine()}")
    print(f"W1 (drmas, {args.steps} steps, engine {args.engine}, vLLM kernels: {kernels}, precision "
          f"{precision}), {parameters / 1e6:.1f}M parameters, {torch.get_num_threads()} threads here")
    print(f"update: {tokens:.0f} tokens through the decoder in {update_s:.2f} s = "
          f"{achieved / 1e9:.1f} GFLOP/s (6 x parameters x tokens) against a "
          f"{str(dtype).removeprefix('torch.')} 2048^3 matmul's "
          f"{peak / 1e9:.1f} GFLOP/s: {achieved / peak:.0%}")
    print(f"sync: {transfer / 1e6:.0f} MB in {sync_s:.2f} s = {transfer / sync_s / 1e9:.2f} GB/s against a "
          f"shared-memory copy's {copy / 1e9:.2f} GB/s: {transfer / sync_s / copy:.0%}")
    print("rollout: not measured yet (bare vLLM generate on the run's recorded prompts)")


if __name__ == "__main__":
    main()
