"""The rollout-engine interface shared by the HF and vLLM engines."""

from __future__ import annotations

import dataclasses
import typing
from abc import ABC, abstractmethod
from dataclasses import dataclass
from typing import Any, ClassVar, Iterator, Sequence

import torch

from drmas.engines.sizing import EngineSizing
from drmas.records import Completion, GenerationSettings
from drmas.registry import Registry

__all__ = ["ENGINES", "Engine", "EngineError", "FullState", "Placement", "check_request", "parse_settings",
           "per_prompt", "policy_settings", "resolve_engine", "tensor_sums"]


@dataclass(frozen=True)
class Placement:
    """Where one policy's engine is built: this process's ranks and device."""

    rank: int = 0
    """Global rank of this process."""
    local_rank: int = 0
    """Rank on this node."""
    world_size: int = 1
    """Data-parallel ranks, each with its own engines."""
    device: torch.device = torch.device("cpu")
    """The device this rank trains on."""
    seed: int = 0
    """This rank's sampling seed."""
    sharded: bool = False
    """The trained model is sharded (FSDP): an engine cannot generate with it directly."""
    overlapped: bool = False
    """The engine generates while the trainer updates (``--data.rollout.staleness`` >= 1): it cannot
    generate with the trained model's tensors either."""
    cpus: tuple[int, ...] | None = None
    """The cores an engine in a process of its own runs on (None: the rank's share of the node's)."""
    engine_device: torch.device | None = None
    """The GPU this rank's engines run on when it is not the trainer's (``--model.engine_placement
    split``); None: the trainer's device."""
    reached: bool = False
    """Other ranks send this engine requests (per-policy pools): it runs in a process of its own,
    which listens on an address (:class:`~drmas.engines.served.ServedEngine`)."""
    in_flight: dict[str, int] = dataclasses.field(default_factory=dict)
    """Sequences a training rollout sends each policy's engine at once on this rank, at most (tasks
    per rank x group size x the policy's agents); none: unknown. An engine may size its batch by it."""

    @property
    def split(self) -> bool:
        """The engines run on a GPU of their own (in processes of their own, weights sent over NCCL
        or through the host)."""
        return self.engine_device is not None

    @property
    def engines_on(self) -> torch.device:
        """The device this rank's engines run on."""
        return self.engine_device if self.engine_device is not None else self.device


class EngineError(RuntimeError):
    """An engine failed while generating; the message names the policy and the agent."""


