"""The AT-GRPO math team: a tool user writes Python, a reasoner writes the solution.

Each turn (at most ``turns``) the tool user acts first: it writes a program that prints the
answer, which runs in the sandbox (:mod:`drmas.envs.sandbox`); then the reasoner writes a
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

``parallel`` mode gives every sample of a trajectory the episode's team reward. ``tree`` mode
(AT-GRPO): for each (task, turn, agent) ``n`` candidates from one prompt, each scored on its
own copy of the state: its local reward, plus ``alpha * team`` when that candidate would end
the episode (a reasoner agreeing with this turn's program, or any reasoner on the last turn),
team being its own answer's correctness. The best candidate is executed (ties: lowest index,
or seeded random) and the next prompt is built from the advanced state.
"""

from __future__ import annotations

import random
import re
from dataclasses import dataclass, field
from typing import Sequence

from drmas.algorithms import mix_rewards
from drmas.data.experience import Experience
from drmas.envs.base import (
    WORKFLOWS,
    ChatPrompt,
    Completion,
    EpisodeResult,
    GenerateFn,
    PromptTemplate,
    RolloutResult,
    Workflow,
    pick_best,
    sample_groups,
    split_tasks,
)
from drmas.envs.math.data import MathTask, math_splits
from drmas.envs.math.grading import extract_boxed, same_answer
from drmas.envs.math.solver_verifier import EXAMPLE_PROBLEM, EXAMPLE_SOLUTION
from drmas.envs.sandbox import Result, SandboxPool

__all__ = ["ReasonerToolUserWorkflow", "parse_program", "program_answer"]

AGENTS = ("tool_user", "reasoner")
_CONTEXT_CHARS = 1200  # cap on a teammate's output quoted in a prompt

_EXAMPLE_PROGRAM = "```python\npencils = 3 * 4\nprint(pencils - 5)\n```"
_CODE = (
    "Problem: {problem}\n{context}Write a Python program that computes the answer and prints only "
    "the final number (use fractions.Fraction for exact fractions)."
)
_SOLVE = "Problem: {problem}\n{context}Solve it step by step, then write the final answer as \\boxed{{answer}}."


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


_CODE_BLOCK = re.compile(r"```(?:python|py)?[ \t]*\n(.*?)(?:```|\Z)", re.DOTALL)


def parse_program(text: str) -> str | None:
    """The first fenced code block (an unclosed one runs to the end); ``None`` if there is none or it is empty."""
    m = _CODE_BLOCK.search(text)
    return m.group(1).strip() or None if m else None


def program_answer(result: Result) -> str | None:
    """The last non-empty line a program printed, or ``None`` if it failed or printed nothing."""
    if result.timed_out or result.returncode != 0:
        return None
    lines = [line.strip() for line in result.stdout.splitlines() if line.strip()]
    return lines[-1][:200] if lines else None


def _clip(text: str) -> str:
    return text if len(text) <= _CONTEXT_CHARS else "..." + text[-_CONTEXT_CHARS:]


def _describe_run(result: Result) -> str:
    if result.timed_out:
        return "nothing: it timed out"
    if result.returncode != 0:
        err = [line for line in result.stderr.splitlines() if line.strip()]
        return f"an error: {err[-1][:200] if err else 'exit code ' + str(result.returncode)}"
    return program_answer(result) or "nothing"


@dataclass
class _Episode:
    task: MathTask
    traj_uid: str
    turn: int = 0
    solution: str = ""  # the reasoner's latest text
    answer: str | None = None  # its boxed answer: the team's answer
    program: str | None = None  # the tool user's latest program
    run_summary: str = ""  # what that program printed (or how it failed)
    tool_answer: str | None = None
    agreed: bool = False
    done: bool = False
    samples: list[Experience] = field(default_factory=list)


