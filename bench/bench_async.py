"""Rollouts behind the update against the synchronous iteration, on the main job's shape.

Runs ``recipes/search.py fit`` with the main job's config (SmolLM2-135M, vLLM rollouts, the
precision the hardware suggests) twice, one after the other, with the same seed: synchronous
(``--data.rollout.staleness 0``: the rollout, then the update, each on every core) and one step
off (``staleness 1``: on CPU the engine process on half of the cores, the trainer on the other
half, the rollout of k+1 playing during update k). Per mode it reports the median over iterations
2..N of the iteration's wall time (between the iterations' last scalars, as TensorBoard stamped
them), the rollout, sync and update times and the waits (``time/trainer_wait_s``: the trainer
waiting for the rollout; ``time/engine_idle_s``: the engines done and waiting for the update), then
the ratio, and validation before and after (``val/avg@k``; one seed each: a sanity check that the
lag did not stop learning, not a comparison of learning).

Its last line estimates what the overlap would give where each phase has devices of its own (a GPU
node split between trainer and engines): ``(rollout + sync + update) / (max(rollout, update) +
sync)`` from the synchronous run's phases. It is an estimate from this machine's phase times, not a
measurement on a GPU.

    python bench/bench_async.py [--iterations 10] [--validation-tasks 16]
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
TAGS = ("rollout", "sync", "update", "trainer_wait", "engine_idle")


def run(staleness: int, iterations: int, tasks: int, out: str) -> dict[str, object]:
    cmd = [sys.executable, os.path.join(ROOT, "recipes", "search.py"), "fit",
           "--trainer.max_epochs", str(iterations), "--data.rollout.staleness", str(staleness),
           "--data.validation.tasks", str(tasks), "--checkpoint.every_n_iterations", "0",
           "--hf_checkpoint.dirpath", os.path.join(out, "hf"), "--trainer.logger.init_args.save_dir", out]
    start = time.perf_counter()
    subprocess.run(cmd, check=True, cwd=out, stdout=subprocess.DEVNULL)
    wall = time.perf_counter() - start
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    ea = EventAccumulator(glob.glob(os.path.join(out, "search", "version_*", "events.*"))[0],
                          size_guidance={"scalars": 0})
    ea.Reload()
    tags = set(ea.Tags()["scalars"])
    series = {k: {e.step: e.value for e in ea.Scalars(f"time/{k}_s")} for k in TAGS if f"time/{k}_s" in tags}
    ends = {e.step: e.wall_time for e in ea.Scalars("train/shared/lr")}  # an iteration's last scalars
    steps = sorted(ends)[1:]
    series["iteration"] = {k: ends[k] - ends[k - 1] for k in steps}
    avg = next((t for t in tags if t.startswith("val/avg@")), None)
    val = {e.step: e.value for e in ea.Scalars(avg)} if avg else {}
    return {"medians": {k: statistics.median(v[k] for k in steps if k in v) for k, v in series.items()},
            "val": val, "wall": wall, "success": [e.value for e in ea.Scalars("rollout/success_rate")]}


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--iterations", type=int, default=10)
    p.add_argument("--validation-tasks", type=int, default=16, help="0: no validation")
    args = p.parse_args()
    sys.path.insert(0, ROOT)
    from drmas.hardware import machine

    print(machine(), flush=True)
    results = {}
    for staleness in (0, 1):
        with tempfile.TemporaryDirectory() as tmp:
            print(f"staleness {staleness}: {args.iterations} iterations ...", flush=True)
            results[staleness] = r = run(staleness, args.iterations, args.validation_tasks, tmp)
            print(f"  done in {r['wall'] / 60:.1f} min", flush=True)
    print(f"\nmedians over iterations 2..{args.iterations} (s)")
    print(f"{'staleness':>9s} {'iteration':>9s} " + " ".join(f"{k:>12s}" for k in TAGS))
    for staleness, r in results.items():
        m = r["medians"]
        print(f"{staleness:9d} {m['iteration']:9.1f} " + " ".join(
            f"{m[k]:12.1f}" if k in m else f"{'-':>12s}" for k in TAGS))
    sync, lag = results[0]["medians"], results[1]["medians"]
    print(f"\none step off / synchronous, iteration time: {lag['iteration'] / sync['iteration']:.2f}x "
          f"({sync['iteration'] / lag['iteration']:.2f}x the throughput)")
    for staleness, r in results.items():
        val = r["val"]
        if val:
            first, last = min(val), max(val)
            print(f"staleness {staleness}: val avg@k {val[first]:.3f} (iteration {first}) -> {val[last]:.3f} "
                  f"(iteration {last}); rollout success {r['success'][0]:.2f} -> {r['success'][-1]:.2f}")
    serial = sync["rollout"] + sync["sync"] + sync["update"]
    ideal = serial / (max(sync["rollout"], sync["update"]) + sync["sync"])
    print(f"estimate, devices of their own (not measured): up to {ideal:.2f}x the synchronous throughput, "
          f"from this machine's synchronous phases (rollout {sync['rollout']:.1f} s, update "
          f"{sync['update']:.1f} s)")


if __name__ == "__main__":
    main()