class Engine(ABC):
    """Generates from token-id prompts with the current weights of one policy.

    An engine class declares its settings (:attr:`settings_type`), builds itself for a policy
    (:meth:`create`), says how long a sequence it takes (:meth:`context_limit`) and, apart, what
    device memory it keeps (:attr:`sizing`, for the memory plan); registered in :data:`ENGINES`
    under a name, it is chosen with ``--model.engine NAME``, or by ``auto``
    (:func:`resolve_engine`). The trainer knows no engine by name.
    """

    settings_type: ClassVar[type | None] = None
    """The dataclass of this engine's settings: ``--model.engine_settings`` (one mapping for every
    policy) and a policy's own ``engine_settings`` over it; None: the engine takes none."""
    auto_preference: ClassVar[int | None] = None
    """Its place in ``--model.engine auto``'s choice: the available engine with the highest
    preference is taken; None: chosen only by name. Read from the class itself, not inherited:
    a subclass registered under a name of its own takes part only if it sets one."""
    sizing: ClassVar[type[EngineSizing]] = EngineSizing
    """What its engines take of device and host memory (:class:`~drmas.engines.sizing.EngineSizing`)."""

    @classmethod
    def own_process(cls, overlapped: bool) -> bool:
        """Whether it generates in a process of its own (``overlapped``: while the trainer updates,
        ``--data.rollout.staleness``); such engines get cores of their own then, on CPU. Default:
        False, in a thread of the trainer's process."""
        return False

    @classmethod
    def available(cls) -> bool:
        """Whether this engine can run here (its packages installed); ``auto`` skips it otherwise."""
        return True

    @classmethod
    def context_limit(cls, settings: Any) -> int | None:
        """Prompt plus response tokens an engine built with ``settings`` takes (None: the model's
        own limit); read before any engine exists, for the memory plan."""
        return None

    @classmethod
    def create(cls, policy: Any, settings: Any, place: Placement, pool: dict[str, Any],
               team: dict[str, Any]) -> tuple[Engine, bool]:
        """This engine for ``policy`` (its ``name``, ``model``, ``tokenizer``, ``adapter``,
        ``config``), and whether it already serves the policy's initial weights (else the first
        ``sync_weights`` publishes them). ``settings``: this policy's :attr:`settings_type`
        instance, ``--model.engine_settings`` with the policy's own over them (None for an engine
        without settings); ``pool``: engines that policies share, kept by the trainer;
        ``team``: every policy's config by name."""
        raise NotImplementedError(f"{cls.__name__} does not say how to build itself: implement Engine.create")

    @classmethod
    def check_placement(cls, place: Placement) -> None:
        """Refuse a placement this engine cannot follow (a one-line ValueError); every rank checks
        its own before any rank builds an engine."""

    asleep_measured: tuple[float, str] | None = None
    """What the engine holds on the device asleep, measured after its first sleep, and how it was read."""

    @classmethod
    def builds_alone(cls, device: Any) -> bool:
        """Whether a rank builds its engines on ``device`` one after the other (each finished before
        the next starts) rather than all at once."""
        return False

    context_length: int | None = None
    """Prompt plus response tokens this engine takes (None: the model's own limit)."""
    prompt_tokens: int = 0
    """Prompt tokens of the requests served since :meth:`take_cache_stats` (one per request, not per
    sample)."""
    cached_tokens: int = 0
    """How many of them came from a prefix cache (engines without one leave both at 0)."""

    def take_cache_stats(self) -> tuple[int, int]:
        """``(prompt_tokens, cached_tokens)`` since the last call; resets both."""
        stats = (self.prompt_tokens, self.cached_tokens)
        self.prompt_tokens = self.cached_tokens = 0
        return stats

    @abstractmethod
    def generate(
        self, prompts: Sequence[Sequence[int]], n: int, params: GenerationSettings,
        stops: Sequence[Sequence[str]] | None = None, max_new_tokens: Sequence[int] | None = None,
    ) -> list[list[Completion]]:
        """``n`` completions for each prompt, in prompt order (``text``: the response alone). ``stops[i]`` and
        ``max_new_tokens[i]``: prompt i's own stop strings and length budget (default:
        ``params.stop`` and ``params.max_new_tokens``), so one batched call serves prompts with
        different ones (:func:`per_prompt` resolves them)."""

    @abstractmethod
    def sync_weights(self, weights: FullState) -> None:
        """Serve the current weights of ``weights.model`` from now on (a copy made from the pass of
        full tensors ``weights`` is, in ``transfer_dtype``, or the model object itself)."""

    def ready(self) -> None:
        """Block until the engine can serve; an engine that builds in the background (a process
        of its own) raises its build failure here. The trainer calls it on every engine once all
        are created, so the engines of one rank build side by side."""

    def reseed(self, seed: int) -> None:
        """Draw the next samples from ``seed`` (called before every rollout with a seed of the run's
        seed, the rank and the iteration). Default: nothing, for an engine that samples from the
        trainer's own RNG, which the checkpoint holds (the HF engine)."""

    def sleep(self) -> None:
        """Free accelerator memory for training until the next ``sync_weights`` or :meth:`wake`
        (default: no-op)."""

    @property
    def transfer_dtype(self) -> torch.dtype | None:
        """The dtype a weight sync gathers sharded tensors in (None: their own)."""
        return None

    def wake(self) -> None:
        """Bring back what :meth:`sleep` released, when no weights are to be sent (default: no-op)."""

    @property
    def asleep(self) -> bool:
        """Whether :meth:`sleep` discarded the weights (the next ``sync_weights`` brings them back)."""
        return False

    def close(self) -> None:
        """Release engine resources (KV cache, worker threads)."""

    def record_transfer(self) -> None:
        """Sum each tensor of the next weight transfer as the engine receives it, for
        :meth:`received_sums` (the first-minute pass); default: nothing to do."""

    def received_sums(self) -> dict[str, tuple[float, float]] | None:
        """:func:`tensor_sums` of each tensor, by checkpoint name, as the engine received it in the
        transfer :meth:`record_transfer` announced; None: the engine generates with the trained model's
        own tensors (nothing moves), or cannot say."""
        return None


