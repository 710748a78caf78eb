"""Curves of a finished (or running) run, read from its ``metrics.jsonl`` (whatever the logger), as a PNG.

    python -m drmas.plots runs/games/version_0 rollout/success_rate val/avg@2 -o curve.png

Each tag is one line over the RL iteration (the x-axis every drmas scalar is logged on); a
tag given as a glob (``rollout/*/reward_mean``) draws every matching tag.
"""

from __future__ import annotations

import argparse
import fnmatch
import glob
import io
import json
import os
from typing import Sequence

from drmas.atomic import write_bytes
from drmas.records import METRICS_FILE

__all__ = ["plot_scalars", "read_scalars"]


def read_scalars(run_dir: str) -> dict[str, list[tuple[int, float]]]:
    """Every scalar tag of the run as sorted ``(step, value)`` pairs: from the run's own
    ``metrics.jsonl`` (written whatever the logger), else from its TensorBoard event files (a run
    of an older drmas)."""
    jsonl = os.path.join(run_dir, METRICS_FILE)
    if os.path.isfile(jsonl):
        return _read_jsonl(jsonl)
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    files = sorted(glob.glob(os.path.join(run_dir, "events.out.tfevents.*")))
    if not files:
        raise FileNotFoundError(f"no metrics.jsonl or TensorBoard event file in {run_dir}")
    out: dict[str, dict[int, float]] = {}
    for path in files:  # a resumed run writes a second file: later values win
        ea = EventAccumulator(path, size_guidance={"scalars": 0})
        ea.Reload()
        for tag in ea.Tags()["scalars"]:
            out.setdefault(tag, {}).update({e.step: e.value for e in ea.Scalars(tag)})
    return {tag: sorted(points.items()) for tag, points in out.items()}


def _read_jsonl(path: str) -> dict[str, list[tuple[int, float]]]:
    out: dict[str, dict[int, float]] = {}
    with open(path) as f:
        for line in f:
            try:
                record = json.loads(line)
            except json.JSONDecodeError:  # a line cut by a kill
                continue
            step = record.pop("iteration")
            for tag, value in record.items():  # a resumed run logs its iterations again: later lines win
                out.setdefault(tag, {})[step] = value
    return {tag: sorted(points.items()) for tag, points in out.items()}


def plot_scalars(run_dir: str, tags: Sequence[str], path: str, title: str | None = None,
                 smooth: int = 1) -> list[str]:
    """Draw ``tags`` (globs allowed) of the run into the PNG ``path`` (written atomically);
    ``smooth`` > 1 adds a trailing moving average of that many iterations. Returns the tags drawn."""
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure

    scalars = read_scalars(run_dir)
    drawn = [t for pattern in tags for t in sorted(fnmatch.filter(scalars, pattern))]
    if not drawn:
        raise ValueError(f"no scalar matches {list(tags)} in {run_dir}; tags: {sorted(scalars)}")
    fig = Figure(figsize=(8, 4.5), dpi=100)
    FigureCanvasAgg(fig)
    ax = fig.add_subplot(1, 1, 1)
    for n, tag in enumerate(dict.fromkeys(drawn)):
        xs, ys = zip(*scalars[tag])
        color = f"C{n % 10}"
        if smooth > 1 and len(ys) > 1:
            avg = [sum(ys[max(0, i - smooth + 1):i + 1]) / len(ys[max(0, i - smooth + 1):i + 1])
                   for i in range(len(ys))]
            ax.plot(xs, ys, color=color, alpha=0.3, linewidth=1)
            ax.plot(xs, avg, color=color, linewidth=1.8, label=f"{tag} ({smooth}-iteration mean)")
        else:
            ax.plot(xs, ys, color=color, marker="o" if len(ys) < 4 else None, linewidth=1.5, label=tag)
    ax.set_xlabel("RL iteration")
    ax.set_title(title or os.path.basename(os.path.normpath(run_dir)))
    ax.grid(True, alpha=0.3)
    ax.legend(loc="best", fontsize="small")
    fig.tight_layout()
    buf = io.BytesIO()
    fig.savefig(buf, format="png")
    os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
    write_bytes(path, buf.getvalue())
    return drawn


def main(argv: Sequence[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="python -m drmas.plots", description=__doc__.split("\n\n")[0])
    parser.add_argument("run_dir", help="a run's log directory (runs/<recipe>/version_N)")
    parser.add_argument("tags", nargs="+",
                        help="scalar tags or globs, e.g. rollout/success_rate 'val/*/avg@2'")
    parser.add_argument("-o", "--output", default="curves.png", help="the PNG to write")
    parser.add_argument("--title", default=None)
    parser.add_argument("--smooth", type=int, default=1, help="moving average over this many iterations")
    args = parser.parse_args(argv)
    drawn = plot_scalars(args.run_dir, args.tags, args.output, args.title, args.smooth)
    print(f"wrote {args.output}: {', '.join(drawn)}")


if __name__ == "__main__":
    main()
