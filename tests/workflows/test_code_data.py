"""The code workflow's data and judge: the embedded problems pass their own golden tests in the
sandbox, the judge's verdicts, and the loaders (files, APPS, CodeContests, LiveCodeBench rows)."""

import base64
import json
import pickle
import zlib

import pytest

from drmas.workflows.code import Judge, TestCase, embedded_problems, load_code_file
from drmas.workflows.code.loaders import load_code_source, parse_tests, tasks_from_rows
from drmas.workflows.sandbox import SandboxSettings


@pytest.fixture(scope="module")
def judge():
    j = Judge(SandboxSettings(time_limit_s=1.0, workers=2))
    yield j
    j.close()


@pytest.mark.integration  # every shipped problem's solution through the sandbox (~13 s of processes)
def test_the_embedded_problems_pass_their_own_golden_tests(judge):
    splits = {s: embedded_problems(s) for s in ("train", "val", "test")}
    assert {s: len(t) for s, t in splits.items()} == {"train": 44, "val": 10, "test": 10}
    tasks = [t for ts in splits.values() for t in ts]
    assert len({t.uid for t in tasks}) == 64 and len({t.question for t in tasks}) == 64
    assert all(len(t.tests) >= 5 and t.solution for t in tasks)
    runs = judge.run([(t.solution, t.tests) for t in tasks])
    failing = [(t.uid, v) for t, run in zip(tasks, runs) for v in run if not v.passed]
    assert failing == []
    # and the tests tell programs apart: printing the first expected output fails somewhere
    constant = judge.run([(f"print({t.tests[0].output.strip()!r})", t.tests) for t in tasks])
    assert all(not all(v.passed for v in run) for run in constant)


def test_verdicts(judge):
    add = "a, b = map(int, input().split())\nprint(a + b)"
    tests = [TestCase("1 2\n", "3\n"), TestCase("5 5\n", "10"), TestCase("0 0\n", "1\n")]
    ok, loop, flood, syntax, crash, none, forked = judge.run([
        (add, tests), ("while True: pass", tests), ("print('x' * (2 << 20))", tests[:1]),
        ("def f(:", tests[:1]), ("raise ValueError('bad input')", tests[:1]), (None, tests[:1]),
        ("import os\nos.fork()\nprint(3)", tests[:1]),
    ])
    assert [v.passed for v in ok] == [True, True, False] and ok[2].output == "0\n"  # "10" == "10\n": tokens
    # after two timeouts the rest is not run (a looping program costs two limits)
    assert [v.status for v in loop] == ["timeout"] * 3 and loop[2].error == "not run after two timeouts"
    assert flood[0].status == "truncated" and not flood[0].passed  # past 1 MiB: never a pass
    assert syntax[0].status == "error" and syntax[0].error.startswith("SyntaxError")
    assert crash[0].status == "error" and crash[0].error == "ValueError: bad input"
    assert none[0].status == "no program" and not none[0].passed
    assert forked[0].output == "3\n3\n" and not forked[0].passed  # a forked child's output counts too


def test_tests_run_in_fresh_processes_and_compare_tokens(judge):
    leak = "import builtins\nprint(getattr(builtins, 'seen', 0))\nbuiltins.seen = 1"
    spaced = "print('1  2')\nprint()\nprint('3')"
    (fresh,), (tokens,) = judge.run([(leak, [TestCase("", "0"), TestCase("", "0")])]), judge.run([
        (spaced, [TestCase("", "1 2 3\n")])])
    assert [v.passed for v in fresh] == [True, True] and tokens[0].passed


def test_a_jsonl_file_in_both_test_formats(tmp_path):
    path = tmp_path / "mine.jsonl"
    rows = [
        {"question": "Echo.", "solution": "print(input())", "tests": [{"input": "a\n", "output": "a\n"}]},
        {"question": "Twice.", "tests": {"inputs": ["2\n", "3\n"], "outputs": ["4\n", "6\n"]}},
    ]
    path.write_text("\n".join(json.dumps(r) for r in rows) + "\n")
    first, second = load_code_file(path)
    assert first.uid == "mine-0" and first.source == "mine" and first.tests == (TestCase("a\n", "a\n"),)
    assert second.solution is None and second.tests == (TestCase("2\n", "4\n"), TestCase("3\n", "6\n"))


@pytest.mark.parametrize("row, message", [
    ({"tests": []}, "line 1 has no question text"),
    ({"question": "Q"}, "line 1 has no 'tests'"),
    ({"question": "Q", "tests": [{"input": "1"}]}, "line 1, field 'tests': each test needs"),
    ({"question": "Q", "tests": {"inputs": ["1"], "outputs": []}}, "same length"),
    ({"question": "Q", "tests": [{"input": "1", "output": "1"}], "solution": ""}, "'solution' must be"),
])
def test_bad_rows_are_named(tmp_path, row, message):
    path = tmp_path / "bad.jsonl"
    path.write_text(json.dumps(row) + "\n")
    with pytest.raises(ValueError, match=message) as err:
        load_code_file(path)
    assert str(path) in str(err.value)


