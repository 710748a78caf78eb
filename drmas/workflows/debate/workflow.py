"""A debate: two debaters argue for an answer to a math word problem, a judge picks one.

Each round debater A, then debater B (who reads A's argument), writes an argument ending in
``\\boxed{answer}``; from the second round on each reads the other's last argument. After the
last round the judge reads both and answers ``<verdict>A</verdict>`` or ``<verdict>B</verdict>``.
The verdict decides the debaters' rewards when the episode is over (:meth:`final_rewards`):
zero-sum (the chosen one +1, the other -1) or not (+1 and 0). The judge's own reward is whether
the answer it chose is right, checked against the known answer; the team's is the same fact.
Parallel sampling only: tree candidates are scored before any verdict exists.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from typing import Any, Sequence

from drmas.workflows.base import WORKFLOWS, ChatPrompt, PromptTemplate, split_tasks
from drmas.workflows.episode import Action, EpisodeState, TurnWorkflow
from drmas.workflows.math.grading import extract_boxed, is_correct
from drmas.workflows.math.splits import math_splits
from drmas.workflows.math.task import MathTask
from drmas.records import Completion

__all__ = ["DebateWorkflow", "parse_verdict"]

AGENTS = ("debater_a", "debater_b", "judge")
SIDES = {"debater_a": "A", "debater_b": "B"}
EXAMPLE_PROBLEM = ("Mia has 3 boxes with 4 pencils in each box. She gives away 5 pencils. How many pencils "
                   "does she have left?")
EXAMPLE_ARGUMENT = "Mia has 3 x 4 = 12 pencils. Giving away 5 leaves 12 - 5 = 7.\n\\boxed{7}"
_ARGUE = ("Problem: {problem}\n{other}You are debater {side}. Argue for the right answer in a few steps, "
          "then write it as \\boxed{{answer}}.")
_JUDGE = ("Problem: {problem}\n\nDebater A says:\n{a}\n\nDebater B says:\n{b}\n\nWhich debater is right? "
          "Reply <verdict>A</verdict> or <verdict>B</verdict>.")


def default_templates() -> dict[str, PromptTemplate]:
    """Debater and judge templates with a worked example each."""
    argue = PromptTemplate(system="You argue about math word problems.", instruction=_ARGUE,
                           example_user=_ARGUE.format(problem=EXAMPLE_PROBLEM, other="", side="A"),
                           example_assistant=EXAMPLE_ARGUMENT)
    return {
        "debater_a": argue,
        "debater_b": argue,
        "judge": PromptTemplate(
            system="You judge debates about math word problems.", instruction=_JUDGE,
            example_user=_JUDGE.format(problem=EXAMPLE_PROBLEM, a=EXAMPLE_ARGUMENT,
                                       b="12 + 5 = 17 pencils are left.\n\\boxed{17}"),
            example_assistant="<verdict>A</verdict>", prefill="<verdict>", stop=("</verdict>",)),
    }


_VERDICT = re.compile(r"\s*(A|B)\s*</verdict>", re.IGNORECASE)


def parse_verdict(text: str) -> str | None:
    """``"A"`` or ``"B"`` from the judge's reply (after the ``<verdict>`` prefill), else None."""
    m = _VERDICT.match(text[len("<verdict>"):] if text.startswith("<verdict>") else text)
    return m.group(1).upper() if m else None


@dataclass
class DebateState(EpisodeState):
    arguments: dict[str, str] = field(default_factory=dict)
    """Each debater's latest argument."""
    verdict: str | None = None
    """The judge's pick, ``"A"`` or ``"B"`` (None: no valid verdict)."""


