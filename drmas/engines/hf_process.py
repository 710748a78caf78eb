"""The HF engine in a process of its own: what ``--model.engine hf`` runs for a trained policy when
rollouts play behind the update (``--data.rollout.staleness`` >= 1), and for every policy when the
engines run on a GPU of their own (``--model.engine_placement split``: the weights then go through
the host's shared memory, not over NCCL).

In a thread of the trainer's process, HF generate would share the trainer's cores, thread pools and
torch's global random generator with the update (the same run twice gave different log-probs).
Here the process holds its own copy of the policy (loaded from the policy's model, then given the
trainer's weights at every sync through a shared-memory file,
:mod:`drmas.engines.shared_weights`), runs on cores of its own, and draws from its own generator,
reseeded before every rollout: runs are reproducible and resume exactly, as with vLLM. It generates
with :class:`~drmas.engines.hf.HFEngine`, so its samples and log-probs are those of the in-process
engine.
"""

from __future__ import annotations

from typing import Any, Sequence

import torch

from drmas.engines.base import FullState, tensor_sums
from drmas.engines.placement import device_env
from drmas.engines.served import ServedEngine
from drmas.engines.shared_weights import aligned, chunk_views, map_shared, send_chunks, shared_file
from drmas.records import Completion, GenerationSettings

__all__ = ["HFProcessEngine", "HFServer", "serve"]

BUFFER_BYTES = 64 * 2**20
"""The shared file's size, raised to the largest tensor where that is larger."""


class HFServer:
    """The engine process's side: an :class:`~drmas.engines.hf.HFEngine` on its own copy of the model."""

    def __init__(self, model: str, dtype: str, device: str) -> None:
        from drmas.engines.hf import HFEngine
        from drmas.models import load_causal_lm

        network, tokenizer = load_causal_lm(model, dtype=dtype)
        self.device = torch.device(device)
        network = network.to(device).eval().requires_grad_(False)
        self.engine = HFEngine(network, tokenizer, copy_weights=True)
        self.state = self.engine.model.state_dict()
        self.buffer: torch.Tensor | None = None

    def describe(self) -> dict[str, Any]:
        return {"threads": torch.get_num_threads()}

    batched = {"generate": "generate_many"}
    """Requests answered together (:mod:`drmas.engines.service`): several ranks' generations, one
    after another in arrival order (HF ``generate`` takes one set of sampling settings per call)."""

    def generate(self, prompts: Sequence[Sequence[int]], n: int, params: GenerationSettings,
                 stops: Sequence[Sequence[str]], max_new_tokens: Sequence[int],
                 seeds: Sequence[int] | None = None) -> tuple[list[list[Completion]], int, int]:
        """Completions per prompt, and no token counts: HF keeps no prefix cache whose hit rate they
        would give (a served engine's answer has their places); ``seeds``: the request draws from the
        first, leaving this process's generator as it was (else from it, as :meth:`reseed` left it)."""
        if seeds is None:
            return self.engine.generate(prompts, n, params, stops, max_new_tokens), 0, 0
        with torch.random.fork_rng(devices=[self.device] if self.device.type == "cuda" else []):
            torch.manual_seed(seeds[0])
            return self.engine.generate(prompts, n, params, stops, max_new_tokens), 0, 0

    def generate_many(self, calls: Sequence[dict[str, Any]]) -> list[tuple[list[list[Completion]], int, int]]:
        return [self.generate(**call) for call in calls]

    def reseed(self, seed: int) -> None:
        torch.manual_seed(seed)  # this process's generator: the rollout's draws alone

    def map_weights(self, path: str, size: int) -> None:
        self.buffer = map_shared(path, size)

    def weight_sums(self) -> dict[str, tuple[float, float]]:
        """The sums of this process's copy, as the transfers left it."""
        return {name: tensor_sums(t) for name, t in self.state.items()}

    def load_chunk(self, **layout: Any) -> None:
        if self.buffer is None:
            raise RuntimeError("load_chunk before map_weights")
        with torch.no_grad():
            for name, tensor in chunk_views(self.buffer, **layout):
                self.state[name].copy_(tensor)


def serve(fd: str) -> None:
    """The engine process: answer the trainer's requests (:func:`drmas.engines.service.serve`)."""
    from drmas.engines.service import serve as serve_requests

    def build(**kwargs: Any) -> tuple[HFServer, dict[str, Any]]:
        server = HFServer(**kwargs)
        return server, server.describe()

    serve_requests(fd, build)


class HFProcessEngine(ServedEngine):
    """The trainer's side: requests to the engine process, and the weights through shared memory."""

    kind = "HF"

    def __init__(self, policy: Any, cpus: Sequence[int], device: torch.device = torch.device("cpu")) -> None:
        """``device``: the engines' (the trainer's, or a GPU of their own); the process is shown that GPU
        alone and takes it as ``cuda:0``. --- GPU path: not exercised by the CPU test suite. ---"""
        self._buffer: torch.Tensor | None = None
        on_gpu = device.type == "cuda"
        self._spawn("drmas.engines.hf_process:serve", [], policy.name, cpus, device_env(device),
                    {"model": policy.config.model, "dtype": policy.config.dtype,
                     "device": "cuda:0" if on_gpu else "cpu"}, on_gpu)
        self.context_length = getattr(policy.model.config, "max_position_embeddings", None)

    def _built(self) -> None:
        print(f"HF engine of policy {self.name}: process {self.pid}, cores {self.cores}, "
              f"{self._info['threads']} threads", flush=True)

    def generate(self, prompts: Sequence[Sequence[int]], n: int, params: GenerationSettings,
                 stops: Sequence[Sequence[str]] | None = None,
                 max_new_tokens: Sequence[int] | None = None) -> list[list[Completion]]:
        return self._generate(prompts, n, params, stops, max_new_tokens)[0]

    def received_sums(self) -> dict[str, tuple[float, float]]:
        return self._call("weight_sums")

    def sync_weights(self, weights: FullState) -> None:
        """Send the model's state dict (gathered from the shards where sharded) chunk by chunk."""
        if self._buffer is None:
            largest = max(t.numel() * t.element_size() for t in weights.model.state_dict().values())
            size = aligned(max(BUFFER_BYTES, largest))
            with shared_file(size) as (self._buffer, path):
                self._call("map_weights", path=path, size=size)
        send_chunks(weights, self._buffer, lambda layout: self._call("load_chunk", **layout))
