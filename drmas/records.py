"""The record types every layer passes around, at the bottom of the package.

What a workflow asks (:class:`ChatPrompt`) and gets back (:class:`Completion`), what one LLM
call becomes for training (:class:`Sample`), how an episode ended (:class:`EpisodeResult`),
what a rollout returns (:class:`RolloutResult`), the tensors of one forward pass
(:class:`MicroBatch`), and what one RL iteration hands the trainer (:class:`PreparedIteration`).
This module imports nothing of drmas, so every other module may import it.
"""

from __future__ import annotations

from dataclasses import dataclass, field, fields
from typing import Any, Callable, Hashable, Protocol, Sequence, runtime_checkable

from torch import Tensor

__all__ = [
    "BatchSpec",
    "ChatPrompt",
    "Completion",
    "EPISODES_DIR",
    "EpisodeResult",
    "GenerateFn",
    "GenerationSettings",
    "METRICS_FILE",
    "MicroBatch",
    "PackedRows",
    "PreparedIteration",
    "RolloutResult",
    "Sample",
    "ScriptedGenerate",
    "Task",
]


@runtime_checkable
class Task(Protocol):
    """What the rollout side reads of a task (``Workflow.tasks`` returns them); a workflow's own
    task type carries whatever else its episodes need."""

    uid: str
    """Unique within its split: an episode's samples name it (``Sample.task_uid``)."""
    source: str | None
    """The dataset it came from (None or empty: not said). Validation keeps avg@k and pass@k per
    source, and ``validation.tasks`` counts per source."""


EPISODES_DIR = "episodes"
"""The folder of a run's log dir that keeps its samples as records (:mod:`drmas.data.episodes`)."""

METRICS_FILE = "metrics.jsonl"
"""Every scalar a run logs, a line per call (``{"iteration": k, tag: value, ...}``), in its log folder
whatever the logger (:mod:`drmas.modules.scalar_log` writes it): what ``drmas.report`` and
``drmas.plots`` read, so a run with ``CSVLogger`` or ``WandbLogger`` (whose files they cannot read)
has its report and plots too."""

@dataclass(frozen=True)
class ChatPrompt:
    """What an agent is asked: chat messages, plus an assistant prefill that is part of the
    prompt (not trained) but also of the text that gets parsed, and the stop strings."""

    messages: tuple[tuple[str, str], ...]  # (role, content)
    prefill: str = ""
    stop: tuple[str, ...] = ()
    max_new_tokens: int | None = None
    """At most this many response tokens (None: the policy's sampling budget, which also caps it)."""
    tools: tuple[str, ...] = ()
    """OpenAI function tools offered, each as JSON text (a prompt is hashable): rendered by the
    policy's chat template where it takes tools, else in the hermes format (``drmas.tool_calls``)."""
    fields: tuple[str, ...] = ()
    """Per message, JSON text of its OpenAI fields beyond role and content (an assistant's
    ``tool_calls``, a tool result's ``tool_call_id``, a ``name``), ``""`` for none; empty: no message
    has any."""
    template_kwargs: str = ""
    """JSON text of the request's own chat-template variables (e.g. ``enable_thinking``), over the
    policy's; "" for none."""


@dataclass
class Completion:
    """One generated answer to a ChatPrompt, with the tokens the trainer needs."""

    prompt_ids: list[int]
    response_ids: list[int]
    logprobs: list[float]
    text: str
    """``prefill + response text``: what the agent's parser reads."""
    finish_reason: str = "stop"


@dataclass(frozen=True)
class GenerationSettings:
    """How a policy samples: its training and its evaluation settings (``generation.train`` and
    ``generation.eval`` of a policy's config), what one engine call samples with, and the limits
    an endpoint answers requests within."""

    temperature: float = 1.0
    """Softmax temperature; 0 means greedy."""
    top_p: float = 1.0
    """Nucleus sampling mass (1.0 = off)."""
    top_k: int = 0
    """Keep the k most likely tokens (0 = off)."""
    max_new_tokens: int = 128
    """The longest response, in tokens (a prompt may ask for fewer)."""
    stop: tuple[str, ...] = ()
    """Stop strings; the response ends after the first one and includes it (every prompt's own
    stops are added to them)."""


