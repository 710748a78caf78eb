"""The Dr. MAS solver / verifier loop.

Loop up to ``max_loops`` times: the solver writes a step-by-step solution ending in
``\\boxed{}`` (seeing the verifier's previous feedback); the verifier answers
``<verify>approve</verify>`` or ``<verify>reject</verify>`` and a reason; an approved solution
ends the episode, and the last loop has no verifier. Team reward: the final solver answer is
correct (``is_correct``), given to every sample of the episode; a malformed action (a solution
without a box, a verdict without the tag) adds ``-format_penalty`` to that sample.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from typing import Sequence

from drmas.algorithms import mix_rewards
from drmas.data.experience import Experience
from drmas.envs.base import (
    WORKFLOWS,
    Completion,
    EpisodeResult,
    GenerateFn,
    PromptTemplate,
    RolloutResult,
    Workflow,
    sample_each,
    split_tasks,
)
from drmas.envs.math.data import MathTask, math_splits
from drmas.envs.math.grading import extract_boxed, is_correct

__all__ = ["SolverVerifierWorkflow", "parse_verdict"]

EXAMPLE_PROBLEM = "Mia has 3 boxes with 4 pencils in each box. She gives away 5 pencils. How many pencils does she have left?"
EXAMPLE_SOLUTION = "Mia has 3 x 4 = 12 pencils. After giving away 5 she has 12 - 5 = 7.\n\\boxed{7}"
_SOLVE = "Problem: {problem}\n{feedback}Solve it step by step, then write the final answer as \\boxed{{answer}}."
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
class _Episode:
    task: MathTask
    traj_uid: str
    loop: int = 0
    solution: str = ""
    feedback: str = ""
    done: bool = False
    samples: list[Experience] = field(default_factory=list)


@WORKFLOWS.register("math_solver_verifier")
class SolverVerifierWorkflow(Workflow):
    agents = ("solver", "verifier")

    def __init__(
        self,
        data_seed: int = 0,
        train_file: str | list[str] | None = None,
        val_file: str | list[str] | None = None,
        test_file: str | list[str] | None = None,
        max_loops: int = 2,
        alpha: float = 1.0,
        format_penalty: float = 0.1,
        templates: dict[str, PromptTemplate] | None = None,
    ) -> None:
        """
        Args:
            data_seed: seed of the embedded arithmetic word problems (used for splits without a file).
            train_file: training problems replacing the embedded ones: a JSONL/parquet file with
                ``problem`` and ``answer`` columns, a benchmark name (``MATH_DATASETS``), or a list.
            val_file: validation problems, likewise; each source is logged as ``val/<source>/...``.
            test_file: test problems, likewise.
            max_loops: solver attempts; every attempt but the last is checked by the verifier.
            alpha: weight of the team reward in ``alpha * team + local``.
            format_penalty: magnitude of the local penalty for a malformed action.
            templates: per-agent prompt templates replacing the defaults (by agent name).
        """
        if max_loops < 1:
            raise ValueError(f"max_loops must be >= 1, got {max_loops}")
        unknown = set(templates or {}) - set(self.agents)
        if unknown:
            raise ValueError(f"templates for unknown agents {sorted(unknown)}; agents: {list(self.agents)}")
        self.max_loops, self.alpha, self.format_penalty = max_loops, alpha, format_penalty
        self.templates = {**default_templates(), **(templates or {})}
        self._splits = math_splits(data_seed, train_file, val_file, test_file)

    def tasks(self, split: str) -> Sequence[MathTask]:
        return split_tasks(self._splits, split)

    def _record(self, ep: _Episode, agent: str, c: Completion, valid: bool) -> Experience:
        return Experience(
            task_uid=ep.task.uid, traj_uid=ep.traj_uid, env_uid=ep.traj_uid, agent=agent, turn=ep.loop,
            policy="", prompt_ids=c.prompt_ids, response_ids=c.response_ids, engine_logprobs=c.logprobs,
            text=c.text, valid=valid,
        )

    def rollout(
        self, tasks: Sequence[MathTask], generate: GenerateFn, *, n: int, mode: str = "parallel", seed: int = 0
    ) -> RolloutResult:
        if mode != "parallel":
            raise ValueError("the solver/verifier workflow runs in parallel mode only (Dr. MAS has no tree mode)")
        eps = [_Episode(t, f"{t.uid}#{j}") for t in tasks for j in range(n)]
        while active := [ep for ep in eps if not ep.done]:
            prompts = [self.templates["solver"].render(problem=ep.task.problem, feedback=ep.feedback) for ep in active]
            for ep, c in zip(active, sample_each(generate, "solver", prompts)):
                ep.samples.append(self._record(ep, "solver", c, extract_boxed(c.text) is not None))
                ep.solution = c.text
                ep.done = ep.loop == self.max_loops - 1
            checked = [ep for ep in active if not ep.done]
            prompts = [self.templates["verifier"].render(problem=ep.task.problem, solution=ep.solution) for ep in checked]
            for ep, c in zip(checked, sample_each(generate, "verifier", prompts)):
                verdict = parse_verdict(c.text)
                ep.samples.append(self._record(ep, "verifier", c, verdict is not None))
                if verdict is not None and verdict[0]:
                    ep.done = True
                else:
                    reason = verdict[1] if verdict else "no clear verdict"
                    ep.feedback = f"Your previous solution was rejected ({reason}):\n{ep.solution}\n"
                    ep.loop += 1

        episodes = []
        for ep in eps:
            team = float(is_correct(ep.solution, ep.task.answer))
            for s in ep.samples:
                s.team_reward = team
                s.local_reward = 0.0 if s.valid else -self.format_penalty
                s.reward = mix_rewards(team, s.local_reward, self.alpha)
            episodes.append(EpisodeResult(ep.task.uid, ep.traj_uid, team > 0, ep.loop + 1, team,
                                          {"answer": extract_boxed(ep.solution)}))
        return RolloutResult([s for ep in eps for s in ep.samples], episodes)
