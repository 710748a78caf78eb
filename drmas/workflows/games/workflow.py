"""AT-GRPO's planning team on the puzzles: a tool user writes a program, a planner acts.

Each turn (at most ``max_turns``) the tool user acts first: it writes a Python program that
prints a plan (an action list) for the board; the program runs in the sandbox
(:mod:`drmas.workflows.sandbox`). Then the planner, seeing the board, the program and what it
printed, writes the actions to execute inside ``<actions>...</actions>``; they are applied to
the puzzle (illegal ones change nothing). The episode ends when the puzzle is solved or after
the last turn.

Actions are parsed strictly (``Game.parse_actions``: ``U, R, R`` for the move puzzles,
``1 2 3; 2 3 4`` for Sudoku). Rewards (``alpha * team + local``; a tool reply without a code
block, or a plan that is not an action list or holds an illegal action, also adds
``-format_penalty``; illegal actions change nothing):

- team: 1 when the puzzle is solved at the episode's end, else 0;
- planner local: the progress its actions made this turn (``Game.progress`` after minus before:
  the drop in shortest-path distance for Plan-Path, boxes on targets for Sokoban, correct cells
  for Sudoku, as a share of what was left at the start);
- tool user local: the progress its printed plan would make from the current board (measured on
  a copy), or -1 when its program fails, prints nothing, or has no code block.

Tree sampling (AT-GRPO) scores each candidate on its own copy of the puzzle and executes the best
one; the next prompts show the board after that candidate only.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from typing import Any, Sequence

from drmas.workflows.base import WORKFLOWS, ChatPrompt, PromptTemplate, split_tasks
from drmas.workflows.episode import Action, EpisodeState, TurnWorkflow
from drmas.workflows.games.base import GAMES, Game, make
from drmas.workflows.programs import ProgramRunner, run_failure
from drmas.workflows.sandbox import SandboxSettings
from drmas.records import Completion

__all__ = ["EXAMPLE_PLAN", "GameTask", "PlanningWorkflow", "parse_plan"]

AGENTS = ("tool_user", "planner")
_TOOL = "{rules}\nBoard:\n{board}\n{context}Write a Python program that prints the actions to take."
_PLAN = "{rules}\nBoard:\n{board}\n{context}Give the actions to take now as <actions>...</actions>."
# The worked example is a Plan-Path board wider than any task's: copied onto a task's board, its
# eleven moves right leave any Plan-Path grid (4 to 10 wide) and hit a Sokoban room's walls (6 to 8
# wide), and they are no Sudoku action: a copy is never a valid plan (tests/workflows/test_games.py).
# (An agent of the AT-GRPO study learned to print the earlier example's plan on every board.)
_EXAMPLE_BOARD = "S..........G"
EXAMPLE_PLAN = ", ".join(["R"] * 11)


def default_templates() -> dict[str, PromptTemplate]:
    rules = GAMES.get("plan_path").rules  # the worked example is a Plan-Path board
    return {
        "tool_user": PromptTemplate(
            system="You write short Python programs that solve grid puzzles.",
            instruction=_TOOL,
            example_user=_TOOL.format(rules=rules, board=_EXAMPLE_BOARD, context=""),
            example_assistant=f"```python\nprint('{EXAMPLE_PLAN}')\n```",
            prefill="```python\n",
            stop=("```",),
        ),
        "planner": PromptTemplate(
            system="You solve grid puzzles step by step.",
            instruction=_PLAN,
            example_user=_PLAN.format(rules=rules, board=_EXAMPLE_BOARD, context=""),
            example_assistant=f"<actions>{EXAMPLE_PLAN}</actions>",
            prefill="<actions>",
            stop=("</actions>",),
        ),
    }


@dataclass(frozen=True)
class GameTask:
    """One puzzle: the game's name, its seed and size arguments."""

    uid: str
    game: str
    seed: int
    size: tuple[tuple[str, Any], ...] = ()
    source: str = ""

    def make(self) -> Game:
        return make(self.game, seed=self.seed, **dict(self.size))


_ACTIONS = re.compile(r"<actions>(.*?)(?:</actions>|\Z)", re.DOTALL)


def parse_plan(text: str) -> str | None:
    """The inside of ``<actions>...</actions>`` (an unclosed tag runs to the end); None when absent or
    empty."""
    m = _ACTIONS.search(text)
    return m.group(1).strip() or None if m else None


@dataclass
class PlanningState(EpisodeState):
    env: Game | None = None
    program: str | None = None
    printed: str = ""
    """What the tool user's program printed this turn (or how it failed)."""
    moves: list[str] = field(default_factory=list)
    """Every action the planner executed, in order."""


