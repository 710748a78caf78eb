"""Whether the device drmas computes on does bf16 natively, and the defaults that follow from it.

bf16 is the fast path on GPUs and on CPUs with bf16 instructions (AVX-512 BF16, AMX, Arm BF16).
Elsewhere PyTorch and vLLM emulate it, and it becomes the slowest choice by far: measured on a
2-core AVX2 CPU (no native bf16), a SmolLM2-135M train step of 4 x 256 tokens took 11 s in fp32
and 260 s under bf16 autocast, and vLLM generated 69 tokens/s in fp32 against 20 in bf16. So
the defaults (``--trainer.precision`` left unset, ``--model.engine_settings.dtype auto``, the KL reference
copy) take bf16 where it is native and fp32 elsewhere.
"""

from __future__ import annotations

import functools
import warnings

import torch

__all__ = ["bf16_is_native", "compute_device", "default_precision", "engine_dtype", "fast_dtype",
           "warn_if_slow_bf16"]


def compute_device(accelerator: str = "auto") -> str:
    """``"cuda"`` when the run computes on a GPU, else ``"cpu"`` (Lightning's accelerator names)."""
    if accelerator in ("auto", "gpu", "cuda") and torch.cuda.is_available():
        return "cuda"
    return "cpu"


@functools.cache
def bf16_is_native(device: str = "cpu") -> bool:
    """Whether ``device`` ("cpu" or "cuda") computes bf16 in hardware."""
    if device == "cuda":
        return torch.cuda.is_available() and torch.cuda.is_bf16_supported()
    try:  # oneDNN's own test of the CPU's instructions (what its bf16 kernels need)
        return bool(torch.ops.mkldnn._is_mkldnn_bf16_supported())
    except (AttributeError, RuntimeError):
        return False


def fast_dtype(device: str, otherwise: torch.dtype = torch.float32) -> torch.dtype:
    """bf16 where ``device`` computes it natively, else ``otherwise``."""
    return torch.bfloat16 if bf16_is_native(device) else otherwise


def default_precision(accelerator: str = "auto") -> str:
    """Lightning precision for an unset ``--trainer.precision``: bf16 autocast (fp32 master
    weights) where bf16 is native, else full fp32."""
    return "bf16-mixed" if bf16_is_native(compute_device(accelerator)) else "32-true"


def engine_dtype(dtype: str) -> str:
    """The vLLM dtype for a configured one: ``auto`` is bfloat16 where the engine's device
    computes it natively, else float32 (not vLLM's own ``auto``, which follows the checkpoint)."""
    if dtype != "auto":
        warn_if_slow_bf16("--model.engine_settings.dtype", dtype, compute_device())
        return dtype
    return "bfloat16" if bf16_is_native(compute_device()) else "float32"


def warn_if_slow_bf16(what: str, dtype: str, device: str) -> None:
    """Warn when bf16 was asked for explicitly on a device that only emulates it."""
    if ("bf16" in dtype or "bfloat16" in dtype) and not bf16_is_native(device):
        warnings.warn(f"{what} {dtype} on a {device.upper()} without native bf16: bf16 is emulated here "
                      "and runs many times slower than fp32 (measured 25x for a training step on an AVX2 "
                      "CPU); leave it unset (or 'auto') to get fp32 on this machine", stacklevel=3)
