"""A few samples as a table in the run's loggers: per agent and iteration, the samples of the
best, median and worst advantage; per validation, each source's first answers. A logger with a
table API (``log_table(key, columns, data, step)``: Lightning's ``WandbLogger``) gets the table
with each response whole; one whose experiment takes text (TensorBoard's ``add_text``) gets it as
Markdown, which TensorBoard's text tab renders as a table; others (CSV, MLflow) get none: the
run's ``episodes/`` files keep every sample (:mod:`drmas.data.episodes`)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Sequence

from drmas.records import Sample

__all__ = ["Table", "agent_table", "log_table", "markdown", "validation_table"]


@dataclass(frozen=True)
class Table:
    columns: list[str]
    rows: list[list[Any]]


def _cell(value: Any, width: int) -> str:
    """A Markdown table cell: one line, pipes escaped, cut to ``width`` characters; numbers signed."""
    if isinstance(value, float):
        return f"{value:+.3f}"
    flat = " ".join(str(value).split()).replace("|", "\\|")
    return flat if len(flat) <= width else flat[: width - 1] + "…"


def markdown(table: Table, width: int = 240) -> str:
    """``table`` as a Markdown table, numbers right-aligned, every cell on one line."""
    if not table.rows:
        return ""
    align = ["---:" if isinstance(v, (int, float)) and not isinstance(v, bool) else "---"
             for v in table.rows[0]]
    lines = [f"| {' | '.join(table.columns)} |", f"|{'|'.join(align)}|"]
    lines += [f"| {' | '.join(_cell(v, width if c == len(row) - 1 else 40) for c, v in enumerate(row))} |"
              for row in table.rows]
    return "\n".join(lines)


def agent_table(samples: Sequence[Sample]) -> Table:
    """One agent's samples of an iteration: those of the best, median and worst advantage, each with
    its reward terms, tree candidate and response (the response last)."""
    ranked = sorted(samples, key=lambda s: s.advantage, reverse=True)
    columns = ["sample", "advantage", "task", "turn", "candidate", "reward", "team", "local", "valid",
               "response"]
    if not ranked:
        return Table(columns, [])
    picks = {"best": ranked[0], "median": ranked[len(ranked) // 2], "worst": ranked[-1]}
    rows = [[name, float(s.advantage), str(s.task_uid), s.turn, f"{s.candidate}{' (chosen)' * s.chosen}",
             float(s.reward), float(s.team_reward), float(s.local_reward), bool(s.valid), s.text]
            for name, s in picks.items()]
    return Table(columns, rows)


def validation_table(result: Any, sources: dict[Any, Any]) -> Table:
    """A validation's first episode of each source: its agents' answers in order and the grader's
    verdict."""
    first: dict[Any, tuple[Any, Any]] = {}
    for e in result.episodes:
        first.setdefault(sources.get(e.task_uid), (e.task_uid, e.traj_uid))
    verdict = {(e.task_uid, e.traj_uid): e.success for e in result.episodes}
    rows = [[str(source), str(key[0]), "right" if verdict[key] else "wrong", s.agent, s.turn, s.text]
            for source, key in first.items() for s in result.samples if (s.task_uid, s.traj_uid) == key]
    return Table(["source", "task", "verdict", "agent", "turn", "response"], rows)


def log_table(trainer: Any, tag: str, table: Table, step: int) -> None:
    """``table`` in every logger of ``trainer`` that takes one (rank 0 calls this)."""
    if not table.rows:
        return
    for logger in trainer.loggers:
        if callable(getattr(logger, "log_table", None)):
            logger.log_table(key=tag, columns=table.columns, data=table.rows, step=step)
            continue
        writer = getattr(logger, "experiment", None)
        if hasattr(writer, "add_text"):
            writer.add_text(tag, markdown(table), global_step=step)
