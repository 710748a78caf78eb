"""Stronger-MAS's claim with the real trainer: AT-GRPO (tree sampling, one group per (task, agent,
turn) node) against trajectory-level GRPO (parallel sampling, one group per task) on Plan-Path,
the planner and the tool user sharing one SmolLM2-135M policy; resumable across sessions
(``bench/study.py``).

    python bench/at_grpo.py select   # the setting: 15 iterations of both arms per candidate, in order
    python bench/at_grpo.py          # then 2 arms x 3 seeds x 30 iterations at the chosen setting
    python bench/at_grpo.py report   # the tables of the seeds finished so far, running nothing
    python bench/at_grpo.py replies  # what the finished runs' final weights say (where they ran)

Matched: both arms train at most the same samples per iteration. ``--data.rollout.group_size 4``
is 4 trajectories per puzzle in the parallel arm and 4 candidates per (agent, turn) step in the
tree arm, over the same 4 puzzles per iteration (the same draws: they depend on the seed and the
iteration only): 4 x 4 x 2 agents x T turns samples at most in each; a solved episode stops early,
so the realised counts differ and are reported. The tree arm executes the best of its candidates,
so its rollout success is a best-of-4 and not comparable: the arms are compared on validation,
which both play the same way (4 samples of each of the first 32 val puzzles, parallel).

The criterion, fixed before any run: the first candidate setting (cheapest first) where either
arm's val avg@2 after 15 iterations reaches 0.125, four times the untrained model's 0.031
(docs/games.md), on a selection seed (10) apart from the final ones; if none does, the last
candidate, said so. Neither arm is tuned: both take each candidate's settings as they are.

Both pin float32 (``--trainer.precision 32-true --model.engine_settings.dtype float32``), so the
study continues on any CPU kind.
"""

from __future__ import annotations

import argparse
import os
import re
import statistics
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

from learning import gains  # noqa: E402
from study import Run, Study, StudyStopped, finish_panel  # noqa: E402

from drmas.atomic import write_text  # noqa: E402

ARMS = {"at_grpo": ["--data.rollout.sampling", "tree", "--data.rollout.estimator", "at_grpo"],
        "grpo": ["--data.rollout.sampling", "parallel", "--data.rollout.estimator", "grpo"]}
COMMON = ["--model.engine_settings.dtype", "float32", "--data.rollout.group_size", "4",
          "--data.rollout.tasks_per_iteration", "4", "--data.validation.tasks", "32",
          "--data.workflow.init_args.game", "plan_path", "--data.workflow.init_args.size", "4"]
LR = "--model.policies.shared.optim.lr"
TURNS = "--data.workflow.init_args.max_turns"
CANDIDATES = {  # cheapest first; the configs' lr 1e-6 barely moved validation in 20 iterations
    "t2-lr5e-6": [TURNS, "2", LR, "5.0e-6"],
    "t2-lr2e-5": [TURNS, "2", LR, "2.0e-5"],
    "t3-lr2e-5": [TURNS, "3", LR, "2.0e-5"],
}
SELECT_SEED, SELECT_ITERATIONS, THRESHOLD = 10, 15, 0.125
AGENTS = ("planner", "tool_user")


def arm_run(arm: str, setting: list[str], seed: int, logs: str, iterations: int, k: int, every: int,
            precision: str | None = "32-true") -> Run:
    """One arm's run; ``setting`` is the candidate's flags after ``COMMON``, or a config file's
    flags alone (``precision`` None: the machine's default)."""
    validations = 1 + iterations // every + (iterations % every > 0)
    return Run(f"{arm}-seed{seed}", "games",
               [*setting, *ARMS[arm], "--data.validation.k", str(k), "--data.validation.every",
                str(every), "--seed_everything", str(seed), "--data.rollout.seed", str(seed)],
               logs, iterations, validations, precision=precision)


def final_avg(run: Run) -> float:
    from drmas.report import question_scores, read_validations

    records = read_validations(run.run_dir)
    scores = question_scores(records[max(records)], None, f"avg@{records[max(records)]['k']}")
    return sum(scores) / len(scores)


