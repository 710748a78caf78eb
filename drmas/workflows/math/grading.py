"""Grading of math answers: the last ``\\boxed{...}`` of a response against a ground truth.

Parsing and comparison are done by ``math-verify`` so that ``0.5``, ``1/2`` and ``\\frac{1}{2}``
(or two spellings of an interval or a set) compare as equal. math-verify's own timeouts use
``signal.alarm``, which only works in the main thread; rollouts are graded from worker
threads, so they are switched off here (``parsing_timeout=None``, ``timeout_seconds=None``).
To keep a hostile or degenerate answer from hanging a thread without a timeout, answers are
capped in length and every parsed expression is checked for a size blow-up
(``10^{10^{10}}``, ``(9!)!``) before sympy is asked to evaluate it.
"""

from __future__ import annotations

import logging
import math
import re
import unicodedata
from functools import lru_cache
from typing import Any

import sympy
from math_verify import parse, verify

from drmas.workflows.base import GraderError

__all__ = ["extract_boxed", "is_correct", "same_answer"]

#: Longer boxed answers are graded wrong without parsing (no benchmark answer is this long).
MAX_ANSWER_CHARS = 1000
#: Expressions whose value may have more decimal digits than this are not evaluated.
MAX_RESULT_DIGITS = 10_000.0

_BOX_COMMANDS = ("\\boxed", "\\fbox")
_ZERO_WIDTH = dict.fromkeys(map(ord, "\u200b\u200c\u200d\u2060\ufeff"))
_MIXED_NUMBER = re.compile(r"^(\d+)\s+(\d+)\s*/\s*(\d+)$")


class _DropTimeoutWarning(logging.Filter):
    """math-verify warns once that its timeout is off; that is deliberate here (see above)."""

    def filter(self, record: logging.LogRecord) -> bool:
        return not record.getMessage().startswith("Timeout is disabled")


for _name in ("math_verify.parser", "math_verify.grader"):
    logging.getLogger(_name).addFilter(_DropTimeoutWarning())


# ---------------------------------------------------------------------------------------------
# Extraction
# ---------------------------------------------------------------------------------------------


def _strip_think(text: str) -> str:
    """Keep only what follows the last ``</think>``: answers inside the reasoning do not count."""
    head, sep, tail = text.rpartition("</think>")
    return tail if sep else text


def _box_opening(text: str, i: int) -> int:
    """If a box command starts at ``text[i]``, the index just after its ``{``; else -1."""
    for cmd in _BOX_COMMANDS:
        if text.startswith(cmd, i):
            j = i + len(cmd)
            while j < len(text) and text[j] in " \t\n":
                j += 1
            return j + 1 if j < len(text) and text[j] == "{" else -1
    return -1


def _last_box(text: str) -> str | None:
    """Content of the last complete ``\\boxed{...}`` / ``\\fbox{...}``, in one linear scan.

    Braces are matched by counting (a regex cannot balance nested braces); a backslash
    escapes the next non-letter, so ``\\{`` ``\\}`` are content, not structure. A box that
    never closes (a truncated response) is ignored: the answer is the last *finished* box.
    """
    n = len(text)
    depth = 0
    open_boxes: list[tuple[int, int]] = []  # (depth of the box's opening brace, content start)
    best: tuple[int, str] | None = None  # (content start, content) of the latest-starting box
    i = 0
    while i < n:
        ch = text[i]
        if ch == "\\":
            if i + 1 < n and not text[i + 1].isalpha():
                i += 2
                continue
            opened = _box_opening(text, i)
            if opened >= 0:
                depth += 1
                open_boxes.append((depth, opened))
                i = opened
                continue
        elif ch == "{":
            depth += 1
        elif ch == "}" and depth > 0:
            if open_boxes and open_boxes[-1][0] == depth:
                _, start = open_boxes.pop()
                if best is None or start > best[0]:
                    best = (start, text[start:i])
            depth -= 1
        i += 1
    return None if best is None else best[1]


def extract_boxed(text: str) -> str | None:
    """The content of the last boxed answer after any ``</think>`` block, stripped; else None."""
    if not isinstance(text, str):
        return None
    box = _last_box(_strip_think(text))
    return None if box is None else box.strip()


def _normalize(answer: str) -> str:
    """Repairs math-verify does not do: odd unicode digits, a trailing period, mixed numbers."""
    answer = unicodedata.normalize("NFKC", answer).translate(_ZERO_WIDTH).strip()
    answer = answer.strip("$").strip()
    if answer.endswith(".") and not answer.endswith(".."):
        answer = answer[:-1].rstrip()
    mixed = _MIXED_NUMBER.match(answer)
    if mixed:  # "2 1/2" means 5/2, but math-verify reads it differently
        whole, num, den = mixed.groups()
        answer = f"{whole}\\frac{{{num}}}{{{den}}}"
    return answer


# ---------------------------------------------------------------------------------------------
# Size guard: refuse to let sympy evaluate astronomically large values
# ---------------------------------------------------------------------------------------------


