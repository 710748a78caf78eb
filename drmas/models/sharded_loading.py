"""Loading a model whose parameters are sharded (FSDP2) without ever holding it whole on a rank.

:func:`empty_causal_lm` builds the model's modules with parameters on the meta device (no
memory) and buffers real (rotary frequencies and the like are computed, not loaded). After
``fully_shard`` each parameter is a DTensor whose local piece is this rank's rows;
:func:`load_shards` allocates those pieces and fills each from the model's safetensors files,
reading only the rows the rank keeps (mapped from the file), so a rank's peak host
memory is its shards, not the model. Checkpoints that are not safetensors, or whose tensor names
do not cover the model's parameters, are read whole on every rank: the fallback costs what loading
did before, and says so.
"""

from __future__ import annotations

import json
import logging
import math
import os
from typing import Any, Callable

import numpy as np
import torch
from torch import nn

from drmas.models.loading import resolve_model_path

__all__ = ["empty_causal_lm", "load_shards"]

log = logging.getLogger(__name__)


def empty_causal_lm(name_or_path: str, dtype: torch.dtype | str) -> nn.Module:
    """The model of ``name_or_path`` in ``dtype``, parameters on the meta device, buffers real."""
    from accelerate import init_empty_weights
    from transformers import AutoConfig, AutoModelForCausalLM, GenerationConfig

    dtype = getattr(torch, dtype) if isinstance(dtype, str) else dtype
    path = resolve_model_path(name_or_path)
    config = AutoConfig.from_pretrained(path)
    with init_empty_weights(include_buffers=False):
        model = AutoModelForCausalLM.from_config(config, dtype=dtype)
    model.tie_weights()  # a tied head is the embedding's parameter, stored once in the checkpoint
    try:  # EOS ids and sampling defaults, as from_pretrained reads them (the HF export writes them)
        model.generation_config = GenerationConfig.from_pretrained(path)
    except OSError:
        pass
    return model


def load_shards(model: nn.Module, name_or_path: str, device: torch.device) -> str:
    """Allocate ``model``'s parameters (sharded or not) on ``device`` and fill each rank's piece
    from the checkpoint; buffers keep their values. Returns how: ``"slices"`` (only this rank's
    rows were read) or ``"whole"`` (the fallback)."""
    # buffers keep their values and their device (fully_shard put them on the compute device,
    # also when the parameters are offloaded to CPU memory)
    buffers = {name: b.detach().clone() for name, b in model.named_buffers()}
    model.to_empty(device=device)
    for name, saved in buffers.items():
        owner, _, leaf = name.rpartition(".")
        model.get_submodule(owner)._buffers[leaf] = saved
    if hasattr(model, "tie_weights"):  # moving off the meta device made new tensors: tie them again
        model.tie_weights()
    params = dict(model.named_parameters())
    read, how = _slice_reader(resolve_model_path(name_or_path), params)
    with torch.no_grad():
        for name, p in params.items():
            local = p.to_local() if hasattr(p, "to_local") else p
            if local.numel() == 0:
                continue
            offset = _row_offset(p)
            local.copy_(read(name, offset, offset + local.shape[0]).to(local.dtype))
    return how



def _row_offset(p: torch.Tensor) -> int:
    """The first global row of this rank's piece (FSDP2 shards dimension 0)."""
    if not hasattr(p, "device_mesh"):
        return 0
    from torch.distributed.tensor._utils import compute_local_shape_and_global_offset

    _, offset = compute_local_shape_and_global_offset(p.shape, p.device_mesh, p.placements)
    if any(o for o in offset[1:]):
        raise ValueError(f"a parameter sharded beyond its first dimension (offset {tuple(offset)}) "
                         "cannot be loaded")
    return int(offset[0])


def _slice_reader(path: str, params: dict[str, Any]) -> tuple[Callable[[str, int, int], torch.Tensor], str]:
    """``read(name, start, stop)``: rows ``start:stop`` of a tensor of the checkpoint."""
    files = _safetensors_files(path)
    if files and set(params) <= set(files):
        headers = {file: _header(file) for file in set(files.values())}
        return ((lambda name, start, stop: _rows(files[name], headers[files[name]], name, start, stop)),
                "slices")
    log.warning("%s: no safetensors files naming every parameter; each rank reads the whole model once", path)
    from drmas.models.loading import load_causal_lm

    full = load_causal_lm(path, dtype=next(iter(params.values())).dtype)[0].state_dict()
    return (lambda name, start, stop: full[name][start:stop]), "whole"


_DTYPES = {"F64": torch.float64, "F32": torch.float32, "F16": torch.float16, "BF16": torch.bfloat16,
           "I64": torch.int64, "I32": torch.int32, "I16": torch.int16, "I8": torch.int8, "U8": torch.uint8,
           "BOOL": torch.bool}


def _header(file: str) -> tuple[int, dict[str, Any]]:
    """Where a safetensors file's data starts, and its tensors' dtypes, shapes and byte ranges."""
    with open(file, "rb") as f:
        size = int.from_bytes(f.read(8), "little")
        return 8 + size, json.loads(f.read(size))


def _rows(file: str, header: tuple[int, dict[str, Any]], name: str, start: int, stop: int) -> torch.Tensor:
    """Rows ``start:stop`` of a tensor, mapped from the file (copy-on-write, never written): the
    copy into the shard reads those pages and nothing else; no heap buffer of the slice is made.
    (A buffer per slice, as ``safe_open(...).get_slice`` returns, was seen to leave a whole model's
    worth of freed heap resident on a rank.)"""
    base, tensors = header
    info = tensors[name]
    dtype, shape, (begin, _) = _DTYPES[info["dtype"]], info["shape"], info["data_offsets"]
    row, stop = math.prod(shape[1:]), min(stop, shape[0])
    element = torch.empty((), dtype=dtype).element_size()
    mapped = np.memmap(file, dtype=np.uint8, mode="c", offset=base + begin + start * row * element,
                       shape=((stop - start) * row * element,))
    return torch.from_numpy(mapped).view(dtype).reshape(stop - start, *shape[1:])


def _safetensors_files(path: str) -> dict[str, str]:
    """Tensor name -> the safetensors file holding it, in a model directory ({} if there is none)."""
    index = os.path.join(path, "model.safetensors.index.json")
    if os.path.isfile(index):
        with open(index) as f:
            return {name: os.path.join(path, file) for name, file in json.load(f)["weight_map"].items()}
    single = os.path.join(path, "model.safetensors")
    if not os.path.isfile(single):
        return {}
    return {name: single for name in _header(single)[1] if name != "__metadata__"}
