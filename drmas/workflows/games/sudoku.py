"""Sudoku: fill the grid so every row, column and box holds each digit once.

Text: one row per line, a digit for a filled cell and ``.`` for an empty one. Actions:
``r c v`` (1-based row and column, value 1..size), e.g. ``3 1 4``. Filling a given or filled
cell, a value out of range, or a value already in the cell's row, column or box is illegal.
Sizes 4 (2 x 2 boxes) and 9 (3 x 3). Generated from a seed: a full grid (a valid pattern with its
digits, rows and columns shuffled within the rules), then givens removed in random order while a
solver confirms the solution stays unique.
"""

from __future__ import annotations

import random

from drmas.workflows.games.base import GAMES, Game, render_grid

__all__ = ["Sudoku", "count_solutions"]


def count_solutions(grid: list[list[int]], box: int, limit: int = 2) -> int:
    """Solutions of ``grid`` (0 = empty), counted up to ``limit``; bitmask search, fewest options first."""
    n = box * box
    grid = [row[:] for row in grid]
    full = (1 << n) - 1
    used_r, used_c, used_b = [0] * n, [0] * n, [0] * n
    empty = []
    for r in range(n):
        for c in range(n):
            if grid[r][c]:
                bit = 1 << (grid[r][c] - 1)
                used_r[r] |= bit
                used_c[c] |= bit
                used_b[r // box * box + c // box] |= bit
            else:
                empty.append((r, c))
    found = 0

    def search() -> bool:
        nonlocal found
        best, options, fewest = None, 0, n + 1
        for r, c in empty:
            if grid[r][c]:
                continue
            opts = full & ~(used_r[r] | used_c[c] | used_b[r // box * box + c // box])
            k = bin(opts).count("1")
            if k < fewest:
                best, options, fewest = (r, c), opts, k
                if k <= 1:
                    break
        if best is None:
            found += 1
            return found >= limit
        r, c = best
        b = r // box * box + c // box
        while options:
            bit = options & -options
            options ^= bit
            grid[r][c] = bit.bit_length()
            used_r[r] |= bit
            used_c[c] |= bit
            used_b[b] |= bit
            stop = search()
            grid[r][c] = 0
            used_r[r] ^= bit
            used_c[c] ^= bit
            used_b[b] ^= bit
            if stop:
                return True
        return False

    search()
    return found


@GAMES.register("sudoku")
class Sudoku(Game):
    action_pattern = r"\d+ \d+ \d+"  # "row col value", actions separated by ";" or ","
    separators = r"\s*[,;\n]\s*"
    rules = ("Fill the empty cells (.) so each row, column and box holds each digit once. "
             "Actions: 'row col value', 1-based, separated by ';'.")
    def __init__(self, seed: int = 0, size: int = 4) -> None:
        """
        Args:
            seed: the puzzle's seed.
            size: 4 or 9.
        """
        if size not in (4, 9):
            raise ValueError(f"sudoku size must be 4 or 9, got {size}")
        rng = random.Random(f"sudoku/{size}/{seed}")
        box = 2 if size == 4 else 3
        self.size, self.box = size, box
        base = [[(box * (r % box) + r // box + c) % size for c in range(size)] for r in range(size)]
        digits = rng.sample(range(1, size + 1), size)
        rows = [g * box + r for g in rng.sample(range(box), box) for r in rng.sample(range(box), box)]
        cols = [g * box + c for g in rng.sample(range(box), box) for c in rng.sample(range(box), box)]
        grid = [[digits[base[r][c]] for c in cols] for r in rows]
        self.solution = [row[:] for row in grid]
        for r, c in rng.sample([(r, c) for r in range(size) for c in range(size)], size * size):
            value, grid[r][c] = grid[r][c], 0
            if count_solutions(grid, box) != 1:
                grid[r][c] = value
        self.grid = grid
        self.givens = {(r, c) for r in range(size) for c in range(size) if grid[r][c]}
        self.blanks = size * size - len(self.givens)
        self.illegal = 0

    @property
    def observation(self) -> str:
        return render_grid(self.size, lambda r, c: str(self.grid[r][c]) if self.grid[r][c] else ".")

    @property
    def solved(self) -> bool:
        return all(all(row) for row in self.grid)  # every fill was checked against the rules

    @property
    def correct_cells(self) -> int:
        """Filled cells (givens excluded) that match the unique solution."""
        return sum(self.grid[r][c] == self.solution[r][c] for r in range(self.size) for c in range(self.size)
                   if self.grid[r][c] and (r, c) not in self.givens)

    @property
    def progress(self) -> float:
        return self.correct_cells / self.blanks

    def apply(self, action: str) -> bool:
        parts = action.split()
        if len(parts) != 3 or not all(p.isdigit() for p in parts):
            return False
        r, c, v = (int(p) for p in parts)
        n, box = self.size, self.box
        if not (1 <= r <= n and 1 <= c <= n and 1 <= v <= n) or self.grid[r - 1][c - 1]:
            return False
        r, c = r - 1, c - 1
        br, bc = r // box * box, c // box * box
        if v in self.grid[r] or any(self.grid[i][c] == v for i in range(n)) or any(
                self.grid[i][j] == v for i in range(br, br + box) for j in range(bc, bc + box)):
            return False
        self.grid[r][c] = v
        return True
