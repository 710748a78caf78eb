"""What the trainer needs to generate with its policies: vLLM engine settings, the check that
several engines fit one GPU, each policy's engine, and the chat prompt's token ids."""

from __future__ import annotations

import os
from dataclasses import dataclass
from typing import Any

import torch

from drmas.engines import ENGINES, Engine, EngineError
from drmas.models import load_causal_lm, resolve_model_path
from drmas.records import ChatPrompt

__all__ = ["VLLMConfig", "check_engine_memory", "check_gpu_fractions", "check_kv_caches", "encode_prompt", "run_engine",
           "engine_fractions", "engine_key", "make_engine"]


@dataclass
class VLLMConfig:
    """Settings of the vLLM engines (one per policy)."""

    dtype: str = "auto"
    """Engine dtype: ``auto`` is bfloat16 where the device computes bf16 natively (GPUs, CPUs
    with AVX-512 BF16 or AMX), else float32; the truncated importance weights correct a bf16
    engine's mismatch with the trainer."""
    max_model_len: int = 4096
    """Longest prompt + response the engine accepts."""
    gpu_memory_utilization: float = 0.5
    """GPU memory fraction per engine (split it between the engines of several policies; a
    policy's own ``gpu_memory_utilization`` overrides it)."""
    kv_cache_gib: float = 2.0
    """KV-cache size on CPU per engine, in GiB (a policy's own ``kv_cache_gib`` overrides it)."""


def engine_key(name: str, config: Any) -> str:
    """Which engine a policy generates with: its own, or its shared LoRA base's."""
    return f"base:{config.model}" if config.share_base else name


def _per_engine(policies: dict[str, Any], value: Any) -> dict[str, Any]:
    """``value(config)`` once per engine: policies sharing a LoRA base count once, with the first one's setting."""
    out: dict[str, Any] = {}
    for name, config in policies.items():
        out.setdefault(engine_key(name, config), value(config))
    return out


def engine_fractions(policies: dict[str, Any], vllm: VLLMConfig) -> dict[str, float]:
    """Each vLLM engine's share of the GPU (a policy's own setting, else the global one)."""
    return _per_engine(policies, lambda c: c.gpu_memory_utilization or vllm.gpu_memory_utilization)


def check_engine_memory(policies: dict[str, Any], vllm: VLLMConfig, on_gpu: bool) -> None:
    """The vLLM engines fit: their GPU fractions add up to at most 1, or on CPU their KV caches
    fit the machine (:func:`check_gpu_fractions`, :func:`check_kv_caches`)."""
    if on_gpu:
        check_gpu_fractions(engine_fractions(policies, vllm))
    else:
        check_kv_caches(_per_engine(policies, lambda c: c.kv_cache_gib or vllm.kv_cache_gib))


def check_gpu_fractions(fractions: dict[str, float]) -> None:
    """Refuse vLLM engines (one per policy, on the same GPU) whose memory fractions add up to more
    than the whole GPU; the message names each engine's share."""
    total = sum(fractions.values())
    if total > 1.0 + 1e-9:
        shares = ", ".join(f"{name} {frac:g}" for name, frac in fractions.items())
        raise ValueError(f"the vLLM engines of the policies share one GPU but ask for {total:g} of it ({shares}): "
                         f"set --model.vllm.gpu_memory_utilization to at most {1.0 / len(fractions):.2f}, or give the "
                         f"policies their own gpu_memory_utilization adding up to at most 1")


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
                         f"{machine_bytes / 2**30:.1f} GiB, more than the {limit:.1f} GiB they may use: lower "
                         f"--model.vllm.kv_cache_gib or the policies' kv_cache_gib")


def encode_prompt(tokenizer, prompt: ChatPrompt, template_kwargs: dict[str, Any] | None = None) -> list[int]:
    """Token ids of the chat prompt with the generation header and the assistant prefill."""
    messages = [{"role": r, "content": c} for r, c in prompt.messages]
    text = tokenizer.apply_chat_template(
        messages, tokenize=False, add_generation_prompt=True, **(template_kwargs or {})
    ) + prompt.prefill
    return tokenizer(text, add_special_tokens=False)["input_ids"]


