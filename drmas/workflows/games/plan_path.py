"""Plan-Path: walk from the start to the goal on a grid with walls.

Text: one row per line, ``#`` wall, ``.`` free, ``S`` the walker's current cell, ``G`` the goal
(``S`` shows on ``G``'s cell once there). Actions: ``U``, ``D``, ``L``, ``R`` (row 0 is the top);
moving into a wall or off the grid is illegal. Generated from a seed: walls at random, start and
goal at least ``size - 1`` steps apart, and a path guaranteed (checked by breadth-first search).
"""

from __future__ import annotations

import random
from collections import deque

from drmas.workflows.games.base import GAMES, Game, render_grid

__all__ = ["MOVES", "PlanPath", "shortest_distance"]

MOVES = {"U": (-1, 0), "D": (1, 0), "L": (0, -1), "R": (0, 1)}


def shortest_distance(walls: list[list[bool]], start: tuple[int, int], goal: tuple[int, int]) -> int | None:
    """Steps of a shortest path from ``start`` to ``goal`` (None when there is none)."""
    n, m = len(walls), len(walls[0])
    seen, queue = {start: 0}, deque([start])
    while queue:
        cell = queue.popleft()
        if cell == goal:
            return seen[cell]
        for dr, dc in MOVES.values():
            r, c = cell[0] + dr, cell[1] + dc
            if 0 <= r < n and 0 <= c < m and not walls[r][c] and (r, c) not in seen:
                seen[(r, c)] = seen[cell] + 1
                queue.append((r, c))
    return None


@GAMES.register("plan_path")
class PlanPath(Game):
    action_pattern = "[UDLR]"  # one move per letter, separated by commas or spaces: "U, R, R"
    rules = "Move S to G. '#' is a wall, '.' is free. Actions: U, D, L, R (one cell each; row 0 is the top)."
    def __init__(self, seed: int = 0, size: int = 6, wall_density: float = 0.3) -> None:
        """
        Args:
            seed: the puzzle's seed.
            size: grid side, 4 to 10.
            wall_density: share of cells that are walls.
        """
        if not 4 <= size <= 10:
            raise ValueError(f"plan_path size must be in 4..10, got {size}")
        rng = random.Random(f"plan_path/{size}/{seed}")
        while True:  # resample until the goal is reachable and not trivially close
            walls = [[rng.random() < wall_density for _ in range(size)] for _ in range(size)]
            free = [(r, c) for r in range(size) for c in range(size) if not walls[r][c]]
            if len(free) < 2:
                continue
            start, goal = rng.sample(free, 2)
            distance = shortest_distance(walls, start, goal)
            if distance is not None and distance >= size - 1:
                break
        self.size, self.walls, self.position, self.goal = size, walls, start, goal
        self.start_distance = distance
        self.illegal = 0

    @property
    def observation(self) -> str:
        def char(r: int, c: int) -> str:
            if (r, c) == self.position:
                return "S"
            return "G" if (r, c) == self.goal else "#" if self.walls[r][c] else "."

        return render_grid(self.size, char)

    @property
    def solved(self) -> bool:
        return self.position == self.goal

    @property
    def distance(self) -> int:
        """Steps left on a shortest path (progress is its drop)."""
        d = shortest_distance(self.walls, self.position, self.goal)
        assert d is not None  # every cell the walker can reach connects to the goal
        return d

    @property
    def progress(self) -> float:
        return 1.0 - self.distance / self.start_distance

    def apply(self, action: str) -> bool:
        if action not in MOVES:
            return False
        r, c = self.position[0] + MOVES[action][0], self.position[1] + MOVES[action][1]
        if not (0 <= r < self.size and 0 <= c < self.size) or self.walls[r][c]:
            return False
        self.position = (r, c)
        return True
