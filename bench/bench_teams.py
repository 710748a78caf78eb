"""Memory and iteration time of the search recipe's three agents as (a) one shared policy,
(b) three full copies, (c) three LoRA adapters on one shared base; ratios against (a).

Each setting runs ``recipes/search.py fit`` in its own process with the embedded model
(SmolLM2-135M), the HF engine (LoRA generates with it) and no validation, for ``--iterations``
iterations; reported: the process's peak resident memory (``ru_maxrss``), the parameters held,
and the last iteration's rollout and update seconds (the first carries warm-up).

    python bench/bench_teams.py [--iterations 2] [--rank 16]
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import tempfile

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)

AGENTS = ("verifier", "searcher", "answerer")
MODEL = "embedded:smollm2-135m-instruct"

_CHILD = """
import resource, runpy, sys
sys.argv = sys.argv[1:]
try:
    runpy.run_path(sys.argv[0], run_name="__main__")
finally:
    print(f"PEAK_RSS_KIB {resource.getrusage(resource.RUSAGE_SELF).ru_maxrss}", file=sys.stderr)
"""


def settings(rank: int) -> dict[str, list[str]]:
    lora = f"model: {MODEL}, optim: {{lr: 1.0e-5}}, lora: {{rank: {rank}, share_base: true}}"
    full = f"model: {MODEL}, optim: {{lr: 1.0e-6}}"
    return {
        "shared": [],
        "copies": ["--model.policies", "{" + ", ".join(f"{a}: {{{full}}}" for a in AGENTS) + "}"],
        "lora": ["--model.policies", "{" + ", ".join(f"{a}: {{{lora}}}" for a in AGENTS) + "}"],
    }


def run(name: str, args: list[str], iterations: int, out: str) -> dict[str, float]:
    from drmas.plots import read_scalars

    cmd = [sys.executable, "-c", _CHILD, os.path.join(ROOT, "recipes", "search.py"), "fit",
           "--model.engine", "hf", "--trainer.max_epochs", str(iterations), "--data.validation.tasks", "0",
           "--checkpoint.every_n_iterations", "0", "--hf_checkpoint.dirpath", os.path.join(out, "hf"),
           "--trainer.logger.init_args.save_dir", out, *args]
    proc = subprocess.run(cmd, cwd=out, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    if proc.returncode != 0:
        raise SystemExit(f"{name} failed:\n{proc.stderr[-3000:]}")
    peak = next(int(line.split()[1]) for line in proc.stderr.splitlines() if line.startswith("PEAK_RSS_KIB"))
    s = read_scalars(os.path.join(out, "search", "version_0"))
    last = {tag: points[-1][1] for tag, points in s.items()}
    trained = [p for p in ("shared", *AGENTS) if f"train/{p}/samples" in last]
    return {"peak_gib": peak / 2**20, "rollout_s": last["time/rollout_s"], "update_s": last["time/update_s"],
            "policies": len(trained)}


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--iterations", type=int, default=2)
    p.add_argument("--rank", type=int, default=16, help="LoRA rank")
    args = p.parse_args()
    rows = {}
    for name, extra in settings(args.rank).items():
        with tempfile.TemporaryDirectory(prefix=f"bench-teams-{name}-") as out:
            rows[name] = run(name, extra, args.iterations, out)
        print(f"{name}: {rows[name]}", flush=True)
    base = rows["shared"]
    print(f"\nsearch recipe, 3 agents, {args.iterations} iterations, HF engine, {MODEL} "
          f"(peak RSS of the whole process; last iteration's times)")
    print(f"{'setting':10s} {'policies':>8s} {'peak GiB':>9s} {'x shared':>9s} "
          f"{'rollout s':>10s} {'update s':>9s} {'x shared':>9s}")
    for name, r in rows.items():
        print(f"{name:10s} {r['policies']:8d} {r['peak_gib']:9.2f} {r['peak_gib'] / base['peak_gib']:9.2f} "
              f"{r['rollout_s']:10.1f} {r['update_s']:9.1f} {r['update_s'] / base['update_s']:9.2f}")


if __name__ == "__main__":
    main()
