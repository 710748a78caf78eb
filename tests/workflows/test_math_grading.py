"""Math grading: boxed-answer extraction and mathematical comparison through math-verify."""

from __future__ import annotations

import random
import threading
import time
from concurrent.futures import ThreadPoolExecutor

import pytest

from drmas.workflows.math import extract_boxed, is_correct
from drmas.workflows.math.grading import _clear_caches

# ------------------------------------------------------------------------------------------
# extraction
# ------------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("so the answer is \\boxed{19}.", "19"),
        ("\\boxed{\\frac{\\sqrt{4}}{2}}", "\\frac{\\sqrt{4}}{2}"),
        ("\\boxed{1} and finally \\boxed{2}", "2"),
        ("\\boxed {7}", "7"),
        ("\\fbox{7}", "7"),
        ("\\boxed{\\{1,2\\}}", "\\{1,2\\}"),  # escaped braces are content, not structure
        ("\\boxed{\\{1,2}", "\\{1,2"),
        ("<think>\\boxed{1}</think>\\boxed{2}", "2"),
        ("<think>\\boxed{1}</think> no box after the thinking", None),
        ("<think>a</think><think>\\boxed{1}</think>\\boxed{3}", "3"),  # the last </think> counts
        ("\\boxed{ 5 }", "5"),
        ("\\boxed{}", ""),
        ("\\boxed{12", None),  # never closed
        ("\\boxed{8} then \\boxed{12", "8"),  # a truncated last box: the last finished one
        ("\\boxedx{3}", None),  # another macro
        ("}}}\\boxed{4}}}", "4"),
        ("no box here", None),
        ("", None),
    ],
)
def test_extract_boxed(text: str, expected: str | None) -> None:
    assert extract_boxed(text) == expected


def test_extract_boxed_nested_box_takes_the_inner_one() -> None:
    assert extract_boxed("\\boxed{\\boxed{5}}") == "5"


# ------------------------------------------------------------------------------------------
# is_correct
# ------------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("response", "truth", "expected"),
    [
        ("\\boxed{\\frac{1}{2}}", "0.5", True),
        ("\\boxed{0.5}", "\\frac{1}{2}", True),
        ("\\boxed{19}", "19", True),
        ("\\boxed{18}", "19", False),
        ("\\boxed{\\frac{\\sqrt{4}}{2}}", "1", True),
        ("\\boxed{18} no wait, \\boxed{19}", "19", True),
        ("\\boxed{19} no wait, \\boxed{18}", "19", False),
        ("<think>maybe \\boxed{18}</think> The answer is \\boxed{19}.", "19", True),
        ("<think>maybe \\boxed{19}</think> The answer is \\boxed{18}.", "19", False),
        ("The answer is 19.", "19", False),
        ("\\boxed{(1, 2]}", "(1,2]", True),
        ("\\boxed{(1, 2]}", "[1,2]", False),
        ("\\boxed{\\{1,2\\}}", "\\{2,1\\}", True),
        ("\\boxed{\\{1,2\\}}", "\\{1,2,3\\}", False),
        ("\\boxed{3/4}", "3/4", True),
        ("\\boxed{\\frac{3}{4}}", "3/4", True),
        ("\\boxed{\\dfrac34}", "3/4", True),
        ("\\boxed{0.75}", "3/4", True),
        ("\\boxed{4/3}", "3/4", False),
        ("\\boxed{5/2}", "5/2", True),
        ("\\boxed{2 1/2}", "5/2", True),  # a mixed number
        ("\\boxed{19.}", "19", True),  # a trailing period
        ("\\boxed{１９}", "19", True),  # full-width digits
        ("\\boxed{$19$}", "19", True),
        ("\\boxed{19 apples}", "19", True),
        ("\\boxed{18, 19}", "19", False),  # hedging with two answers is wrong
        ("\\boxed {19}", "19", True),
        ("\\fbox{19}", "19", True),
        ("\\boxed{x^2+1}", "1+x^2", True),
        ("\\boxed{}", "19", False),
        ("\\boxed{19", "19", False),  # unbalanced
        ("\\boxed{\\frac{1}{2}", "0.5", False),
        ("}\\boxed{{19}", "19", False),
    ],
)
def test_is_correct(response: str, truth: str, expected: bool) -> None:
    assert is_correct(response, truth) is expected


