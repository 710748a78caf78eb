"""Coding problems: the embedded set, JSONL / parquet files, and APPS, CodeContests and
LiveCodeBench by name through the ``datasets`` library (hub or local cache)."""

from __future__ import annotations

import base64
import io
import json
import pickle
import re
import zlib
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from drmas.workflows.code.task import CodeTask, TestCase
from drmas.workflows.files import (check_hidden_from_programs, check_prompt_size, load_hub_dataset,
                                   read_records)

__all__ = ["CODE_DATASETS", "EMBEDDED", "embedded_problems", "load_code_dataset", "load_code_file",
           "load_code_source", "parse_tests", "tasks_from_rows"]

EMBEDDED = Path(__file__).with_name("problems.jsonl")
"""64 short problems written for drmas (strings, arithmetic, lists, DP, simulation), each
with a reference solution and 6-8 golden tests: 44 train, 10 val, 10 test."""


def parse_tests(value: Any) -> tuple[TestCase, ...]:
    """Tests from a list of ``{"input", "output"}`` objects or from ``{"inputs": [...],
    "outputs": [...]}`` (APPS), either possibly as a JSON string. ValueError when neither."""
    if isinstance(value, str):
        value = json.loads(value)
    if isinstance(value, Mapping):
        ins, outs = value.get("inputs", value.get("input")), value.get("outputs", value.get("output"))
        if not isinstance(ins, list) or not isinstance(outs, list) or len(ins) != len(outs):
            raise ValueError("tests need lists 'inputs' and 'outputs' of the same length")
        pairs = list(zip(ins, outs))
    elif isinstance(value, list):
        if not all(isinstance(t, Mapping) and "input" in t and "output" in t for t in value):
            raise ValueError("each test needs an 'input' and an 'output'")
        pairs = [(t["input"], t["output"]) for t in value]
    else:
        raise ValueError(f"tests must be a list or an object, not {type(value).__name__}")
    tests = []
    for i, o in pairs:
        if isinstance(i, list):  # APPS sometimes stores lines
            i = "\n".join(map(str, i)) + "\n"
        if isinstance(o, list):
            o = "\n".join(map(str, o)) + "\n"
        if not isinstance(i, str) or not isinstance(o, str):
            raise ValueError("test inputs and outputs must be text")
        tests.append(TestCase(i, o))
    if not tests:
        raise ValueError("no tests")
    return tuple(tests)


def load_code_file(path: str | Path, source: str | None = None, split: str | None = None) -> list[CodeTask]:
    """Tasks from a JSONL or parquet file with ``question``, ``tests`` and optionally ``solution``
    (a reference program; without it the tester earns no local reward). Rows with a ``split``
    field are kept only when it equals ``split`` (if given). Errors name the file and the line."""
    path = Path(path)
    check_hidden_from_programs(path)
    src = source or path.stem
    tasks = []
    for index, (where, record) in enumerate(read_records(path, ("question", "tests"))):
        if split is not None and record.get("split", split) != split:
            continue
        question = record.get("question")
        if not isinstance(question, str) or not question.strip():
            raise ValueError(f"{path}: {where} has no question text in 'question' (keys: {sorted(record)})")
        check_prompt_size(path, where, "question", question)
        if "tests" not in record:
            raise ValueError(f"{path}: {where} has no 'tests' (keys: {sorted(record)})")
        try:
            tests = parse_tests(record["tests"])
        except ValueError as err:
            raise ValueError(f"{path}: {where}, field 'tests': {err}") from None
        solution = record.get("solution")
        if solution is not None and (not isinstance(solution, str) or not solution.strip()):
            raise ValueError(f"{path}: {where}: 'solution' must be a non-empty program")
        uid = f"{src}-{record.get('id', index)}"
        tasks.append(CodeTask(uid, question.strip(), tests, solution, src))
    return tasks


def embedded_problems(split: str) -> list[CodeTask]:
    """The embedded problems of one split (``train``, ``val``, ``test``)."""
    if split not in ("train", "val", "test"):
        raise KeyError(f"unknown split {split!r}; known: ['test', 'train', 'val']")
    return load_code_file(EMBEDDED, source="drmas-code", split=split)


# ---- benchmarks by name ------------------------------------------------------------------

def _apps_row(row: Mapping[str, Any]) -> tuple[str, tuple[TestCase, ...], str | None]:
    solutions = json.loads(row["solutions"]) if row.get("solutions") else []
    return row["question"], parse_tests(row["input_output"]), solutions[0] if solutions else None


