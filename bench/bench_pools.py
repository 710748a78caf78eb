"""Per-policy pools against the shared layout, on a two-policy team over 2 ranks.

Runs ``recipes/math_team.py fit`` on 2 ranks (``--trainer.strategy fsdp``, gloo on CPU) with the
solver and the verifier as two policies of the embedded SmolLM2-135M (vLLM rollouts), twice, one after
the other, with the same seed: the shared layout (each policy sharded over both ranks, each rank
holding an engine of each, the policies updating one after the other) and pools (the solver on rank
0, the verifier on rank 1, each rank holding one policy and one engine, the verifier's calls from
rank 0 answered by rank 1's engine and the other way round, both updates at once). Per layout it
reports the median over iterations 2..N of the iteration's wall time (between the iterations' last
scalars, as TensorBoard stamped them) and of the rollout, sync and update times, then pools /
shared for each.

Its last lines say what the measured phases imply for a GPU node, labelled as an estimate.

    python bench/bench_pools.py [--iterations 3]
"""

from __future__ import annotations

import argparse
import glob
import os
import statistics
import subprocess
import sys
import tempfile
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
PHASES = ("rollout", "sync", "update")
POLICY = "{{model: embedded:smollm2-135m-instruct, update: {{micro_batch_size: 2}}{ranks}}}"


def policies(pooled: bool) -> str:
    ranks = {"solver": ", ranks: [0]", "verifier": ", ranks: [1]"}
    return "{" + ", ".join(f"{n}: {POLICY.format(ranks=r if pooled else '')}" for n, r in ranks.items()) + "}"


def run(pooled: bool, iterations: int, out: str) -> dict[str, object]:
    cmd = [sys.executable, os.path.join(ROOT, "recipes", "math_team.py"), "fit",
           "--trainer.devices", "2", "--trainer.strategy", "fsdp", "--model.engine", "vllm",
           "--model.policies", policies(pooled), "--trainer.max_epochs", str(iterations),
           "--data.rollout.tasks_per_iteration", "4", "--data.rollout.group_size", "4",
           # the shared layout holds two policies and two engines per rank: on 24 GiB and 2 ranks it
           # ran out of memory at 8 tasks, 1 GiB of KV cache per engine and micro-batches of 4
           "--model.engine_settings", "{kv_cache_gib: 0.5}",
           "--data.validation.tasks", "0", "--checkpoint.every_n_iterations", "0",
           "--hf_checkpoint.dirpath", os.path.join(out, "hf"), "--trainer.logger.init_args.save_dir", out]
    start = time.perf_counter()
    proc = subprocess.run(cmd, cwd=out, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    if proc.returncode != 0:
        sys.exit(f"the {'pooled' if pooled else 'shared'} run failed:\n{proc.stderr[-3000:]}")
    wall = time.perf_counter() - start
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    ea = EventAccumulator(glob.glob(os.path.join(out, "math", "version_*", "events.*"))[0],
                          size_guidance={"scalars": 0})
    ea.Reload()
    series = {k: {e.step: e.value for e in ea.Scalars(f"time/{k}_s")} for k in PHASES}
    ends = {e.step: e.wall_time for e in ea.Scalars("train/solver/lr")}  # an iteration's last scalars
    steps = sorted(ends)[1:]
    series["iteration"] = {k: ends[k] - ends[k - 1] for k in steps}
    answered = [line for line in proc.stdout.splitlines() if " answered " in line]
    return {"medians": {k: statistics.median(v[k] for k in steps) for k, v in series.items()},
            "wall": wall, "answered": answered}


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--iterations", type=int, default=3)
    args = p.parse_args()
    if args.iterations < 2:
        p.error("--iterations must be >= 2 (the first iteration's times include the engines' build)")
    sys.path.insert(0, ROOT)
    from drmas.hardware import machine

    print(machine(), flush=True)
    results = {}
    for pooled in (False, True):
        name = "pools" if pooled else "shared"
        with tempfile.TemporaryDirectory() as tmp:
            print(f"{name}: {args.iterations} iterations on 2 ranks ...", flush=True)
            started = time.perf_counter()
            results[name] = r = run(pooled, args.iterations, tmp)
            print(f"  done in {(time.perf_counter() - started) / 60:.1f} min", flush=True)
            for line in r["answered"]:
                print(f"  {line}")
    keys = ("iteration", *PHASES)
    print(f"\nmedians over iterations 2..{args.iterations} (s)")
    print(f"{'layout':>8s} " + " ".join(f"{k:>10s}" for k in keys))
    for name, r in results.items():
        print(f"{name:>8s} " + " ".join(f"{r['medians'][k]:10.2f}" for k in keys))
    shared, pools = results["shared"]["medians"], results["pools"]["medians"]
    print(f"{'pools/shared':>8s} " + " ".join(f"{pools[k] / shared[k]:10.2f}" for k in keys))
    print(f"\nestimate for a GPU node (from these phases, not measured on GPUs): a compute-bound update "
          f"takes about as long on two pools of half the devices at once as the shared layout's one policy "
          f"after the other on all of them ({pools['update'] / shared['update']:.2f}x here); what pools save "
          f"there is memory (one model and one engine per device, not two) and one engine's sleep and wake "
          f"per device. The rollout ({pools['rollout'] / shared['rollout']:.2f}x here) depends on how busy "
          f"each pool's engines are with the other pools' calls.")

if __name__ == "__main__":
    main()
