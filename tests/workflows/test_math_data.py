"""Math data: the generated arithmetic problems, file loaders and the benchmark registry."""

from __future__ import annotations

import json
import sys
import types
from collections import Counter
from fractions import Fraction
from pathlib import Path
from typing import Any

import pytest

from drmas.workflows.math import is_correct
from drmas.workflows.math.loaders import MATH_DATASETS, gsm8k_final_answer, load_math_dataset, load_math_file
from drmas.workflows.math.problems import _make_problem, _solve, arithmetic_word_problems
from drmas.workflows.math.splits import math_splits
from drmas.workflows.math.task import MathTask

ANA = ("Ana", "she", "her", "her")

# ------------------------------------------------------------------------------------------
# generated problems
# ------------------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def splits() -> dict[str, tuple[MathTask, ...]]:
    return arithmetic_word_problems(seed=0)


def test_sizes_and_fields(splits: dict[str, tuple[MathTask, ...]]) -> None:
    assert {k: len(v) for k, v in splits.items()} == {"train": 2000, "val": 100, "test": 100}
    uids = [t.uid for tasks in splits.values() for t in tasks]
    assert len(set(uids)) == len(uids)
    for task in splits["test"]:
        assert task.source == "arithmetic"
        assert task.problem.endswith("?")
        assert Fraction(task.answer) > 0


def test_deterministic_from_the_seed(splits: dict[str, tuple[MathTask, ...]]) -> None:
    assert arithmetic_word_problems(seed=0) == splits
    other = arithmetic_word_problems(seed=1, train_size=50, val_size=10, test_size=10)
    assert [t.problem for t in other["test"]] != [t.problem for t in splits["test"][:10]]
    assert arithmetic_word_problems(seed=1, train_size=50, val_size=10, test_size=10) == other


def test_splits_are_disjoint(splits: dict[str, tuple[MathTask, ...]]) -> None:
    texts = {name: {t.problem for t in tasks} for name, tasks in splits.items()}
    assert sum(map(len, texts.values())) == sum(map(len, splits.values()))  # no repeats inside
    assert not texts["train"] & texts["val"]
    assert not texts["train"] & texts["test"]
    assert not texts["val"] & texts["test"]


def test_every_split_mixes_difficulties(splits: dict[str, tuple[MathTask, ...]]) -> None:
    for tasks in splits.values():
        counts = Counter(t.difficulty for t in tasks)
        assert set(counts) == {1, 2, 3, 4}
        assert counts[1] >= 0.3 * len(tasks)  # plenty of one-step problems
    small = arithmetic_word_problems(seed=3, train_size=4, val_size=5, test_size=3)
    assert {t.difficulty for t in small["train"]} == {1, 2, 3, 4}
    assert {t.difficulty for t in small["val"]} == {1, 2, 3, 4}


def test_one_step_problems_use_small_numbers(splits: dict[str, tuple[MathTask, ...]]) -> None:
    easy = [t for t in splits["train"] if t.difficulty == 1]
    assert all(Fraction(t.answer) <= 60 for t in easy)
    assert sum(Fraction(t.answer).denominator == 1 for t in easy) > 0.6 * len(easy)


def test_answers_are_whole_numbers_or_reduced_fractions(splits: dict[str, tuple[MathTask, ...]]) -> None:
    answers = [t.answer for t in splits["train"]]
    assert any("/" in a for a in answers) and any("/" not in a for a in answers)
    for answer in answers:
        num, den = Fraction(answer).numerator, Fraction(answer).denominator
        expected = str(num) if den == 1 else f"{num}/{den}"
        assert answer == expected


def test_every_answer_grades_correct_when_boxed(splits: dict[str, tuple[MathTask, ...]]) -> None:
    for task in splits["train"]:
        assert is_correct(f"So the answer is \\boxed{{{task.answer}}}.", task.answer), task
        value = Fraction(task.answer)
        if value.denominator != 1:
            latex = f"\\frac{{{value.numerator}}}{{{value.denominator}}}"
            assert is_correct(f"\\boxed{{{latex}}}", task.answer), task
        assert not is_correct(f"\\boxed{{{value + 1}}}", task.answer), task


def test_a_hand_checked_story() -> None:
    # 12 apples, 5 more, 3 eaten: 14; shared among 4 friends: 14/4 = 7/2.
    text, answer = _make_problem("fruit", ANA, 12, [("add", 5), ("sub", 3), ("share", 4)], noun="apples")
    assert text == (
        "Ana has 12 apples. She picks 5 more apples. She eats 3 of them. "
        "She shares the apples equally among 4 friends. How many apples does each friend get?"
    )
    assert answer == Fraction(7, 2)