def _log10_bound(expr: Any, depth: int = 0) -> float:
    """Rough upper bound on log10 of the magnitude of ``expr`` (symbols count as ~10).

    Only has to be cheap and on the safe side: it decides whether comparing the expression
    could make sympy build a number with millions of digits.
    """
    if depth > 100:
        return math.inf
    if isinstance(expr, sympy.MatrixBase):
        return max((_log10_bound(e, depth + 1) for e in expr), default=0.0)
    if not isinstance(expr, sympy.Basic):
        return 0.0
    if isinstance(expr, sympy.Rational):
        p, q = abs(int(expr.p)), abs(int(expr.q))
        return max(p.bit_length(), q.bit_length()) * 0.30103
    if isinstance(expr, sympy.Float):
        try:
            return math.log10(abs(float(expr)) + 1.0)
        except (OverflowError, ValueError):
            return math.inf
    if isinstance(expr, (sympy.Symbol, sympy.NumberSymbol)) or expr.is_Atom:
        return 1.0
    bounds = [_log10_bound(a, depth + 1) for a in expr.args]
    if isinstance(expr, sympy.Pow):
        base, exp = bounds
        if exp > 7:
            return math.inf
        return max(base, 0.0) * 10.0**exp
    if isinstance(expr, (sympy.factorial, sympy.factorial2, sympy.gamma, sympy.binomial, sympy.subfactorial)):
        top = max(bounds, default=0.0)
        if top > 6:
            return math.inf
        n = 10.0**top
        return n * max(top, 1.0)
    if isinstance(expr, (sympy.Sum, sympy.Product)):
        terms = max((_log10_bound(limit[-1], depth + 1) for limit in expr.limits), default=0.0)
        if terms > 5:
            return math.inf
        body = _log10_bound(expr.function, depth + 1)
        return body * 10.0**terms if isinstance(expr, sympy.Product) else body + terms
    if isinstance(expr, sympy.Mul):
        return sum(max(b, 0.0) for b in bounds)
    if isinstance(expr, sympy.Add):
        return max(bounds, default=0.0) + math.log10(len(bounds))
    return max(bounds, default=0.0) + 1.0


def _too_big(parsed: tuple[Any, ...]) -> bool:
    try:
        return any(_log10_bound(p) > MAX_RESULT_DIGITS for p in parsed)
    except Exception:  # noqa: BLE001 - an expression we cannot size is not worth the risk
        return True


# ---------------------------------------------------------------------------------------------
# Parsing and comparison
# ---------------------------------------------------------------------------------------------


_BUGS = (TypeError, AttributeError, NameError, ImportError)
"""Exceptions no answer can cause: the grader's own bugs (counted), not an unparseable answer."""


@lru_cache(maxsize=16384)
def _parse_answer(answer: str) -> tuple[Any, ...]:
    """math-verify's parse of one (normalised) answer, cached: ground truths and the answers of
    a group of rollouts repeat a lot. Empty when unparseable or too large to compare safely.

    Wrapping in ``\\boxed{}`` gives math-verify's LaTeX path an anchor, and it reads plain
    numbers ("0.5", "3/4"), LaTeX (``\\frac{1}{2}``), intervals and sets alike.
    """
    try:
        parsed = tuple(parse(f"\\boxed{{{answer}}}", parsing_timeout=None))
    except _BUGS as err:  # not the answer's fault: the grader's (e.g. math-verify's API changed)
        raise GraderError(f"math-verify's parse failed: {type(err).__name__}: {err}") from err
    except Exception:  # noqa: BLE001 - never raise on model output
        return ()
    if _too_big(parsed):
        return ()
    return parsed


def _clear_caches() -> None:
    """For tests: force the next grading to parse again."""
    _parse_answer.cache_clear()


def same_answer(answer: str, ground_truth: str) -> bool:
    """Whether a plain answer (no box) equals ``ground_truth`` mathematically; e.g. a program's
    printed ``0.5`` against ``\\frac{1}{2}``. Safe to call from many threads. Raises only
    :class:`~drmas.workflows.base.GraderError`, when the grader itself fails (a programming error such
    as a ``TypeError`` from a changed math-verify API), so the episode fails loudly instead of
    being graded wrong."""
    try:
        if not answer or len(answer) > MAX_ANSWER_CHARS:
            return False
        pred_text = _normalize(answer)
        gold_text = _normalize(str(ground_truth))
        if not pred_text or not gold_text:
            return False
        gold = _parse_answer(gold_text)
        pred = _parse_answer(pred_text)
        if not gold or not pred:
            return pred_text == gold_text
        return bool(verify(list(gold), list(pred), timeout_seconds=None))
    except GraderError:
        raise
    except _BUGS as err:
        raise GraderError(f"math-verify's verify failed: {type(err).__name__}: {err}") from err
    except Exception:  # noqa: BLE001 - an expression the comparison cannot take: not equal
        return False


def is_correct(response: str, ground_truth: str) -> bool:
    """Whether the last boxed answer of ``response`` equals ``ground_truth`` mathematically.

    Anything before the last ``</think>`` is ignored. A response without a (complete) boxed
    answer is wrong. Never raises on malformed model output; safe to call from many threads.
    """
    return same_answer(extract_boxed(response) or "", ground_truth)
