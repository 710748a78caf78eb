"""Planning puzzles (Plan-Path, Sokoban, Sudoku) behind one Gym-like API: ``make(name, seed, **size)``
returns a :class:`Game` with ``observation``, ``step(actions)``, ``solved`` and ``copy()``; and
the planner / tool-user workflow that plays them (registered as ``games``)."""

from drmas.workflows.games.base import GAMES, Game, make
from drmas.workflows.games.plan_path import PlanPath
from drmas.workflows.games.sokoban import Sokoban
from drmas.workflows.games.sudoku import Sudoku
from drmas.workflows.games.workflow import GameTask, PlanningWorkflow

__all__ = ["GAMES", "Game", "GameTask", "PlanPath", "PlanningWorkflow", "Sokoban", "Sudoku", "make"]
