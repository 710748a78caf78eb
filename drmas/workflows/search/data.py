"""Search tasks, and the files of Search-R1 (NQ, HotpotQA, ...) for runs on real data.

The embedded synthetic world that needs no file is in :mod:`drmas.workflows.search.world`.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from drmas.workflows.files import check_prompt_size, read_records

__all__ = ["SearchTask", "load_corpus", "load_search_r1", "write_corpus"]

SPLITS = ("train", "val", "test")


@dataclass(frozen=True)
class SearchTask:
    """One question with its gold answers.

    ``entity`` (the name the question asks about) and ``bridge`` (the intermediate entity of a
    2-hop question) are known only for synthetic tasks; they let tests and role rewards check
    that the right passages were found. Both are ``""`` when unknown.
    """

    uid: str
    question: str
    answers: tuple[str, ...]
    source: str
    hops: int = 1
    entity: str = ""
    bridge: str = ""




def _as_list(value: Any) -> list[Any]:
    """A string, list, tuple or numpy array (parquet read through pandas) as a list."""
    if value is None:
        return []
    if isinstance(value, str):
        return [value]
    if hasattr(value, "tolist"):
        value = value.tolist()
    return list(value) if isinstance(value, (list, tuple)) else [value]


def _gold_answers(record: dict[str, Any]) -> list[str]:
    answers = _as_list(record.get("golden_answers"))
    if not answers:
        ground_truth = (record.get("reward_model") or {}).get("ground_truth") or {}
        answers = _as_list(ground_truth.get("target") if isinstance(ground_truth, dict) else ground_truth)
    return [str(a).strip() for a in answers if str(a).strip()]


def load_search_r1(path: str | Path, source: str | None = None) -> list[SearchTask]:
    """Tasks from a Search-R1 data file (JSONL or parquet).

    Accepts the raw shape (``question``, ``golden_answers``) and the verl shape (``question``,
    ``reward_model.ground_truth.target``, ``data_source``). ``source`` overrides the record's
    ``data_source``; without either the file name is used. Hops are unknown (0).
    """
    path = Path(path)
    tasks = []
    for index, (where, record) in enumerate(read_records(path, ("question",))):
        question = record.get("question")
        if not isinstance(question, str) or not question.strip():
            raise ValueError(f"{path}: {where} has no 'question'")
        check_prompt_size(path, where, "question", question)
        answers = _gold_answers(record)
        if not answers:
            raise ValueError(f"{path}: {where} has no answers "
                             "('golden_answers' or 'reward_model.ground_truth.target')")
        question = question.strip()
        if not question.endswith("?"):
            question += "?"
        src = source or record.get("data_source") or path.stem
        tasks.append(SearchTask(uid=f"{src}-{index}", question=question, answers=tuple(answers),
                                source=str(src), hops=0))
    return tasks


def load_corpus(path: str | Path) -> list[str]:
    """Passages from a JSONL corpus: ``contents`` (kept whole, Search-R1 stores "title\\ntext"
    there) or else ``text`` (prefixed with ``title`` and a newline when there is one)."""
    path = Path(path)
    passages = []
    for where, record in read_records(path):
        if isinstance(record.get("contents"), str):
            passages.append(record["contents"])
        elif isinstance(record.get("text"), str):
            title = record.get("title")
            passages.append(f"{title}\n{record['text']}" if title else record["text"])
        else:
            raise ValueError(f"{path}: {where} has neither 'contents' nor 'text'")
    return passages


def write_corpus(corpus: Sequence[str], path: str | Path) -> None:
    """Write passages as JSONL with ``id`` and ``contents``, the format Search-R1 retrievers index."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    with path.open("w", encoding="utf-8") as fh:
        for i, text in enumerate(corpus):
            fh.write(json.dumps({"id": str(i), "contents": text}, ensure_ascii=False) + "\n")
