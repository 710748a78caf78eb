"""Rollout engines: one interface, HF ``generate`` (runs anywhere) and vLLM (fast, optional).

``vllm`` is imported only when a :class:`VLLMEngine` is created, so this package imports
without it; :func:`vllm_available` says whether it is installed. Both register themselves in
:data:`ENGINES` (``hf``, ``vllm``) with their settings types and their preference for
``--model.engine auto``; an engine of your own is one class and one registration.
"""

from drmas.engines.base import (ENGINES, Engine, EngineError, Placement,
                                parse_settings, policy_settings, resolve_engine)
from drmas.engines.hf import HFEngine
from drmas.engines.vllm import VLLMEngine, VLLMSettings, vllm_available

__all__ = ["ENGINES", "Engine", "EngineError", "HFEngine", "Placement",
           "VLLMEngine", "VLLMSettings", "parse_settings", "policy_settings", "resolve_engine",
           "vllm_available"]