@pytest.mark.parametrize(
    "response",
    [
        "\\boxed{10^{10^{10}}}",  # sympy would build a 10-billion-digit integer
        "\\boxed{(9!)!}",
        "\\boxed{2^{2^{2^{2^{2^{2}}}}}}",
        "\\boxed{\\prod_{i=1}^{10^{9}} i}",
    ],
)
def test_huge_values_are_refused_quickly(response: str) -> None:
    # this process's CPU time, not the wall clock: a busy machine (pytest's other worker) cannot
    # make these bounds fail; an answer that reached sympy would take hours, not seconds
    start = time.process_time()
    assert is_correct(response, "19") is False
    assert time.process_time() - start < 2.0


def test_moderately_large_values_still_compare() -> None:
    assert is_correct("\\boxed{2^{100}}", str(2**100))
    assert is_correct("\\boxed{10!}", "3628800")


def test_malformed_output_never_raises() -> None:
    rng = random.Random(0)
    alphabet = "\\{}[]()^_$boxedfrac0123456789 é中😀\u200b\x00</think>"
    garbage = "".join(rng.choice(alphabet) for _ in range(10_000))
    start = time.process_time()
    assert is_correct(garbage, "19") is False
    assert is_correct("\\boxed{" * 3000, "19") is False
    assert is_correct("\\boxed{" + "(" * 5000 + "}", "19") is False
    assert is_correct("\\boxed{" + "1" * 5000 + "}", "19") is False  # over the length cap
    assert is_correct("\\boxed{\\frac{}{}}", "19") is False
    assert is_correct("\\boxed{\udcff}", "19") is False  # a lone surrogate
    assert time.process_time() - start < 5.0
    assert is_correct(None, "19") is False  # type: ignore[arg-type]
    assert extract_boxed(None) is None  # type: ignore[arg-type]


def test_grading_is_fast() -> None:
    _clear_caches()
    is_correct("\\boxed{1}", "1")  # warm-up: math-verify loads its grammar once
    pairs = [(f"\\boxed{{{i}/{i + 2}}}", f"{i}/{i + 2}") for i in range(1, 41)]
    start = time.process_time()
    assert all(is_correct(r, t) for r, t in pairs)
    per_pair = (time.process_time() - start) / len(pairs)
    assert per_pair < 0.1, f"{per_pair * 1000:.1f} ms per pair"


def _pairs() -> list[tuple[str, str]]:
    """200 distinct pairs, about half of them right, of several kinds of answer."""
    pairs = []
    for i in range(1, 51):
        pairs += [
            (f"\\boxed{{{i}}}", str(i if i % 3 else i + 1)),
            (f"<think>\\boxed{{0}}</think>\\boxed{{\\frac{{{i}}}{{{i + 1}}}}}", f"{i}/{i + 1}"),
            (f"\\boxed{{({i}, {i + 1}]}}", f"[{i},{i + 1}]" if i % 2 else f"({i},{i + 1}]"),
            (f"\\boxed{{{i}.5}}", f"{2 * i + 1}/2"),
        ]
    return pairs


def test_threads_give_the_same_results_as_sequential_grading() -> None:
    pairs = _pairs()
    _clear_caches()
    sequential = [is_correct(r, t) for r, t in pairs]
    assert 50 < sum(sequential) < 200
    _clear_caches()  # parse again, concurrently
    threads: set[int] = set()

    def grade(pair: tuple[str, str]) -> bool:
        threads.add(threading.get_ident())
        return is_correct(*pair)

    with ThreadPoolExecutor(max_workers=8) as pool:
        concurrent = list(pool.map(grade, pairs))
    assert concurrent == sequential
    assert threading.main_thread().ident not in threads
