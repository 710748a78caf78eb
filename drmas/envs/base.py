"""Interfaces shared by every multi-agent workflow: prompts, completions, the workflow, registries.

A workflow decides which agent acts when, builds each agent's prompt from the current state,
parses the agent's output into an action, steps the environment and assigns rewards. It never
sees models or tokenizers: it calls a ``generate(agent, prompts, n)`` function that the data
module routes to the agent's policy, so one workflow runs on a shared model, one model per
agent, or different model families alike. Nothing here imports Lightning.
"""

from __future__ import annotations

import random
from abc import ABC, abstractmethod
from collections import defaultdict
from dataclasses import dataclass, field
from typing import Any, Callable, Generic, Protocol, Sequence, TypeVar

from drmas.data.experience import Experience

__all__ = [
    "WORKFLOWS",
    "ChatPrompt",
    "Completion",
    "EpisodeResult",
    "GenerateFn",
    "PromptTemplate",
    "Registry",
    "RolloutResult",
    "Workflow",
    "pick_best",
    "sample_each",
    "sample_groups",
    "split_tasks",
]

T = TypeVar("T")


class Registry(Generic[T]):
    """Name -> class map that users extend with ``@REGISTRY.register("name")``."""

    def __init__(self, kind: str) -> None:
        self.kind = kind
        self._items: dict[str, T] = {}

    def register(self, name: str) -> Callable[[T], T]:
        def deco(obj: T) -> T:
            if name in self._items:
                raise ValueError(f"{self.kind} {name!r} is already registered")
            self._items[name] = obj
            return obj

        return deco

    def get(self, name: str) -> T:
        if name not in self._items:
            raise KeyError(f"unknown {self.kind} {name!r}; known: {', '.join(sorted(self._items))}")
        return self._items[name]

    def __contains__(self, name: str) -> bool:
        return name in self._items

    def names(self) -> list[str]:
        return sorted(self._items)


@dataclass(frozen=True)
class ChatPrompt:
    """What an agent is asked: chat messages, plus an assistant prefill that is part of the
    prompt (not trained) but also of the text that gets parsed, and the stop strings."""

    messages: tuple[tuple[str, str], ...]  # (role, content)
    prefill: str = ""
    stop: tuple[str, ...] = ()


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


@dataclass
class Completion:
    """One generated answer to a ChatPrompt, with the tokens the trainer needs."""

    prompt_ids: list[int]
    response_ids: list[int]
    logprobs: list[float]
    text: str
    """``prefill + response text``: what the agent's parser reads."""
    finish_reason: str = "stop"


class GenerateFn(Protocol):
    def __call__(self, agent: str, prompts: Sequence[ChatPrompt], n: int) -> list[list[Completion]]:
        """``n`` completions for each prompt, sampled from ``agent``'s policy."""


@dataclass
class EpisodeResult:
    """Outcome of one trajectory (for success rates, turns and avg@k / pass@k)."""

    task_uid: str
    traj_uid: str
    success: bool
    turns: int
    team_reward: float
    info: dict = field(default_factory=dict)


@dataclass
class RolloutResult:
    experiences: list[Experience]
    episodes: list[EpisodeResult]


class Workflow(ABC):
    """A multi-agent workflow over a task set."""

    agents: tuple[str, ...] = ()
    """The agent roles, in acting order."""

    @abstractmethod
    def tasks(self, split: str) -> Sequence[Any]:
        """The tasks of a split (``train``, ``val``, ``test``); each has a unique ``uid``."""

    @abstractmethod
    def rollout(
        self, tasks: Sequence[Any], generate: GenerateFn, *, n: int, mode: str = "parallel", seed: int = 0
    ) -> RolloutResult:
        """Play the tasks. ``parallel``: ``n`` independent trajectories per task. ``tree``: one
        executed trajectory per task, ``n`` candidates per (agent, turn) from one prompt."""

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


def sample_groups(generate: GenerateFn, agent: str, prompts: Sequence[ChatPrompt], k: int = 1) -> list[list[Completion]]:
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


def sample_each(generate: GenerateFn, agent: str, prompts: Sequence[ChatPrompt]) -> list[Completion]:
    """One completion per prompt (see :func:`sample_groups`)."""
    return [c for (c,) in sample_groups(generate, agent, prompts)]


WORKFLOWS: Registry[type[Workflow]] = Registry("workflow")
