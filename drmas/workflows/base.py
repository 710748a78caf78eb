"""What every multi-agent workflow shares: the interface, prompt templates, the registry, helpers.

A workflow decides which agent acts when, builds each agent's prompt from the current state,
parses the agent's output into an action, steps the environment and assigns rewards. It never
sees models or tokenizers: it calls a ``generate(agent, prompts, n)`` function that the trainer
routes to the agent's policy, so one workflow runs on a shared model, one model per agent, or
different model families alike. Nothing in ``drmas.workflows`` imports Lightning, the engines, the
data module or the trainer.

Most workflows are turn-based and subclass :class:`drmas.workflows.episode.TurnWorkflow`, which plays
the episodes; :class:`Workflow` is the bare interface for those that are not.
"""

from __future__ import annotations

import random
from abc import ABC, abstractmethod
from collections import defaultdict
from dataclasses import dataclass
from typing import Any, Callable, Sequence

from drmas.algorithms import SAMPLINGS, estimators_for
from drmas.records import ChatPrompt, Completion, EpisodeResult, GenerateFn, RolloutResult, Task
from drmas.registry import Registry

__all__ = [
    "SAMPLINGS",
    "WORKFLOWS",
    "ChatPrompt",
    "Completion",
    "EpisodeResult",
    "GenerateFn",
    "GraderError",
    "PromptTemplate",
    "RolloutResult",
    "Workflow",
    "check_tasks",
    "pick_best",
    "sample_groups",
    "split_tasks",
]


class GraderError(RuntimeError):
    """The reward function itself failed (a grader's bug or an API it calls that changed), not the
    model's output: the episode's reward is unknown, so it is a failed episode, counted in
    ``rollout/grader_errors``, never a silent zero reward."""


@dataclass
class PromptTemplate:
    """One agent's prompt, in the form a small model needs to follow a format at all.

    The worked example is given as a previous chat turn (user then assistant); the prefill
    opens the assistant's answer (e.g. with ``<verify>``); stop strings end the completion at
    the closing tag. Only ``instruction`` is a ``str.format`` template; the example is literal.
    """

    instruction: str
    """The user message; ``{fields}`` are filled from the state (e.g. question, information)."""
    system: str | None = None
    """Optional system message."""
    example_user: str | None = None
    """The worked example's user message, written out in full."""
    example_assistant: str | None = None
    """The worked example's answer, in exactly the format the parser expects."""
    prefill: str = ""
    """Opening of the assistant turn, e.g. ``<verify>``."""
    stop: tuple[str, ...] = ()
    """Stop strings, e.g. ``("</verify>",)``."""

    def render(self, **fields: Any) -> ChatPrompt:
        msgs: list[tuple[str, str]] = []
        if self.system:
            msgs.append(("system", self.system))
        if self.example_user and self.example_assistant:
            msgs.append(("user", self.example_user))
            msgs.append(("assistant", self.example_assistant))
        msgs.append(("user", self.instruction.format(**fields)))
        return ChatPrompt(tuple(msgs), self.prefill, tuple(self.stop))


class Workflow(ABC):
    """A multi-agent workflow over a task set."""

    agents: tuple[str, ...] = ()
    """The agent roles, in acting order."""
    samplings: tuple[str, ...] = SAMPLINGS
    """The samplings :meth:`rollout` plays (``parallel``, ``tree``)."""
    why_not: dict[str, str] = {}
    """Why a sampling is not in ``samplings``, for the error that refuses it."""

    @abstractmethod
    def tasks(self, split: str) -> Sequence[Task]:
        """The tasks of a split (``train``, ``val``, ``test``), each a :class:`~drmas.records.Task`:
        a unique ``uid`` and its ``source``."""

    @abstractmethod
    def rollout(
        self, tasks: Sequence[Any], generate: GenerateFn, *, n: int, sampling: str = "parallel",
        seed: int = 0, progress: Callable[[bool], None] | None = None,
    ) -> RolloutResult:
        """Play the tasks. ``parallel``: ``n`` independent trajectories per task. ``tree``: one
        executed trajectory per task, ``n`` candidates per (agent, turn) from one prompt.
        ``progress`` (None when no bar is shown): call it with each episode's success as the
        episode finishes. Every workflow takes it (checked when the rollouts are set up)."""

    def estimators(self, sampling: str) -> tuple[str, ...]:
        """The estimators this workflow accepts with ``sampling``: by default every registered
        one that declares it (``register_estimator(name, samplings=...)``); a workflow may narrow it."""
        return estimators_for(sampling)

    def scalars(self, counts: dict[str, float]) -> dict[str, float]:
        """The scalars logged for a rollout's :attr:`RolloutResult.counts` (summed over ranks);
        by default each count as ``rollout/<name>``."""
        return {f"rollout/{k}": v for k, v in counts.items()}

    def close(self) -> None:
        """Release what the workflow holds (worker pools, connections); it may be used again after."""


def split_tasks(splits: dict[str, Sequence[Any]], split: str) -> Sequence[Any]:
    """``splits[split]``, or a KeyError naming the known splits."""
    if split not in splits:
        raise KeyError(f"unknown split {split!r}; known: {sorted(splits)}")
    return splits[split]


def pick_best(scores: Sequence[float], tie_break: str, rng: random.Random | None) -> int:
    """Index of the best tree candidate; ties go to the lowest index (``first``, or no ``rng``)
    or to a seeded random one (``random``)."""
    best = max(scores)
    ties = [i for i, s in enumerate(scores) if s == best]
    return ties[0] if rng is None or tie_break == "first" else rng.choice(ties)


def sample_groups(generate: GenerateFn, agent: str, prompts: Sequence[ChatPrompt],
                  k: int = 1) -> list[list[Completion]]:
    """``k`` completions per prompt. Identical prompts (e.g. every trajectory's first turn) are
    merged into one request, so the engine computes their common prefix once."""
    slots: dict[ChatPrompt, list[int]] = defaultdict(list)
    for i, p in enumerate(prompts):
        slots[p].append(i)
    by_count: dict[int, list[ChatPrompt]] = defaultdict(list)
    for p, idx in slots.items():
        by_count[k * len(idx)].append(p)
    out: list[list[Completion]] = [[] for _ in prompts]
    for count, unique in by_count.items():  # one call per distinct n
        for p, comps in zip(unique, generate(agent, unique, count)):
            for j, i in enumerate(slots[p]):
                out[i] = comps[j * k:(j + 1) * k]
    return out


WORKFLOWS: Registry[type[Workflow]] = Registry("workflow")
"""Workflow classes by name: ``--data.workflow search`` resolves through it."""


def check_tasks(tasks: Sequence[Any], workflow: Any, split: str) -> list[Task]:
    """``tasks`` as a list, refused (a TypeError naming the workflow, the split and what is missing)
    when one is not a :class:`~drmas.records.Task`: a workflow's own task type needs a ``uid`` and
    a ``source`` (None when it has none)."""
    tasks = list(tasks)
    checked: set[type] = set()  # one task per type: a split can hold many thousands
    for t in tasks:
        if type(t) in checked:
            continue
        checked.add(type(t))
        missing = [m for m in ("uid", "source") if not hasattr(t, m)]
        if missing:
            raise TypeError(f"{type(workflow).__name__}.tasks({split!r}) gave a {type(t).__name__} without "
                            f"{' and '.join(missing)}: a task needs a uid and a source (None when it has "
                            "none; drmas.records.Task)")
    return tasks