def test_a_missing_file_or_unknown_name_is_named():
    with pytest.raises(FileNotFoundError, match="'nope.jsonl': no such file, and not a known data set"):
        load_code_source("nope.jsonl", "train")


def test_benchmark_rows_in_their_own_formats():
    apps = {"question": "Add.", "solutions": json.dumps(["print(sum(map(int, input().split())))"]),
            "input_output": json.dumps({"inputs": ["1 2\n"], "outputs": ["3\n"]})}
    (task,) = tasks_from_rows([apps], "apps", "test")
    assert (task.uid == "apps-test-0" and task.solution.startswith("print")
            and task.tests == (TestCase("1 2\n", "3\n"),))

    contests = {"description": "Add.", "public_tests": {"input": ["1 2\n"], "output": ["3\n"]},
                "private_tests": {"input": ["2 2\n"], "output": ["4\n"]}, "generated_tests": None,
                "solutions": {"language": [2, 3], "solution": ["// c++", "print(3)"]}}
    (task,) = tasks_from_rows([contests], "codecontests", "test")
    assert task.solution == "print(3)" and len(task.tests) == 2  # the Python 3 solution (language 3)

    private = [{"input": "5\n", "output": "25\n", "testtype": "stdin"}]
    packed = base64.b64encode(zlib.compress(pickle.dumps(json.dumps(private)))).decode()
    lcb = {"question_content": "Square.", "private_test_cases": packed,
           "public_test_cases": json.dumps([{"input": "2\n", "output": "4\n", "testtype": "stdin"},
                                            {"input": "f(2)", "output": "4", "testtype": "functional"}])}
    (task,) = tasks_from_rows([lcb], "livecodebench", "test")
    assert task.solution is None and task.tests == (TestCase("2\n", "4\n"), TestCase("5\n", "25\n"))

    class Evil:
        def __reduce__(self):
            return (print, ("pwned",))

    evil = dict(lcb, private_test_cases=base64.b64encode(zlib.compress(pickle.dumps(Evil()))).decode())
    with pytest.raises(ValueError, match="row 0: refusing to unpickle builtins.print"):
        tasks_from_rows([evil], "livecodebench", "test")


def test_parse_tests_rejects_what_it_cannot_read():
    with pytest.raises(ValueError, match="no tests"):
        parse_tests([])
    with pytest.raises(ValueError, match="must be a list or an object"):
        parse_tests(3)


def test_a_benchmark_by_name_through_the_real_datasets_library(monkeypatch, tmp_path):
    """APPS rows in their own format, read by ``datasets`` from a local file standing in for the hub."""
    datasets = pytest.importorskip("datasets")
    from drmas.workflows.code import load_code_dataset

    path = tmp_path / "apps.jsonl"
    path.write_text(json.dumps({"question": "Add two numbers.",
                                "solutions": json.dumps(["print(sum(map(int, input().split())))"]),
                                "input_output": json.dumps({"inputs": ["1 2\n"], "outputs": ["3\n"]})})
                    + "\n")
    real, calls = datasets.load_dataset, []

    def local(path_or_id, name=None, split=None):
        calls.append((path_or_id, name, split))
        if path_or_id != "codeparrot/apps":
            raise ConnectionError(f"Couldn't reach {path_or_id!r} on the Hub")
        return real("json", data_files=str(path), split="train", cache_dir=str(tmp_path / "cache"))

    monkeypatch.setattr(datasets, "load_dataset", local)
    (task,) = load_code_dataset("APPS")
    assert calls == [("codeparrot/apps", "all", "test")] and task.tests == (TestCase("1 2\n", "3\n"),)
    with pytest.raises(RuntimeError, match=r"could not load 'codecontests' \(deepmind/code_contests, split "
                                           r"'test'\): it needs network access"):
        load_code_dataset("codecontests")


def test_many_noisy_tests_still_fit_the_report(judge):
    """64 tests whose output and error are long control characters: the report is shortened
    to the sandbox's output cap, the verdicts stay."""
    noisy = "print('\\x01' * 300)\nraise ValueError('\\x02' * 300)"
    (run,) = judge.run([(noisy, [TestCase(f"{i}\n", "x") for i in range(64)])])
    assert len(run) == 64 and {v.status for v in run} == {"error"} and run[0].error.startswith("ValueError")