class GenerateFn(Protocol):
    """The ``generate`` function a workflow is given: every member a workflow may use. The
    trainer's (``drmas.modules.policy_generate.PolicyGenerate``) answers all of them; a scripted one
    (:class:`ScriptedGenerate`) says it knows no settings or lengths."""

    train: bool
    """Whether it samples for training (True) or for validation and testing (False)."""

    def __call__(self, agent: str, prompts: Sequence[ChatPrompt], n: int) -> list[list[Completion]]:
        """``n`` completions for each prompt, sampled from ``agent``'s policy."""

    def settings(self, agent: str) -> GenerationSettings | None:
        """The agent's policy's generation settings (None: not known)."""

    def context_length(self, agent: str) -> int | None:
        """Prompt plus response tokens the agent's engine takes (None: not known)."""

    def prompt_tokens(self, agent: str, prompt: ChatPrompt) -> int | None:
        """The prompt's length in tokens under the agent's chat template (None: not known)."""

    def check_stop(self) -> None:
        """Raise when the run was asked to stop (preempted)."""

    def tool_format(self, agent: str) -> tuple[str, Any] | None:
        """``(format, tokenizer)`` the agent's tool calls are parsed with (None: it takes no tools)."""

    def tokenizer(self, agent: str) -> Any | None:
        """The agent's policy's tokenizer, to show the text of each sampled token (None: not known)."""


@dataclass
class ScriptedGenerate:
    """A :class:`GenerateFn` around a plain ``fn(agent, prompts, n)``, for a workflow's tests or a
    scripted engine: no settings or lengths to report, nothing to stop."""

    fn: Callable[[str, Sequence[ChatPrompt], int], list[list[Completion]]]
    train: bool = True

    def __call__(self, agent: str, prompts: Sequence[ChatPrompt], n: int) -> list[list[Completion]]:
        return self.fn(agent, prompts, n)

    def settings(self, agent: str) -> GenerationSettings | None:
        return None

    def context_length(self, agent: str) -> int | None:
        return None

    def prompt_tokens(self, agent: str, prompt: ChatPrompt) -> int | None:
        return None

    def check_stop(self) -> None:
        return None

    def tool_format(self, agent: str) -> tuple[str, Any] | None:
        return None

    def tokenizer(self, agent: str) -> Any | None:
        return None


@dataclass
class Sample:
    """One training sample: one agent's LLM call with everything the estimators and the trainer
    need."""

    task_uid: Hashable
    traj_uid: Hashable
    """The trajectory; in tree sampling the task's one executed trajectory, under which every
    step's candidates are recorded (AT-GRPO groups by it)."""
    agent: str
    turn: int
    policy: str
    prompt_ids: list[int]
    response_ids: list[int]
    engine_logprobs: list[float]
    text: str = ""
    """The parsed text: the prompt's prefill followed by the response."""
    valid: bool = True
    """Whether the action parsed; an invalid one gets the format penalty."""
    team_reward: float = 0.0
    local_reward: float = 0.0
    """The agent's role reward plus the format term (``drmas.algorithms.rewards``)."""
    reward: float = 0.0
    """The score the estimators use (alpha * team + local, set by the workflow)."""
    advantage: float = 0.0
    version: int = 0
    """The weights that generated it: those after this many updates of its policy (iterations;
    the trainer at iteration k holds ``k - 1``, so its staleness there is ``k - 1 - version``)."""
    candidate: int = 0
    """Its index among the candidates sampled from one prompt at one tree node (tree sampling: the
    node is its trajectory, agent and turn); 0 with one candidate per step."""
    chosen: bool = True
    """Whether it was the candidate executed (tree sampling); always with one candidate per step."""
    cut: bool = False
    """The response ended at its token limit (finish reason ``length``), not at a stop."""
    info: dict = field(default_factory=dict)


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
    """What playing a batch of tasks returns: every sample, and how each episode ended."""

    samples: list[Sample]
    episodes: list[EpisodeResult]
    counts: dict[str, float] = field(default_factory=dict)
    """Additive counts the workflow reports (summed over ranks; see ``Workflow.scalars``)."""


