"""Rollout engines: one interface, HF ``generate`` (runs anywhere) and vLLM (fast, optional).

``vllm`` is imported only when a :class:`VLLMEngine` is created, so this package imports
without it; :func:`vllm_available` says whether it is installed. Both register themselves in
:data:`ENGINES` (``hf``, ``vllm``); an engine of your own is one class and one registration.
"""

from drmas.engines.base import ENGINES, Engine, EngineError, Generation, Placement, SamplingParams
from drmas.engines.hf import HFEngine
from drmas.engines.vllm import VLLMEngine, vllm_available
from drmas.engines.vllm_settings import VLLMConfig

__all__ = ["ENGINES", "Engine", "EngineError", "Generation", "HFEngine", "Placement", "SamplingParams", "VLLMConfig",
           "VLLMEngine", "vllm_available"]
