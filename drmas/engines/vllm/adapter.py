"""One policy's LoRA adapter as an engine of its own, on a vLLM engine that serves the adapters of
every policy sharing its base."""

from __future__ import annotations

from typing import Any, Sequence


from drmas.engines.base import Engine, FullState
from drmas.records import Completion, GenerationSettings

__all__ = ["VLLMAdapter"]


class VLLMAdapter(Engine):
    """One policy's LoRA adapter on a :class:`VLLMEngine` that may serve several (one base in
    memory for all the policies that share it)."""

    def __init__(self, engine: Any, adapter: str) -> None:  # a VLLMEngine (which imports this module)
        self.engine, self.adapter = engine, adapter
        self.context_length = engine.context_length
        engine.users += 1

    def generate(self, prompts: Sequence[Sequence[int]], n: int, params: GenerationSettings,
                 stops: Sequence[Sequence[str]] | None = None,
                 max_new_tokens: Sequence[int] | None = None) -> list[list[Completion]]:
        out = self.engine.generate(prompts, n, params, stops, max_new_tokens, adapter=self.adapter)
        prompt, cached = self.engine.take_cache_stats()  # this adapter's share of the engine's counts
        self.prompt_tokens += prompt
        self.cached_tokens += cached
        return out

    def ready(self) -> None:
        self.engine.ready()

    def reseed(self, seed: int) -> None:
        self.engine.reseed(seed)

    def sync_weights(self, weights: FullState) -> None:
        self.engine.sync_adapter(weights.model, self.adapter)

    @property
    def asleep(self) -> bool:
        return self.engine.asleep

    def sleep(self) -> None:
        self.engine.sleep()

    def wake(self) -> None:
        self.engine.wake()

    def close(self) -> None:
        self.engine.users -= 1
        if self.engine.users == 0:
            self.engine.close()
