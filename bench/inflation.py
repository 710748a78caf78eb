"""Where can Dr. MAS's gradient-norm claim be tested at all? Its cause is an agent whose advantages one
baseline per task inflates: ``rollout/<agent>/baseline_inflation`` (docs/stability.md), at most
1/sqrt(p) for an agent with share p of its group's samples. This runs each candidate team for a few
iterations (no validation) and tabulates, per agent, its sample share, that bound, and the
inflation measured; resumable (``bench/study.py``).

    python bench/inflation.py        # every candidate, 3 iterations each (bench/results/inflation)

The candidates are drmas's domains as configured, and the debate with more rounds (its judge acts
once per episode beside debaters that act once per round: the smallest share among the domains).
The full study (``bench/stability.py``-style, 3 seeds) is worth running only where some agent's
inflation is at least 1.3 over most iterations. float32 is pinned.
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

from study import Run, Study, StudyStopped  # noqa: E402

from drmas.atomic import write_text  # noqa: E402

ROUNDS = "--data.workflow.init_args.max_turns"
CANDIDATES = {  # name: (recipe, flags)
    "search": ("search", []),
    "math": ("math", []),
    "games": ("games", []),
    "code": ("code", []),
    "debate-1-round": ("debate", []),
    "debate-3-rounds": ("debate", [ROUNDS, "3"]),
    "debate-3-rounds-not-zero-sum": ("debate", [ROUNDS, "3", "--data.workflow.init_args.zero_sum", "false"]),
}
STRONG = 1.3


def agent_rows(run_dir: str) -> list[tuple[str, float, list[float]]]:
    """Per agent: its share of the rollout's samples (mean over iterations) and its inflation per
    iteration (iterations where the pooled rewards of no task varied log none)."""
    from drmas.plots import read_scalars

    scalars = read_scalars(run_dir)
    counts = {tag.split("/")[1]: dict(points) for tag, points in scalars.items()
              if tag.startswith("rollout/") and tag.endswith("/samples") and tag.count("/") == 2}
    steps = sorted(set().union(*counts.values())) if counts else []
    rows = []
    for agent, per_step in sorted(counts.items()):
        shares = [per_step.get(s, 0.0) / sum(c.get(s, 0.0) for c in counts.values()) for s in steps]
        inflation = [v for _, v in scalars.get(f"rollout/{agent}/baseline_inflation", [])]
        rows.append((agent, statistics.mean(shares), inflation))
    return rows


def table(runs: list[Run]) -> str:
    lines = ["| team | agent | sample share p | bound 1/sqrt(p) | inflation per iteration | mean | "
             f"iterations >= {STRONG} |", "|---|---|---|---|---|---|---|"]
    for run in runs:
        for agent, share, inflation in agent_rows(run.run_dir):
            shown = ", ".join(f"{v:.2f}" for v in inflation) or "-"
            mean = f"{statistics.mean(inflation):.2f}" if inflation else "-"
            strong = f"{sum(v >= STRONG for v in inflation)} of {len(inflation)}"
            lines.append(f"| {run.name} | {agent} | {share:.2f} | {share ** -0.5:.2f} | {shown} | {mean} | "
                         f"{strong} |")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--iterations", type=int, default=3)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--only", nargs="+", choices=list(CANDIDATES), default=list(CANDIDATES),
                   help="the teams to run; the table holds every team whose run has finished")
    p.add_argument("--out", default="bench/results/inflation", help="finished runs here are kept in git")
    args = p.parse_args(argv)
    out = os.path.abspath(args.out)
    seed = ["--seed_everything", str(args.seed), "--data.rollout.seed", str(args.seed)]
    pinned = ["--model.engine_settings.dtype", "float32", "--data.validation.tasks", "0"]
    every = [Run(name, recipe, [*pinned, *flags, *seed], os.path.join(out, name), args.iterations, 0,
                 precision="32-true") for name, (recipe, flags) in CANDIDATES.items()]
    try:
        Study([r for r in every if r.name in args.only]).run_all()
    except StudyStopped as stop:
        raise SystemExit(f"study stopped: {stop}") from None
    runs = [r for r in every if r.finished]  # the table keeps the teams that earlier calls ran
    machines = sorted({r.record["machine"] + ", " + r.record["precision"] for r in runs})
    text = (f"# Baseline inflation per agent, {args.iterations} iterations, seed {args.seed}\n\n"
            f"machine(s): {'; '.join(machines)}\n\n{table(runs)}\n")
    write_text(os.path.join(out, "inflation.md"), text)
    print(text)


if __name__ == "__main__":
    main()