_PYTHON3 = 3  # CodeContests' language code for Python 3


def _code_contests_row(row: Mapping[str, Any]) -> tuple[str, tuple[TestCase, ...], str | None]:
    tests: list[TestCase] = []
    for key in ("public_tests", "private_tests", "generated_tests"):
        block = row.get(key) or {}
        tests += [TestCase(i, o) for i, o in zip(block.get("input", []), block.get("output", []))]
    sols = row.get("solutions") or {}
    python = [s for lang, s in zip(sols.get("language", []), sols.get("solution", [])) if lang == _PYTHON3]
    if not tests:
        raise ValueError("no tests")
    return row["description"], tuple(tests), python[0] if python else None


def _lcb_cases(value: Any) -> list[dict]:
    """LiveCodeBench's test cases: JSON text, or base64 of zlib of a pickled JSON text."""
    if not value:
        return []
    try:
        return json.loads(value)
    except ValueError:
        # the format the benchmark publishes its private tests in: a pickled JSON string
        return json.loads(_StringsOnly(io.BytesIO(zlib.decompress(base64.b64decode(value)))).load())


class _StringsOnly(pickle.Unpickler):
    """Unpickles plain data only: a pickle naming any class or function is refused (no code runs)."""

    def find_class(self, module: str, name: str) -> Any:
        raise ValueError(f"refusing to unpickle {module}.{name} from a data set")


def _livecodebench_row(row: Mapping[str, Any]) -> tuple[str, tuple[TestCase, ...], str | None]:
    cases = _lcb_cases(row.get("public_test_cases")) + _lcb_cases(row.get("private_test_cases"))
    stdin_cases = [c for c in cases if c.get("testtype", "stdin") == "stdin"]
    if not stdin_cases:
        raise ValueError("no stdin tests (functional problems are not supported)")
    return row["question_content"], parse_tests(stdin_cases), None


@dataclass(frozen=True)
class CodeDatasetSpec:
    hub_id: str
    config: str | None
    split: str  # the default evaluation split
    read_row: Callable[[Mapping[str, Any]], tuple[str, tuple[TestCase, ...], str | None]]


CODE_DATASETS: dict[str, CodeDatasetSpec] = {
    "apps": CodeDatasetSpec("codeparrot/apps", "all", "test", _apps_row),
    "codecontests": CodeDatasetSpec("deepmind/code_contests", None, "test", _code_contests_row),
    "livecodebench": CodeDatasetSpec("livecodebench/code_generation_lite", "release_v5", "test",
                                     _livecodebench_row),
}


def _canonical(name: str) -> str:
    return re.sub(r"[\s_\-]", "", name.lower())


def tasks_from_rows(rows: Any, name: str, split: str) -> list[CodeTask]:
    """CodeTasks from a benchmark's rows; a row that cannot be read is an error naming it."""
    spec = CODE_DATASETS[name]
    tasks = []
    for index, row in enumerate(rows):
        try:
            question, tests, solution = spec.read_row(row)
        except (KeyError, ValueError, TypeError) as err:
            raise ValueError(f"{name} ({split}): row {index}: {err}") from None
        tasks.append(CodeTask(f"{name}-{split}-{index}", question.strip(), tests, solution, name))
    return tasks


def load_code_dataset(name: str, split: str | None = None) -> list[CodeTask]:
    """APPS, CodeContests or LiveCodeBench (stdin problems) by name, through ``datasets``."""
    key = next((k for k in CODE_DATASETS if _canonical(k) == _canonical(name)), None)
    if key is None:
        raise ValueError(f"unknown code data set {name!r}; known: {', '.join(CODE_DATASETS)}")
    spec = CODE_DATASETS[key]
    split = split or spec.split
    rows = load_hub_dataset(key, spec.hub_id, spec.config, split)
    return tasks_from_rows(rows, key, split)


def load_code_source(entry: str, split: str) -> list[CodeTask]:
    """One data source: an existing JSONL/parquet path, else a benchmark name of :data:`CODE_DATASETS`."""
    if Path(entry).exists():
        return load_code_file(entry)
    if _canonical(entry) not in {_canonical(k) for k in CODE_DATASETS}:
        raise FileNotFoundError(
            f"{split} data {entry!r}: no such file, and not a known data set ({', '.join(CODE_DATASETS)})")
    return load_code_dataset(entry, "train" if split == "train" else None)
