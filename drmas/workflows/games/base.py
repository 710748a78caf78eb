"""The API every puzzle shares: a board as text, actions as strings, solved or not.

Workflows, tests and users drive puzzles the same way::

    env = drmas.workflows.games.make("plan_path", seed=3, size=6)
    print(env.observation)       # the board in the puzzle's conventional text format
    env.step(["R", "R", "D"])    # applied in order; an illegal one changes nothing, is counted
    env.solved, env.illegal      # bool, number of illegal actions so far
    branch = env.copy()          # an independent copy (tree sampling explores from copies)
"""

from __future__ import annotations

import copy as _copy
import re
from abc import ABC, abstractmethod
from typing import Any, Callable, Sequence

from drmas.registry import Registry

__all__ = ["GAMES", "Game", "make", "render_grid"]

GAMES: Registry[type["Game"]] = Registry("game")
"""Puzzle classes by name; ``make`` builds them. Register your own with ``@GAMES.register``."""


class Game(ABC):
    """One puzzle instance, generated from a seed (the same seed gives the same puzzle)."""

    illegal: int = 0
    """Actions refused so far (unparseable, against a wall, onto a given cell...)."""
    rules: str = ""
    """The rules and the action format, as the agents read them in their prompts."""
    options: tuple[str, ...] = ("size",)
    """The constructor arguments (besides ``seed``) a workflow sets from its own settings."""

    @property
    @abstractmethod
    def observation(self) -> str:
        """The board as text."""

    @property
    @abstractmethod
    def solved(self) -> bool:
        """Whether the puzzle is solved."""

    @property
    @abstractmethod
    def progress(self) -> float:
        """How far the puzzle is from its start toward solved, 0 to 1 (1 = solved)."""

    action_pattern: str = r"\S+"
    """What one action looks like (a regular expression)."""
    separators: str = r"[,;\s]+"
    """What separates actions."""

    @classmethod
    def parse_actions(cls, text: str) -> list[str] | None:
        """The actions in ``text``, or None when any piece is not an action (the format is strict)."""
        pieces = [p for p in re.split(cls.separators, text.strip()) if p]
        ok = all(re.fullmatch(cls.action_pattern, p) for p in pieces)
        return pieces if pieces and ok else None

    @abstractmethod
    def apply(self, action: str) -> bool:
        """Apply one action if it is legal; return whether it was."""

    def step(self, actions: Sequence[str]) -> None:
        """Apply ``actions`` in order; each illegal one changes nothing and adds to ``illegal``."""
        for action in actions:
            if not self.apply(action.strip()):
                self.illegal += 1

    def copy(self) -> "Game":
        return _copy.deepcopy(self)


def render_grid(size: int, char: Callable[[int, int], str]) -> str:
    """A square board as text: ``char(row, col)`` for each cell, one row per line."""
    return "\n".join("".join(char(r, c) for c in range(size)) for r in range(size))


def make(name: str, seed: int = 0, **size: Any) -> Game:
    """The puzzle ``name`` (``plan_path``, ``sokoban``...) generated from ``seed``, with its size
    arguments (e.g. ``size=6``, ``boxes=2``)."""
    return GAMES.get(name)(seed=seed, **size)