ENGINES: Registry[type[Engine]] = Registry("engine")
"""Engine classes by name (``--model.engine NAME``): ``@ENGINES.register("name")`` on an
:class:`Engine` subclass adds one, from any module the recipe imports."""


def resolve_engine(name: str) -> tuple[str, type[Engine]]:
    """The engine ``--model.engine NAME`` selects: a registered name, or ``auto``, the available
    engine of the highest :attr:`Engine.auto_preference`."""
    if name != "auto":
        if name not in ENGINES:
            raise ValueError(f"engine must be 'auto' or one of {ENGINES.names()}, got {name!r}")
        return name, ENGINES.get(name)
    ranked = sorted(((vars(c)["auto_preference"], n) for n, c in ENGINES.items()
                     if vars(c).get("auto_preference") is not None), reverse=True)
    for _, n in ranked:
        if ENGINES.get(n).available():
            return n, ENGINES.get(n)
    raise ValueError(f"--model.engine auto found no available engine among {[n for _, n in ranked]}")


def parse_settings(name: str, engine: type[Engine], raw: dict[str, Any],
                   where: str = "--model.engine_settings", base: Any = None) -> Any:
    """``raw`` as an instance of the engine's :attr:`~Engine.settings_type` (over ``base``, else
    the type's defaults). One namespace serves every engine, as one config may run with any:
    the keys another registered engine declares are left to it; a key no engine declares, or a
    value of the wrong type, is refused in one line naming the key, the engine and ``where``."""
    kind = engine.settings_type
    hints = typing.get_type_hints(kind) if kind is not None else {}
    others = {f.name for _, c in ENGINES.items()
              if c.settings_type is not None and c is not engine
              for f in dataclasses.fields(c.settings_type)}
    own: dict[str, Any] = {}
    for key, value in raw.items():
        if key not in hints:
            if key in others:
                continue
            raise ValueError(f"unknown setting {key!r} of engine {name!r} in {where}; known: {list(hints)}")
        want = hints[key]
        if want is float and isinstance(value, int) and not isinstance(value, bool):
            value = float(value)
        elif isinstance(want, type) and not isinstance(value, want):
            raise ValueError(f"setting {key!r} of engine {name!r} in {where} must be {want.__name__}, "
                             f"got {value!r}")
        own[key] = value
    if kind is None:
        return None
    return dataclasses.replace(base, **own) if base is not None else kind(**own)


def policy_settings(settings: Any, config: Any) -> Any:
    """``settings`` with a policy's own ``engine_settings`` over them (the keys of this engine's
    type; checked by :func:`parse_settings` at the trainer's start)."""
    own = config.engine_settings
    if settings is None or not own:
        return settings
    known = {f.name for f in dataclasses.fields(settings)}
    return dataclasses.replace(settings, **{k: v for k, v in own.items() if k in known})