def test_a_hand_checked_measuring_story() -> None:
    # 3 scoops of 3/4 cup = 9/4; add 1/2 -> 11/4; double -> 11/2; one of 2 jars back -> 11/4.
    text, answer = _make_problem(
        "recipe", ANA, 3, [("group", Fraction(3, 4)), ("add", Fraction(1, 2)), ("mul", 2), ("div", 2)],
        noun="sugar",
    )
    assert text.startswith("Ana fills a bowl with 3 scoops of sugar, each scoop holding 3/4 cup. ")
    assert "She adds 1/2 more cup of sugar." in text
    assert "2 times as large" in text and "into 2 jars" in text
    assert text.endswith("How many cups of sugar are in the bowl now?")
    assert answer == Fraction(11, 4)


def test_solve_applies_operations_in_order() -> None:
    ops = [("sub", 4), ("mul", 3), ("div", 9), ("add", Fraction(1, 3))]
    assert _solve(Fraction(10), ops) == Fraction(7, 3)  # (10 - 4) * 3 / 9 + 1/3
    assert _solve(Fraction(2), [("group", 6), ("share", 4)]) == 3
    with pytest.raises(ValueError, match="unknown operation"):
        _solve(Fraction(1), [("pow", 2)])


def test_misplaced_operations_are_rejected() -> None:
    with pytest.raises(ValueError, match="last operation"):
        _make_problem("fruit", ANA, 6, [("share", 2), ("add", 1)])
    with pytest.raises(ValueError, match="first operation"):
        _make_problem("fruit", ANA, 6, [("add", 1), ("group", 2)])
    with pytest.raises(ValueError, match="no template"):
        _make_problem("juice", ANA, 6, [("mul", 2)])


def test_sizes_are_validated() -> None:
    with pytest.raises(ValueError, match="val_size"):
        arithmetic_word_problems(val_size=-1)
    assert arithmetic_word_problems(train_size=0, val_size=0, test_size=1)["train"] == ()


# ------------------------------------------------------------------------------------------
# files
# ------------------------------------------------------------------------------------------


def _write_jsonl(path: Path, rows: list[Any]) -> Path:
    path.write_text("".join(json.dumps(r) + "\n" for r in rows) + "\n", encoding="utf-8")
    return path


def test_load_math_file_jsonl(tmp_path: Path) -> None:
    path = _write_jsonl(tmp_path / "mine.jsonl", [
        {"problem": " What is 1+1? ", "answer": 2},
        {"problem": "Half of 1?", "answer": "\\frac{1}{2}"},
        {"problem": "A float", "answer": 27.0},
    ])
    tasks = load_math_file(path)
    assert tasks == [
        MathTask(uid="mine-0", problem="What is 1+1?", answer="2", source="mine"),
        MathTask(uid="mine-1", problem="Half of 1?", answer="\\frac{1}{2}", source="mine"),
        MathTask(uid="mine-2", problem="A float", answer="27", source="mine"),
    ]
    assert load_math_file(path, source="x")[0].uid == "x-0"


def test_load_math_file_other_keys_and_nested_answers(tmp_path: Path) -> None:
    path = _write_jsonl(tmp_path / "verl.jsonl", [{"prompt": "p", "reward_model": {"ground_truth": "7"}}])
    (task,) = load_math_file(path, problem_key="prompt", answer_key="reward_model.ground_truth")
    assert (task.problem, task.answer) == ("p", "7")


def test_load_math_file_errors(tmp_path: Path) -> None:
    missing = tmp_path / "nope.jsonl"
    with pytest.raises(FileNotFoundError, match="nope.jsonl"):
        load_math_file(missing)
    path = _write_jsonl(tmp_path / "bad.jsonl", [{"problem": "a", "answer": "1"}, {"problem": "b"}])
    with pytest.raises(ValueError, match=r"bad\.jsonl: line 2 has no answer in 'answer'"):
        load_math_file(path)
    path = _write_jsonl(tmp_path / "bad2.jsonl", [{"question": "a", "answer": "1"}])
    with pytest.raises(ValueError, match=r"bad2\.jsonl: line 1 has no problem text in 'problem'"):
        load_math_file(path)
    path = tmp_path / "broken.jsonl"
    path.write_text('{"problem": "a", "answer": "1"}\n{not json\n', encoding="utf-8")
    with pytest.raises(ValueError, match=r"broken\.jsonl: line 2 is not valid JSON"):
        load_math_file(path)


