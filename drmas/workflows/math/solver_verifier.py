"""The Dr. MAS solver / verifier loop.

Loop up to ``max_turns`` times: the solver writes a step-by-step solution ending in
``\\boxed{}`` (seeing the verifier's previous feedback); the verifier answers
``<verify>approve</verify>`` or ``<verify>reject</verify>`` and a reason; an approved solution
ends the episode, and the last loop has no verifier. Team reward: the final solver answer is
correct (``is_correct``), given to every sample of the episode; a malformed action (a solution
without a box, a verdict without the tag) adds ``-format_penalty`` to that sample.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Any, Sequence

from drmas.workflows.base import WORKFLOWS, ChatPrompt, PromptTemplate, split_tasks
from drmas.workflows.episode import Action, EpisodeState, TurnWorkflow
from drmas.workflows.math.grading import extract_boxed, is_correct
from drmas.workflows.math.splits import math_splits
from drmas.workflows.math.task import MathTask
from drmas.records import Completion

__all__ = ["SolverVerifierWorkflow", "parse_verdict"]

EXAMPLE_PROBLEM = ("Mia has 3 boxes with 4 pencils in each box. She gives away 5 pencils. How many pencils "
                   "does she have left?")
EXAMPLE_SOLUTION = "Mia has 3 x 4 = 12 pencils. After giving away 5 she has 12 - 5 = 7.\n\\boxed{7}"
_SOLVE = ("Problem: {problem}\n{feedback}Solve it step by step, then write the final answer as "
          "\\boxed{{answer}}.")
_CHECK = (
    "Problem: {problem}\nProposed solution:\n{solution}\n\nIs the final answer correct? Reply "
    "<verify>approve</verify> or <verify>reject</verify>, then one sentence why."
)


def default_templates() -> dict[str, PromptTemplate]:
    """Solver and verifier templates with a worked example each (no data set contains it)."""
    return {
        "solver": PromptTemplate(
            system="You solve math word problems.",
            instruction=_SOLVE,
            example_user=_SOLVE.format(problem=EXAMPLE_PROBLEM, feedback=""),
            example_assistant=EXAMPLE_SOLUTION,
        ),
        "verifier": PromptTemplate(
            system="You check solutions of math word problems.",
            instruction=_CHECK,
            example_user=_CHECK.format(problem=EXAMPLE_PROBLEM, solution=EXAMPLE_SOLUTION),
            example_assistant="<verify>approve</verify> 3 x 4 - 5 = 7 is right.",
            prefill="<verify>",
        ),
    }


_VERDICT = re.compile(r"\s*<verify>\s*(approve|reject)\s*</verify>(.*)", re.DOTALL | re.IGNORECASE)


def parse_verdict(text: str) -> tuple[bool, str] | None:
    """``(approved, reason)``, or ``None`` when the verdict tag is missing or malformed."""
    m = _VERDICT.match(text)
    if m is None:
        return None
    return m.group(1).lower() == "approve", " ".join(m.group(2).split())[:300]


@dataclass
class SolverVerifierState(EpisodeState):
    solution: str = ""
    """The solver's latest text (its last box is the team's answer)."""
    feedback: str = ""
    """The verifier's last rejection, quoted to the solver."""


@WORKFLOWS.register("math_solver_verifier")
class SolverVerifierWorkflow(TurnWorkflow):
    agents = ("solver", "verifier")
    samplings = ("parallel",)  # Dr. MAS's loop has no tree sampling
    default_max_turns = 2  # solver attempts; every attempt but the last is checked by the verifier

    def __init__(
        self,
        data_seed: int = 0,
        train_file: str | list[str] | None = None,
        val_file: str | list[str] | None = None,
        test_file: str | list[str] | None = None,
        **options: Any,
    ) -> None:
        """
        Args:
            data_seed: seed of the embedded arithmetic word problems (used for splits without a file).
            train_file: training problems replacing the embedded ones: a JSONL/parquet file with
                ``problem`` and ``answer`` columns, a benchmark name (``MATH_DATASETS``), or a list.
            val_file: validation problems, likewise; each source is logged as ``val/<source>/...``.
            test_file: test problems, likewise.
            **options: ``max_turns`` (solver attempts), ``alpha``, ``format_penalty``, ``tie_break``,
                ``templates``, as every turn-based workflow takes them
                (:class:`~drmas.workflows.episode.TurnWorkflow`).
        """
        super().__init__(default_templates=default_templates(), **options)
        self._splits = math_splits(data_seed, train_file, val_file, test_file)

    def tasks(self, split: str) -> Sequence[MathTask]:
        return split_tasks(self._splits, split)

    def initial_state(self, task: MathTask) -> SolverVerifierState:
        return SolverVerifierState(task, "solver")

    def prompt(self, agent: str, state: SolverVerifierState) -> ChatPrompt:
        if agent == "solver":
            return self.templates["solver"].render(problem=state.task.problem, feedback=state.feedback)
        return self.templates["verifier"].render(problem=state.task.problem, solution=state.solution)

    def evaluate(self, agent: str, states: Sequence[SolverVerifierState],
                 completions: Sequence[Completion]) -> list[Action]:
        # no role rewards: every sample earns the team reward, minus the format penalty
        if agent == "solver":
            return [Action(extract_boxed(c.text) is not None, value=c.text) for c in completions]
        verdicts = [parse_verdict(c.text) for c in completions]
        return [Action(v is not None, value=v) for v in verdicts]

    def advance(self, agent: str, state: SolverVerifierState, action: Action) -> None:
        if agent == "solver":
            state.solution = action.value
            state.done = state.turn == self.max_turns - 1  # the last attempt is not checked
            state.agent = "verifier"
        elif action.value is not None and action.value[0]:
            state.done = True
        else:
            reason = action.value[1] if action.value else "no clear verdict"
            state.feedback = f"Your previous solution was rejected ({reason}):\n{state.solution}\n"
            state.turn += 1
            state.agent = "solver"

    def team_reward(self, state: SolverVerifierState) -> float:
        return float(is_correct(state.solution, state.task.answer))

    def episode_info(self, state: SolverVerifierState) -> dict:
        return {"answer": extract_boxed(state.solution)}
