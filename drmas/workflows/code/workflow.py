"""AT-GRPO's code team: a coder writes a program, a tester writes tests; both run in the sandbox.

Each turn (at most ``max_turns``) the **coder** acts first: it writes a Python program that
reads stdin and prints the answer, seeing its previous program and the tester's tests with
what that program printed on them. Its program is judged on the problem's golden tests (never
shown to either agent). Then the **tester**, seeing the problem, the coder's new program and
what it printed on the tester's previous tests, writes test cases as
``<input>...</input><output>...</output>`` pairs. The episode ends when the coder's program
passes every one of the tester's tests, or after the last turn.

Rewards (each sample ``alpha * team + local``; a reply without a program or without a test
also adds ``-format_penalty``):

- team: the pass rate of the coder's final program on the golden tests;
- coder local: the pass rate of its program on the golden tests;
- tester local: the share of its tests that the reference solution passes (0 when the task
  has no reference solution, e.g. LiveCodeBench).

An episode is a success when the final program passes every golden test. Tree sampling (AT-GRPO)
judges each candidate on its own and executes the best one.
"""

from __future__ import annotations

import logging
import re
from dataclasses import dataclass, field
from typing import Any, Sequence, Union

from drmas.workflows.base import WORKFLOWS, ChatPrompt, GenerateFn, PromptTemplate, RolloutResult, split_tasks
from drmas.workflows.code.judge import MAX_TESTS, Judge, Verdict, pass_rate
from drmas.workflows.code.loaders import embedded_problems, load_code_source
from drmas.workflows.code.task import CodeTask, TestCase
from drmas.workflows.episode import Action, EpisodeState, TurnWorkflow
from drmas.workflows.programs import parse_program
from drmas.workflows.sandbox import SandboxSettings
from drmas.records import Completion

log = logging.getLogger(__name__)

__all__ = ["CodeState", "CoderTesterWorkflow", "parse_test_cases"]

AGENTS = ("coder", "tester")
SplitSource = Union[str, Sequence[str], None]

_CODER = ("{question}\n\n{context}Write a Python program that reads the input from stdin and prints the "
          "answer.")
_TESTER = ("{question}\n\n{context}Write test cases for this problem: for each, the exact stdin in "
           "<input>...</input>, then the exact expected stdout in <output>...</output>.")
_EXAMPLE = "Read two integers a and b on one line and print their sum.\n\nExample: input\n2 3\noutput\n5"
_SHOWN_TESTS = 5
_PROGRAM_CHARS = 1500


def default_templates() -> dict[str, PromptTemplate]:
    return {
        "coder": PromptTemplate(
            system="You write short, correct Python programs for programming problems.",
            instruction=_CODER,
            example_user=_CODER.format(question=_EXAMPLE, context=""),
            example_assistant="```python\na, b = map(int, input().split())\nprint(a + b)\n```",
            prefill="```python\n",
            stop=("```",),
        ),
        "tester": PromptTemplate(
            system="You write test cases for programming problems.",
            instruction=_TESTER,
            example_user=_TESTER.format(question=_EXAMPLE, context=""),
            example_assistant=("<tests>\n<input>\n2 3\n</input>\n<output>\n5\n</output>\n"
                               "<input>\n-7 7\n</input>\n<output>\n0\n</output>\n</tests>"),
            prefill="<tests>\n",
            stop=("</tests>",),
        ),
    }


_TEST = re.compile(r"<input>\n?(.*?)</input>\s*<output>\n?(.*?)</output>", re.DOTALL)


def parse_test_cases(text: str, limit: int = 8) -> list[TestCase] | None:
    """The first ``limit`` ``<input>...</input><output>...</output>`` pairs; None when there is none."""
    tests = [TestCase(i if i.endswith("\n") or not i else i + "\n", o)
             for i, o in _TEST.findall(text)[:limit]]
    return tests or None


def _line(text: str, chars: int = 120) -> str:
    text = text.strip().replace("\n", "\\n")
    return text if len(text) <= chars else text[:chars] + "..."


def _show(tests: Sequence[TestCase], verdicts: Sequence[Verdict]) -> str:
    rows = []
    for t, v in list(zip(tests, verdicts))[:_SHOWN_TESTS]:
        got = v.output if v.status == "ok" else f"{v.status}" + (f": {v.error}" if v.error else "")
        rows.append(f"input: {_line(t.input)} | expected: {_line(t.output)} | got: {_line(got)} | "
                    f"{'pass' if v.passed else 'FAIL'}")
    return "\n".join(rows) + "\n"


@dataclass
class CodeState(EpisodeState):
    program: str | None = None
    """The coder's latest program."""
    golden: float = 0.0
    """Its pass rate on the golden tests (the team reward)."""
    tests: list[TestCase] = field(default_factory=list)
    """The tester's latest tests."""
    on_tests: list[Verdict] = field(default_factory=list)
    """The latest program on those tests."""