@dataclass
class PackedRows:
    """A micro-batch's samples with shared prompt prefixes packed so each prefix runs once.

    Each row holds one group of samples: their common prompt prefix, then every sample's own
    remainder (rest of the prompt and the response), one after another. A remainder attends to
    the prefix and to itself only (``segments``), with positions continuing from the prefix.
    """

    input_ids: Tensor  # [R, Lp]
    position_ids: Tensor  # [R, Lp]
    segments: Tensor  # [R, Lp]: 0 = the shared prefix, k > 0 = the k-th remainder, -1 = padding
    rows: Tensor  # [T]: for each response token, in ``response_mask`` order, the packed row ...
    cols: Tensor  # [T]: ... and column whose logits predict it

    @property
    def tokens(self) -> int:
        """Tokens the decoder runs (padding excluded)."""
        return int((self.segments >= 0).sum())

    def to(self, device) -> "PackedRows":
        return PackedRows(*(getattr(self, f.name).to(device) for f in fields(self)))


@dataclass
class MicroBatch:
    """Right-padded token tensors of some samples of one policy, ready for a forward pass.

    Padding is tight: sequences are sorted by length before chunking, so a micro-batch is only
    as long as its longest sequence.
    """

    policy: str
    input_ids: Tensor  # [B, L]
    attention_mask: Tensor  # [B, L]
    response_mask: Tensor  # [B, L-1], aligned with logits[:, :-1] (predicts token t+1)
    engine_logprobs: Tensor  # [B, L-1]
    advantages: Tensor  # [B]
    sample_index: Tensor  # [B] positions in the policy's sample list (for old log-probs)
    loss_scale: float
    """This micro-batch's share of its policy's batch, so summed micro-batch losses equal
    the loss of the whole batch under the chosen aggregation."""
    ppo_epoch: int = 0
    """Which pass over the policy's samples this is (0 = the first, sampled by these weights)."""
    step_after: bool = False
    """Run the optimiser step of ``policy`` after this micro-batch's backward."""
    packed: PackedRows | None = None
    """The same samples with shared prefixes packed (None: run them as they are)."""
    stand_in: bool = False
    """A zero-weight stand-in that keeps this rank's passes in step with the other ranks'
    (sharded training needs every rank to run the same number of forward/backward passes)."""
    agent: str | None = None
    """The one agent whose samples this micro-batch holds (batches split by agent), else None."""
    idle: bool = False
    """Under per-policy pools: a pass of no policy, which keeps this rank's passes as many as every
    other rank's (Lightning broadcasts its stop flag before each); the trainer skips it."""


@dataclass(frozen=True)
class BatchSpec:
    """What packing one policy's samples into micro-batches needs to know about the policy."""

    pad_id: int
    micro_batch_size: int
    ppo_epochs: int = 1
    agg: str = "token-mean"
    """The loss aggregation (sets each micro-batch's ``loss_scale``)."""
    prefix_sharing: bool = False
    """Order samples so shared prompt prefixes sit together and pack them (:class:`PackedRows`)."""
    by_agent: bool = False
    """Never put two agents' samples in one micro-batch (for per-agent gradient norms)."""
    attention_window: int | None = None
    """The model's sliding attention window: a micro-batch is packed only when each of its
    samples fits in it (a packed row's block mask knows no window)."""
    trainable: bool = True
    """False: a frozen policy, whose samples get no micro-batches."""
    ranks: tuple[int, ...] | None = None
    """The ranks that train the policy, its pool (each gets its share of the policy's micro-batches,
    the others none); None: every rank."""


@dataclass
class PreparedIteration:
    """One RL iteration as the rollout side hands it to the trainer and the callbacks."""

    iteration: int
    rollout: RolloutResult
    """Every sample (with policy, reward and advantage set) and every episode's outcome, of all
    ranks."""
    micro_batches: list[MicroBatch]
    """This rank's share of each policy's micro-batches, PPO epoch after PPO epoch, in training
    order (every micro-batch when there is one rank)."""
    timings: dict[str, float] = field(default_factory=dict)
    """Seconds spent: ``time/sync_s``, ``time/rollout_s``, ``time/advantage_s``."""
    scalars: dict[str, float] = field(default_factory=dict)
    """Rollout-wide counts over all ranks: ``rollout/failed_actions``, ``rollout/nonfinite_rewards``
    and, when the engines keep a prefix cache, ``rollout/prefix_cache_hit_rate``."""

    @property
    def samples(self) -> list[Sample]:
        return self.rollout.samples
