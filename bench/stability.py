"""The Dr. MAS stability claim in miniature, with the real trainer: one baseline per task across
agents (``grpo_step``) against agent-wise normalisation (``drmas``), with one shared policy and
with one policy per agent, over several seeds; each agent's own gradient norm logged.

    python bench/stability.py                          # search recipe, role rewards, 3 seeds, 6 iterations
    python bench/stability.py --iterations 20 --seeds 0 1 2 3 4

The search workflow with role rewards gives the agents strongly different reward distributions
(the verifier is rewarded far more often than the answerer). Every run logs
``train/<policy>/<agent>/grad_norm`` (``--model.agent_grad_norms true``); the table reports per
estimator, policy layout and agent the max and median of those norms over all steps and seeds,
the spikes the monitor flagged per 100 optimiser steps, and the last rollout success rate. One
PNG per estimator draws each agent's norm per iteration (mean over seeds).
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)

AGENTS = ("verifier", "searcher", "answerer")
MODEL = "embedded:smollm2-135m-instruct"


def layouts(model: str) -> dict[str, list[str]]:
    per_agent = "{" + ", ".join(f"{a}: {{model: {model}, lr: 1.0e-6}}" for a in AGENTS) + "}"
    return {"shared": [], "per-agent": ["--model.policies", per_agent]}


def run(estimator: str, layout: list[str], seed: int, iterations: int, out: str, config: list[str],
        extra: list[str]) -> dict:
    from drmas.plots import read_scalars

    logs = os.path.join(out, "runs", f"{estimator}-{'per' if layout else 'shared'}-seed{seed}")
    cmd = [sys.executable, os.path.join(ROOT, "recipes", "search.py"), "fit", *config, "--data.estimator", estimator,
           *layout, "--model.agent_grad_norms", "true", "--trainer.max_epochs", str(iterations),
           "--data.val_tasks", "0", "--checkpoint.save_last", "false", "--seed_everything", str(seed),
           "--data.seed", str(seed), "--model.seed", str(seed), "--trainer.logger.init_args.save_dir", logs, *extra]
    proc = subprocess.run(cmd, cwd=out, capture_output=True, text=True)
    if proc.returncode != 0:
        raise SystemExit(f"{estimator} {layout} seed {seed} failed:\n{proc.stderr[-4000:]}")
    return read_scalars(os.path.join(logs, "search", "version_0"))


def agent_norms(s: dict, agent: str) -> list[tuple[int, float]]:
    """The agent's grad-norm series, whichever policy it was on."""
    for tag, points in s.items():
        if tag.startswith("train/") and tag.endswith(f"/{agent}/grad_norm"):
            return points
    return []


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--seeds", nargs="+", type=int, default=[0, 1, 2])
    p.add_argument("--iterations", type=int, default=6)
    p.add_argument("--model", default=MODEL)
    p.add_argument("--out", default="stability")
    p.add_argument("--config", default=None, help="config file (default: the recipe's own default)")
    p.add_argument("extra", nargs=argparse.REMAINDER, help="after --: flags passed to every run")
    args = p.parse_args(argv)
    out = os.path.abspath(args.out)
    os.makedirs(out, exist_ok=True)
    config = ["--config", os.path.abspath(args.config)] if args.config else []  # first: the flags override it
    extra = [a for a in args.extra if a != "--"]
    results: dict[tuple[str, str], list[dict]] = {}
    combos = [(e, name, flags) for e in ("grpo_step", "drmas") for name, flags in layouts(args.model).items()]
    for i, (estimator, name, flags) in enumerate(combos):
        for j, seed in enumerate(args.seeds):
            print(f"[{i * len(args.seeds) + j + 1}/{len(combos) * len(args.seeds)}] {estimator}, {name}, seed {seed}",
                  flush=True)
            results.setdefault((estimator, name), []).append(run(estimator, flags, seed, args.iterations, out, config, extra))
    lines = ["| estimator | policies | agent | max grad norm | median grad norm | spikes / 100 steps | success (last) |",
             "|---|---|---|---|---|---|---|"]
    for (estimator, name), runs in results.items():
        steps = sum(len(pts) for s in runs for tag, pts in s.items() if tag.endswith("/grad_norm")
                    and tag.count("/") == 2)
        spikes = sum(max((v for _, v in pts), default=0) for s in runs for tag, pts in s.items()
                     if tag.endswith("/grad_norm_spikes"))
        success = statistics.mean(s["rollout/success_rate"][-1][1] for s in runs)
        for agent in AGENTS:
            norms = [v for s in runs for _, v in agent_norms(s, agent)]
            lines.append(f"| {estimator} | {name} | {agent} | {max(norms):.3f} | {statistics.median(norms):.3f} | "
                         f"{100 * spikes / max(steps, 1):.1f} | {success:.3f} |")
    table = "\n".join(lines)
    with open(os.path.join(out, "stability.md"), "w") as f:
        f.write(f"search recipe, role rewards, {args.iterations} iterations, seeds {args.seeds}\n\n{table}\n")
    for estimator in ("grpo_step", "drmas"):
        _plot(results, estimator, os.path.join(out, f"grad_norms_{estimator}.png"))
    print(table)
    print(f"\nwritten: {out}/stability.md, grad_norms_grpo_step.png, grad_norms_drmas.png")


def _plot(results: dict, estimator: str, path: str) -> None:
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure

    fig = Figure(figsize=(10, 4), dpi=100)
    FigureCanvasAgg(fig)
    for k, name in enumerate(("shared", "per-agent")):
        ax = fig.add_subplot(1, 2, k + 1)
        for n, agent in enumerate(AGENTS):
            series = [agent_norms(s, agent) for s in results.get((estimator, name), [])]
            steps = sorted({i for pts in series for i, _ in pts})
            means = [statistics.mean(v for pts in series for i, v in pts if i == step) for step in steps]
            ax.plot(steps, means, marker="o", color=f"C{n}", label=agent)
        ax.set_yscale("log")
        ax.set_title(f"{estimator}, {name} policies")
        ax.set_xlabel("RL iteration")
        ax.set_ylabel("agent's grad norm")
        ax.grid(True, alpha=0.3)
        ax.legend(fontsize="small")
    fig.tight_layout()
    fig.savefig(path)


if __name__ == "__main__":
    main()