def test_load_math_file_parquet(tmp_path: Path) -> None:
    pa = pytest.importorskip("pyarrow")
    pq = pytest.importorskip("pyarrow.parquet")
    path = tmp_path / "set.parquet"
    pq.write_table(pa.table({"question": ["q0", "q1"], "final": ["3", None]}), path)
    with pytest.raises(ValueError, match=r"set\.parquet: row 1 has no answer in 'final'"):
        load_math_file(path, problem_key="question", answer_key="final")
    pq.write_table(pa.table({"question": ["q0"], "final": ["3"]}), path)
    assert load_math_file(path, problem_key="question", answer_key="final") == [
        MathTask(uid="set-0", problem="q0", answer="3", source="set")
    ]


def test_load_math_file_parquet_without_pyarrow(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    path = tmp_path / "set.parquet"
    path.write_bytes(b"PAR1")
    monkeypatch.setitem(sys.modules, "pyarrow", None)
    monkeypatch.setitem(sys.modules, "pyarrow.parquet", None)
    with pytest.raises(ImportError, match=r"pip install 'drmas\[parquet\]'"):
        load_math_file(path)


# ------------------------------------------------------------------------------------------
# benchmarks by name
# ------------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("solution", "expected"),
    [
        ("She has 3 + 4 = <<3+4=7>>7 apples.\n#### 7", "7"),
        ("It costs 1,200 dollars.\n#### 1,200", "1200"),
        ("#### -3", "-3"),
        ("#### 2.5", "2.5"),
        ("#### $18.", "18"),
        ("a #### 1 then #### 5", "5"),  # the last marker
    ],
)
def test_gsm8k_final_answer(solution: str, expected: str) -> None:
    assert gsm8k_final_answer(solution) == expected


@pytest.mark.parametrize("bad", ["no marker at all", "#### ", ""])
def test_gsm8k_final_answer_rejects_malformed(bad: str) -> None:
    with pytest.raises(ValueError, match="GSM8K"):
        gsm8k_final_answer(bad)


def test_registry_covers_the_usual_benchmarks() -> None:
    assert set(MATH_DATASETS) == {"dapo-math-17k", "math-500", "aime-2024", "aime-2025", "olympiadbench",
                                  "amc23", "gsm8k"}
    for spec in MATH_DATASETS.values():
        assert spec.hub_id.count("/") == 1 and spec.problem_field and spec.answer_field and spec.split


def test_unknown_name_lists_the_known_ones() -> None:
    with pytest.raises(ValueError, match=r"unknown math data set 'math-5000'.*math-500.*gsm8k"):
        load_math_dataset("math-5000")


def _fake_datasets(monkeypatch: pytest.MonkeyPatch, rows: list[dict[str, Any]] | Exception) -> list[tuple]:
    """Install a stand-in ``datasets`` module; returns the calls it receives."""
    calls: list[tuple] = []

    def load_dataset(path: str, name: str | None = None, split: str | None = None) -> list[dict[str, Any]]:
        calls.append((path, name, split))
        if isinstance(rows, Exception):
            raise rows
        return rows

    module = types.ModuleType("datasets")
    module.load_dataset = load_dataset  # type: ignore[attr-defined]
    monkeypatch.setitem(sys.modules, "datasets", module)
    return calls


def test_load_by_name_maps_fields(monkeypatch: pytest.MonkeyPatch) -> None:
    calls = _fake_datasets(monkeypatch, [{"question": "Q?", "answer": "steps\n#### 1,000", "extra": 1}])
    (task,) = load_math_dataset("GSM8K")
    assert calls == [("openai/gsm8k", "main", "test")]
    assert task == MathTask(uid="gsm8k-test-0", problem="Q?", answer="1000", source="gsm8k")
    load_math_dataset("gsm8k", split="train")
    assert calls[-1] == ("openai/gsm8k", "main", "train")


