"""A learning report from runs' scalars (their ``metrics.jsonl``, whatever the logger; else their
TensorBoard events): one Markdown page with PNGs.

    python -m drmas.report runs/search/version_0 runs/search/version_1 runs/search/version_2 -o report

For each validation tag (``val/avg@k``, ``val/pass@k``, per source too) the mean over the runs at
each validated iteration with a 95% interval: a two-level percentile bootstrap (the runs, then the
questions within each drawn run) where the runs wrote each question's result
(``validation.jsonl``, which ``fit`` writes beside its scalars), else a bootstrap over the runs
(with one run and no ``validation.jsonl`` there is no interval); per agent the rollout reward
and valid ratio over the first and last iterations (up to 5 each); each policy's (and, where
logged, each agent's) gradient norms: median, 90th percentile, max over every step of every
run; and the seconds per phase of an iteration. Runs of several seeds of one
configuration are what the intervals are meant for.
"""

from __future__ import annotations

import argparse
import io
import json
import os
import re
from collections import defaultdict
from typing import Sequence

import numpy as np

from drmas.atomic import write_bytes, write_text
from drmas.plots import read_scalars

__all__ = ["bootstrap_interval", "main", "quantile", "question_scores", "read_validations",
           "two_level_interval", "write_report"]

_VAL = re.compile(r"^val/(?:(?P<source>[^/]+)/)?(?P<metric>(?:avg|pass)@\d+)$")
_AGENT = re.compile(r"^rollout/(?P<agent>[^/]+)/(?P<metric>reward_mean|valid_ratio)$")
_GRAD = re.compile(r"^train/(?P<name>[^/]+(?:/[^/]+)?)/grad_norm$")
_TIME = re.compile(r"^time/(?P<phase>[a-z_]+)_s$")


def _percentiles(means: np.ndarray) -> tuple[float, float]:
    """The 2.5% and 97.5% points of ``means`` (draws), as the order statistics the interval uses."""
    ordered, draws = np.sort(means), len(means)
    return float(ordered[int(0.025 * draws)]), float(ordered[min(draws - 1, int(0.975 * draws))])


def bootstrap_interval(values: Sequence[float], draws: int = 2000,
                       seed: int = 0) -> tuple[float, float] | None:
    """The 95% percentile-bootstrap interval of the mean of ``values`` (None for fewer than 2):
    ``draws`` resamples of as many values, with replacement, drawn at once."""
    if len(values) < 2:
        return None
    x = np.asarray(values, dtype=float)
    rng = np.random.default_rng(seed)
    return _percentiles(x[rng.integers(0, len(x), size=(draws, len(x)))].mean(axis=1))


def two_level_interval(runs: Sequence[Sequence[float]], draws: int = 2000,
                       seed: int = 0) -> tuple[float, float] | None:
    """The 95% interval of the mean over runs of each run's mean over its questions: every draw
    takes as many runs as there are, with replacement, and within each drawn run as many of its
    questions, with replacement. Seeds and questions both vary, so both are in the interval.
    Vectorised: the runs of every draw are picked at once, then each run's questions for all the
    places it was picked."""
    runs = [np.asarray(r, dtype=float) for r in runs if len(r)]
    if not runs or (len(runs) == 1 and len(runs[0]) < 2):
        return None
    rng = np.random.default_rng(seed)
    picked = rng.integers(0, len(runs), size=(draws, len(runs)))
    run_means = np.empty(picked.shape)
    for i, questions in enumerate(runs):
        where = picked == i
        drawn = questions[rng.integers(0, len(questions), size=(int(where.sum()), len(questions)))]
        run_means[where] = drawn.mean(axis=1)
    return _percentiles(run_means.mean(axis=1))


def read_validations(run_dir: str) -> dict[int, dict]:
    """``validation.jsonl`` of a run: iteration -> ``{"k": k, "tasks": [{uid, source, correct}]}``
    (an iteration validated twice, by a resumed run, keeps its last line); {} without the file."""
    path = os.path.join(run_dir, "validation.jsonl")
    if not os.path.exists(path):
        return {}
    out = {}
    with open(path) as f:
        for line in f:
            if line.strip():
                record = json.loads(line)
                out[record["iteration"]] = record
    return out


def question_scores(record: dict, source: str | None, metric: str) -> list[float]:
    """Each question's avg@k (correct / k) or pass@k (any correct) in one validation."""
    k = record["k"]
    tasks = [t for t in record["tasks"] if source is None or t["source"] == source]
    if metric.startswith("avg@"):
        return [t["correct"] / k for t in tasks]
    return [float(t["correct"] > 0) for t in tasks]


def quantile(values: Sequence[float], q: float) -> float:
    ordered = sorted(values)
    position = q * (len(ordered) - 1)
    low = int(position)
    high = min(low + 1, len(ordered) - 1)
    return ordered[low] + (ordered[high] - ordered[low]) * (position - low)


def _png(path: str, series: dict[str, dict[int, list[float]]], title: str, ylabel: str,
         bands: dict[str, dict[int, tuple[float, float]]] | None = None) -> None:
    """Mean over runs per step, one line per name, with ``bands`` (name -> step -> (low, high))
    where given, else the runs' min-max, as a band."""
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure

    fig = Figure(figsize=(8, 4.5), dpi=100)
    FigureCanvasAgg(fig)
    ax = fig.add_subplot(1, 1, 1)
    for n, (name, by_step) in enumerate(sorted(series.items())):
        steps = sorted(by_step)
        means = [sum(by_step[s]) / len(by_step[s]) for s in steps]
        color = f"C{n % 10}"
        ax.plot(steps, means, color=color, marker="o" if len(steps) < 8 else None, label=name)
        band = (bands or {}).get(name, {})
        if band and all(s in band for s in steps):
            ax.fill_between(steps, [band[s][0] for s in steps], [band[s][1] for s in steps], color=color,
                            alpha=0.15)
        elif any(len(by_step[s]) > 1 for s in steps):
            ax.fill_between(steps, [min(by_step[s]) for s in steps], [max(by_step[s]) for s in steps],
                            color=color, alpha=0.15)
    ax.set_xlabel("RL iteration")
    ax.set_ylabel(ylabel)
    ax.set_title(title)
    ax.grid(True, alpha=0.3)
    ax.legend(loc="best", fontsize="small")
    fig.tight_layout()
    buf = io.BytesIO()
    fig.savefig(buf, format="png")
    write_bytes(path, buf.getvalue())


