"""The AT-GRPO math team: a tool user writes Python, a reasoner writes the solution.

Each turn (at most ``max_turns``) the tool user acts first: it writes a program that prints the
answer, which runs in the sandbox (:mod:`drmas.workflows.sandbox`); then the reasoner writes a
step-by-step solution ending in ``\\boxed{}``. Each sees the other's latest output: the tool
user the reasoner's previous solution, the reasoner the program and what it printed this turn.
The episode ends when the reasoner's boxed answer and the program's printed answer agree
(``same_answer``), or after the last turn. The team's final answer is the reasoner's last one.

Rewards (``alpha * team + local``; a malformed action, a solution without a box or a reply
without a code block, also adds ``-format_penalty``):

- reasoner local: 1 if its answer is correct, else 0;
- tool user local: +1 if the printed answer is correct, 0 if wrong, -1 if the program fails
  (error, timeout, no code) or prints nothing;
- team: the final answer is correct.

``parallel`` sampling gives every sample of a trajectory the episode's team reward. ``tree`` sampling
(AT-GRPO): for each (task, turn, agent) ``n`` candidates from one prompt, each scored on its
own copy of the state: its local reward, plus ``alpha * team`` when that candidate would end
the episode (a reasoner agreeing with this turn's program, or any reasoner on the last turn),
team being its own answer's correctness. The best candidate is executed (ties: lowest index,
or seeded random) and the next prompt is built from the advanced state.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Sequence

from drmas.workflows.base import WORKFLOWS, ChatPrompt, PromptTemplate, split_tasks
from drmas.workflows.episode import Action, EpisodeState, TurnWorkflow
from drmas.workflows.math.grading import extract_boxed, same_answer
from drmas.workflows.math.solver_verifier import EXAMPLE_PROBLEM, EXAMPLE_SOLUTION
from drmas.workflows.math.splits import math_splits
from drmas.workflows.math.task import MathTask
from drmas.workflows.programs import ProgramRunner, parse_program, run_failure
from drmas.workflows.sandbox import SandboxSettings
from drmas.workflows.sandbox import Result
from drmas.records import Completion

__all__ = ["ReasonerToolUserWorkflow", "parse_program", "program_answer"]

AGENTS = ("tool_user", "reasoner")
_CONTEXT_CHARS = 1200  # cap on a teammate's output quoted in a prompt

_EXAMPLE_PROGRAM = "```python\npencils = 3 * 4\nprint(pencils - 5)\n```"
_CODE = (
    "Problem: {problem}\n{context}Write a Python program that computes the answer and prints only "
    "the final number (use fractions.Fraction for exact fractions)."
)
_SOLVE = ("Problem: {problem}\n{context}Solve it step by step, then write the final answer as "
          "\\boxed{{answer}}.")


def default_templates() -> dict[str, PromptTemplate]:
    """Tool-user and reasoner templates, each with a worked example as a previous chat turn."""
    return {
        "tool_user": PromptTemplate(
            system="You write short Python programs that solve math word problems.",
            instruction=_CODE,
            example_user=_CODE.format(problem=EXAMPLE_PROBLEM, context=""),
            example_assistant=_EXAMPLE_PROGRAM,
            prefill="```python\n",
            stop=("```",),
        ),
        "reasoner": PromptTemplate(
            system="You solve math word problems.",
            instruction=_SOLVE,
            example_user=_SOLVE.format(problem=EXAMPLE_PROBLEM, context=""),
            example_assistant=EXAMPLE_SOLUTION,
        ),
    }


def program_answer(result: Result) -> str | None:
    """The last non-empty line a program printed, or ``None`` if it failed, printed nothing, or
    printed past the output cap (a cut output is never an answer)."""
    if not result.ok:
        return None
    lines = [line.strip() for line in result.stdout.splitlines() if line.strip()]
    return lines[-1][:200] if lines else None


def _clip(text: str) -> str:
    return text if len(text) <= _CONTEXT_CHARS else "..." + text[-_CONTEXT_CHARS:]


def _describe_run(result: Result) -> str:
    return run_failure(result) or program_answer(result) or "nothing"


@dataclass
class ToolTeamState(EpisodeState):
    solution: str = ""
    """The reasoner's latest text."""
    answer: str | None = None
    """Its boxed answer: the team's answer."""
    program: str | None = None
    """The tool user's latest program."""
    run_summary: str = ""
    """What that program printed (or how it failed)."""
    tool_answer: str | None = None
    agreed: bool = False


