"""Math problems from files and from the usual benchmarks by name.

* :func:`load_math_file` reads a JSONL or parquet file with a problem and an answer column.
* :func:`load_math_dataset` loads MATH-500, AIME, GSM8K, ... by name through the ``datasets``
  library, from the hub or the local cache.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from drmas.workflows.files import (check_hidden_from_programs, check_prompt_size, load_hub_dataset,
                                   read_records)
from drmas.workflows.math.task import MathTask

__all__ = ["MATH_DATASETS", "MathDatasetSpec", "gsm8k_final_answer", "load_math_dataset", "load_math_file",
           "math_dataset_spec"]


def _lookup(record: Mapping[str, Any], key: str) -> Any:
    """``record[key]``; a dotted key ("reward_model.ground_truth") walks nested objects."""
    if key in record:
        return record[key]
    value: Any = record
    for part in key.split("."):
        if not isinstance(value, Mapping) or part not in value:
            return None
        value = value[part]
    return value


def _answer_text(value: Any) -> str | None:
    """An answer cell as text: strings stripped, whole floats without ".0"; None if unusable."""
    if isinstance(value, bool) or value is None:
        return None
    if isinstance(value, float) and value.is_integer():
        value = int(value)
    if isinstance(value, (int, float)):
        return str(value)
    if isinstance(value, str) and value.strip():
        return value.strip()
    return None


def load_math_file(
    path: str | Path, problem_key: str = "problem", answer_key: str = "answer", source: str | None = None
) -> list[MathTask]:
    """Tasks from a JSONL or parquet file with a problem and an answer column.

    Keys may be dotted to reach nested fields (verl files keep the answer in
    ``reward_model.ground_truth``). ``source`` defaults to the file name.
    """
    path = Path(path)
    check_hidden_from_programs(path)
    src = source or path.stem
    tasks = []
    columns = (problem_key.split(".")[0], answer_key.split(".")[0])
    for index, (where, record) in enumerate(read_records(path, columns)):
        problem = _lookup(record, problem_key)
        if not isinstance(problem, str) or not problem.strip():
            raise ValueError(f"{path}: {where} has no problem text in {problem_key!r} "
                             f"(keys: {sorted(record)})")
        check_prompt_size(path, where, problem_key, problem)
        answer = _answer_text(_lookup(record, answer_key))
        if answer is None:
            raise ValueError(f"{path}: {where} has no answer in {answer_key!r} (keys: {sorted(record)})")
        tasks.append(MathTask(uid=f"{src}-{index}", problem=problem.strip(), answer=answer, source=src))
    return tasks


_GSM8K_MARK = "####"


def gsm8k_final_answer(solution: str) -> str:
    """The number after GSM8K's ``####`` marker, without thousands separators ("1,200" -> "1200")."""
    head, sep, tail = str(solution).rpartition(_GSM8K_MARK)
    if not sep:
        raise ValueError(f"GSM8K answer without {_GSM8K_MARK!r}: {str(solution)[-80:]!r}")
    answer = tail.strip().replace(",", "").replace("$", "").rstrip(".").strip()
    if not answer:
        raise ValueError(f"GSM8K answer with nothing after {_GSM8K_MARK!r}")
    return answer


def _plain_answer(value: Any) -> str:
    """A numeric or text answer cell as a string ("27.0" -> "27")."""
    text = _answer_text(value)
    if text is None:
        raise ValueError(f"empty answer {value!r}")
    return text


def _olympiad_answer(value: Any) -> str:
    """OlympiadBench stores a list of LaTeX answers wrapped in ``$``; several are joined by ", "."""
    items = list(value) if isinstance(value, (list, tuple)) else [value]
    parts = [_plain_answer(v).strip().strip("$").strip() for v in items if _answer_text(v) is not None]
    if not parts:
        raise ValueError(f"empty answer {value!r}")
    return ", ".join(parts)


@dataclass(frozen=True)
class MathDatasetSpec:
    """Where a benchmark lives on the hub and how to read its problem and final answer."""

    hub_id: str
    config: str | None
    split: str  # the default split
    problem_field: str
    answer_field: str
    answer_fn: Callable[[Any], str] = _plain_answer


#: Benchmarks known by name. Keys are matched ignoring case, spaces, "-" and "_".
MATH_DATASETS: dict[str, MathDatasetSpec] = {
    # 17k competition problems with integer answers, deduplicated and English-only.
    "dapo-math-17k": MathDatasetSpec("open-r1/DAPO-Math-17k-Processed", "en", "train", "prompt", "solution"),
    "math-500": MathDatasetSpec("HuggingFaceH4/MATH-500", None, "test", "problem", "answer"),
    "aime-2024": MathDatasetSpec("HuggingFaceH4/aime_2024", None, "train", "problem", "answer"),
    "aime-2025": MathDatasetSpec("math-ai/aime25", None, "test", "problem", "answer"),
    # The 675 open-ended, text-only, English competition math problems.
    "olympiadbench": MathDatasetSpec("Hothan/OlympiadBench", "OE_TO_maths_en_COMP", "train", "question",
                                     "final_answer", _olympiad_answer),
    "amc23": MathDatasetSpec("math-ai/amc23", None, "test", "question", "answer"),
    "gsm8k": MathDatasetSpec("openai/gsm8k", "main", "test", "question", "answer", gsm8k_final_answer),
}


def _canonical(name: str) -> str:
    return re.sub(r"[\s_\-]", "", name.lower())


def math_dataset_spec(name: str) -> tuple[str, MathDatasetSpec]:
    """(canonical name, spec) of a benchmark of :data:`MATH_DATASETS`; ValueError naming the known ones."""
    wanted = _canonical(name)
    for key, spec in MATH_DATASETS.items():
        if _canonical(key) == wanted:
            return key, spec
    raise ValueError(f"unknown math data set {name!r}; known: {', '.join(MATH_DATASETS)}")


def _tasks_from_rows(rows: Iterable[Mapping[str, Any]], spec: MathDatasetSpec, source: str,
                     split: str) -> list[MathTask]:
    """MathTasks from the rows of a loaded data set, reading the spec's fields."""
    tasks = []
    for index, row in enumerate(rows):
        problem = row.get(spec.problem_field)
        if not isinstance(problem, str) or not problem.strip():
            raise ValueError(f"{source} ({split}): row {index} has no problem text in {spec.problem_field!r}")
        try:
            answer = spec.answer_fn(row.get(spec.answer_field))
        except ValueError as err:
            raise ValueError(f"{source} ({split}): row {index}, field {spec.answer_field!r}: {err}") from None
        tasks.append(MathTask(uid=f"{source}-{split}-{index}", problem=problem.strip(), answer=answer,
                              source=source))
    return tasks


def load_math_dataset(name: str, split: str | None = None) -> list[MathTask]:
    """A benchmark from :data:`MATH_DATASETS` by name, through ``datasets`` (hub or local cache).

    ``split`` defaults to the benchmark's usual evaluation split ("train" for DAPO-Math-17k).
    """
    key, spec = math_dataset_spec(name)
    split = split or spec.split
    rows = load_hub_dataset(key, spec.hub_id, spec.config, split)
    return _tasks_from_rows(rows, spec, key, split)