@WORKFLOWS.register("games")
class PlanningWorkflow(TurnWorkflow):
    agents = AGENTS
    samplings = ("parallel", "tree")

    def __init__(
        self,
        game: str = "plan_path",
        size: int = 4,
        boxes: int = 1,
        train_size: int = 2000,
        val_size: int = 100,
        test_size: int = 100,
        sandbox: SandboxSettings = SandboxSettings(),  # noqa: B008 (frozen)
        **options: Any,
    ) -> None:
        """
        Args:
            game: ``plan_path``, ``sokoban`` or ``sudoku``.
            size: grid side (Plan-Path 4-10, Sokoban 6-8 with walls, Sudoku 4 or 9).
            boxes: Sokoban boxes (1 or 2).
            train_size: puzzles in the train split (seeds 0..); val and test use later seeds.
            val_size: puzzles in the val split.
            test_size: puzzles in the test split.
            sandbox: how the tool user's programs run: time and memory limits, workers,
                ``allow_unconfined`` (:class:`~drmas.workflows.sandbox.SandboxSettings`).
            **options: ``max_turns`` (each turn: the tool user, then the planner), ``alpha``,
                ``format_penalty``, ``tie_break``, ``templates``, as every turn-based workflow takes
                them (:class:`~drmas.workflows.episode.TurnWorkflow`).
        """
        if game not in GAMES:
            raise ValueError(f"game must be one of {GAMES.names()}, got {game!r}")
        super().__init__(default_templates=default_templates(), **options)
        args = {k: v for k, v in {"size": size, "boxes": boxes}.items() if k in GAMES.get(game).options}
        make(game, seed=0, **args)  # a bad size fails here, naming the value
        name = f"{game}-{size}" + (f"x{boxes}" if "boxes" in args else "")
        starts = {"train": 0, "val": train_size, "test": train_size + val_size}
        counts = {"train": train_size, "val": val_size, "test": test_size}
        self._splits = {split: [GameTask(f"{name}/{seed}", game, seed, tuple(args.items()), name)
                                for seed in range(starts[split], starts[split] + counts[split])]
                        for split in starts}
        self.game = game
        self.programs = ProgramRunner(sandbox)

    def tasks(self, split: str) -> Sequence[GameTask]:
        return split_tasks(self._splits, split)

    def close(self) -> None:
        self.programs.close()

    def initial_state(self, task: GameTask) -> PlanningState:
        return PlanningState(task, "tool_user", env=task.make())

    def prompt(self, agent: str, state: PlanningState) -> ChatPrompt:
        context = ""
        if agent == "planner" and state.program is not None:
            context = (f"A teammate's program:\n```python\n{state.program[-1200:]}\n```\n"
                       f"It printed: {state.printed}\n")
        elif agent == "planner" and state.printed:
            context = f"A teammate's program printed: {state.printed}\n"
        return self.templates[agent].render(rules=GAMES.get(self.game).rules, board=state.env.observation,
                                            context=context)

    def evaluate(self, agent: str, states: Sequence[PlanningState],
                 completions: Sequence[Completion]) -> list[Action]:
        out = []
        if agent == "tool_user":
            for st, (prog, run) in zip(states, self.programs.run_replies([c.text for c in completions])):
                printed = run.stdout.strip()[-500:] if run.ok else ""  # a cut output is no plan
                actions = st.env.parse_actions(printed) if printed else None
                local = -1.0  # failed, silent, or not an action list
                if actions is not None:
                    trial = st.env.copy()
                    trial.step(actions)
                    local = trial.progress - st.env.progress
                summary = printed or ("nothing (no program)" if prog is None
                                      else run_failure(run) or "nothing")
                out.append(Action(prog is not None, local, value=(prog, summary)))
            return out
        for st, c in zip(states, completions):
            plan = parse_plan(c.text)
            actions = st.env.parse_actions(plan) if plan else None
            after = st.env.copy()
            after.step(actions or [])
            ends = after.solved or st.turn == self.max_turns - 1
            # valid: an action list in the documented format, every action legal
            valid = actions is not None and after.illegal == st.env.illegal
            out.append(Action(valid, after.progress - st.env.progress, ends=ends,
                              team_reward=float(after.solved), value=(after, actions or [])))
        return out

    def advance(self, agent: str, state: PlanningState, action: Action) -> None:
        if agent == "tool_user":
            state.program, state.printed = action.value
            state.agent = "planner"
            return
        state.env, executed = action.value
        state.moves += executed
        state.done = action.ends
        if not state.done:
            state.turn += 1
            state.agent = "tool_user"

    def team_reward(self, state: PlanningState) -> float:
        return float(state.env.solved)

    def episode_info(self, state: PlanningState) -> dict:
        return {"moves": len(state.moves), "illegal": state.env.illegal, "progress": state.env.progress}

