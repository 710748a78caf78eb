"""Does training make the team better? The main job (``recipes/search.py fit``, the embedded
default) over several seeds, at a horizon where learning can show, with intervals over seeds and
questions; resumable across sessions (see ``bench/study.py``).

    python bench/learning.py                              # 3 seeds x 30 iterations (~1 h a seed, native bf16)
    python bench/learning.py --out bench/results/learning # the same folder again (the default): continues
    python bench/learning.py --name lr3e-6 --seeds 0 -- --model.policies.shared.optim.lr 3.0e-6   # a variant

Every run validates on ``--val_tasks`` questions per source (1-hop, 2-hop) x ``--val_k`` samples
before training, every ``--val_every`` iterations and at the end, and records each question's
result. When every run has finished, ``python -m drmas.report`` over them writes
``<out>/<name>/report.md`` with its PNGs (val avg@k and pass@k per iteration with a two-level
bootstrap interval, per source; each agent's reward and valid ratio; grad norms; time per phase),
and this script adds the gain from the first to the last validation with its interval (the
questions paired within a run) and says whether it is beyond the interval.
"""

from __future__ import annotations

import argparse
import os
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

from study import Run, Study, StudyStopped  # noqa: E402

from drmas.atomic import write_text  # noqa: E402


def gains(run_dirs: list[str], metric: str,
          source: str | None) -> tuple[float, float, tuple[float, float] | None]:
    """The mean over runs of the first and last validation's ``metric`` (``avg@k``/``pass@k``)
    and the 95% two-level interval of their difference, each question paired with itself."""
    from drmas.report import question_scores, read_validations, two_level_interval

    firsts, lasts, diffs = [], [], []
    for d in run_dirs:
        records = read_validations(d)
        first, last = records[min(records)], records[max(records)]
        a, b = question_scores(first, source, metric), question_scores(last, source, metric)
        firsts.append(sum(a) / len(a))
        lasts.append(sum(b) / len(b))
        diffs.append([y - x for x, y in zip(a, b)])
    return sum(firsts) / len(firsts), sum(lasts) / len(lasts), two_level_interval(diffs)


def summary(run_dirs: list[str], k: int) -> str:
    """A Markdown table: per metric and source, before, after, the gain and its interval, and
    whether the interval excludes 0."""
    from drmas.report import read_validations

    sources = sorted({t["source"] for t in next(iter(read_validations(run_dirs[0]).values()))["tasks"]}
                     - {None})
    lines = ["| metric | questions | first | last | gain | 95% interval of the gain | beyond noise |",
             "|---|---|---|---|---|---|---|"]
    for metric in (f"avg@{k}", f"pass@{k}"):
        for source in (None, *sources):
            first, last, ci = gains(run_dirs, metric, source)
            shown = f"[{ci[0]:+.3f}, {ci[1]:+.3f}]" if ci else "-"
            beyond = "yes" if ci and (ci[0] > 0 or ci[1] < 0) else "no"
            lines.append(f"| {metric} | {source or 'all'} | {first:.3f} | {last:.3f} | {last - first:+.3f} | "
                         f"{shown} | {beyond} |")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--name", default="main", help="the configuration's name (a folder under --out)")
    p.add_argument("--seeds", nargs="+", type=int, default=[0, 1, 2])
    p.add_argument("--iterations", type=int, default=30)
    p.add_argument("--val_every", type=int, default=10)
    p.add_argument("--val_tasks", type=int, default=32, help="val questions per source")
    p.add_argument("--val_k", type=int, default=4)
    p.add_argument("--config", default=None, help="config file (default: the recipe's own default)")
    p.add_argument("--out", default="bench/results/learning", help="finished runs here are kept in git")
    p.add_argument("extra", nargs=argparse.REMAINDER, help="after --: flags passed to every run")
    args = p.parse_args(argv)
    out = os.path.abspath(os.path.join(args.out, args.name))
    config = ["--config", os.path.abspath(args.config)] if args.config else []
    flags = [*config, "--data.validation.tasks", str(args.val_tasks), "--data.validation.k", str(args.val_k),
             "--data.validation.every", str(args.val_every), *[a for a in args.extra if a != "--"]]
    validations = 1 + args.iterations // args.val_every + (args.iterations % args.val_every > 0)
    runs = [Run(f"{args.name}-seed{seed}", "search",
                [*flags, "--seed_everything", str(seed), "--data.rollout.seed", str(seed)],
                os.path.join(out, f"seed{seed}"), args.iterations, validations) for seed in args.seeds]
    try:
        Study(runs).run_all()
    except StudyStopped as stop:
        raise SystemExit(f"study stopped: {stop}") from None
    from drmas.report import write_report

    run_dirs = [r.run_dir for r in runs]
    write_report(run_dirs, out)
    machines = sorted({r.record["machine"] + ", " + r.record["precision"] for r in runs})
    table = summary(run_dirs, args.val_k)
    text = (f"# {args.name}: {args.iterations} iterations, seeds {args.seeds}\n\n"
            f"flags: `{' '.join(flags)}`\n\nmachine(s): {'; '.join(machines)}\n\n"
            f"Gain from the first to the last validation, mean over seeds; interval: two-level bootstrap "
            f"(seeds, then questions), each question paired with itself.\n\n{table}\n")
    write_text(os.path.join(out, "gain.md"), text)
    print(text)
    print(f"written: {out}/report.md (with PNGs), {out}/gain.md")


if __name__ == "__main__":
    main()
