"""The Dr. MAS stability claim with the real trainer: one baseline per task across agents
(``grpo_step``) against agent-wise normalisation (``drmas``), one shared policy, over seeds, at a
horizon where spikes can be counted; resumable across sessions (see ``bench/study.py``).

    python bench/stability.py                              # 2 estimators x 3 seeds x 30 iterations
    python bench/stability.py --out bench/results/stability  # the same folder again (the default): continues

The search workflow with role rewards gives the agents different reward distributions (the
verifier is rewarded far more often than the answerer). Every run logs each agent's own gradient
norm before clipping (``--model.agent_grad_norms true``) and, at every iteration, each agent's
``rollout/<agent>/baseline_inflation``: per task group, sqrt(std_k^2 + (mean_k - mean)^2) / std,
how much one baseline per task scales that agent's advantages (what the claim is about).

``stability.md`` reports per estimator and agent the grad norms' median, 90th percentile and max
over all steps and seeds, spikes per 100 steps (the spike monitor's rule applied to the agent's
own norms), the mean inflation factor, and the final val avg@k with its two-level interval; PNGs
draw the norms and the factors per iteration (mean over seeds). ``python -m drmas.report`` writes
each estimator's full report beside it.
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

from study import Run, Study, StudyStopped, finish_panel  # noqa: E402

from drmas.atomic import write_text  # noqa: E402

AGENTS = ("verifier", "searcher", "answerer")
ESTIMATORS = ("grpo_step", "drmas")


def agent_series(scalars: dict, agent: str, name: str) -> list[tuple[int, float]]:
    """``train/<policy>/<agent>/grad_norm`` (``name="grad_norm"``) or ``rollout/<agent>/<name>``."""
    for tag, points in scalars.items():
        if tag.endswith(f"/{agent}/{name}") and tag.count("/") == (3 if name == "grad_norm" else 2):
            return points
    return []


def spikes(norms: list[float]) -> int:
    """The spike monitor's count over one run's series of norms, with its default rule."""
    from drmas.callbacks.grad_norm import GradNormSpikeMonitor

    monitor = GradNormSpikeMonitor(plot=False)
    return sum(monitor.record("agent", i, v) for i, v in enumerate(norms))


def table(runs: dict[str, list[Run]], k: int) -> str:
    from drmas.plots import read_scalars
    from drmas.report import quantile, question_scores, read_validations, two_level_interval

    lines = ["| estimator | agent | grad norm median | p90 | max | spikes / 100 steps | "
             f"baseline inflation | final val avg@{k} |", "|---|---|---|---|---|---|---|---|"]
    for estimator, group in runs.items():
        scalars = [read_scalars(r.run_dir) for r in group]
        finals = []
        for r in group:
            records = read_validations(r.run_dir)
            finals.append(question_scores(records[max(records)], None, f"avg@{k}"))
        mean = statistics.mean(statistics.mean(f) for f in finals)
        ci = two_level_interval(finals)
        val = f"{mean:.3f}" + (f" [{ci[0]:.3f}, {ci[1]:.3f}]" if ci else "")
        for agent in AGENTS:
            series = [[v for _, v in agent_series(s, agent, "grad_norm")] for s in scalars]
            norms = [v for one in series for v in one]
            if not norms:
                continue
            inflation = [v for s in scalars for _, v in agent_series(s, agent, "baseline_inflation")]
            shown = f"{statistics.mean(inflation):.2f}" if inflation else "-"
            lines.append(f"| {estimator} | {agent} | {statistics.median(norms):.3f} | "
                         f"{quantile(norms, 0.9):.3f} | {max(norms):.3f} | "
                         f"{100 * sum(spikes(one) for one in series) / len(norms):.1f} | "
                         f"{shown} | {val} |")
    return "\n".join(lines)


def plot(runs: dict[str, list[Run]], name: str, ylabel: str, path: str) -> None:
    """One panel per estimator, one line per agent: the mean over seeds per iteration."""
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure

    from drmas.plots import read_scalars

    fig = Figure(figsize=(10, 4), dpi=100)
    FigureCanvasAgg(fig)
    for n, (estimator, group) in enumerate(runs.items()):
        ax = fig.add_subplot(1, len(runs), n + 1)
        scalars = [read_scalars(r.run_dir) for r in group]
        for c, agent in enumerate(AGENTS):
            by_step: dict[int, list[float]] = {}
            for s in scalars:
                for step, v in agent_series(s, agent, name):
                    by_step.setdefault(step, []).append(v)
            steps = sorted(by_step)
            ax.plot(steps, [statistics.mean(by_step[i]) for i in steps], color=f"C{c}", label=agent)
        finish_panel(ax, estimator, ylabel)
    fig.tight_layout()
    fig.savefig(path)


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--seeds", nargs="+", type=int, default=[0, 1, 2])
    p.add_argument("--iterations", type=int, default=30)
    p.add_argument("--group_size", type=int, default=8)
    p.add_argument("--val_tasks", type=int, default=32,
                   help="val questions per source (before and at the end)")
    p.add_argument("--val_k", type=int, default=4)
    p.add_argument("--config", default=None, help="config file (default: the recipe's own default)")
    p.add_argument("--out", default="bench/results/stability", help="finished runs here are kept in git")
    p.add_argument("extra", nargs=argparse.REMAINDER, help="after --: flags passed to every run")
    args = p.parse_args(argv)
    out = os.path.abspath(args.out)
    config = ["--config", os.path.abspath(args.config)] if args.config else []
    flags = [*config, "--data.rollout.group_size", str(args.group_size), "--model.agent_grad_norms", "true",
             "--data.validation.tasks", str(args.val_tasks), "--data.validation.k", str(args.val_k),
             *[a for a in args.extra if a != "--"]]
    runs: dict[str, list[Run]] = {e: [] for e in ESTIMATORS}
    order = []  # seed by seed, so an unfinished study already holds pairs
    for seed in args.seeds:
        for estimator in ESTIMATORS:
            run = Run(f"{estimator}-seed{seed}", "search",
                      [*flags, "--data.rollout.estimator", estimator, "--seed_everything", str(seed),
                       "--data.rollout.seed", str(seed)],
                      os.path.join(out, estimator, f"seed{seed}"), args.iterations)
            runs[estimator].append(run)
            order.append(run)
    try:
        Study(order).run_all()
    except StudyStopped as stop:
        raise SystemExit(f"study stopped: {stop}") from None
    from drmas.report import write_report

    for estimator, group in runs.items():
        write_report([r.run_dir for r in group], os.path.join(out, estimator))
    text = table(runs, args.val_k)
    machines = sorted({r.record["machine"] + ", " + r.record["precision"] for r in order})
    write_text(os.path.join(out, "stability.md"),
               f"search recipe, role rewards, one shared policy, group size {args.group_size}, "
               f"{args.iterations} iterations, seeds {args.seeds}; "
               f"machine(s): {'; '.join(machines)}\n\n{text}\n")
    plot(runs, "grad_norm", "agent's grad norm (pre-clip)", os.path.join(out, "grad_norms.png"))
    plot(runs, "baseline_inflation", "inflation under one baseline per task",
         os.path.join(out, "inflation.png"))
    print(text)
    print(f"\nwritten: {out}/stability.md, grad_norms.png, inflation.png, <estimator>/report.md")


if __name__ == "__main__":
    main()
