"""One turn-based episode loop for every workflow, in ``parallel`` and ``tree`` (AT-GRPO) sampling.

A workflow subclasses :class:`TurnWorkflow` and declares its agents, its samplings, its tasks, and
per step: which agent acts (``state.agent``), that agent's prompt (:meth:`~TurnWorkflow.prompt`),
how a candidate is scored on its own (:meth:`~TurnWorkflow.evaluate`, which must not touch the
state), how the state advances with the executed candidate (:meth:`~TurnWorkflow.advance`, which
also sets ``state.agent``, ``state.turn`` and ``state.done``), and the episode's team reward
(:meth:`~TurnWorkflow.team_reward`). The loop does the rest:

- Rounds: every round serves the agents in ``step_order``; each active episode whose
  ``state.agent`` is that agent gets one prompt, and all those prompts go out in one
  ``generate`` call (identical prompts merged, so a shared prefix is computed once).
- ``parallel``: ``n`` independent trajectories per task, one candidate per step. At the end
  every sample of a trajectory gets ``alpha * team + local``, where team is the episode's team
  reward and local is the format term (``-format_penalty`` for an invalid action), plus the
  sample's role reward when ``role_rewards`` is on, plus the agent's final reward: what
  :meth:`~TurnWorkflow.final_rewards` gives it once the episode is over (a judge's verdict
  deciding two debaters' rewards), on every sample of that agent.
- ``tree``: one trajectory per task; at every step ``n`` candidates from the same prompt, each
  scored on its own: ``alpha * team + role + format``, where team counts only when that
  candidate would end the episode. All candidates are recorded under the trajectory's ``traj_uid``;
  the best (:func:`pick_best`: ties to the lowest index, or seeded random) is executed and the
  next prompt is built from the advanced state.
"""

from __future__ import annotations

import random
from abc import abstractmethod
from dataclasses import dataclass, field
from typing import Any, Callable, Sequence

from drmas.algorithms import sample_reward
from drmas.workflows.base import SAMPLINGS, GraderError, PromptTemplate, Workflow, pick_best, sample_groups
from drmas.records import ChatPrompt, Completion, EpisodeResult, Sample, GenerateFn, RolloutResult

__all__ = ["Action", "EpisodeState", "TurnWorkflow"]

TIE_BREAKS = ("first", "random")


@dataclass
class EpisodeState:
    """The part of a workflow's state the loop reads; workflows subclass it with their own fields."""

    task: Any
    """The task being played (it has a ``uid``)."""
    agent: str
    """The agent that acts next."""
    turn: int = 0
    """The current turn (recorded on every sample; an episode's turn count is ``turn + 1``)."""
    done: bool = False


@dataclass
class Action:
    """One candidate's outcome, scored without touching the state."""

    valid: bool
    """The output parsed; an invalid one adds ``-format_penalty`` to the local reward."""
    role_reward: float = 0.0
    """What the action earned in the agent's role (the local reward adds the format term)."""
    ends: bool = False
    """Executing it would end the episode (tree sampling then adds ``alpha * team_reward``)."""
    team_reward: float = 0.0
    """The team reward if it ends the episode (read only when ``ends``)."""
    value: Any = None
    """What :meth:`TurnWorkflow.advance` needs to execute it (a parsed answer, search results...)."""
    failure: str | None = None
    """Why the environment could not carry the action out (a retrieval server down after its
    retries...): not the agent's fault, so no format penalty; the rollout counts these and stops
    the run when too many of an iteration's actions fail (``max_failed_share``)."""


@dataclass
class _Episode:
    state: EpisodeState
    traj_uid: str
    samples: list[Sample] = field(default_factory=list)