@WORKFLOWS.register("math_reasoner_tool_user")
class ReasonerToolUserWorkflow(TurnWorkflow):
    agents = AGENTS

    def __init__(
        self,
        data_seed: int = 0,
        train_file: str | list[str] | None = None,
        val_file: str | list[str] | None = None,
        test_file: str | list[str] | None = None,
        sandbox: SandboxSettings = SandboxSettings(),  # noqa: B008 (frozen)
        **options: Any,
    ) -> None:
        """
        Args:
            data_seed: seed of the embedded arithmetic word problems (used for splits without data).
            train_file: training problems replacing the embedded ones: a JSONL/parquet file with
                ``problem`` and ``answer`` columns, a benchmark name (``MATH_DATASETS``), or a list.
            val_file: validation problems, likewise; each source is logged as ``val/<source>/...``.
            test_file: test problems, likewise.
            sandbox: how the tool user's programs run: time and memory limits, workers,
                ``allow_unconfined`` (:class:`~drmas.workflows.sandbox.SandboxSettings`).
            **options: ``max_turns`` (each turn: the tool user, then the reasoner), ``alpha``,
                ``format_penalty``, ``tie_break``, ``templates``, as every turn-based workflow takes
                them (:class:`~drmas.workflows.episode.TurnWorkflow`).
        """
        super().__init__(default_templates=default_templates(), **options)
        self._splits = math_splits(data_seed, train_file, val_file, test_file)
        self.programs = ProgramRunner(sandbox)

    def tasks(self, split: str) -> Sequence[MathTask]:
        return split_tasks(self._splits, split)

    def close(self) -> None:
        self.programs.close()

    # ---- one step -------------------------------------------------------------------------

    def initial_state(self, task: MathTask) -> ToolTeamState:
        return ToolTeamState(task, "tool_user")

    def prompt(self, agent: str, state: ToolTeamState) -> ChatPrompt:
        if agent == "tool_user":
            context = f"A teammate's solution:\n{_clip(state.solution)}\n" if state.solution else ""
        elif state.program is not None:
            context = (f"A teammate's program:\n```python\n{_clip(state.program)}\n```\n"
                       f"It printed {state.run_summary}.\n")
        else:
            context = f"A teammate's program printed {state.run_summary}.\n" if state.run_summary else ""
        return self.templates[agent].render(problem=state.task.problem, context=context)

    def evaluate(self, agent: str, states: Sequence[ToolTeamState],
                 completions: Sequence[Completion]) -> list[Action]:
        if agent == "tool_user":
            # local: +1 correct output, 0 wrong, -1 failed or silent; a tool step never ends the episode
            out = []
            for st, (prog, run) in zip(states, self.programs.run_replies([c.text for c in completions])):
                answer = program_answer(run)
                local = -1.0 if answer is None else float(same_answer(answer, st.task.answer))
                out.append(Action(prog is not None, local, value=(prog, run, answer)))
            return out
        out = []
        for st, c in zip(states, completions):
            answer = extract_boxed(c.text)
            correct = float(answer is not None and same_answer(answer, st.task.answer))
            agree = answer is not None and st.tool_answer is not None and same_answer(answer, st.tool_answer)
            # it ends the episode by agreeing with this turn's program, or by being the last word
            ends = st.turn == self.max_turns - 1 or agree
            out.append(Action(answer is not None, correct, ends=ends, team_reward=correct,
                              value=(c.text, answer, agree)))
        return out

    def advance(self, agent: str, state: ToolTeamState, action: Action) -> None:
        if agent == "tool_user":
            state.program, run, state.tool_answer = action.value
            state.run_summary = _describe_run(run)
            state.agent = "reasoner"
            return
        state.solution, state.answer, state.agreed = action.value
        state.done = action.ends
        if not state.done:
            state.turn += 1
            state.agent = "tool_user"

    def team_reward(self, state: ToolTeamState) -> float:
        return float(state.answer is not None and same_answer(state.answer, state.task.answer))

    def episode_info(self, state: ToolTeamState) -> dict:
        return {"answer": state.answer, "agreed": state.agreed}