def per_prompt(prompts: Sequence[Sequence[int]], params: GenerationSettings,
               stops: Sequence[Sequence[str]] | None,
               max_new_tokens: Sequence[int] | None) -> tuple[list[list[str]], list[int]]:
    """Each prompt's stop strings and length budget: the given ones, else ``params``'s; checked."""
    stops = [list(params.stop)] * len(prompts) if stops is None else [list(s) for s in stops]
    budgets = [params.max_new_tokens] * len(prompts) if max_new_tokens is None else list(max_new_tokens)
    if len(stops) != len(prompts) or len(budgets) != len(prompts):
        raise ValueError(f"{len(prompts)} prompts but {len(stops)} stop lists and "
                         f"{len(budgets)} max_new_tokens")
    for i, budget in enumerate(budgets):
        if budget < 1:
            raise ValueError(f"max_new_tokens must be >= 1, got {budget} for prompt {i}")
    return stops, budgets


def check_request(prompts: Sequence[Sequence[int]], n: int, params: GenerationSettings) -> None:
    """Refuse requests every engine would mishandle, with the offending value in the message."""
    if n < 1:
        raise ValueError(f"n must be >= 1, got {n}")
    if params.max_new_tokens < 1:
        raise ValueError(f"max_new_tokens must be >= 1, got {params.max_new_tokens}")
    if params.temperature < 0:
        raise ValueError(f"temperature must be >= 0 (0 = greedy), got {params.temperature}")
    if not 0 < params.top_p <= 1:
        raise ValueError(f"top_p must be in (0, 1], got {params.top_p}")
    if params.top_k < 0:
        raise ValueError(f"top_k must be >= 0 (0 = off), got {params.top_k}")
    for i, p in enumerate(prompts):
        if len(p) == 0:
            raise ValueError(f"prompt {i} is empty; engines need at least one prompt token")


def tensor_sums(tensor: torch.Tensor) -> tuple[float, float]:
    """``(sum, sum of squares)`` of a tensor's values in float64: what a weight transfer's two sides
    compare (one altered value moves the second by its square)."""
    values = tensor.detach().double()
    return float(values.sum()), float(values.square().sum())


class FullState:
    """One pass over ``model``'s state dict, each item a full tensor (floating ones cast to ``dtype``),
    for one engine's weight sync; it holds its own count of the gathers made, so no state outlives
    the sync.

    A sharded (FSDP2) parameter is gathered from every rank when its turn comes and dropped once
    the consumer has copied it, so no rank holds a second full copy of the model; its local shard
    is cast first, so the gather moves the target dtype's bytes. Gathering is a collective: every
    rank must make the whole pass, in the same order; a rank whose consumer failed midway makes the
    rest with :meth:`finish`. Engines that use the model object itself (no copy) read :attr:`model`.
    """

    def __init__(self, model: torch.nn.Module, dtype: torch.dtype | None = None) -> None:
        self.model, self.dtype = model, dtype
        self.gathered = 0
        """Items of the current pass gathered so far."""

    def __iter__(self) -> Iterator[tuple[str, torch.Tensor]]:
        self.gathered = 0
        for name, tensor in self.model.state_dict().items():
            full = _full(_cast(tensor.detach(), self.dtype))
            self.gathered += 1
            yield name, full

    def finish(self) -> None:
        """Make, and drop, the gathers of the pass that this rank's consumer left undone (it failed):
        the other ranks are not left waiting inside a gather."""
        for _, tensor in list(self.model.state_dict().items())[self.gathered:]:
            _full(_cast(tensor.detach(), self.dtype))
            self.gathered += 1


def _cast(tensor: torch.Tensor, dtype: torch.dtype | None) -> torch.Tensor:
    return tensor.to(dtype) if dtype is not None and tensor.is_floating_point() else tensor


def _full(tensor: torch.Tensor) -> torch.Tensor:
    if not hasattr(tensor, "full_tensor"):
        return tensor
    mesh = tensor.device_mesh.device_type
    if tensor.device.type != mesh:  # an offloaded shard (fsdp_offload): gather where the group runs
        tensor = tensor.to(mesh)
    return tensor.full_tensor()
