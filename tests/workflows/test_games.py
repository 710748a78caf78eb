"""The puzzles' public API, rules and generators; every generated puzzle is checked solvable by
a solver written here, independently of the generator."""

from collections import deque

import pytest

from drmas.workflows.games import GAMES, Sokoban, make

D = {"U": (-1, 0), "D": (1, 0), "L": (0, -1), "R": (0, 1)}


def grid_path(text):
    """Shortest path length from S to G on a Plan-Path board (None: unreachable)."""
    rows = text.split("\n")
    find = lambda ch: next((r, row.index(ch)) for r, row in enumerate(rows) if ch in row)  # noqa: E731
    start, goal = find("S"), find("G")
    seen, queue = {start: 0}, deque([start])
    while queue:
        r, c = queue.popleft()
        if (r, c) == goal:
            return seen[(r, c)]
        for dr, dc in D.values():
            n = (r + dr, c + dc)
            if (0 <= n[0] < len(rows) and 0 <= n[1] < len(rows[0]) and rows[n[0]][n[1]] != "#"
                    and n not in seen):
                seen[n] = seen[(r, c)] + 1
                queue.append(n)
    return None


def sokoban_solvable(text):
    """Breadth-first search over box positions (pushes only), player reduced to its reachable area."""
    walls, boxes, targets, player = set(), set(), set(), None
    for r, row in enumerate(text.split("\n")):
        for c, ch in enumerate(row):
            if ch == "#":
                walls.add((r, c))
            if ch in "$*":
                boxes.add((r, c))
            if ch in ".*+":
                targets.add((r, c))
            if ch in "@+":
                player = (r, c)

    def area(p, bx):
        seen, queue = {p}, deque([p])
        while queue:
            r, c = queue.popleft()
            for dr, dc in D.values():
                n = (r + dr, c + dc)
                if n not in walls and n not in bx and n not in seen:
                    seen.add(n)
                    queue.append(n)
        return seen

    start = frozenset(boxes)
    queue, seen = deque([(start, player)]), {(start, min(area(player, start)))}
    while queue:
        bx, p = queue.popleft()
        if bx == targets:
            return True
        reach = area(p, bx)
        for b in bx:
            for dr, dc in D.values():
                behind, dest = (b[0] - dr, b[1] - dc), (b[0] + dr, b[1] + dc)
                if behind in reach and dest not in walls and dest not in bx:
                    nb = (bx - {b}) | {dest}
                    key = (nb, min(area(b, nb)))
                    if key not in seen:
                        seen.add(key)
                        queue.append((nb, b))
    return False


def test_every_plan_path_seed_has_a_path():
    for seed in range(1000):
        size = 4 + seed % 7
        env = make("plan_path", seed=seed, size=size)
        text = env.observation
        assert len(text.split("\n")) == size and set(text) <= set("#.SG\n")
        assert text.count("S") == 1 and text.count("G") == 1 and not env.solved
        distance = grid_path(text)
        assert distance is not None and distance >= size - 1 and distance == env.distance


def test_every_sokoban_seed_is_solvable():
    for seed in range(1000):
        size, boxes = 6 + seed % 3, 1 + seed % 2
        env = make("sokoban", seed=seed, size=size, boxes=boxes)
        text = env.observation
        assert set(text) <= set("#$.*@+ \n") and sum(text.count(ch) for ch in "@+") == 1
        assert sum(text.count(ch) for ch in "$*") == boxes == sum(text.count(ch) for ch in ".*+")
        assert not env.solved and sokoban_solvable(text), (seed, text)


def sudoku_solutions(text, limit=2):
    """Solutions of a Sudoku board (digits and dots), counted up to ``limit``: plain backtracking
    over sets, most constrained cell first."""
    grid = [[0 if ch == "." else int(ch) for ch in row] for row in text.split("\n")]
    n = len(grid)
    box = int(n ** 0.5)

    def options(r, c):
        seen = set(grid[r]) | {grid[i][c] for i in range(n)}
        seen |= {grid[i][j] for i in range(r - r % box, r - r % box + box)
                 for j in range(c - c % box, c - c % box + box)}
        return [v for v in range(1, n + 1) if v not in seen]

    def count():
        best = None
        for r in range(n):
            for c in range(n):
                if not grid[r][c]:
                    opts = options(r, c)
                    if best is None or len(opts) < len(best[2]):
                        best = (r, c, opts)
                    if len(opts) <= 1:
                        break
            if best is not None and len(best[2]) <= 1:
                break
        if best is None:
            return 1
        r, c, opts = best
        total = 0
        for v in opts:
            grid[r][c] = v
            total += count()
            grid[r][c] = 0
            if total >= limit:
                break
        return total

    return count()


@pytest.mark.integration  # an exhaustive check of 200 shipped puzzles (~12 s), not a unit
def test_sudoku_seeds_have_exactly_one_solution():
    for seed in range(200):  # 100 of each size (1,000 took 85 s on 2 cores, for the same law)
        size = (4, 9)[seed % 2]
        env = make("sudoku", seed=seed, size=size)
        text = env.observation
        assert len(text.split("\n")) == size and set(text) <= set(".123456789\n") and "." in text
        assert sudoku_solutions(text) == 1, (seed, text)


