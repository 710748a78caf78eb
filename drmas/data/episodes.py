"""Every iteration's samples kept as data beside the run's logs: ``<log dir>/episodes/``, one gzipped
JSON-lines file per training iteration (``iter_000005.jsonl.gz``, written after its update) and per
validation (``val_iter_000005.jsonl.gz``), one record per sample (one agent's LLM call).

Why JSON lines, gzipped: one self-describing line per sample that ``zcat | jq`` and any language
read, no dependency beyond the standard library (Parquet would need pyarrow at run time), and a
file per iteration written whole (``drmas.atomic``), so a crashed run's folder holds every
finished iteration and nothing half-written. A record's fields: :func:`sample_record`.
"""

from __future__ import annotations

import gzip
import json
import os
from dataclasses import dataclass
from typing import Any, Callable, Sequence

from drmas.atomic import write_bytes
from drmas.records import EPISODES_DIR, EpisodeResult, Sample

__all__ = ["EPISODES_DIR", "EpisodeRecords", "agent_table", "episodes_path", "keep", "log_markdown",
           "policy_gaps", "read_records", "sample_record", "validation_table", "write_records"]

@dataclass(frozen=True)
class EpisodeRecords:
    """Which samples are kept as data under the run's log folder (``episodes/``)."""

    per_iteration: int | None = None
    """Samples written per training iteration: whole tasks, in the rollout's order, until this many
    (so a task's groups stay whole); None: every sample (the default at CPU scale); 0: none. At GPU
    scale (thousands of samples an iteration) a few hundred keep the files small."""
    validation: bool = True
    """Also write each validation's samples, with the grader's verdict per episode."""

    def __post_init__(self) -> None:
        if self.per_iteration is not None and self.per_iteration < 0:
            raise ValueError(f"episodes.per_iteration must be >= 0 (or unset), got {self.per_iteration}")


def keep(samples: Sequence[Sample], limit: int | None) -> list[Sample]:
    """The samples of the first tasks (in rollout order) until ``limit`` are reached (None: all)."""
    if limit is None:
        return list(samples)
    order: dict[Any, list[Sample]] = {}
    for s in samples:
        order.setdefault(s.task_uid, []).append(s)
    kept: list[Sample] = []
    for group in order.values():
        if len(kept) >= limit:
            break
        kept += group
    return kept


def policy_gaps(samples: Sequence[Sample], gaps: dict[tuple[str, int], Any]) -> dict[int, Any]:
    """``id(sample)`` -> its log-prob gaps, from ``gaps`` keyed as the trainer knows them: (policy,
    index among that policy's samples, in rollout order)."""
    seen: dict[str, int] = {}
    out = {}
    for s in samples:
        i = seen.get(s.policy, 0)
        seen[s.policy] = i + 1
        if (s.policy, i) in gaps:
            out[id(s)] = gaps[(s.policy, i)]
    return out


def sample_record(s: Sample, split: str, iteration: int, source: Any, prompt: str,
                  episode: EpisodeResult | None, group: Any = None, gaps: tuple[float, Any] | None = None,
                  pieces: Sequence[str] | None = None) -> dict[str, Any]:
    """One sample as a record: where it sits (split, iteration, task and its source, trajectory,
    agent, policy, turn, tree candidate and whether it was the one executed, the estimator's group
    its advantage is relative to), its text (the prompt as the engine saw it, the response as the
    agent's parser read it), its tokens and whether the response was cut at its limit, every reward
    term, the reward, the advantage, the weights that generated it, its episode's outcome, and for
    a trained sample the gap between the trainer's log-probs (before the update) and the engine's:
    the mean absolute gap per response token (``logprob_gap``) and each response token's text
    (``tokens``) with its ``trainer - engine`` (``token_logprob_diff``); None where not trained."""
    diffs = None if gaps is None else [round(float(d), 4) for d in gaps[1]]
    return {
        "split": split, "iteration": iteration, "task": str(s.task_uid), "source": source,
        "trajectory": str(s.traj_uid), "agent": s.agent, "policy": s.policy, "turn": s.turn,
        "candidate": s.candidate, "chosen": s.chosen, "group": None if group is None else str(group),
        "prompt": prompt, "response": s.text, "prompt_tokens": len(s.prompt_ids),
        "response_tokens": len(s.response_ids), "cut": s.cut,
        "valid": s.valid, "team_reward": s.team_reward, "local_reward": s.local_reward,
        "role_reward": s.info.get("role_reward"), "failure": s.info.get("failure"),
        "reward": s.reward, "advantage": s.advantage, "version": s.version,
        "logprob_gap": None if gaps is None else gaps[0],
        "tokens": None if diffs is None else list(pieces or ()), "token_logprob_diff": diffs,
        "episode_success": None if episode is None else episode.success,
        "episode_team_reward": None if episode is None else episode.team_reward,
        "info": {k: v for k, v in s.info.items() if k not in ("role_reward", "failure")},
    }


