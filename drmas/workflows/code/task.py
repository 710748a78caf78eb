"""The record of one coding problem, shared by the embedded set, the loaders and the workflow."""

from __future__ import annotations

from dataclasses import dataclass

__all__ = ["CodeTask", "TestCase"]


@dataclass(frozen=True)
class TestCase:
    """One test: the whole stdin, and the expected stdout (compared token by token)."""

    __test__ = False  # not a pytest class

    input: str
    output: str


@dataclass(frozen=True)
class CodeTask:
    """A problem statement, its golden tests, and a reference solution when one is known
    (the tester's reward needs it; LiveCodeBench ships none)."""

    uid: str
    question: str
    tests: tuple[TestCase, ...]
    solution: str | None = None
    source: str = ""
