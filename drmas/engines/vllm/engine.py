"""The trainer's side of a vLLM engine: it builds the engine's process, asks it to generate, sends
it weights and puts it to sleep. Why a process per engine and why its settings: the package's
docstring (:mod:`drmas.engines.vllm`)."""

from __future__ import annotations

import dataclasses
import os
import shutil
import tempfile
from typing import Any, Sequence

import torch

from drmas import console
from drmas.engines.base import (ENGINES, Engine, FullState, Placement, policy_settings)
from drmas.engines.sizing import EngineSizing
from drmas.engines.served import EngineProcessError, ServedEngine
from drmas.engines.vllm.adapter import VLLMAdapter
from drmas.engines.vllm.runtime import vllm_available
from drmas.engines.vllm.settings import (NCCL_BUFFERS, VLLMSettings, builds_alone, check_gpu_fractions,
                                         check_kv_caches, eager, engine_fractions, engine_key,
                                         engine_process_env, engine_sizes, gpu_element_bytes, host_copy_bytes,
                                         in_flight_per_engine, llm_kwargs, transfer_buffer_bytes)
from drmas.engines.vllm.sizing import EngineBudget, engine_budget
from drmas.engines.placement import local_ranks, rank_cores
from drmas.models import resolve_model_path
from drmas.records import Completion, GenerationSettings

__all__ = ["VLLMAdapter", "VLLMEngine", "vllm_available"]


ASLEEP_BYTES = 2**30
"""Device memory an engine process keeps asleep (CUDA context, what sleep does not release): an estimate."""


class VLLMSizing(EngineSizing):
    """A vLLM engine's memory: the GPU fraction each reserves, its start-up by vLLM's rules, what its
    sleep keeps, the weight transfer's peak."""

    @classmethod
    def check_memory(cls, team: dict[str, Any], settings: VLLMSettings, on_gpu: bool,
                     split: bool = False) -> None:
        """The engines' GPU fractions add up to at most 1, or on CPU their KV caches fit the machine."""
        if on_gpu:
            check_gpu_fractions(engine_fractions(team, settings, split))
        else:
            check_kv_caches(engine_sizes(team, settings))

    @classmethod
    def device_fractions(cls, team: dict[str, Any], settings: VLLMSettings) -> list[float]:
        return list(engine_fractions(team, settings).values())

    @classmethod
    def startup_budgets(cls, team: dict[str, Any], settings: VLLMSettings, shapes: dict[str, Any],
                        device_bytes: int, device_name: str, in_flight: dict[str, int],
                        split: bool) -> list[EngineBudget]:
        """Each engine's start-up by vLLM 0.32's rules (:mod:`drmas.engines.vllm.sizing`), with the
        fraction and ``max_num_seqs`` it is built with."""
        fractions = engine_fractions(team, settings, split)
        widths = in_flight_per_engine(team, in_flight)
        budgets, seen = [], set()
        for name, config in team.items():
            key = engine_key(name, config)
            if key in seen:
                continue
            seen.add(key)
            own = policy_settings(settings, config)
            seqs = own.llm_args.get("max_num_seqs") or widths.get(key) or None
            budgets.append(engine_budget(
                key, shapes[name], fractions[key], device_bytes, gpu_element_bytes(own.dtype),
                own.max_model_len, eager(own.enforce_eager, True), seqs,
                own.llm_args.get("max_num_batched_tokens"), device_name))
        return budgets

    @classmethod
    def asleep_bytes(cls, team: dict[str, Any], settings: VLLMSettings) -> list[float]:
        """An estimate, not measured: each engine process's CUDA context and the allocations that
        live outside the CuMem pool (sleep releases only the pool)."""
        return [ASLEEP_BYTES] * len(engine_fractions(team, settings))

    @classmethod
    def asleep_host_bytes(cls, team: dict[str, Any], settings: VLLMSettings,
                          parameters: dict[str, int]) -> float:
        return host_copy_bytes(team, settings, parameters)

    @classmethod
    def transfer_bytes(cls, settings: VLLMSettings, largest: int, split: bool = False) -> float:
        """A GPU transfer's peak on the trainer's side: its buffer (raised to the largest tensor, of
        ``largest`` elements) and one gathered tensor beside it, both in the engine's dtype; over
        NCCL (``split``) chunks filled up to one tensor past the buffer's size: the
        :data:`NCCL_BUFFERS` in flight (vLLM's packed broadcast), and the one being packed twice over
        (its gathered tensors and their concatenation) while the other is in flight."""
        tensor = largest * gpu_element_bytes(settings.dtype)
        buffer = max(transfer_buffer_bytes(settings.transfer_buffer_mib, True), tensor)
        return (NCCL_BUFFERS + 1) * (buffer + tensor) if split else buffer + tensor