@WORKFLOWS.register("math_reasoner_tool_user")
class ReasonerToolUserWorkflow(Workflow):
    agents = AGENTS

    def __init__(
        self,
        data_seed: int = 0,
        train_file: str | list[str] | None = None,
        val_file: str | list[str] | None = None,
        test_file: str | list[str] | None = None,
        turns: int = 4,
        alpha: float = 1.0,
        format_penalty: float = 0.1,
        code_timeout_s: float = 5.0,
        code_memory_mb: int = 512,
        sandbox_workers: int = 4,
        tie_break: str = "first",
        templates: dict[str, PromptTemplate] | None = None,
    ) -> None:
        """
        Args:
            data_seed: seed of the embedded arithmetic word problems (used for splits without data).
            train_file: training problems replacing the embedded ones: a JSONL/parquet file with
                ``problem`` and ``answer`` columns, a benchmark name (``MATH_DATASETS``), or a list.
            val_file: validation problems, likewise; each source is logged as ``val/<source>/...``.
            test_file: test problems, likewise.
            turns: turns per episode (each: the tool user, then the reasoner).
            alpha: weight of the team reward in ``alpha * team + local``.
            format_penalty: magnitude of the extra penalty for a malformed action.
            code_timeout_s: wall-clock limit of each program in the sandbox.
            code_memory_mb: address-space limit of each program.
            sandbox_workers: programs run at the same time.
            tie_break: how tree sampling picks among equally scored candidates: ``first``
                (lowest index) or ``random`` (seeded).
            templates: per-agent prompt templates replacing the defaults (by agent name).
        """
        if turns < 1 or sandbox_workers < 1:
            raise ValueError(f"turns and sandbox_workers must be >= 1, got {turns}, {sandbox_workers}")
        if tie_break not in ("first", "random"):
            raise ValueError(f"tie_break must be 'first' or 'random', got {tie_break!r}")
        unknown = set(templates or {}) - set(AGENTS)
        if unknown:
            raise ValueError(f"templates for unknown agents {sorted(unknown)}; agents: {list(AGENTS)}")
        self.turns, self.alpha, self.format_penalty, self.tie_break = turns, alpha, format_penalty, tie_break
        self.code_timeout_s, self.code_memory_mb = code_timeout_s, code_memory_mb
        self.templates = {**default_templates(), **(templates or {})}
        self._splits = math_splits(data_seed, train_file, val_file, test_file)
        self.sandbox_workers = sandbox_workers
        self._pool: SandboxPool | None = None

    def tasks(self, split: str) -> Sequence[MathTask]:
        return split_tasks(self._splits, split)

    def close(self) -> None:
        if self._pool is not None:
            self._pool.close()
            self._pool = None

    # ---- one agent step ---------------------------------------------------------------------

    def _prompt(self, agent: str, ep: _Episode) -> ChatPrompt:
        if agent == "tool_user":
            context = f"A teammate's solution:\n{_clip(ep.solution)}\n" if ep.solution else ""
        elif ep.program is not None:
            context = f"A teammate's program:\n```python\n{_clip(ep.program)}\n```\nIt printed {ep.run_summary}.\n"
        else:
            context = f"A teammate's program printed {ep.run_summary}.\n" if ep.run_summary else ""
        return self.templates[agent].render(problem=ep.task.problem, context=context)

    def _record(self, ep: _Episode, agent: str, c: Completion, valid: bool, local: float) -> Experience:
        local += 0.0 if valid else -self.format_penalty
        return Experience(
            task_uid=ep.task.uid, traj_uid=ep.traj_uid, env_uid=ep.traj_uid, agent=agent, turn=ep.turn,
            policy="", prompt_ids=c.prompt_ids, response_ids=c.response_ids, engine_logprobs=c.logprobs,
            text=c.text, valid=valid, local_reward=local,
        )

    def _run(self, programs: list[str | None]) -> list[Result]:
        """Sandbox results in order; a missing program is a failure that never reaches the sandbox."""
        real = [p for p in programs if p is not None]
        if self._pool is None:
            self._pool = SandboxPool(self.sandbox_workers)
        results = iter(self._pool.run(real, timeout_s=self.code_timeout_s, memory_mb=self.code_memory_mb))
        missing = Result("", "no code block", 1, False)
        return [next(results) if p is not None else missing for p in programs]

    def _tool_local(self, ep: _Episode, answer: str | None) -> float:
        return -1.0 if answer is None else float(same_answer(answer, ep.task.answer))

    # ---- rollout ----------------------------------------------------------------------------

    def rollout(
        self, tasks: Sequence[MathTask], generate: GenerateFn, *, n: int, mode: str = "parallel", seed: int = 0
    ) -> RolloutResult:
        if mode == "parallel":
            eps = [_Episode(t, f"{t.uid}#{j}") for t in tasks for j in range(n)]
            self._play(eps, generate, 1, None)
        elif mode == "tree":
            eps = [_Episode(t, f"{t.uid}#tree") for t in tasks]
            self._play(eps, generate, n, random.Random(seed))
        else:
            raise ValueError(f"mode must be 'parallel' or 'tree', got {mode!r}")
        episodes = []
        for ep in eps:
            team = float(ep.answer is not None and same_answer(ep.answer, ep.task.answer))
            if mode == "parallel":
                for s in ep.samples:
                    s.team_reward = team
                    s.reward = mix_rewards(team, s.local_reward, self.alpha)
            episodes.append(EpisodeResult(ep.task.uid, ep.traj_uid, team > 0, ep.turn + 1, team,
                                          {"answer": ep.answer, "agreed": ep.agreed}))
        return RolloutResult([s for ep in eps for s in ep.samples], episodes)

    def _play(self, eps: list[_Episode], generate: GenerateFn, k: int, rng: random.Random | None) -> None:
        """Parallel play is the tree with one candidate per node (k=1), whose records get the
        episode's team reward at the end; the tree scores and picks among k candidates."""
        while active := [ep for ep in eps if not ep.done]:
            cands = sample_groups(generate, "tool_user", [self._prompt("tool_user", ep) for ep in active], k)
            programs = [[parse_program(c.text) for c in comps] for comps in cands]
            results = iter(self._run([p for ps in programs for p in ps]))
            for ep, comps, progs in zip(active, cands, programs):
                recs, runs = [], []
                for c, prog in zip(comps, progs):
                    run = next(results)
                    answer = program_answer(run)
                    s = self._record(ep, "tool_user", c, prog is not None, self._tool_local(ep, answer))
                    s.reward = mix_rewards(0.0, s.local_reward, self.alpha)  # the tool user never ends an episode
                    recs.append(s)
                    runs.append((run, answer))
                ep.samples.extend(recs)
                best = pick_best([s.reward for s in recs], self.tie_break, rng)
                ep.program, ep.run_summary = progs[best], _describe_run(runs[best][0])
                ep.tool_answer = runs[best][1]

            cands = sample_groups(generate, "reasoner", [self._prompt("reasoner", ep) for ep in active], k)
            for ep, comps in zip(active, cands):
                last = ep.turn == self.turns - 1
                recs, answers, agrees = [], [], []
                for c in comps:
                    answer = extract_boxed(c.text)
                    correct = float(answer is not None and same_answer(answer, ep.task.answer))
                    s = self._record(ep, "reasoner", c, answer is not None, correct)
                    agree = answer is not None and ep.tool_answer is not None and same_answer(answer, ep.tool_answer)
                    s.team_reward = correct if last or agree else 0.0  # this candidate would end the episode
                    s.reward = mix_rewards(s.team_reward, s.local_reward, self.alpha)
                    recs.append(s)
                    answers.append(answer)
                    agrees.append(agree)
                ep.samples.extend(recs)
                best = pick_best([s.reward for s in recs], self.tie_break, rng)
                ep.solution, ep.answer, ep.agreed = comps[best].text, answers[best], agrees[best]
                ep.done = last or ep.agreed
                if not ep.done:
                    ep.turn += 1