def select(out: str) -> str:
    """Run the candidates in order until one meets the criterion; write ``selection.md``; return
    the chosen candidate's name."""
    lines = ["| candidate | flags | AT-GRPO val avg@2 | GRPO val avg@2 | meets 0.125 |",
             "|---|---|---|---|---|"]
    chosen = None
    for name, setting in CANDIDATES.items():
        runs = [arm_run(arm, [*COMMON, *setting], SELECT_SEED, os.path.join(out, "select", name, arm),
                        SELECT_ITERATIONS, 2, SELECT_ITERATIONS) for arm in ARMS]
        Study(runs).run_all()
        scores = [final_avg(r) for r in runs]
        meets = max(scores) >= THRESHOLD
        lines.append(f"| {name} | `{' '.join(setting)}` | {scores[0]:.3f} | {scores[1]:.3f} | "
                     f"{'yes' if meets else 'no'} |")
        if meets:
            chosen = name
            break
    verdict = (f"chosen: **{chosen}** (the first to meet the criterion)" if chosen else
               f"no candidate met the criterion: the last, **{list(CANDIDATES)[-1]}**, is taken")
    chosen = chosen or list(CANDIDATES)[-1]
    write_text(os.path.join(out, "selection.md"),
               f"Selection: seed {SELECT_SEED}, {SELECT_ITERATIONS} iterations, val 32 puzzles x 2, "
               f"criterion: val avg@2 >= {THRESHOLD} in either arm\n\n"
               + "\n".join(lines) + f"\n\n{verdict}\n")
    return chosen


def chosen_setting(out: str) -> str:
    path = os.path.join(out, "selection.md")
    if not os.path.exists(path):
        raise SystemExit(f"no {path}: run `python bench/at_grpo.py select` first")
    text = open(path).read()
    return next(name for name in CANDIDATES if f"**{name}**" in text)


def series(run_dirs: list[str], tag: str) -> dict[int, list[float]]:
    from drmas.plots import read_scalars

    by_step: dict[int, list[float]] = {}
    for d in run_dirs:
        for step, v in read_scalars(d).get(tag, []):
            by_step.setdefault(step, []).append(v)
    return by_step


def trained_samples(run_dirs: list[str]) -> list[float]:
    """Samples of both agents per iteration, over every iteration of every run."""
    from drmas.plots import read_scalars

    out = []
    for d in run_dirs:
        scalars = read_scalars(d)
        per_agent = [dict(scalars.get(f"rollout/{a}/samples", [])) for a in AGENTS]
        out += [sum(c.get(step, 0.0) for c in per_agent) for step in sorted(set().union(*per_agent))]
    return out


def difference(runs: dict[str, list[Run]], metric: str) -> tuple[float, tuple[float, float] | None]:
    """AT-GRPO's last validation ``metric`` minus GRPO's, the mean over seeds, and its 95% two-level
    interval: the arms' runs paired by seed, each val puzzle with itself (both arms validate on the
    same puzzles), seeds and puzzles resampled."""
    from drmas.report import question_scores, read_validations, two_level_interval

    diffs = []
    for at, grpo in zip(*(runs[arm] for arm in ARMS)):
        last = [read_validations(r.run_dir) for r in (at, grpo)]
        a, b = (question_scores(v[max(v)], None, metric) for v in last)
        diffs.append([x - y for x, y in zip(a, b)])
    return statistics.mean(sum(d) / len(d) for d in diffs), two_level_interval(diffs)


def early_late(run_dirs: list[str], tag: str) -> tuple[float, float]:
    """``tag``'s mean over iterations 1-5 and over the last 5, over the runs."""
    by_step = series(run_dirs, tag)
    steps = sorted(by_step)
    return tuple(statistics.mean(v for s in part for v in by_step[s]) for part in (steps[:5], steps[-5:]))


def per_seed(runs: dict[str, list[Run]], k: int) -> str:
    """Each run's validations and what its agents' replies did, iterations 1-5 -> the last 5."""
    from drmas.report import question_scores, read_validations

    tags = ["rollout/planner/valid_ratio", "rollout/planner/response_tokens_mean",
            "rollout/planner/advantage_abs_mean", "rollout/tool_user/reward_mean"]
    lines = [f"| run | val avg@{k} at each validation | planner valid ratio | planner reply tokens | "
             "planner mean abs. advantage | tool user reward |", "|---|---|---|---|---|---|"]
    for group in runs.values():
        for r in group:
            records = read_validations(r.run_dir)
            vals = [question_scores(records[it], None, f"avg@{k}") for it in sorted(records)]
            cells = [" -> ".join(f"{sum(v) / len(v):.3f}" for v in vals)]
            cells += ["{:.2f} -> {:.2f}".format(*early_late([r.run_dir], tag)) for tag in tags]
            lines.append(f"| {r.name} | " + " | ".join(cells) + " |")
    return "\n".join(lines)


