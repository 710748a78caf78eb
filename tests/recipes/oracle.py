"""A recipe run whose engine knows the answers: ``oracle.py <recipe> fit ...``.

The ``oracle`` engine (registered here, ``--model.engine oracle``) reads each prompt and writes
what a perfect agent would: the planner a shortest plan of the Plan-Path board in its prompt
(found by breadth-first search), the coder the reference solution of the embedded problem in its
prompt; every other agent a fixed reply. Recipe tests then assert the solved rewards, which a
broken workflow (success, team reward, routing, validation) could not produce.
"""

import os
import sys
from collections import deque

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
sys.path.insert(0, ROOT)

from drmas.engines import ENGINES, HFEngine  # noqa: E402
from drmas.recipes import main  # noqa: E402
from drmas.records import Completion  # noqa: E402
from drmas.workflows.code.loaders import embedded_problems  # noqa: E402
from drmas.workflows.games.plan_path import MOVES  # noqa: E402


def shortest_plan(board: str) -> str:
    """The moves from S to G on a Plan-Path board, e.g. ``"D, R, R"``."""
    rows = board.splitlines()
    cells = {(r, c): ch for r, row in enumerate(rows) for c, ch in enumerate(row)}
    start = next(p for p, ch in cells.items() if ch == "S")
    seen, queue = {start: ""}, deque([start])
    while queue:
        cell = queue.popleft()
        if cells[cell] == "G":
            return ", ".join(seen[cell])
        for move, (dr, dc) in MOVES.items():
            nxt = (cell[0] + dr, cell[1] + dc)
            if cells.get(nxt, "#") != "#" and nxt not in seen:
                seen[nxt] = seen[cell] + move
                queue.append(nxt)
    raise ValueError(f"no path on\n{board}")


SOLUTIONS = {p.question: p.solution for split in ("train", "val", "test") for p in embedded_problems(split)}


def reply(prompt: str) -> str:
    if prompt.endswith("<actions>"):  # the planner: the board of the real question is the last one
        board = prompt.rsplit("Board:\n", 1)[1].split("\n\n")[0].split("\nGive the actions")[0]
        return shortest_plan(board.split("\n<|")[0].strip()) + "</actions>"
    if "```python\n" in prompt[-20:] and "Write a Python program that reads" in prompt:  # the coder
        question = next(q for q in SOLUTIONS if q in prompt)
        return SOLUTIONS[question] + "\n```"
    return "print('')\n```" if prompt.endswith("```python\n") else "</tests>"


@ENGINES.register("oracle")
class OracleEngine(HFEngine):
    def generate(self, prompts, n, params, stops=None, max_new_tokens=None):
        out = []
        for ids in prompts:
            text = reply(self.tokenizer.decode(ids))
            tokens = self.tokenizer(text, add_special_tokens=False)["input_ids"]
            out.append([Completion(list(ids), tokens, [-1.0] * len(tokens), text, "stop") for _ in range(n)])
        return out


if __name__ == "__main__":
    main(sys.argv.pop(1))
