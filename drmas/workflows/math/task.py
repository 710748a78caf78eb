"""The record of one math problem, shared by the generator, the loaders and the workflows."""

from __future__ import annotations

from dataclasses import dataclass

__all__ = ["MathTask"]


@dataclass(frozen=True)
class MathTask:
    """One problem and its exact final answer (plain text: "19", "3/4" or LaTeX).

    ``difficulty`` is the number of arithmetic operations for generated problems, 0 when unknown.
    """

    uid: str
    problem: str
    answer: str
    source: str
    difficulty: int = 0