def summary(runs: dict[str, list[Run]], k: int) -> str:
    lines = ["| arm | samples / iteration | rollout success, it. 1-5 -> last 5 | "
             f"val avg@{k} first -> last [gain interval] | val pass@{k} first -> last [gain interval] |",
             "|---|---|---|---|---|"]
    for arm, group in runs.items():
        dirs = [r.run_dir for r in group]
        early, late = early_late(dirs, "rollout/success_rate")
        samples = statistics.mean(trained_samples(dirs))
        cells = []
        for metric in (f"avg@{k}", f"pass@{k}"):
            first, last, ci = gains(dirs, metric, None)
            cells.append(f"{first:.3f} -> {last:.3f} [{ci[0]:+.3f}, {ci[1]:+.3f}]" if ci else
                         f"{first:.3f} -> {last:.3f}")
        lines.append(f"| {arm} | {samples:.1f} | {early:.3f} -> {late:.3f} | {cells[0]} | {cells[1]} |")
    cells = []
    for metric in (f"avg@{k}", f"pass@{k}"):
        gap, ci = difference(runs, metric)
        cells.append(f"{gap:+.3f} [{ci[0]:+.3f}, {ci[1]:+.3f}]" if ci else f"{gap:+.3f}")
    lines.append(f"| AT-GRPO - GRPO, last validation [interval] | | | {cells[0]} | {cells[1]} |")
    return "\n".join(lines)


def singletons(group: list[Run]) -> str:
    """The parallel arm's share of samples alone in their (task, agent, turn, prompt) group, by turn."""
    from drmas.plots import read_scalars

    shares: dict[str, list[float]] = {}
    for r in group:
        for tag, points in read_scalars(r.run_dir).items():
            if "/singleton_prompts_turn" in tag:
                agent, turn = tag.split("/")[1], tag.rsplit("turn", 1)[1]
                shares.setdefault(f"{agent}, turn {turn}", []).extend(v for _, v in points)
    lines = ["| agent, turn | share of samples whose prompt no other trajectory reached (mean over "
             "iterations and seeds) |", "|---|---|"]
    lines += [f"| {key} | {statistics.mean(v):.3f} |" for key, v in sorted(shares.items())]
    return "\n".join(lines)


def plot(runs: dict[str, list[Run]], k: int, path: str) -> None:
    """Rollout success and val avg@k per iteration, the mean over seeds, both arms on each panel."""
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure

    fig = Figure(figsize=(10, 4), dpi=100)
    FigureCanvasAgg(fig)
    for n, (tag, title) in enumerate([("rollout/success_rate", "rollout success (AT-GRPO: best of 4)"),
                                      (f"val/avg@{k}", f"val avg@{k}")]):
        ax = fig.add_subplot(1, 2, n + 1)
        for c, (arm, group) in enumerate(runs.items()):
            by_step = series([r.run_dir for r in group], tag)
            steps = sorted(by_step)
            ax.plot(steps, [statistics.mean(by_step[s]) for s in steps], color=f"C{c}", label=arm,
                    marker="o" if n else None)
        finish_panel(ax, title)
    fig.tight_layout()
    fig.savefig(path)


def replies(run_dir: str, puzzles: int = 3, samples: int = 2, seed: int = 0) -> str:
    """What a run's final weights say on the first val puzzles' first turn (HF sampling with the
    run's train settings, cut at each template's stop): the tool user's replies, then the planner's
    after the first tool-user reply's program ran in the sandbox, as in a rollout."""
    import torch
    import yaml
    from transformers import AutoModelForCausalLM

    from drmas.models import load_tokenizer
    from drmas.modules.policy_generate import encode_prompt
    from drmas.records import Completion
    from drmas.workflows.games.workflow import PlanningWorkflow

    hf = os.path.join(run_dir, "hf")  # ``latest`` names the newest export (HFCheckpoint writes it)
    path = os.path.join(hf, open(os.path.join(hf, "latest")).read().strip(), "shared")
    tok, model = load_tokenizer(path), AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32).eval()
    config = yaml.safe_load(open(os.path.join(run_dir, "config.yaml")))
    game = config["data"]["workflow"]["init_args"]
    sampling = config["model"]["policies"]["shared"]["generation"]["train"]
    wf = PlanningWorkflow(game=game["game"], size=game["size"])
    torch.manual_seed(seed)

    def sample(agent, state) -> list[Completion]:
        prompt = wf.prompt(agent, state)
        ids = encode_prompt(tok, prompt)
        out = model.generate(torch.tensor([ids]), do_sample=True, temperature=sampling["temperature"],
                             max_new_tokens=sampling["max_new_tokens"], num_return_sequences=samples,
                             pad_token_id=tok.eos_token_id)
        texts = [tok.decode(o[len(ids):], skip_special_tokens=True) for o in out]
        cut = [min((t.split(stop)[0] for stop in prompt.stop), key=len) for t in texts]
        return [Completion(ids, [], [], prompt.prefill + t) for t in cut]

    lines = [f"Replies of `{path}` (first turn, {samples} samples each):", ""]
    try:
        for task in list(wf.tasks("val"))[:puzzles]:
            state = wf.initial_state(task)
            lines += ["```", state.env.observation, "```"]
            tool = sample("tool_user", state)
            lines += [f"- tool user: `{c.text!r}`" for c in tool]
            wf.advance("tool_user", state, wf.evaluate("tool_user", [state], tool[:1])[0])
            lines += [f"- planner (after the first program printed `{state.printed}`): `{c.text!r}`"
                      for c in sample("planner", state)]
    finally:
        wf.close()
    return "\n".join(lines)