def make_engine(kind: str, policy: Any, vllm: VLLMConfig, seed: int, device: torch.device,
                sharded: bool, pool: dict[str, Any] | None = None, lora_slots: int = 1,
                lora_rank: int = 0, ranks: tuple[int, int, int] = (0, 0, 1)) -> tuple[Engine, bool]:
    """``policy``'s rollout engine, and whether it already serves the policy's initial weights.

    A LoRA policy on vLLM gets a view of an engine kept in ``pool``: one engine per shared base
    (``lora_slots`` adapters of rank at most ``lora_rank``: the policies that share it), else
    one of its own. ``ranks``: this process's (global rank, local rank, world size); a vLLM
    engine takes its rank's device from them (see ``drmas.engines.vllm.launcher_kwargs``)."""
    rank, local_rank, world_size = ranks
    if kind == "vllm" and device.type == "cuda" and world_size > 1 and device.index != local_rank:
        raise ValueError(f"rank {rank} trains on {device} but its vLLM engine would take cuda:{local_rank} "
                         "(vLLM's external launcher places an engine by LOCAL_RANK): give --trainer.devices a count, "
                         "not a list, and choose GPUs with CUDA_VISIBLE_DEVICES")
    if kind == "vllm" and policy.adapter is not None:
        from drmas.engines.vllm import VLLMAdapter

        pool = {} if pool is None else pool
        key = engine_key(policy.name, policy.config)
        if key not in pool:
            lora = max(lora_rank, policy.config.lora.rank)
            lora = max(8, 1 << (lora - 1).bit_length())  # vLLM takes powers of two
            pool[key] = ENGINES["vllm"](
                resolve_model_path(policy.config.model), dtype=vllm.dtype, max_model_len=vllm.max_model_len,
                seed=seed, gpu_memory_utilization=policy.config.gpu_memory_utilization or vllm.gpu_memory_utilization,
                kv_cache_gib=policy.config.kv_cache_gib or vllm.kv_cache_gib,
                max_loras=lora_slots if policy.config.share_base else 1, max_lora_rank=lora,
                rank=rank, local_rank=local_rank, world_size=world_size)
        return VLLMAdapter(pool[key], policy.adapter), False  # the adapter is published by the first sync
    if kind == "hf" and not sharded:
        return ENGINES["hf"](policy.model, policy.tokenizer, adapter=policy.adapter), True
    if kind == "hf":
        # Each rank generates for its own tasks, a different number of steps, which the
        # collectives of a sharded model cannot follow: generate with an unsharded copy that
        # sync_weights fills tensor by tensor.
        model = load_causal_lm(policy.config.model, dtype=policy.config.dtype)[0]
        model = model.to(device).eval().requires_grad_(False)
        return ENGINES["hf"](model, policy.tokenizer, copy_weights=True), False
    engine = ENGINES["vllm"](
        resolve_model_path(policy.config.model), dtype=vllm.dtype, max_model_len=vllm.max_model_len, seed=seed,
        gpu_memory_utilization=policy.config.gpu_memory_utilization or vllm.gpu_memory_utilization,
        kv_cache_gib=policy.config.kv_cache_gib or vllm.kv_cache_gib,
        rank=rank, local_rank=local_rank, world_size=world_size,
    )
    if world_size > 1:  # which device each rank's engine took, as its LLM was asked for it
        executor = engine.llm_kwargs.get("distributed_executor_backend", "uni")
        where = f"cuda:{local_rank}" if executor == "external_launcher" else "cpu"
        print(f"[rank {rank}] vLLM engine of policy {policy.name}: {where}, executor {executor}", flush=True)
    return engine, True


def run_engine(engine: Any, kind: str, policy: str, agent: str, ids: list[list[int]], n: int, params: Any) -> Any:
    """``engine.generate(ids, n, params)``; any failure re-raised as :class:`EngineError` naming
    the policy and the agent, so a lost device or a bad request says whose rollout it ended."""
    try:
        return engine.generate(ids, n, params)
    except Exception as err:
        raise EngineError(f"the {kind} engine of policy {policy!r} failed generating for agent {agent!r} "
                          f"({len(ids)} prompts x {n}): {type(err).__name__}: {err}") from err