def test_sudoku_fills_by_the_rules():
    env = make("sudoku", seed=1, size=4)
    empty = [(r, c) for r in range(4) for c in range(4) if env.grid[r][c] == 0]
    # an empty cell whose row already holds a value
    r, c, clash = next((r, c, v) for r, c in empty for v in env.grid[r] if v)
    gr, gc = next(iter(env.givens))
    env.step([f"{gr + 1} {gc + 1} 1", "0 1 1", "1 1 5", "a b c", "1 1", f"{r + 1} {c + 1} {clash}"])
    assert env.illegal == 6 and env.grid[r][c] == 0  # a given, out of range x2, syntax x2, a clash
    env.step([f"{r + 1} {c + 1} {env.solution[r][c]}"])
    assert env.grid[r][c] == env.solution[r][c] and env.correct_cells == 1 and not env.solved
    env.step([f"{i + 1} {j + 1} {env.solution[i][j]}" for i, j in empty if (i, j) != (r, c)])
    assert env.solved and env.correct_cells == len(empty) and env.illegal == 6


def room(rows):
    """A Sokoban level from square XSB rows (for rule tests)."""
    env = Sokoban(seed=0, size=6)
    env.size = len(rows)
    env.floor = {(r, c) for r, row in enumerate(rows) for c, ch in enumerate(row) if ch != "#"}
    env.boxes = {(r, c) for r, row in enumerate(rows) for c, ch in enumerate(row) if ch in "$*"}
    env.targets = {(r, c) for r, row in enumerate(rows) for c, ch in enumerate(row) if ch in ".*+"}
    env.player = next((r, c) for r, row in enumerate(rows) for c, ch in enumerate(row) if ch in "@+")
    return env


def test_sokoban_pushes_exactly_and_never_pulls():
    env = room(["######",
                "#@$ .#",
                "# $  #",
                "######",
                "######",
                "######"])
    env.step(["L"])  # a wall: nothing moves
    assert env.illegal == 1 and env.player == (1, 1)
    env.step(["R", "R"])  # pushes the box two cells, onto the target
    assert env.observation.split("\n")[1] == "#  @*#" and env.solved is False  # one box left off
    env.step(["R"])  # would push the box into the wall
    assert env.illegal == 2 and env.player == (1, 3)
    env.step(["L"])  # walking away does not pull the box
    assert env.observation.split("\n")[1] == "# @ *#"
    env.step(["D"])  # pushing the lower box into the bottom wall: illegal
    assert env.illegal == 3
    two = room(["#######",
                "#@$$ .#"] + ["#######"] * 5)
    two.step(["R"])  # two boxes in a row cannot be pushed
    assert two.illegal == 1 and two.player == (1, 1)


def test_plan_path_moves_and_solves():
    env = make("plan_path", seed=5, size=5)
    start = env.observation
    branch = env.copy()
    env.step(["Q", "up"])  # unparseable: illegal, nothing moves
    assert env.illegal == 2 and env.observation == start
    # walk a shortest path found by breadth-first search over the env's own moves
    queue, seen = deque([(branch, [])]), {branch.position}
    while queue:
        state, path = queue.popleft()
        if state.solved:
            break
        for a in "UDLR":
            nxt = state.copy()
            if nxt.apply(a) and nxt.position not in seen:
                seen.add(nxt.position)
                queue.append((nxt, path + [a]))
    env.step(path)
    # copies are independent
    assert env.solved and env.distance == 0 and env.illegal == 2 and branch.observation == start
    assert len(path) == grid_path(start)


def test_make_names_and_sizes():
    assert (make("sokoban", seed=3, size=7, boxes=2).observation
            == make("sokoban", seed=3, size=7, boxes=2).observation)
    assert make("plan_path", seed=3).observation != make("plan_path", seed=4).observation
    with pytest.raises(KeyError, match="unknown game 'chess'; known: plan_path, sokoban, sudoku"):
        make("chess")
    with pytest.raises(ValueError, match="plan_path size must be in 4..10, got 12"):
        make("plan_path", size=12)
    with pytest.raises(ValueError, match="sokoban boxes must be 1 or 2, got 3"):
        make("sokoban", boxes=3)
    with pytest.raises(ValueError, match="sudoku size must be 4 or 9, got 6"):
        make("sudoku", size=6)
    assert GAMES.names() == ["plan_path", "sokoban", "sudoku"]


def test_the_worked_examples_plan_is_invalid_on_every_board_of_every_size():
    # the prompts' example, copied as the answer, is never a valid plan: some move is illegal (or,
    # for Sudoku, it is no action at all), so copying it always takes the format penalty
    from drmas.workflows.games.workflow import EXAMPLE_PLAN

    boards = ([("plan_path", {"size": n}) for n in range(4, 11)]
              + [("sokoban", {"size": n, "boxes": b}) for n in range(6, 9) for b in (1, 2)]
              + [("sudoku", {"size": n}) for n in (4, 9)])
    for name, size in boards:
        for seed in range(20):
            game = make(name, seed=seed, **size)
            actions = type(game).parse_actions(EXAMPLE_PLAN)
            if actions is None:  # not this game's action format
                assert name == "sudoku"
                continue
            assert not all(game.apply(a) for a in actions), (name, size, seed)
