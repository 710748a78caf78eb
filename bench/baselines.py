"""The baselines matrix: train and evaluate the rows the papers compare, on the same data,
budget and seeds, and write ``baselines.md`` (mean and spread over seeds) and PNG curves.

    python bench/baselines.py --recipe math                       # embedded model, CPU budget
    python bench/baselines.py --recipe search --config configs/qwen3_8b.yaml --seeds 0 1 2
    python bench/baselines.py --recipe math --rows prompt_only drmas --seeds 0 --iterations 1

Rows (each with the recipe's config; ``*_per_agent``: one policy per agent):

- ``single``: one agent does the whole task (math: the solver alone, ``max_turns 1``; a recipe
  without a single-agent form skips it);
- ``prompt_only``: the multi-agent team, untrained (``validate`` on the initial policies);
- ``grpo``: the team with one baseline per task across agents (``grpo_step``);
- ``drmas``: agent-wise normalisation (Dr. MAS);
- ``at_grpo``: tree sampling with agent- and turn-wise groups (AT-GRPO).

Each training row runs ``recipes/<recipe>.py fit`` once per seed (``--seed_everything``,
``--data.rollout.seed``), validating every ``--val_every`` iterations and at the end;
the table reports the final ``val/avg@k`` and the last rollout success rate, mean and standard
deviation over the seeds, and the curves plot their means per iteration. The team rows start
from the same weights on the same val tasks, so their iteration-0 point is the ``prompt_only``
evaluation of that seed (run once, not once per row).

The scale: with ``--config`` the config decides it (iterations: its ``trainer.max_epochs``
unless ``--iterations``); without, the embedded model's CPU default config runs with the
budget of :data:`CPU_BUDGET` (two seeds, about an hour on two cores).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)

from drmas.checkout import recipe_script  # noqa: E402

SINGLE = {"math": ["--data.workflow.init_args.max_turns", "1"]}
TRAINED = {
    "grpo": ["--data.rollout.estimator", "grpo_step"],
    "drmas": ["--data.rollout.estimator", "drmas"],
    "at_grpo": ["--data.rollout.sampling", "tree", "--data.rollout.estimator", "at_grpo"],
}
CPU_BUDGET = {"iterations": 2, "flags": ["--data.rollout.tasks_per_iteration", "2",
                                         "--data.validation.tasks", "16"]}
"""The matrix on the embedded default config: 2 tasks x 4 trajectories per iteration, 16 val tasks
per source (the recipes' own defaults are sized for one run, not for a matrix of them)."""
AGENTS = {"math": ("solver", "verifier"), "search": ("verifier", "searcher", "answerer"),
          "games": ("tool_user", "planner"), "code": ("coder", "tester")}


def rows(recipe: str, model: str) -> dict[str, list[str] | None]:
    """Row name -> extra flags (None: evaluate the untrained team)."""
    out: dict[str, list[str] | None] = {}
    if recipe in SINGLE:
        out["single"] = SINGLE[recipe] + ["--data.rollout.estimator", "grpo"]
    out["prompt_only"] = None
    per_agent = ["--model.policies",
                 "{" + ", ".join(f"{a}: {{model: {model}}}" for a in AGENTS[recipe]) + "}"]
    for name, flags in TRAINED.items():
        out[name] = flags
        out[f"{name}_per_agent"] = flags + per_agent
    return out


def run_logs(out: str, name: str, seed: int) -> str:
    return os.path.join(out, "runs", f"{name}-seed{seed}")


def cache_file(out: str, name: str, seed: int) -> str:
    return os.path.join(run_logs(out, name, seed), "scalars.json")


class RowFailed(Exception):
    """A run ended with an error; the message holds the end of its stderr."""


def run_row(recipe: str, base: list[str], name: str, flags: list[str] | None, seed: int,
            iterations: int | None, val_every: int, out: str,
            known_before: bool = False) -> dict[str, list[tuple[int, float]]]:
    """One run's curves; ``known_before``: its iteration-0 evaluation is prompt_only's, not run
    again. A finished run's curves are kept in ``scalars.json`` beside its logs and read back,
    not run again, when the matrix is run again with the same ``--out``."""
    from drmas.plots import read_scalars

    logs = run_logs(out, name, seed)
    cached = cache_file(out, name, seed)
    if os.path.exists(cached):
        with open(cached) as f:
            return {tag: [tuple(p) for p in points] for tag, points in json.load(f).items()}
    seeds = ["--seed_everything", str(seed), "--data.rollout.seed", str(seed)]
    if flags is None:
        cmd = [sys.executable, recipe_script(recipe), "validate", *base, *seeds,
               "--trainer.logger.init_args.save_dir", logs]
    else:
        budget = [] if iterations is None else ["--trainer.max_epochs", str(iterations)]
        before = ["--data.validation.before_training", "false"] if known_before else []
        cmd = [sys.executable, recipe_script(recipe), "fit", *base, *flags, *seeds,
               *budget, *before, "--data.validation.every", str(val_every),
               "--checkpoint.every_n_iterations", "0", "--trainer.logger.init_args.save_dir", logs]
    proc = subprocess.run(cmd, cwd=out, capture_output=True, text=True)
    if proc.returncode != 0:
        raise RowFailed(proc.stderr[-4000:])
    run_dir = os.path.join(logs, recipe, "version_0")
    if flags is None:  # the untrained team: one evaluation, at iteration 0
        scalars = json.loads(open(os.path.join(run_dir, "eval_val.json")).read())["scalars"]
        curves = {tag: [(0, v)] for tag, v in scalars.items()}
    else:
        curves = read_scalars(run_dir)
    with open(cached, "w") as f:
        json.dump(curves, f)
    return curves


def complete(results: dict[str, dict[int, dict]]) -> None:
    """Give each team row its seed's ``prompt_only`` numbers at iteration 0, and draw
    ``prompt_only`` flat to the last iteration of the others."""
    before = results.get("prompt_only", {})
    last = max((s for name, runs in results.items() if name != "prompt_only"
                for r in runs.values() for points in r.values() for s, _ in points), default=0)
    for name, runs in results.items():
        for seed, r in runs.items():
            if name == "prompt_only":
                for tag, points in r.items():
                    points.append((last, points[0][1]))
            elif name != "single" and seed in before:  # same weights, same val tasks
                for tag, points in before[seed].items():
                    if tag in r and tag.startswith("val/") and r[tag][0][0] > 0:
                        r[tag].insert(0, points[0])


def summarise(results: dict[str, dict[int, dict]], k: int,
              missing: dict[str, str] | None = None) -> tuple[str, dict[str, dict[str, list]]]:
    """The markdown table and, per row, the mean curves of val avg@k and the success rate;
    ``missing``: rows without a finished run, and why (a line of the table each)."""
    val_tag = f"val/avg@{k}"
    lines = [f"| row | val avg@{k} (final) | rollout success (last) | seeds |", "|---|---|---|---|"]
    curves: dict[str, dict[str, list]] = {}
    for name, by_seed in results.items():
        runs = list(by_seed.values())
        finals = [r[val_tag][-1][1] for r in runs if val_tag in r]
        success = [r["rollout/success_rate"][-1][1] for r in runs if "rollout/success_rate" in r]
        spread = lambda xs: f"{statistics.mean(xs):.3f} ± {statistics.pstdev(xs):.3f}" if xs else "-"  # noqa: E731
        lines.append(f"| {name} | {spread(finals)} | {spread(success)} | {len(runs)} |")
        curves[name] = {tag: _mean_curve([r[tag] for r in runs if tag in r])
                        for tag in (val_tag, "rollout/success_rate")}
    for name, why in (missing or {}).items():
        lines.append(f"| {name} | {why} | | 0 |")
    return "\n".join(lines), curves


def _mean_curve(series: list[list[tuple[int, float]]]) -> list[tuple[int, float]]:
    steps = sorted({s for points in series for s, _ in points})
    out = []
    for step in steps:
        values = [v for points in series for s, v in points if s == step]
        out.append((step, statistics.mean(values)))
    return out


def plot(curves: dict[str, dict[str, list]], tag: str, path: str, title: str) -> None:
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure
    from matplotlib.ticker import MaxNLocator

    fig = Figure(figsize=(8, 4.5), dpi=100)
    FigureCanvasAgg(fig)
    ax = fig.add_subplot(1, 1, 1)
    for n, (name, row) in enumerate(curves.items()):
        if row.get(tag):
            xs, ys = zip(*row[tag])
            ax.plot(xs, ys, marker="o", color=f"C{n % 10}",
                    linestyle="--" if name == "prompt_only" else "-", label=name)
    ax.xaxis.set_major_locator(MaxNLocator(integer=True))
    ax.set_xlabel("RL iteration")
    ax.set_ylabel(tag)
    ax.set_title(title)
    ax.grid(True, alpha=0.3)
    ax.legend(loc="best", fontsize="small")
    fig.tight_layout()
    fig.savefig(path)


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--recipe", default="math", choices=sorted(AGENTS))
    p.add_argument("--config", default=None, help="config file (default: the recipe's own default)")
    p.add_argument("--rows", nargs="+", default=None, help="a subset of the rows (default: all)")
    p.add_argument("--seeds", nargs="+", type=int, default=[0, 1])
    p.add_argument("--iterations", type=int, default=None,
                   help="iterations per run (default: the config's max_epochs; "
                        f"{CPU_BUDGET['iterations']} without --config)")
    p.add_argument("--val_every", type=int, default=0,
                   help="validate every this many iterations (0: at the end only)")
    p.add_argument("--model", default="embedded:smollm2-135m-instruct",
                   help="model of the per-agent rows' policies")
    p.add_argument("--val_k", type=int, default=2)
    p.add_argument("--out", default="baselines")
    p.add_argument("extra", nargs=argparse.REMAINDER, help="after --: flags passed to every run")
    args = p.parse_args(argv)
    out = os.path.abspath(args.out)
    os.makedirs(out, exist_ok=True)
    base = ((["--config", os.path.abspath(args.config)] if args.config else [])
            + ["--data.validation.k", str(args.val_k)])
    iterations = args.iterations
    if args.config is None:  # the embedded CPU default: a budget for the whole matrix, not one run
        base += CPU_BUDGET["flags"]
        iterations = iterations or CPU_BUDGET["iterations"]
    base += [a for a in args.extra if a != "--"]
    table_rows = rows(args.recipe, args.model)
    unknown = set(args.rows or ()) - set(table_rows)
    if unknown:
        raise SystemExit(f"unknown rows {sorted(unknown)}; rows of {args.recipe}: {', '.join(table_rows)}")
    chosen = {n: f for n, f in table_rows.items() if args.rows is None or n in args.rows}
    results: dict[str, dict[int, dict]] = {}
    missing: dict[str, str] = {}  # rows that do not apply, or failed
    total = len(chosen) * len(args.seeds)
    start = time.perf_counter()
    reused = 0  # runs finished by an earlier call with this --out
    plan = [(name, flags, seed) for name, flags in chosen.items() for seed in args.seeds]
    for n, (name, flags, seed) in enumerate(plan):
        if name in missing:
            continue
        reused += os.path.exists(cache_file(out, name, seed))
        print(f"[{n + 1}/{total}] {name}, seed {seed} "
              f"({(time.perf_counter() - start) / 60:.1f} min so far)", flush=True)
        try:
            results.setdefault(name, {})[seed] = run_row(
                args.recipe, base, name, flags, seed, iterations, args.val_every, out,
                known_before=name != "single" and "prompt_only" in chosen)
        except RowFailed as err:
            lines = [line for line in str(err).strip().splitlines() if line.strip()]
            if "does not support sampling=" in str(err):  # e.g. a workflow without tree sampling
                missing[name] = "n/a: " + lines[-1].split(": ", 1)[-1]
            else:
                missing[name] = f"failed (seed {seed}): " + (lines[-1] if lines else "no message")
                print(str(err), file=sys.stderr)
            print(f"    {missing[name]}", flush=True)
    results = {name: runs for name, runs in results.items() if name not in missing}
    complete(results)
    table, curves = summarise(results, args.val_k, missing)
    budget = f"{iterations} iterations" if iterations else "the config's iterations"
    header = (f"# Baselines: {args.recipe}\n\n{budget}, seeds {args.seeds}, "
              f"validated {f'every {args.val_every} iterations and ' if args.val_every else ''}at the end, "
              f"config {args.config or 'the recipe default'}, "
              f"flags {' '.join(base)}\n\n")
    with open(os.path.join(out, "baselines.md"), "w") as f:
        f.write(header + table + "\n")
    plot(curves, f"val/avg@{args.val_k}", os.path.join(out, "val.png"),
         f"{args.recipe}: val avg@{args.val_k}")
    plot(curves, "rollout/success_rate", os.path.join(out, "success.png"),
         f"{args.recipe}: rollout success rate")
    print(table)
    if any(why.startswith("failed") for why in missing.values()):
        raise SystemExit("rows failed: "
                         + ", ".join(n for n, why in missing.items() if why.startswith("failed")))
    finished = sum(len(runs) for runs in results.values())
    print(f"\n{finished} runs ({reused} read back from an earlier call) in "
          f"{(time.perf_counter() - start) / 60:.1f} min; written: {os.path.join(out, 'baselines.md')}, "
          "val.png, success.png")


if __name__ == "__main__":
    main()
