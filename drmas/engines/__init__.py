"""Rollout engines: one interface, HF ``generate`` (runs anywhere) and vLLM (fast, optional).

``vllm`` is imported only when a :class:`VLLMEngine` is created, so this package imports
without it; :func:`vllm_available` says whether it is installed.
"""

from drmas.engines.base import Engine, EngineError, Generation, SamplingParams
from drmas.engines.hf import HFEngine
from drmas.engines.vllm import VLLMEngine, vllm_available

ENGINES: dict[str, type[Engine]] = {"hf": HFEngine, "vllm": VLLMEngine}
"""Engine classes by config name."""

__all__ = ["ENGINES", "Engine", "EngineError", "Generation", "HFEngine", "SamplingParams", "VLLMEngine", "vllm_available"]
