"""One LoRA adapter per policy (peft), several adapters on one shared base model.

A policy with a ``lora`` section trains only its adapter; with ``share_base`` the policies
that name the same base model keep it once in memory, each with its own adapter (named after
the policy) and its own optimiser. peft runs one adapter at a time: :func:`activate` selects a
policy's adapter before each of its forward passes (training, log-probs, HF generation).
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field
from typing import Any

import torch
from torch import nn

__all__ = ["LoraSettings", "activate", "adapter_parameters", "add_lora", "save_adapter"]


@dataclass
class LoraSettings:
    """A LoRA adapter (peft) on the policy's model; only its tensors are trained."""

    rank: int = 16
    """Rank r of the low-rank update."""
    alpha: float = 32.0
    """Scale numerator: the update is ``alpha / rank * B @ A``."""
    dropout: float = 0.0
    """Dropout on the adapter's input."""
    target_modules: list[str] = field(default_factory=lambda: ["all-linear"])
    """Module names to adapt (e.g. ``[q_proj, v_proj]``); ``all-linear``: every linear layer but the
    output head."""
    share_base: bool = False
    """Keep the base model once for every policy whose adapter says so (they must name the same
    model and dtype); each trains its own adapter with its own optimiser."""

    def __post_init__(self) -> None:
        if self.rank < 1 or self.alpha <= 0 or not 0 <= self.dropout < 1:
            raise ValueError(f"lora needs rank >= 1, alpha > 0 and 0 <= dropout < 1, got {self.rank}, "
                             f"{self.alpha}, {self.dropout}")
        if not self.target_modules:
            raise ValueError("lora.target_modules is empty")


def _linear_names(model: nn.Module) -> set[str]:
    """Names of the model's linear layers (a layer peft already wraps counts as its own name)."""
    names = set()
    for name, mod in model.named_modules():
        if ".lora_" in name or name.endswith(".base_layer"):
            continue  # the parts of a peft-wrapped layer
        # transformers' Conv1D (GPT-2 style) is a linear layer with its weight transposed
        if isinstance(mod, nn.Linear) or type(mod).__name__ == "Conv1D" or hasattr(mod, "base_layer"):
            names.add(name.rsplit(".", 1)[-1])
    return names


def add_lora(model: nn.Module, adapter: str, settings: LoraSettings) -> nn.Module:
    """Add the adapter ``adapter`` to ``model``: a plain transformers model is wrapped into a
    ``PeftModel`` (its base weights frozen), a ``PeftModel`` gets one more adapter. Returns the
    ``PeftModel``. A target module the model does not have is a ValueError naming its layers."""
    try:
        import peft
    except ImportError as err:
        raise ImportError("LoRA policies need peft: pip install peft") from err
    targets = list(settings.target_modules)
    if targets != ["all-linear"]:
        have = _linear_names(model)
        missing = sorted(set(targets) - have)
        if missing:
            raise ValueError(f"LoRA target module(s) {missing} are not linear layers of the model; "
                             f"its linear layers: {sorted(have)}")
    config = peft.LoraConfig(r=settings.rank, lora_alpha=settings.alpha, lora_dropout=settings.dropout,
                             target_modules=targets[0] if targets == ["all-linear"] else targets,
                             task_type="CAUSAL_LM")
    if isinstance(model, peft.PeftModel):
        if adapter in model.peft_config:
            raise ValueError(f"the shared base already has an adapter named {adapter!r}")
        model.add_adapter(adapter, config)
        return model
    return peft.get_peft_model(model, config, adapter_name=adapter)


def activate(model: nn.Module, adapter: str) -> None:
    """Make ``adapter`` the one peft applies (and the only trainable one)."""
    if model.active_adapter != adapter:
        model.set_adapter(adapter)


def adapter_parameters(model: nn.Module, adapter: str) -> list[torch.nn.Parameter]:
    """The tensors of one adapter (``...lora_A.<adapter>.weight`` and ``lora_B``)."""
    return [p for name, p in model.named_parameters() if ".lora_" in name and name.split(".")[-2] == adapter]


def save_adapter(model: nn.Module, adapter: str, out: str, merged: bool = False) -> None:
    """Write ``adapter`` in peft's format to ``out`` (``PeftModel.from_pretrained(base, out)``
    loads it); ``merged``: also the base with the adapter merged in, as a plain model in
    ``out/merged`` (the live model is not changed)."""
    import peft
    from safetensors.torch import save_file

    os.makedirs(out, exist_ok=True)
    state = peft.get_peft_model_state_dict(model, adapter_name=adapter)
    save_file({k: v.detach().cpu().contiguous() for k, v in state.items()},
              os.path.join(out, "adapter_model.safetensors"))
    model.peft_config[adapter].save_pretrained(out)
    if merged:
        merged_model = _merged_copy(model, adapter)
        merged_model.save_pretrained(os.path.join(out, "merged"))


def _merged_copy(model: Any, adapter: str) -> nn.Module:
    """A plain copy of the base with ``adapter`` folded into its weights: peft's own merge on a copy
    (``merge_and_unload(adapter_names=[adapter])``: the adapter's scaling, rsLoRA, DoRA, a LoRA
    bias and ``fan_in_fan_out`` layers as peft defines them), which also unwraps the layers that only
    other adapters on a shared base target (they keep the base weight)."""
    import copy

    return copy.deepcopy(model).merge_and_unload(adapter_names=[adapter])
