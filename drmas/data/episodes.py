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

__all__ = ["EPISODES_DIR", "EpisodeRecords", "episodes_path", "keep", "policy_gaps", "read_records",
           "sample_record", "write_records"]

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