class TurnWorkflow(Workflow):
    """A workflow whose episodes are played by the shared loop (see the module docstring)."""

    step_order: tuple[str, ...] = ()
    """The order in which agents are served within a round (default: ``agents``)."""
    default_max_turns: int = 4
    """The workflow's turn limit when ``max_turns`` is not given."""

    def __init__(
        self,
        *,
        max_turns: int | None = None,
        alpha: float = 1.0,
        format_penalty: float = 0.1,
        tie_break: str = "first",
        templates: dict[str, PromptTemplate] | None = None,
        role_rewards: bool = True,
        default_templates: dict[str, PromptTemplate] | None = None,
    ) -> None:
        """The options every turn-based workflow takes; a workflow's own ``__init__`` passes them on
        with ``**options`` (so they are declared and documented here once) and sets the last two.

        Args:
            max_turns: turn limit of an episode (None: the workflow's own, ``default_max_turns``:
                2 solver attempts for the solver/verifier loop, 1 round for debate, 4 elsewhere).
            alpha: weight of the team reward in ``alpha * team + local``.
            format_penalty: magnitude of the format term, ``-format_penalty`` in the local
                reward of a malformed action.
            tie_break: how tree sampling picks among equally scored candidates: ``first``
                (lowest index) or ``random`` (seeded).
            templates: per-agent prompt templates replacing the defaults (by agent name).
            role_rewards: in parallel sampling, add each agent's role reward to its local term (set
                by the workflow). Tree sampling always scores a candidate with its role reward
                (AT-GRPO's local term): it is what ranks one (agent, turn)'s candidates.
            default_templates: the workflow's own templates (set by the workflow).
        """
        self.max_turns = self.default_max_turns if max_turns is None else max_turns
        if self.max_turns < 1:
            raise ValueError(f"max_turns must be >= 1, got {self.max_turns}")
        if tie_break not in TIE_BREAKS:
            raise ValueError(f"tie_break must be one of {TIE_BREAKS}, got {tie_break!r}")
        unknown = set(templates or {}) - set(self.agents)
        if unknown:
            raise ValueError(f"templates for unknown agents {sorted(unknown)}; agents: {list(self.agents)}")
        self.alpha, self.format_penalty, self.role_rewards, self.tie_break = (alpha, format_penalty,
                                                                              role_rewards, tie_break)
        self.templates = {**(default_templates or {}), **(templates or {})}

    # ---- what a workflow declares -----------------------------------------------------------

    @abstractmethod
    def initial_state(self, task: Any) -> EpisodeState:
        """A fresh episode of ``task`` (``agent`` = the first to act)."""

    @abstractmethod
    def prompt(self, agent: str, state: EpisodeState) -> ChatPrompt:
        """``agent``'s prompt in ``state``."""

    @abstractmethod
    def evaluate(self, agent: str, states: Sequence[EpisodeState],
                 completions: Sequence[Completion]) -> list[Action]:
        """Parse and score each completion against its state, in one batch (so retrieval or
        code execution can run together); never changes a state."""

    @abstractmethod
    def advance(self, agent: str, state: EpisodeState, action: Action) -> None:
        """Execute ``action`` on ``state``: update it, and set ``agent``, ``turn`` and ``done``."""

    @abstractmethod
    def team_reward(self, state: EpisodeState) -> float:
        """The team reward of a finished episode (its success when > 0)."""

    def success(self, state: EpisodeState) -> bool:
        """Whether a finished episode counts as solved (success rate, avg@k, pass@k): by default
        a positive team reward; a workflow with graded team rewards (a pass rate) says more."""
        return self.team_reward(state) > 0

    def final_rewards(self, state: EpisodeState) -> dict[str, float]:
        """Per-agent rewards decided when the episode is over (parallel sampling: added to the local
        reward of every sample of that agent; tree candidates are scored before any exists, so a
        workflow that uses them plays parallel sampling only). Default: none."""
        return {}

    def episode_info(self, state: EpisodeState) -> dict:
        """Extra facts about a finished episode (e.g. its answer) for :class:`EpisodeResult`."""
        return {}

    # ---- the loop ---------------------------------------------------------------------------

    def rollout(
        self, tasks: Sequence[Any], generate: GenerateFn, *, n: int, sampling: str = "parallel",
        seed: int = 0, progress: Callable[[bool], None] | None = None,
    ) -> RolloutResult:
        if sampling not in SAMPLINGS:
            raise ValueError(f"sampling must be one of {list(SAMPLINGS)}, got {sampling!r}")
        if sampling not in self.samplings:
            raise ValueError(f"{type(self).__name__} plays {' or '.join(self.samplings)} sampling only, "
                             f"not {sampling!r}")
        tree = sampling == "tree"
        if tree:
            eps = [_Episode(self.initial_state(t), f"{t.uid}#tree") for t in tasks]
        else:
            eps = [_Episode(self.initial_state(t), f"{t.uid}#{j}") for t in tasks for j in range(n)]
        rng = random.Random(seed) if tree else None
        order = self.step_order or self.agents
        reported: set[int] = set()
        while any(not ep.state.done for ep in eps):
            for agent in order:
                group = [ep for ep in eps if not ep.state.done and ep.state.agent == agent]
                if group:
                    self._step(agent, group, generate, n if tree else 1, rng)
            if progress is not None:
                for i, ep in enumerate(eps):
                    if ep.state.done and i not in reported:
                        reported.add(i)
                        progress(self.success(ep.state))
        episodes, samples, grader_errors = [], [], 0
        for ep in eps:
            try:
                team = self.team_reward(ep.state)
            except GraderError as err:  # the reward is unknown: a failed episode, none of it trained
                grader_errors += 1
                why = f"episode {ep.traj_uid}: the grader failed: {err}"
                episodes.append(EpisodeResult(ep.state.task.uid, ep.traj_uid, False, ep.state.turn + 1, 0.0,
                                              {"failure": why}))
                continue
            if not tree:
                final = self.final_rewards(ep.state)
                for s in ep.samples:
                    role = (s.info["role_reward"] if self.role_rewards else 0.0) + final.get(s.agent, 0.0)
                    s.team_reward = team
                    s.local_reward, s.reward = sample_reward(team, role, s.valid, self.alpha,
                                                             self.format_penalty)
            episodes.append(EpisodeResult(ep.state.task.uid, ep.traj_uid, self.success(ep.state),
                                          ep.state.turn + 1, team, self.episode_info(ep.state)))
            samples += ep.samples
        return RolloutResult(samples, episodes, {"grader_errors": float(grader_errors)})

    def _step(self, agent: str, group: list[_Episode], generate: GenerateFn, k: int,
              rng: random.Random | None) -> None:
        """One prompt per episode, ``k`` candidates each, all scored in one batch; then each
        episode executes its best candidate (with ``k == 1``, its only one)."""
        cands = sample_groups(generate, agent, [self.prompt(agent, ep.state) for ep in group], k)
        actions = iter(self.evaluate(agent, [ep.state for ep in group for _ in range(k)],
                                     [c for cs in cands for c in cs]))
        for ep, comps in zip(group, cands):
            acts = [next(actions) for _ in comps]
            recs = [self._record(ep, agent, c, a) for c, a in zip(comps, acts)]
            best = pick_best([s.reward for s in recs], self.tie_break, rng)
            for i, s in enumerate(recs):
                s.candidate, s.chosen = i, i == best
            ep.samples.extend(recs)
            self.advance(agent, ep.state, acts[best])

    def _record(self, ep: _Episode, agent: str, c: Completion, a: Action) -> Sample:
        """The candidate as a sample, with its tree score (parallel sampling rescores at the end)."""
        s = Sample(
            task_uid=ep.state.task.uid, traj_uid=ep.traj_uid, agent=agent, turn=ep.state.turn,
            policy="", prompt_ids=c.prompt_ids, response_ids=c.response_ids, engine_logprobs=c.logprobs,
            text=c.text, valid=a.valid, cut=c.finish_reason == "length", info={"role_reward": a.role_reward},
        )
        if a.failure is not None:
            s.info["failure"] = a.failure
        s.team_reward = a.team_reward if a.ends else 0.0
        s.local_reward, s.reward = sample_reward(s.team_reward, a.role_reward, a.valid, self.alpha,
                                                 self.format_penalty)
        return s