@WORKFLOWS.register("debate")
class DebateWorkflow(TurnWorkflow):
    agents = AGENTS
    samplings = ("parallel",)
    default_max_turns = 1  # rounds of arguments before the verdict
    why_not = {"tree": "the debaters' rewards are decided by the verdict at the episode's end, and tree "
                       "candidates are scored before any verdict exists"}

    def __init__(
        self,
        data_seed: int = 0,
        train_file: str | list[str] | None = None,
        val_file: str | list[str] | None = None,
        test_file: str | list[str] | None = None,
        zero_sum: bool = True,
        **options: Any,
    ) -> None:
        """
        Args:
            data_seed: seed of the embedded arithmetic word problems (splits without a file).
            train_file: training problems (``problem`` and ``answer`` columns), as the math recipe reads them.
            val_file: validation problems, likewise.
            test_file: test problems, likewise.
            zero_sum: the chosen debater gets +1 and the other -1 (False: +1 and 0).
            **options: ``max_turns`` (rounds of arguments, one per debater each, before the verdict),
                ``alpha``, ``format_penalty``, ``tie_break``, ``templates``, as every turn-based workflow
                takes them (:class:`~drmas.workflows.episode.TurnWorkflow`).
        """
        super().__init__(default_templates=default_templates(), **options)
        self.zero_sum = zero_sum
        self._splits = math_splits(data_seed, train_file, val_file, test_file)

    def tasks(self, split: str) -> Sequence[MathTask]:
        return split_tasks(self._splits, split)

    def initial_state(self, task: MathTask) -> DebateState:
        return DebateState(task, "debater_a")

    def prompt(self, agent: str, state: DebateState) -> ChatPrompt:
        problem = state.task.problem
        if agent == "judge":
            return self.templates["judge"].render(problem=problem,
                                                  a=state.arguments.get("debater_a", "(nothing)"),
                                                  b=state.arguments.get("debater_b", "(nothing)"))
        other = "debater_b" if agent == "debater_a" else "debater_a"
        said = state.arguments.get(other)
        context = f"Debater {SIDES[other]} says:\n{said}\n\n" if said else ""
        return self.templates[agent].render(problem=problem, other=context, side=SIDES[agent])

    def chosen_answer(self, state: DebateState, verdict: str | None) -> str | None:
        if verdict is None:
            return None
        return extract_boxed(state.arguments.get("debater_a" if verdict == "A" else "debater_b", ""))

    def evaluate(self, agent: str, states: Sequence[DebateState],
                 completions: Sequence[Completion]) -> list[Action]:
        if agent != "judge":
            return [Action(extract_boxed(c.text) is not None, value=c.text) for c in completions]
        out = []
        for st, c in zip(states, completions):
            verdict = parse_verdict(c.text)
            chosen = self.chosen_answer(st, verdict)
            right = float(chosen is not None and is_correct(f"\\boxed{{{chosen}}}", st.task.answer))
            out.append(Action(verdict is not None, role_reward=right, ends=True, team_reward=right,
                              value=verdict))
        return out

    def advance(self, agent: str, state: DebateState, action: Action) -> None:
        if agent == "judge":
            state.verdict, state.done = action.value, True
            return
        state.arguments[agent] = action.value
        if agent == "debater_a":
            state.agent = "debater_b"
        elif state.turn + 1 < self.max_turns:
            state.turn += 1
            state.agent = "debater_a"
        else:
            state.agent = "judge"

    def team_reward(self, state: DebateState) -> float:
        chosen = self.chosen_answer(state, state.verdict)
        return float(chosen is not None and is_correct(f"\\boxed{{{chosen}}}", state.task.answer))

    def final_rewards(self, state: DebateState) -> dict[str, float]:
        """The verdict's: the chosen debater +1, the other -1 (zero-sum) or 0; none without a verdict."""
        if state.verdict is None:
            return {}
        winner = "debater_a" if state.verdict == "A" else "debater_b"
        loser = "debater_b" if winner == "debater_a" else "debater_a"
        return {winner: 1.0, loser: -1.0 if self.zero_sum else 0.0}

    def episode_info(self, state: DebateState) -> dict:
        return {"verdict": state.verdict, "answer": self.chosen_answer(state, state.verdict)}