@WORKFLOWS.register("code")
class CoderTesterWorkflow(TurnWorkflow):
    agents = AGENTS
    samplings = ("parallel", "tree")

    def __init__(
        self,
        train_file: SplitSource = None,
        val_file: SplitSource = None,
        test_file: SplitSource = None,
        sandbox: SandboxSettings = SandboxSettings(time_limit_s=1.0),  # noqa: B008 (frozen)
        max_golden_tests: int = 16,
        max_tests: int = 8,
        **options: Any,
    ) -> None:
        """
        Args:
            train_file: JSONL/parquet files or data set names (``apps``, ``codecontests``,
                ``livecodebench``); default: the embedded problems.
            val_file: the same for validation.
            test_file: the same for testing.
            sandbox: how programs are judged: ``time_limit_s`` (of a program on one test),
                memory, workers, ``allow_unconfined`` (:class:`~drmas.workflows.sandbox.SandboxSettings`).
            max_golden_tests: golden tests judged per program in training (the first ones of
                each task; 0 = all); validation and test always judge all of them.
            max_tests: test cases read from a tester's reply.
            **options: ``max_turns`` (each turn: the coder, then the tester), ``alpha``,
                ``format_penalty``, ``tie_break``, ``templates``, as every turn-based workflow takes
                them (:class:`~drmas.workflows.episode.TurnWorkflow`).
        """
        if max_golden_tests < 0 or not 1 <= max_tests <= MAX_TESTS:
            raise ValueError(f"max_golden_tests must be >= 0 (0 = all) and max_tests in 1..{MAX_TESTS}, got "
                             f"{max_golden_tests} and {max_tests}")
        super().__init__(default_templates=default_templates(), **options)
        self._splits: dict[str, Sequence[CodeTask]] = {}
        for split, entries in (("train", train_file), ("val", val_file), ("test", test_file)):
            if not entries:
                self._splits[split] = embedded_problems(split)
                continue
            tasks = [t for e in ([entries] if isinstance(entries, str) else entries)
                     for t in load_code_source(e, split)]
            if len({t.uid for t in tasks}) != len(tasks):
                raise ValueError(f"{split} data: duplicate task uids "
                                 "(the same file or data set given twice?)")
            self._splits[split] = tasks
        self.max_golden_tests, self.max_tests = max_golden_tests, max_tests
        self.judge = Judge(sandbox)
        self._all_golden = False  # set per rollout: validation and test judge every golden test
        capped = (sum(len(t.tests) > max_golden_tests for t in self._splits["train"]) if max_golden_tests
                  else 0)
        if capped:
            log.warning("code: training judges the first %d golden tests of each problem (%d of %d training "
                        "problems have more; validation and test judge all of them)", max_golden_tests,
                        capped, len(self._splits["train"]))

    def tasks(self, split: str) -> Sequence[CodeTask]:
        return split_tasks(self._splits, split)

    def close(self) -> None:
        self.judge.close()

    def rollout(self, tasks: Sequence[CodeTask], generate: GenerateFn, *, n: int, sampling: str = "parallel",
                seed: int = 0, **kwargs: Any) -> RolloutResult:
        # a benchmark is scored as its authors score it: on every golden test (the trainer's
        # generate function says whether it samples for training)
        self._all_golden = not generate.train
        return super().rollout(tasks, generate, n=n, sampling=sampling, seed=seed, **kwargs)

    def golden_tests(self, task: CodeTask) -> list[TestCase]:
        """The golden tests a program of ``task`` is judged on now."""
        if self._all_golden or not self.max_golden_tests:
            return list(task.tests)
        return list(task.tests[:self.max_golden_tests])

    def initial_state(self, task: CodeTask) -> CodeState:
        return CodeState(task, "coder")

    def prompt(self, agent: str, state: CodeState) -> ChatPrompt:
        context = ""
        if agent == "coder" and state.program is not None:
            context = f"Your previous program:\n```python\n{state.program[-_PROGRAM_CHARS:]}\n```\n"
            if state.tests:
                context += f"A teammate's tests and what it printed:\n{_show(state.tests, state.on_tests)}"
            context += "Improve it if a test fails.\n\n"
        elif agent == "tester":
            if state.program is None:
                context = "A teammate wrote no program yet.\n\n"
            else:
                context = f"A teammate's program:\n```python\n{state.program[-_PROGRAM_CHARS:]}\n```\n"
                if state.tests:
                    context += ("What it printed on your previous tests:\n"
                                f"{_show(state.tests, state.on_tests)}")
                context += "\n"
        return self.templates[agent].render(question=state.task.question, context=context)

    def evaluate(self, agent: str, states: Sequence[CodeState],
                 completions: Sequence[Completion]) -> list[Action]:
        if agent == "coder":
            programs = [parse_program(c.text) for c in completions]
            golden = [self.golden_tests(st.task) for st in states]
            runs = self.judge.run([(p, g + st.tests) for p, g, st in zip(programs, golden, states)])
            out = []
            for prog, g, run in zip(programs, golden, runs):
                rate = pass_rate(run[:len(g)])
                out.append(Action(prog is not None, rate, value=(prog, rate, run[len(g):])))
            return out
        tests = [parse_test_cases(c.text, self.max_tests) for c in completions]
        jobs = []
        for st, ts in zip(states, tests):
            jobs += [(st.task.solution, ts or []), (st.program, ts or [])]
        runs = self.judge.run(jobs)
        out = []
        for i, (st, ts) in enumerate(zip(states, tests)):
            on_reference, on_program = runs[2 * i], runs[2 * i + 1]
            local = pass_rate(on_reference) if st.task.solution is not None else 0.0
            passes_all = bool(ts) and all(v.passed for v in on_program)
            ends = passes_all or st.turn == self.max_turns - 1
            out.append(Action(ts is not None, local, ends=ends, team_reward=st.golden,
                              value=(ts or [], on_program)))
        return out

    def advance(self, agent: str, state: CodeState, action: Action) -> None:
        if agent == "coder":
            state.program, state.golden, state.on_tests = action.value
            state.agent = "tester"
            return
        state.tests, state.on_tests = action.value
        state.done = action.ends
        if not state.done:
            state.turn += 1
            state.agent = "coder"

    def team_reward(self, state: CodeState) -> float:
        return state.golden

    def success(self, state: CodeState) -> bool:
        return state.golden == 1.0

    def episode_info(self, state: CodeState) -> dict:
        return {"pass_rate": state.golden, "tests_written": len(state.tests)}
