"""FSDP2 sharding of the policies: ``fully_shard`` per decoder layer and at the root.

``FSDP`` is Lightning's ``ModelParallelStrategy`` with the mesh drmas needs (every rank in one
data-parallel dimension, no tensor parallelism) and the sharding options; the LightningModule
applies :func:`shard_model` to each policy in ``configure_model``. Lightning's own ``fsdp``
strategy (FSDP1) wraps the whole LightningModule and breaks manual optimisation, so it is not
used.
"""

from __future__ import annotations

from typing import Any

import torch
from lightning.pytorch.strategies import ModelParallelStrategy
from torch import nn

__all__ = ["FSDP", "decoder_layers", "shard_model"]


class FSDP(ModelParallelStrategy):
    """Shard every policy over all ranks (FSDP2)."""

    def __init__(self, mixed_precision: bool | None = None, cpu_offload: bool = False, **kwargs: Any) -> None:
        """
        Args:
            mixed_precision: compute in bf16 with fp32 master weights and fp32 gradient
                reductions (default: on CUDA only; gloo on CPU reduces fp32).
            cpu_offload: keep parameters and optimiser state in CPU memory between uses.
        """
        kwargs.setdefault("tensor_parallel_size", 1)
        super().__init__(**kwargs)
        self.mixed_precision, self.cpu_offload = mixed_precision, cpu_offload

    def setup_environment(self) -> None:
        if self._data_parallel_size == "auto":  # Lightning's default would be one rank per node
            self._data_parallel_size = self.num_nodes * self.num_processes
        super().setup_environment()


def decoder_layers(model: nn.Module) -> list[nn.Module]:
    """The model's repeated blocks: the modules whose class the model lists as not to be split."""
    names = set(getattr(model, "_no_split_modules", None) or ())
    layers = [m for m in model.modules() if type(m).__name__ in names]
    if not layers:
        raise ValueError(f"{type(model).__name__} names no decoder layer class (_no_split_modules); "
                         "it cannot be sharded layer by layer")
    return layers


def shard_model(model: nn.Module, mesh: Any, mixed_precision: bool = False, cpu_offload: bool = False) -> nn.Module:
    """``fully_shard`` each decoder layer, then the root (embeddings, final norm, head)."""
    from torch.distributed.fsdp import CPUOffloadPolicy, MixedPrecisionPolicy, fully_shard

    kwargs: dict[str, Any] = {"mesh": mesh}
    if mixed_precision:
        kwargs["mp_policy"] = MixedPrecisionPolicy(param_dtype=torch.bfloat16, reduce_dtype=torch.float32)
    if cpu_offload:
        kwargs["offload_policy"] = CPUOffloadPolicy()
    for layer in decoder_layers(model):
        fully_shard(layer, **kwargs)
    fully_shard(model, **kwargs)
    return model
