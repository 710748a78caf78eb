"""Bad data files are refused at load time with the file, the row and the field named: a parquet
file missing a column, a task whose answer is empty, a 1 MB prompt."""

import json
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from drmas.workflows.code.loaders import load_code_file
from drmas.workflows.files import MAX_PROMPT_CHARS
from drmas.workflows.math.loaders import load_math_file
from drmas.workflows.search.data import load_search_r1

TESTS = {"inputs": ["1\n"], "outputs": ["1\n"]}
GOOD = {
    "search": {"question": "who wrote it?", "golden_answers": ["Ann"]},
    "math": {"problem": "1 + 1?", "answer": "2"},
    "code": {"question": "echo the input", "tests": TESTS},
}
LOAD = {"search": load_search_r1, "math": load_math_file, "code": load_code_file}
PROMPT = {"search": "question", "math": "problem", "code": "question"}


def write_jsonl(path: Path, rows: list[dict]) -> Path:
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return path


@pytest.mark.parametrize("kind", ["search", "math", "code"])
def test_a_parquet_file_missing_a_column_is_refused_before_any_row(tmp_path, kind):
    row = dict(GOOD[kind])
    del row[PROMPT[kind]]
    row["other"] = "x"
    path = tmp_path / "set.parquet"
    pq.write_table(pa.Table.from_pylist([{**row, "tests": json.dumps(TESTS)} if kind == "code" else row]),
                   path)
    with pytest.raises(ValueError, match=rf"set\.parquet has no column '{PROMPT[kind]}' "
                                         r"\(its columns: .*other"):
        LOAD[kind](path)


@pytest.mark.parametrize("kind", ["search", "math", "code"])
def test_a_one_megabyte_prompt_is_refused_naming_the_line(tmp_path, kind):
    huge = dict(GOOD[kind], **{PROMPT[kind]: "why? " * 210_000})  # 1.05 MB
    path = write_jsonl(tmp_path / "set.jsonl", [GOOD[kind], GOOD[kind], huge])
    with pytest.raises(ValueError, match=rf"set\.jsonl: line 3, field '{PROMPT[kind]}' "
                                         r"holds 1,050,000 characters, "
                                         rf"more than the {MAX_PROMPT_CHARS:,}"):
        LOAD[kind](path)
    assert len(LOAD[kind](write_jsonl(tmp_path / "ok.jsonl", [GOOD[kind]] * 2))) == 2


@pytest.mark.parametrize(("kind", "empty", "why"), [
    ("search", {"golden_answers": []}, "has no answers"),
    ("search", {"golden_answers": ["  "]}, "has no answers"),
    ("math", {"answer": ""}, "has no answer in 'answer'"),
    ("math", {"answer": None}, "has no answer in 'answer'"),
    ("code", {"tests": {"inputs": [], "outputs": []}}, "field 'tests': no tests"),
])
def test_a_task_with_an_empty_answer_is_refused_naming_the_line(tmp_path, kind, empty, why):
    path = write_jsonl(tmp_path / "set.jsonl", [GOOD[kind], dict(GOOD[kind], **empty)])
    with pytest.raises(ValueError, match=rf"set\.jsonl: line 2.*{why}"):
        LOAD[kind](path)
