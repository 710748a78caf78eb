"""The vLLM engines' settings and the arithmetic of where they run: their share of a GPU or of
the machine's memory (refused when they cannot fit), the arguments of each engine, and the device
and cores of its process. Pure Python: importing it does not import vLLM."""

from __future__ import annotations

import os
from dataclasses import dataclass, field
from typing import Any, Sequence

import torch

from drmas.engines.base import policy_settings
from drmas.engines.placement import device_env, gpu_uuid
from drmas.hardware import engine_dtype

__all__ = ["NCCL_BUFFERS", "OWNED_LLM_ARGS", "SHARED_FRACTION", "SPLIT_FRACTION", "VLLMSettings",
           "builds_alone", "check_gpu_fractions", "check_kv_caches", "eager", "engine_fractions",
           "engine_key", "engine_process_env", "engine_sizes", "gpu_element_bytes", "host_copy_bytes",
           "in_flight_per_engine", "llm_kwargs", "transfer_backend", "transfer_buffer_bytes"]


OWNED_LLM_ARGS = {
    "model": "the policy's model", "tokenizer": "the policy's model",
    "dtype": "set engine_settings.dtype", "max_model_len": "set engine_settings.max_model_len",
    "gpu_memory_utilization": "set engine_settings.gpu_memory_utilization",
    "kv_cache_memory_bytes": "set engine_settings.kv_cache_gib",
    "enforce_eager": "set engine_settings.enforce_eager",
    "seed": "each rollout reseeds the engine from --data.rollout.seed",
    "enable_sleep_mode": "drmas sleeps engines on the trainer's GPU through the update",
    "weight_transfer_config": "drmas sends the weights",
    "logprobs_mode": "the loss needs processed log-probs",
    "enable_lora": "set by the policies' lora sections", "max_loras": "set by the policies' lora sections",
    "max_lora_rank": "set by the policies' lora sections", "use_tqdm_on_load": "drmas's console",
}
"""``vllm.LLM`` arguments drmas sets itself, with what sets them instead."""


@dataclass
class VLLMSettings:
    """Settings of the vLLM engines (one per policy): ``--model.engine_settings`` for every
    policy, a policy's own ``engine_settings`` over them."""

    dtype: str = "auto"
    """Engine dtype: ``auto`` is bfloat16 where the device computes bf16 natively (GPUs, CPUs
    with AVX-512 BF16 or AMX), else float32; the truncated importance weights correct a bf16
    engine's mismatch with the trainer."""
    max_model_len: int = 4096
    """Longest prompt + response the engine accepts."""
    gpu_memory_utilization: float | None = None
    """GPU memory fraction per engine (split it between the engines of several policies, or give
    each policy its own in its ``engine_settings``). Unset: 0.5 on the trainer's GPU; on a GPU of
    the engines' own (``--model.engine_placement split``) 0.92 (vLLM's default) divided among the
    rank's engines."""
    kv_cache_gib: float = 2.0
    """KV-cache size on CPU per engine, in GiB."""
    transfer_buffer_mib: int | None = None
    """The trainer's buffer for one weight transfer into an engine, in MiB (weights go in chunks
    of this size); raised to the largest tensor when smaller, with a line saying so. Unset: 1024
    on GPUs, 256 on CPU."""
    enforce_eager: bool | None = None
    """Run the engine's model eagerly, without CUDA graphs or compilation. Unset: True on CPU
    (compiling took minutes there for 1.2x faster decoding), False on GPUs (CUDA graphs)."""
    llm_args: dict[str, Any] = field(default_factory=dict)
    """Other ``vllm.LLM`` arguments, passed as given (e.g. ``{max_num_seqs: 64,
    enable_prefix_caching: true}``); vLLM refuses a name it does not know. Those drmas sets itself
    are refused by name here: the settings above, and what the engine's protocol needs (the weight
    transfer, sleep mode, log-probs, LoRA slots, seed)."""

    def __post_init__(self) -> None:
        owned = sorted(set(self.llm_args) & set(OWNED_LLM_ARGS))
        if owned:
            raise ValueError("llm_args may not set " + "; ".join(f"{k} ({OWNED_LLM_ARGS[k]})" for k in owned))
        if self.gpu_memory_utilization is not None and not 0 < self.gpu_memory_utilization <= 1:
            raise ValueError(f"gpu_memory_utilization must be in (0, 1], got {self.gpu_memory_utilization}")
        if self.kv_cache_gib <= 0:
            raise ValueError(f"kv_cache_gib must be > 0, got {self.kv_cache_gib}")
        if self.transfer_buffer_mib is not None and self.transfer_buffer_mib <= 0:
            raise ValueError(f"transfer_buffer_mib must be > 0 (or unset), got {self.transfer_buffer_mib}")


