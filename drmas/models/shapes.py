"""A model's shape, as the memory plan needs it: parameter counts (whole, largest tensor, what sits
outside the decoder layers), vocabulary, and the attention and MLP sizes that decide an engine's KV
cache and activations. Read from a model (loaded, or on the meta device) or from its ``config.json``
alone (:func:`config_shape`: a model on the meta device, no weights read), so a plan can be made on a
machine that holds no weights and no GPU (``--print_memory_plan``)."""

from __future__ import annotations

from dataclasses import dataclass

import torch

__all__ = ["ModelShape", "config_shape", "model_shape"]


@dataclass(frozen=True)
class ModelShape:
    """What the memory plan reads of one model."""

    parameters: int
    largest: int
    """Elements of the largest tensor (a weight transfer buffers and gathers it whole)."""
    root: int
    """Parameters outside the decoder layers (embeddings, final norm, head): FSDP2's root group,
    unsharded from the forward to the end of the backward."""
    vocab_size: int
    hidden_size: int
    intermediate_size: int
    layers: int
    kv_heads: int
    head_dim: int
    max_positions: int | None = None

    def kv_bytes_per_token(self, element_bytes: int) -> int:
        """Key and value of one token in every layer's cache."""
        return 2 * self.layers * self.kv_heads * self.head_dim * element_bytes


def _layer_parameters(model: torch.nn.Module) -> int:
    names = set(getattr(model, "_no_split_modules", None) or ())
    return sum(p.numel() for m in model.modules() if type(m).__name__ in names for p in m.parameters())


def model_shape(model: torch.nn.Module) -> ModelShape:
    """The shape of ``model`` (its weights may be on the meta device; a sharded tensor counts whole)."""
    c = model.config
    c = getattr(c, "text_config", None) or c
    parameters = sum(p.numel() for p in model.parameters())
    heads = c.num_attention_heads
    return ModelShape(
        parameters=parameters,
        largest=max((t.numel() for t in model.state_dict().values()), default=0),
        root=parameters - _layer_parameters(model),
        vocab_size=c.vocab_size, hidden_size=c.hidden_size,
        intermediate_size=getattr(c, "intermediate_size", None) or 4 * c.hidden_size,
        layers=c.num_hidden_layers, kv_heads=getattr(c, "num_key_value_heads", None) or heads,
        head_dim=getattr(c, "head_dim", None) or c.hidden_size // heads,
        max_positions=getattr(c, "max_position_embeddings", None),
    )


def config_shape(name_or_path: str) -> ModelShape:
    """The shape of the model ``name_or_path`` names (a directory, or a hub id the local cache holds),
    from its ``config.json`` alone: the model is built on the meta device, no weight is read."""
    from transformers import AutoConfig, AutoModelForCausalLM

    from drmas.models.loading import resolve_model_path

    config = AutoConfig.from_pretrained(resolve_model_path(name_or_path))
    with torch.device("meta"):
        model = AutoModelForCausalLM.from_config(config)
    return model_shape(model)
