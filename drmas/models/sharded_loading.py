"""Loading a model whose parameters are sharded (FSDP2) without ever holding it whole on a rank.

:func:`empty_causal_lm` builds the model's modules with parameters on the meta device (no
memory) and buffers real (rotary frequencies and the like are computed, not loaded). After
``fully_shard`` each parameter is a DTensor whose local piece is this rank's rows;
:func:`load_shards` allocates those pieces and fills each from the model's safetensors files
(one file, or several named by ``model.safetensors.index.json``), reading only the rows the rank
keeps (mapped from the file), so a rank's peak host memory is its shards, not the model.
Persistent buffers (a router's ``e_score_correction_bias``) are read from the checkpoint too;
computed ones keep their values, in every module that shares them. Every tensor's shape is
checked against its target, and FP8 weights are dequantised with their block scales
(``weight_scale_inv``), never copied as raw values. Checkpoints that are not safetensors, or
whose tensor names do not cover the model's parameters (an MoE whose experts transformers fuses
as it loads), are read whole on every rank: the fallback costs what loading did before, and says so.
"""

from __future__ import annotations

import json
import logging
import math
import os
from typing import Any

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
    from the checkpoint, and its persistent buffers whole. Returns how: ``"slices"`` (only this
    rank's rows were read) or ``"whole"`` (the fallback). A tensor whose shape differs from its
    target's, or FP8 values without their scales, raise ``ValueError`` naming it and the file."""
    path = resolve_model_path(name_or_path)
    persistent = _keep_buffers(model, device)
    if hasattr(model, "tie_weights"):  # moving off the meta device made new tensors: tie them again
        model.tie_weights()
    params = dict(model.named_parameters())
    files = _safetensors_files(path)
    source = (_Safetensors(path, files) if files and set(params) <= set(files)
              else _Whole(path, next(iter(params.values())).dtype))
    with torch.no_grad():
        for name, p in params.items():
            source.check(name, p.shape)
            local = p.to_local() if hasattr(p, "to_local") else p
            if local.numel() == 0:
                continue
            offset = _row_offset(p)
            local.copy_(source.read(name, offset, offset + local.shape[0]).to(local.dtype))
        for name, b in persistent.items():
            if name not in source.names:
                log.warning("%s: no tensor %r in the checkpoint; the buffer keeps its initial value",
                            path, name)
                continue
            source.check(name, b.shape)
            b.copy_(source.read(name, 0, b.shape[0] if b.dim() else None).reshape(b.shape).to(b.dtype))
    return source.how


def _keep_buffers(model: nn.Module, device: torch.device) -> dict[str, torch.Tensor]:
    """``model.to_empty(device)`` keeping its buffers' values and devices (fully_shard put them on
    the compute device, also when the parameters are offloaded to CPU memory), and keeping every
    module that shares a buffer on one tensor (to_empty gives each owner a new one). Returns the
    persistent buffers by their first name: the checkpoint holds those."""
    owners: dict[int, list[tuple[nn.Module, str]]] = {}
    saved: dict[int, torch.Tensor] = {}
    persistent: dict[str, int] = {}
    for name, module in model.named_modules(remove_duplicate=False):
        for leaf, b in module._buffers.items():
            if b is None:
                continue
            owners.setdefault(id(b), []).append((module, leaf))
            saved.setdefault(id(b), b.detach().clone())
            if leaf not in module._non_persistent_buffers_set:
                persistent.setdefault(id(b), f"{name}.{leaf}" if name else leaf)
    model.to_empty(device=device)
    for key, places in owners.items():
        for module, leaf in places:
            module._buffers[leaf] = saved[key]
    return {name: saved[key] for key, name in persistent.items()}


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


_DTYPES = {"F64": torch.float64, "F32": torch.float32, "F16": torch.float16, "BF16": torch.bfloat16,
           "F8_E4M3": torch.float8_e4m3fn, "F8_E5M2": torch.float8_e5m2, "I64": torch.int64,
           "I32": torch.int32, "I16": torch.int16, "I8": torch.int8, "U8": torch.uint8, "BOOL": torch.bool}
_FP8 = {"F8_E4M3", "F8_E5M2"}


def _shape_error(name: str, found: Any, wanted: Any, file: str) -> ValueError:
    return ValueError(f"{file}: tensor {name!r} has shape {list(found)}, the model's has {list(wanted)}; "
                      "is this checkpoint for another model size or config?")


class _Safetensors:
    """The model's safetensors files, read by rows; FP8 weights dequantised with their scales."""

    how = "slices"

    def __init__(self, path: str, files: dict[str, str] | None = None) -> None:
        self.files = _safetensors_files(path) if files is None else files
        self.names = set(self.files)
        self.headers = {file: _header(file) for file in set(self.files.values())}
        self.block = _fp8_block(path)

    def _info(self, name: str) -> dict[str, Any]:
        return self.headers[self.files[name]][1][name]

    def check(self, name: str, shape: torch.Size) -> None:
        found = self._info(name)["shape"]
        if list(found) != list(shape):
            raise _shape_error(name, found, shape, self.files[name])

    def read(self, name: str, start: int, stop: int | None) -> torch.Tensor:
        """Rows ``start:stop`` of tensor ``name`` (``stop`` None: a 0-d tensor, whole)."""
        file = self.files[name]
        kind = self._info(name)["dtype"]
        rows = _rows(file, self.headers[file], name, start, stop)
        if kind not in _FP8:
            return rows
        scale = f"{name}_scale_inv"
        if scale not in self.files or self.block is None or rows.dim() != 2:
            why = (f"no {scale!r} beside it" if scale not in self.files else
                   "no weight_block_size in config.json's quantization_config" if self.block is None else
                   f"{rows.dim()}-d, not a 2-d weight")
            raise ValueError(f"{file}: tensor {name!r} is {kind} and cannot be dequantised ({why}); "
                             "drmas loads FP8 only as block-scaled weights with weight_scale_inv, "
                             "never as raw values")
        # one scale per (b0 x b1) block: the blocks of these rows, each repeated over its rows and columns
        (b0, b1), n = self.block, rows.shape[0]
        first, last = start // b0, math.ceil((start + n) / b0)
        scales = _rows(self.files[scale], self.headers[self.files[scale]], scale, first, last).float()
        scales = scales.repeat_interleave(b0, 0)[start - first * b0:][:n]
        return rows.float() * scales.repeat_interleave(b1, 1)[:, :rows.shape[1]]


class _Whole:
    """The fallback: the checkpoint loaded whole by transformers, once on every rank."""

    how = "whole"

    def __init__(self, path: str, dtype: torch.dtype) -> None:
        quantised = _config(path).get("quantization_config")
        if quantised:
            raise ValueError(f"{path}: a quantised checkpoint ({quantised.get('quant_method')}) without "
                             "safetensors files naming every parameter; drmas dequantises FP8 only from "
                             "safetensors with weight_scale_inv")
        log.warning("%s: no safetensors files naming every parameter; each rank reads the whole model once",
                    path)
        from transformers import AutoModelForCausalLM

        self.path = path
        # mismatches and gaps are ours to refuse, in one line (transformers would log a report and
        # raise pointing to it, or initialise a missing tensor at random)
        model, info = AutoModelForCausalLM.from_pretrained(path, dtype=dtype, ignore_mismatched_sizes=True,
                                                           output_loading_info=True)
        if info["mismatched_keys"]:
            name, found, wanted = sorted(info["mismatched_keys"])[0]
            raise _shape_error(name, found, wanted, path)
        if info["missing_keys"]:
            missing = sorted(info["missing_keys"])
            named = ", ".join(missing[:3]) + (", ..." if len(missing) > 3 else "")
            raise ValueError(f"{path}: the checkpoint has no tensor for {len(missing)} of the model's "
                             f"parameters and buffers ({named})")
        self.state = model.state_dict()
        self.names = set(self.state)

    def check(self, name: str, shape: torch.Size) -> None:
        if self.state[name].shape != shape:
            raise _shape_error(name, self.state[name].shape, shape, self.path)

    def read(self, name: str, start: int, stop: int | None) -> torch.Tensor:
        return self.state[name] if stop is None else self.state[name][start:stop]


def _config(path: str) -> dict[str, Any]:
    try:
        with open(os.path.join(path, "config.json")) as f:
            return json.load(f)
    except OSError:
        return {}


def _fp8_block(path: str) -> tuple[int, int] | None:
    """The FP8 scales' block (rows, columns) from config.json, as DeepSeek-V3 and Qwen3-FP8 write it."""
    block = (_config(path).get("quantization_config") or {}).get("weight_block_size")
    return (int(block[0]), int(block[1])) if block else None


def _header(file: str) -> tuple[int, dict[str, Any]]:
    """Where a safetensors file's data starts, and its tensors' dtypes, shapes and byte ranges."""
    with open(file, "rb") as f:
        size = int.from_bytes(f.read(8), "little")
        return 8 + size, json.loads(f.read(size))


def _rows(file: str, header: tuple[int, dict[str, Any]], name: str, start: int,
          stop: int | None) -> torch.Tensor:
    """Rows ``start:stop`` of a tensor (``stop`` None: a 0-d one), mapped from the file
    (copy-on-write, never written): the copy into the shard reads those pages and nothing else; no
    heap buffer of the slice is made. (A buffer per slice, as ``safe_open(...).get_slice``
    returns, was seen to leave a whole model's worth of freed heap resident on a rank.)"""
    base, tensors = header
    info = tensors[name]
    if info["dtype"] not in _DTYPES:
        raise ValueError(f"{file}: tensor {name!r} has dtype {info['dtype']}, which drmas cannot load")
    dtype, shape, (begin, _) = _DTYPES[info["dtype"]], info["shape"], info["data_offsets"]
    row, stop = math.prod(shape[1:]), 1 if stop is None else min(stop, shape[0])
    element = torch.empty((), dtype=dtype).element_size()
    mapped = np.memmap(file, dtype=np.uint8, mode="c", offset=base + begin + start * row * element,
                       shape=((stop - start) * row * element,))
    return torch.from_numpy(mapped).view(dtype).reshape(stop - start, *shape[1:]) if shape else \
        torch.from_numpy(mapped).view(dtype).reshape(())


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