@pytest.mark.parametrize(
    ("name", "row", "answer"),
    [
        ("MATH-500", {"problem": "p", "answer": "\\frac{\\pi}{2}"}, "\\frac{\\pi}{2}"),
        ("math_500", {"problem": "p", "answer": "3"}, "3"),
        ("AIME 2024", {"problem": "p", "answer": "204"}, "204"),
        ("aime-2025", {"problem": "p", "answer": "70"}, "70"),
        ("amc23", {"question": "p", "answer": 27.0}, "27"),
        ("OlympiadBench", {"question": "p", "final_answer": ["$\\frac{1}{2}$"]}, "\\frac{1}{2}"),
        ("olympiadbench", {"question": "p", "final_answer": ["$1$", "$2$"]}, "1, 2"),
        ("DAPO-Math-17k", {"prompt": "p", "solution": "34"}, "34"),
    ],
)
def test_answer_post_processing(
    monkeypatch: pytest.MonkeyPatch, name: str, row: dict[str, Any], answer: str
) -> None:
    _fake_datasets(monkeypatch, [row])
    (task,) = load_math_dataset(name)
    assert task.answer == answer
    assert is_correct(f"\\boxed{{{answer}}}", task.answer)


def test_load_by_name_reports_bad_rows(monkeypatch: pytest.MonkeyPatch) -> None:
    rows = [{"question": "ok", "answer": "#### 1"}, {"question": "Q", "answer": "no marker"}]
    _fake_datasets(monkeypatch, rows)
    with pytest.raises(ValueError, match=r"gsm8k \(test\): row 1, field 'answer'"):
        load_math_dataset("gsm8k")


def test_offline_failure_names_the_data_set(monkeypatch: pytest.MonkeyPatch) -> None:
    _fake_datasets(monkeypatch, ConnectionError("Couldn't reach 'HuggingFaceH4/MATH-500' on the Hub"))
    expected = r"'math-500' \(HuggingFaceH4/MATH-500.*network.*local datasets cache"
    with pytest.raises(RuntimeError, match=expected):
        load_math_dataset("math-500")


def test_missing_datasets_library(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(sys.modules, "datasets", None)
    with pytest.raises(ImportError, match=r"pip install 'drmas\[hub\]'"):
        load_math_dataset("gsm8k")


def test_registry_with_the_real_datasets_library(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    """The mapping applied to a real ``datasets.Dataset`` read from a local JSON file."""
    datasets = pytest.importorskip("datasets")
    path = _write_jsonl(tmp_path / "gsm8k.jsonl", [
        {"question": "Tom has 3 apples and buys 4. How many?", "answer": "3 + 4 = 7\n#### 7"},
        {"question": "Twice 600?", "answer": "2 * 600 = 1200\n#### 1,200"},
    ])
    real = datasets.load_dataset
    calls = []

    def local(path_or_id: str, name: str | None = None, split: str | None = None) -> Any:
        calls.append((path_or_id, name, split))
        return real("json", data_files=str(path), split="train", cache_dir=str(tmp_path / "cache"))

    monkeypatch.setattr(datasets, "load_dataset", local)
    tasks = load_math_dataset("gsm8k")
    assert calls == [("openai/gsm8k", "main", "test")]
    assert [(t.problem, t.answer) for t in tasks] == [
        ("Tom has 3 apples and buys 4. How many?", "7"), ("Twice 600?", "1200")
    ]


# ------------------------------------------------------------------------------------------
# the splits of a workflow
# ------------------------------------------------------------------------------------------


def test_math_splits_mix_files_names_and_the_embedded_problems(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    a, b = tmp_path / "a.jsonl", tmp_path / "b.jsonl"
    a.write_text(json.dumps({"problem": "1+1?", "answer": "2"}) + "\n")
    b.write_text(json.dumps({"problem": "2+2?", "answer": "4"}) + "\n"
                 + json.dumps({"problem": "3+3?", "answer": "6"}) + "\n")
    _fake_datasets(monkeypatch, [{"question": "Q?", "answer": "#### 7"}])
    splits = math_splits(0, train=str(a), val=[str(a), str(b), "gsm8k"])
    assert [t.source for t in splits["train"]] == ["a"]
    assert ([(t.source, t.answer) for t in splits["val"]]
            == [("a", "2"), ("b", "4"), ("b", "6"), ("gsm8k", "7")])
    assert splits["test"] == arithmetic_word_problems(seed=0)["test"]  # not given: embedded


def test_math_splits_errors(tmp_path: Path) -> None:
    with pytest.raises(FileNotFoundError, match=r"val data 'nope.jsonl': no such file.*math-500"):
        math_splits(val="nope.jsonl")
    a = tmp_path / "a.jsonl"
    a.write_text(json.dumps({"problem": "1+1?", "answer": "2"}) + "\n")
    with pytest.raises(ValueError, match="duplicate task uids"):
        math_splits(val=[str(a), str(a)])