def episodes_path(log_dir: str, split: str, iteration: int) -> str:
    """Where one iteration's (``split`` ``train``) or one validation's records go."""
    name = f"iter_{iteration:06d}.jsonl.gz" if split == "train" else f"{split}_iter_{iteration:06d}.jsonl.gz"
    return os.path.join(log_dir, EPISODES_DIR, name)


def write_records(log_dir: str, split: str, iteration: int, samples: Sequence[Sample],
                  episodes: Sequence[EpisodeResult], sources: dict[Any, Any], tokenizer: Callable[[str], Any],
                  gaps: dict[int, Any] | None = None, group: Callable[[Sample], Any] | None = None) -> str:
    """Write the records of ``samples`` whole, or not at all; returns the file's path. ``sources``:
    task uid -> source; ``tokenizer(agent)``: the tokenizer its prompts and tokens are decoded with;
    ``gaps``: :func:`policy_gaps`; ``group(sample)``: its estimator group's key."""
    by_traj = {(e.task_uid, e.traj_uid): e for e in episodes}
    gaps = gaps or {}
    lines = []
    for s in samples:
        tok = tokenizer(s.agent)
        gap = gaps.get(id(s))
        # each response token on its own (a character split across tokens shows as a replacement)
        pieces = tok.batch_decode([[t] for t in s.response_ids]) if gap is not None else None
        record = sample_record(s, split, iteration, sources.get(s.task_uid), tok.decode(s.prompt_ids),
                               by_traj.get((s.task_uid, s.traj_uid)), group and group(s), gap, pieces)
        lines.append(json.dumps(record, default=str))
    path = episodes_path(log_dir, split, iteration)
    os.makedirs(os.path.dirname(path), exist_ok=True)
    # mtime 0: the same records make the same bytes
    write_bytes(path, gzip.compress(("\n".join(lines) + "\n").encode(), mtime=0))
    return path


def read_records(path: str) -> list[dict[str, Any]]:
    """The records of one file."""
    with gzip.open(path, "rt") as f:
        return [json.loads(line) for line in f if line.strip()]


def _cell(text: Any, width: int = 240) -> str:
    """A Markdown table cell: one line, pipes escaped, cut to ``width`` characters."""
    flat = " ".join(str(text).split()).replace("|", "\\|")
    return flat if len(flat) <= width else flat[: width - 1] + "…"


def agent_table(samples: Sequence[Sample]) -> str:
    """One agent's samples of an iteration as a Markdown table: those of the best, median and worst
    advantage, each with its reward terms, tree candidate and response."""
    ranked = sorted(samples, key=lambda s: s.advantage, reverse=True)
    if not ranked:
        return ""
    picks = {"best": ranked[0], "median": ranked[len(ranked) // 2], "worst": ranked[-1]}
    rows = ["| sample | advantage | task | turn | candidate | reward | team | local | valid | response |",
            "|---|---:|---|---:|---|---:|---:|---:|---|---|"]
    for name, s in picks.items():
        cand = f"{s.candidate}{' (chosen)' if s.chosen else ''}"
        rows.append(f"| {name} | {s.advantage:+.3f} | {_cell(s.task_uid, 40)} | {s.turn} | {cand} | "
                    f"{s.reward:+.3f} | {s.team_reward:+.3f} | {s.local_reward:+.3f} | {s.valid} | "
                    f"{_cell(s.text)} |")
    return "\n".join(rows)


def validation_table(result: Any, sources: dict[Any, Any]) -> str:
    """A validation's first episode of each source as a Markdown table: its agents' answers in
    order and the grader's verdict."""
    first: dict[Any, tuple[Any, Any]] = {}
    for e in result.episodes:
        first.setdefault(sources.get(e.task_uid), (e.task_uid, e.traj_uid))
    rows = ["| source | task | verdict | agent | turn | response |", "|---|---|---|---|---:|---|"]
    verdict = {(e.task_uid, e.traj_uid): e.success for e in result.episodes}
    for source, key in first.items():
        for s in (s for s in result.samples if (s.task_uid, s.traj_uid) == key):
            rows.append(f"| {_cell(source, 40)} | {_cell(key[0], 40)} | "
                        f"{'right' if verdict[key] else 'wrong'} | {s.agent} | {s.turn} | {_cell(s.text)} |")
    return "\n".join(rows)


def log_markdown(trainer: Any, tag: str, text: str, step: int) -> None:
    """``text`` as TensorBoard text (a Markdown table renders as one) in every logger that takes it."""
    for logger in trainer.loggers:
        writer = getattr(logger, "experiment", None)
        if hasattr(writer, "add_text"):
            writer.add_text(tag, text, global_step=step)
