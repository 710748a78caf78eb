"""Planning puzzles (Plan-Path, Sokoban, Sudoku) behind one Gym-like API: ``make(name, seed, **size)``
returns a :class:`Game` with ``observation``, ``step(actions)``, ``solved`` and ``copy()``."""

from drmas.envs.games.base import GAMES, Game, make
from drmas.envs.games.plan_path import PlanPath
from drmas.envs.games.sokoban import Sokoban
from drmas.envs.games.sudoku import Sudoku

__all__ = ["GAMES", "Game", "PlanPath", "Sokoban", "Sudoku", "make"]