def sections(text: str) -> dict[str, str]:
    """replies.md's sections by run name, each from its ``## name`` heading to the next one."""
    parts = re.split(r"^(?=## )", text, flags=re.M)
    return {part.split("\n", 1)[0][3:].strip(): part.rstrip("\n") for part in parts if part.startswith("## ")}


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("phase", nargs="?", choices=["select", "study", "report", "replies"], default="study",
                   help="report: the tables of the seeds whose two runs finished, running nothing; "
                        "replies: what each finished run's final weights say (replies.md)")
    p.add_argument("--seeds", nargs="+", type=int, default=[0, 1, 2])
    p.add_argument("--iterations", type=int, default=30)
    p.add_argument("--val_k", type=int, default=4)
    p.add_argument("--val_every", type=int, default=15)
    p.add_argument("--config", default=None,
                   help="a config's games setting in place of the chosen candidate's (the GPU config: "
                        "Plan-Path 10x10, K = 4, T = 4), in the machine's default precision")
    p.add_argument("--out", default="bench/results/at_grpo", help="finished runs here are kept in git")
    args = p.parse_args(argv)
    out = os.path.abspath(args.out)
    if args.config and (args.phase == "select" or args.out == p.get_default("out")):
        p.error("--config runs the study at the config's setting: give it an --out of its own (no select)")
    try:
        if args.phase == "select":
            print(f"chosen: {select(out)}; written: {out}/selection.md")
            return
        if args.config:
            name, precision = os.path.basename(args.config), None
            setting = ["--config", os.path.abspath(args.config)]
        else:
            name = chosen_setting(out)
            setting, precision = [*COMMON, *CANDIDATES[name]], "32-true"
        pairs = {seed: [arm_run(arm, setting, seed, os.path.join(out, arm, f"seed{seed}"),
                                args.iterations, args.val_k, args.val_every, precision) for arm in ARMS]
                 for seed in args.seeds}
        if args.phase == "replies":
            path = os.path.join(out, "replies.md")
            kept = sections(open(path).read()) if os.path.exists(path) else {}
            parts = []
            for r in (r for pair in pairs.values() for r in pair if r.finished):
                if os.path.exists(os.path.join(r.run_dir, "hf", "latest")):
                    parts.append(f"## {r.name}\n\n{replies(r.run_dir)}")
                elif r.name in kept:  # sampled where its weights were: they are not in git
                    parts.append(kept[r.name])
                    print(f"{r.name}: no weights here; its replies are kept from {path}")
                else:
                    print(f"{r.name}: no weights here (hf/ is not in git) and no earlier replies")
            text = "\n\n".join(parts)
            write_text(path, text + "\n")
            print(text)
            return
        if args.phase == "report":
            pairs = {seed: pair for seed, pair in pairs.items() if all(r.finished for r in pair)}
            if not pairs:
                raise SystemExit(f"no seed of {args.seeds} has both runs finished in {out}")
            args.seeds = list(pairs)
        order = [r for pair in pairs.values() for r in pair]  # seed by seed: an unfinished study holds pairs
        runs = {arm: [pair[n] for pair in pairs.values()] for n, arm in enumerate(ARMS)}
        Study(order).run_all()
    except StudyStopped as stop:
        raise SystemExit(f"study stopped: {stop}") from None
    from drmas.report import write_report

    for arm, group in runs.items():
        write_report([r.run_dir for r in group], os.path.join(out, arm))
    machines = sorted({r.record["machine"] + ", " + r.record["precision"] for r in order})
    flags = " ".join(setting if args.config else CANDIDATES[name])
    text = (f"# AT-GRPO vs trajectory GRPO on Plan-Path, setting {name} (`{flags}`)\n\n"
            f"{args.iterations} iterations, seeds {args.seeds}; machine(s): {'; '.join(machines)}\n\n"
            f"{summary(runs, args.val_k)}\n\nPer run:\n\n{per_seed(runs, args.val_k)}\n\n"
            f"GRPO arm (parallel sampling):\n\n{singletons(runs['grpo'])}\n")
    write_text(os.path.join(out, "at_grpo.md"), text)
    plot(runs, args.val_k, os.path.join(out, "curves.png"))
    print(text)
    print(f"written: {out}/at_grpo.md, curves.png, <arm>/report.md")


if __name__ == "__main__":
    main()