@ENGINES.register("vllm")
class VLLMEngine(ServedEngine):
    """One vLLM engine in a process of its own; see the module docstring for why each setting is
    what it is.

    ``settings``: :class:`VLLMSettings` (``gpu_memory_utilization`` applies on GPU, ``kv_cache_gib``
    on CPU, ``llm_args`` go to ``vllm.LLM`` as given). ``device``: where the trainer that
    owns the engine runs (the engine process takes the same GPU), or with ``split`` the GPU of the
    engine's own; ``cpus``: the cores the process runs on (default: this rank's share of this
    process's cores).
    """

    settings_type = VLLMSettings
    sizing = VLLMSizing
    kind = "vLLM"
    auto_preference = 10  # over HF's 0: where vLLM is installed, ``auto`` takes it

    @classmethod
    def available(cls) -> bool:
        return vllm_available()

    @classmethod
    def own_process(cls, overlapped: bool) -> bool:
        return True

    @classmethod
    def context_limit(cls, settings: VLLMSettings) -> int | None:
        return settings.max_model_len

    def __init__(
        self,
        model_path: str,
        settings: VLLMSettings | None = None,
        seed: int = 0,
        max_loras: int = 0,
        max_lora_rank: int = 16,
        device: torch.device | str | None = None,
        cpus: Sequence[int] | None = None,
        name: str = "",
        split: bool = False,
        max_num_seqs: int = 0,
    ) -> None:
        settings = settings if settings is not None else VLLMSettings()
        self.device_asked = torch.device(device if device is not None else
                                         "cuda" if torch.cuda.is_available() else "cpu")
        self.on_gpu = self.device_asked.type == "cuda"
        self.split = split and self.on_gpu  # on a GPU of its own: never asleep, weights over NCCL
        self.sleeps = self.on_gpu and not self.split
        if not self.on_gpu and os.environ.get("VLLM_CPU_KVCACHE_SPACE"):
            print(f"VLLM_CPU_KVCACHE_SPACE={os.environ['VLLM_CPU_KVCACHE_SPACE']} overrides "
                  f"kv_cache_gib={settings.kv_cache_gib}", flush=True)
        self.llm_kwargs = llm_kwargs(model_path, settings, seed, self.on_gpu, max_loras, max_lora_rank,
                                     quiet=console.QUIET, split=self.split, max_num_seqs=max_num_seqs)
        self.transfer_buffer = transfer_buffer_bytes(settings.transfer_buffer_mib, self.on_gpu)
        cores = list(cpus) if cpus is not None else rank_cores()
        self._spawn("drmas.engines.vllm.process:serve", ["quiet" if console.QUIET else ""],
                    name or os.path.basename(model_path), cores, engine_process_env(self.device_asked, cores),
                    {"llm_kwargs": self.llm_kwargs}, self.on_gpu)
        self._transfer: Any = None
        self._asleep = False
        self._adapters: dict[str, tuple[str, int, str]] = {}  # adapter -> (version name, lora id, dir)
        self._lora_ids = 0
        self._lora_dir = tempfile.mkdtemp(prefix="drmas-vllm-lora-") if max_loras else None
        self.users = 0  # VLLMAdapter views sharing this engine; the last one closes it
        self.frozen = False  # set by create for a policy that does not train
        self.context_length = settings.max_model_len
        self._rank: int | None = None  # set by create: the start-up line names the rank
        try:  # the engine builds in the background (see ready) while this process imports vLLM too
            from drmas.engines.vllm.runtime import import_vllm

            import_vllm()  # a missing or broken vLLM named in this process, with the install hint
        except BaseException:
            self.close()
            raise

    def _built(self) -> None:
        if self._rank is not None:
            self._announce(self._rank)

    @property
    def device(self) -> str:
        """The device the engine's worker runs on, as the worker reports it."""
        self.ready()
        return self._info["device"]

    @property
    def dtype(self) -> torch.dtype:
        self.ready()
        return self._info["dtype"]

    @property
    def transfer_dtype(self) -> torch.dtype:
        return self.dtype

    @classmethod
    def create(cls, policy: Any, settings: VLLMSettings, place: Placement, pool: dict[str, Any],
               team: dict[str, Any]) -> tuple[Engine, bool]:
        """An engine of the policy's own; a LoRA policy gets a view of an engine in ``pool``, one
        per shared base (as many adapter slots as policies share it), else one of its own."""
        c = policy.config
        cores = place.cpus or rank_cores(place.local_rank, local_ranks(place.world_size))
        widths = in_flight_per_engine(team, place.in_flight)
        fraction = engine_fractions(team, settings, place.split)[engine_key(policy.name, c)]
        if settings.gpu_memory_utilization is None:  # the default of this placement, as the plan counted
            settings = dataclasses.replace(settings, gpu_memory_utilization=fraction)
        kwargs = dict(settings=settings, seed=place.seed, device=place.engines_on, cpus=list(cores),
                      split=place.split, max_num_seqs=widths.get(engine_key(policy.name, c), 0))
        if policy.adapter is None:
            engine = cls(resolve_model_path(c.model), name=policy.name, **kwargs)
            engine._rank = place.rank
            engine.frozen = not policy.trainable
            return engine, True
        key = engine_key(policy.name, c)
        if key not in pool:
            sharing = [t.lora.rank for t in team.values() if t.share_base]
            lora = max(8, 1 << (max([c.lora.rank, *sharing]) - 1).bit_length())  # vLLM takes powers of two
            pool[key] = cls(resolve_model_path(c.model), max_loras=len(sharing) if c.share_base else 1,
                            max_lora_rank=lora, name=key, **kwargs)
            pool[key]._rank = place.rank
        return VLLMAdapter(pool[key], policy.adapter), False  # the adapter is published by the first sync

    @classmethod
    def builds_alone(cls, device: torch.device) -> bool:
        return builds_alone(device.type == "cuda")

    def _announce(self, rank: int) -> None:
        """One line per engine: the device its worker reports it took, its process and cores, and
        the kernel library vLLM chose for the machine."""
        cores = f"{self.cores[0]}-{self.cores[-1]}" if len(self.cores) > 1 else str(self.cores[0])
        print(f"[rank {rank}] vLLM engine of policy {self.name}: {self.device}, process {self.pid} "
              f"(trainer {os.getpid()}), cores {cores}, kernels {self._info['kernels']}", flush=True)

    def generate(
        self, prompts: Sequence[Sequence[int]], n: int, params: GenerationSettings,
        stops: Sequence[Sequence[str]] | None = None, max_new_tokens: Sequence[int] | None = None,
        adapter: str | None = None,
    ) -> list[list[Completion]]:
        """``adapter``: generate with that LoRA adapter (published by :meth:`sync_adapter`)."""
        lora_id = None
        if adapter is not None:
            if adapter not in self._adapters:
                raise RuntimeError(f"LoRA adapter {adapter!r} was never synced to this vLLM engine")
            lora_id = self._adapters[adapter][1]
        if self._asleep:
            raise RuntimeError("the vLLM engine is asleep (weights discarded): call sync_weights(model)")
        result, prompt_tokens, cached = self._generate(prompts, n, params, stops, max_new_tokens,
                                                       lora_id=lora_id)
        self.prompt_tokens += prompt_tokens
        self.cached_tokens += cached
        return result

    def record_transfer(self) -> None:
        self._call("record_transfer")

    def received_sums(self) -> dict[str, tuple[float, float]]:
        return self._call("received_sums")

    def _wake(self, tags: list[str] | None = None) -> None:
        """Wake what ``tags`` names (None: everything); the engine must then be fully awake unless only
        its weights were asked for. --- GPU path: not exercised by the CPU test suite. ---"""
        awake = self._call("wake_up", tags=tags)
        if not awake and tags != ["weights"]:
            raise EngineProcessError(f"the vLLM engine of {self.name} is not fully awake after "
                                     f"wake_up(tags={tags}) (vLLM said so)")

    def wake(self) -> None:
        """Bring back an engine that kept its weights through its sleep (level 1: a LoRA base, a frozen
        policy), when nothing is to be sent."""
        if self._asleep:
            self._wake()
            self._asleep = False

    def sync_weights(self, weights: FullState) -> None:
        """Send the model's state dict (checkpoint-format names, i.e. those of the HF model, cast to the
        engine dtype: ``weights.dtype`` is :attr:`transfer_dtype`) through the weight transfer; every
        rank of a sharded model calls it alike."""
        from drmas.engines.vllm.transfer import trainer_engine

        if self._asleep and self.sleep_level == 1:  # weights kept on the host: back whole, then overwritten
            self.wake()
        if self.sleeps and not self._asleep and self.sleep_level == 2:
            # every weight is replaced: a fresh engine (after a resume) takes the transfer with only
            # its weights awake, as every later sync does, not with its KV cache beside them
            self.sleep()
        if self._asleep:  # GPU only: the weight memory back, then the weights, then the KV cache
            self._wake(["weights"])
        if self._transfer is None:
            self._transfer = trainer_engine(weights, self._call, self.on_gpu, self.transfer_buffer,
                                            self.name, self.split)
        self._transfer.source.weights = weights  # this sync's pass (the model object may be another)
        self._transfer.send_weights()
        if self._asleep:
            self._wake(["kv_cache"])
            self._asleep = False

    def timed_generate(self, prompts: Sequence[Sequence[int]], lengths: Sequence[int],
                       params: GenerationSettings) -> tuple[float, int]:
        """Seconds and tokens of one bare ``LLM.generate`` in the engine process, each prompt made to
        generate exactly its length (a benchmark's limit; see ``EngineServer.timed_generate``)."""
        return self._call("timed_generate", prompts=prompts, lengths=lengths, params=params)

    def sync_adapter(self, model: torch.nn.Module, adapter: str) -> None:
        """Publish ``adapter``'s current tensors (of the peft ``model``) as a new version and
        retire the previous one; nothing else is sent."""
        from drmas.models.lora import save_adapter

        if self._lora_dir is None:
            raise RuntimeError("this vLLM engine was created without LoRA (max_loras=0)")
        if self._asleep:  # the base comes back from host memory (level 1)
            self._wake()
            self._asleep = False
        self._lora_ids += 1
        path = os.path.join(self._lora_dir, f"{adapter}-{self._lora_ids}")
        save_adapter(model, adapter, path)
        old = self._adapters.get(adapter)
        version = (f"{adapter}-v{self._lora_ids}", self._lora_ids, path)
        self._call("add_adapter", name=version[0], lora_id=version[1], path=path)
        self._adapters[adapter] = version
        if old is not None:
            self._call("remove_adapter", lora_id=old[1])
            shutil.rmtree(old[2], ignore_errors=True)

    def adapter_version(self, adapter: str) -> str | None:
        """The name the adapter's current version is published under (None before the first sync)."""
        version = self._adapters.get(adapter)
        return None if version is None else version[0]

    @property
    def asleep(self) -> bool:
        """Whether the engine slept and discarded its weights (level 2): the next sync sends them."""
        return self._asleep and self.sleep_level == 2

    @property
    def sleep_level(self) -> int:
        """2 for a trained whole model (re-sent at every sync), 1 for a LoRA base (kept; only
        adapters are re-sent) and a frozen policy (kept: its weights never change)."""
        return 1 if self._lora_dir is not None or self.frozen else 2

    def sleep(self) -> None:
        """On the trainer's GPU: free the engine's memory for the update (see :attr:`sleep_level`) until
        the next sync; a no-op on CPU, where vLLM has no sleep mode, and on a GPU of its own.

        --- GPU path: not exercised by the CPU test suite. ---
        """
        if self.sleeps and not self._asleep:
            self._call("sleep", level=self.sleep_level)
            self._asleep = True
            if self.asleep_measured is None:  # once: what this process really keeps (for the plan)
                self.asleep_measured = self._call("device_bytes")

    def close(self) -> None:
        """End the engine process (it also ends with this process, however that ends)."""
        super().close()
        if getattr(self, "_lora_dir", None) is not None:
            shutil.rmtree(self._lora_dir, ignore_errors=True)
            self._lora_dir = None