def write_report(run_dirs: Sequence[str], out_dir: str) -> str:
    """Write ``out_dir/report.md`` and its PNGs from the runs' scalars; returns the Markdown."""
    runs = {d: read_scalars(d) for d in run_dirs}
    questions = {d: read_validations(d) for d in run_dirs}
    os.makedirs(out_dir, exist_ok=True)
    lines = [f"# Learning report: {len(runs)} run(s)", "",
             *[f"- `{os.path.relpath(d, out_dir)}`" for d in runs], ""]

    val: dict[str, dict[int, list[float]]] = defaultdict(lambda: defaultdict(list))
    agents: dict[str, dict[int, list[float]]] = defaultdict(lambda: defaultdict(list))
    grads: dict[str, list[float]] = defaultdict(list)
    times: dict[str, list[float]] = defaultdict(list)
    for scalars in runs.values():
        for tag, points in scalars.items():
            for step, value in points:
                if _VAL.match(tag):
                    val[tag][step].append(value)
                elif _AGENT.match(tag):
                    agents[tag][step].append(value)
                elif g := _GRAD.match(tag):
                    grads[g.group("name")].append(value)
                elif t := _TIME.match(tag):
                    times[t.group("phase")].append(value)

    if val:
        lines += ["## Validation", "",
                  "Mean over the runs, with its 95% bootstrap interval: over runs and questions "
                  "(two levels) where every run recorded its questions (interval marked `q`), else over "
                  "the runs.",
                  "", "| tag | iteration | mean | 95% interval | runs |", "|---|---|---|---|---|"]
        intervals: dict[str, dict[int, tuple[float, float]]] = defaultdict(dict)
        for tag in sorted(val):
            parts = _VAL.match(tag)
            for step in sorted(val[tag]):
                values = val[tag][step]
                records = [q[step] for q in questions.values() if step in q]
                if len(records) == len(values):
                    ci = two_level_interval([question_scores(r, parts.group("source"), parts.group("metric"))
                                             for r in records])
                    mark = " q"
                else:
                    ci, mark = bootstrap_interval(values), ""
                if ci:
                    intervals[tag][step] = ci
                shown = f"[{ci[0]:.3f}, {ci[1]:.3f}]{mark}" if ci else "-"
                lines.append(f"| {tag} | {step} | {sum(values) / len(values):.3f} | {shown} | "
                             f"{len(values)} |")
        _png(os.path.join(out_dir, "validation.png"), val, "validation (band: 95% interval)", "score",
             intervals)
        lines += ["", "![validation](validation.png)", ""]
    if agents:
        # an iteration's rollout holds a few tasks: its means swing, a window of up to 5 holds
        lines += ["## Agents", "", "Rollout reward and valid ratio: the mean over the runs and over the "
                  "first and the last iterations (up to 5 each).", "",
                  "| tag | first iterations | first | last iterations | last |", "|---|---|---|---|---|"]
        for tag in sorted(agents):
            steps = sorted(agents[tag])
            window = max(1, min(5, len(steps) // 2))
            cells = []
            for part in (steps[:window], steps[-window:]):
                values = [v for step in part for v in agents[tag][step]]
                label = f"{part[0]}-{part[-1]}" if len(part) > 1 else f"{part[0]}"
                cells.append(f"{label} | {sum(values) / len(values):.3f}")
            lines.append(f"| {tag} | {cells[0]} | {cells[1]} |")
        _png(os.path.join(out_dir, "agents.png"), agents, "agents (band: the runs' range)", "")
        lines += ["", "![agents](agents.png)", ""]
    if grads:
        lines += ["## Gradient norms", "", "Before clipping, every step of every run.", "",
                  "| policy (/agent) | steps | median | 90th percentile | max |", "|---|---|---|---|---|"]
        for name in sorted(grads):
            values = grads[name]
            lines.append(f"| {name} | {len(values)} | {quantile(values, 0.5):.3f} | "
                         f"{quantile(values, 0.9):.3f} | {max(values):.3f} |")
        lines.append("")
    if times:
        lines += ["## Time per iteration", "", "| phase | mean s | iterations |", "|---|---|---|"]
        for phase in sorted(times):
            lines.append(f"| {phase} | {sum(times[phase]) / len(times[phase]):.2f} | {len(times[phase])} |")
        lines.append("")
    text = "\n".join(lines).rstrip() + "\n"
    write_text(os.path.join(out_dir, "report.md"), text)
    return text


def main(argv: Sequence[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="python -m drmas.report", description=__doc__.split("\n\n")[0])
    parser.add_argument("run_dirs", nargs="+", help="runs' log directories (runs/<recipe>/version_N)")
    parser.add_argument("-o", "--output", default="report", help="the folder for report.md and its PNGs")
    args = parser.parse_args(argv)
    write_report(args.run_dirs, args.output)
    print(f"wrote {os.path.join(args.output, 'report.md')}")


if __name__ == "__main__":
    main()