def gpu_element_bytes(dtype: str) -> int:
    """Bytes per element of an engine's dtype on a GPU (``auto``: bfloat16, which GPUs compute
    natively)."""
    return 2 if dtype == "auto" else getattr(torch, dtype).itemsize


def transfer_buffer_bytes(mib: int | None, on_gpu: bool) -> int:
    """The transfer buffer asked for (``transfer_buffer_mib``, else the device's default), in bytes;
    :func:`drmas.engines.vllm.transfer.trainer_engine` raises it to the largest tensor."""
    return (mib if mib is not None else 1024 if on_gpu else 256) * 2**20


def eager(asked: bool | None, on_gpu: bool) -> bool:
    """``enforce_eager``: as asked, else True on CPU and False on GPUs."""
    return (not on_gpu) if asked is None else asked


def builds_alone(on_gpu: bool) -> bool:
    """Whether a rank's engines must be built one after the other. On a GPU, yes: vLLM sizes the KV
    cache from how much the device's free memory changed while it loaded and profiled, so an
    engine built while another loads on the same GPU counts that load as its own (a shrunken or
    negative KV cache, or vLLM's assertion that free memory never grew). On CPU the KV cache is
    sized in bytes (``kv_cache_gib``), so the builds overlap."""
    return on_gpu


def engine_key(name: str, config: Any) -> str:
    """Which engine a policy generates with: its own, or its shared LoRA base's."""
    return f"base:{config.model}" if config.share_base else name


def _per_engine(policies: dict[str, Any], value: Any) -> dict[str, Any]:
    """``value(config)`` once per engine: policies sharing a LoRA base count once, with the first one's
    setting."""
    out: dict[str, Any] = {}
    for name, config in policies.items():
        out.setdefault(engine_key(name, config), value(config))
    return out


SHARED_FRACTION = 0.5
"""An engine's GPU fraction on the trainer's GPU when none is set."""
SPLIT_FRACTION = 0.92
"""What the engines on a GPU of their own share when none is set (vLLM's default for one engine)."""


def engine_fractions(policies: dict[str, Any], vllm: VLLMSettings, split: bool = False) -> dict[str, float]:
    """Each vLLM engine's share of its GPU: a policy's own setting, else the global one, else
    :data:`SHARED_FRACTION` on the trainer's GPU, or under ``split`` :data:`SPLIT_FRACTION` divided
    among the rank's engines (the GPU is theirs)."""
    asked = _per_engine(policies, lambda c: policy_settings(vllm, c).gpu_memory_utilization)
    unset = SPLIT_FRACTION / len(asked) if split else SHARED_FRACTION
    return {key: unset if value is None else value for key, value in asked.items()}


def in_flight_per_engine(policies: dict[str, Any], in_flight: dict[str, int]) -> dict[str, int]:
    """Sequences each engine is sent at once (``in_flight`` per policy; policies sharing a LoRA base
    add up on its engine)."""
    out: dict[str, int] = {}
    for name, config in policies.items():
        key = engine_key(name, config)
        out[key] = out.get(key, 0) + in_flight.get(name, 0)
    return out


def check_gpu_fractions(fractions: dict[str, float]) -> None:
    """Refuse vLLM engines (one per policy, on the same GPU) whose memory fractions add up to more
    than the whole GPU; the message names each engine's share."""
    total = sum(fractions.values())
    if total > 1.0 + 1e-9:
        shares = ", ".join(f"{name} {frac:g}" for name, frac in fractions.items())
        raise ValueError(f"the vLLM engines of the policies share one GPU but ask for {total:g} of it "
                         f"({shares}): set --model.engine_settings.gpu_memory_utilization to at most "
                         f"{1.0 / len(fractions):.2f}, or give the policies their own "
                         f"(engine_settings: {{gpu_memory_utilization: ...}}) adding up to at most 1")


def check_kv_caches(sizes: dict[str, float], machine_bytes: int | None = None) -> None:
    """Refuse CPU vLLM engines whose KV caches together take more than three quarters of the
    machine's memory (the models and the trainer need the rest); the message names each."""
    if machine_bytes is None:
        machine_bytes = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    total = sum(sizes.values())
    limit = 0.75 * machine_bytes / 2**30
    if total > limit:
        each = ", ".join(f"{name} {gib:g}" for name, gib in sizes.items())
        raise ValueError(f"the vLLM engines' KV caches take {total:g} GiB ({each}) of this machine's "
                         f"{machine_bytes / 2**30:.1f} GiB, more than the {limit:.1f} GiB they may use: "
                         "lower --model.engine_settings.kv_cache_gib or the policies' own "
                         f"(engine_settings: {{kv_cache_gib: ...}})")


def host_copy_bytes(team: dict[str, Any], vllm: VLLMSettings, parameters: dict[str, int]) -> float:
    """The weights engines asleep at level 1 keep in host memory (bytes): a frozen policy's whole model
    and a LoRA base, in the engine's dtype; level 2 keeps nothing."""
    total = 0.0
    for key, name in {engine_key(n, c): n for n, c in reversed(list(team.items()))}.items():
        config = team[name]  # the first policy of each engine, as _per_engine counts it
        if config.lora is not None or not config.trainable:
            dtype = getattr(torch, engine_dtype(policy_settings(vllm, config).dtype))
            total += parameters[name] * dtype.itemsize
    return total


def engine_sizes(team: dict[str, Any], vllm: VLLMSettings) -> dict[str, float]:
    """Each vLLM engine's KV cache on CPU, GiB (a policy's own setting, else the global one)."""
    return _per_engine(team, lambda c: policy_settings(vllm, c).kv_cache_gib)


NCCL_BUFFERS = 2
"""Chunks the packed NCCL broadcast of a weight transfer keeps in flight (vLLM's default), each up to
one tensor past the transfer buffer's size."""


def transfer_backend(on_gpu: bool, split: bool = False) -> str:
    """vLLM's weight-transfer backend of an engine: on the trainer's GPU CUDA IPC; on a GPU of its own
    (``--model.engine_placement split``) an NCCL broadcast; on CPU drmas's shared memory."""
    return ("nccl" if split else "ipc") if on_gpu else "drmas_shm"


def llm_kwargs(model: str, settings: VLLMSettings, seed: int, on_gpu: bool, max_loras: int = 0,
               max_lora_rank: int = 16, quiet: bool = False, split: bool = False,
               max_num_seqs: int = 0) -> dict[str, Any]:
    """The ``vllm.LLM`` arguments of one engine process, from its settings. On the trainer's GPU sleep
    mode is on (it switches on vLLM's CuMem allocator: one engine per process); on a GPU of its own
    (``split``) the engine never sleeps; on CPU vLLM has no sleep mode. Weights arrive through
    :func:`transfer_backend`'s backend; ``llm_args`` beside them (never over them:
    :data:`OWNED_LLM_ARGS` are refused). ``max_num_seqs``: the sequences a rollout sends at once, the
    engine's batch bound unless ``llm_args`` sets one (vLLM's default, 1,024 on large GPUs, sizes its
    start-up sampler pass, and that memory is taken from the KV cache); 0: vLLM's. On CPU the KV
    cache is set in bytes, so vLLM's default stays (and with it the batches the tests pin)."""
    kwargs: dict[str, Any] = dict(
        model=model, dtype=engine_dtype(settings.dtype), max_model_len=settings.max_model_len, seed=seed,
        enforce_eager=eager(settings.enforce_eager, on_gpu), logprobs_mode="processed_logprobs",
        use_tqdm_on_load=not quiet, weight_transfer_config={"backend": transfer_backend(on_gpu, split)},
    )
    if on_gpu:
        fraction = settings.gpu_memory_utilization
        if fraction is None:
            fraction = SPLIT_FRACTION if split else SHARED_FRACTION
        kwargs.update(gpu_memory_utilization=fraction, enable_sleep_mode=not split)
    else:
        kwargs.update(kv_cache_memory_bytes=int(settings.kv_cache_gib * 2**30))
    if on_gpu and max_num_seqs and "max_num_seqs" not in settings.llm_args:
        kwargs["max_num_seqs"] = max_num_seqs
    if max_loras:
        kwargs.update(enable_lora=True, max_loras=max_loras, max_lora_rank=max_lora_rank)
    return {**settings.llm_args, **kwargs}


def engine_process_env(device: Any, cores: Sequence[int], visible: str | None = None,
                       uuid_of: Any = gpu_uuid) -> dict[str, str]:
    """The environment of an engine process: on a GPU only that GPU is visible, by its UUID
    (:func:`~drmas.engines.placement.device_env`; the engine takes ``cuda:0`` of what it sees); on
    CPU vLLM's thread binding names the process's cores."""
    env = {"VLLM_ENABLE_V1_MULTIPROCESSING": "0", **device_env(device, visible, uuid_of)}
    if getattr(device, "type", "cpu") != "cuda":
        env["VLLM_CPU_OMP_THREADS_BIND"] = ",".join(str(c) for c in cores)
    return env
