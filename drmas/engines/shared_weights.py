"""Weights from the trainer into an engine process through a shared-memory file: the trainer writes a
model's tensors into the file chunk by chunk and sends each chunk's layout (names, dtypes, shapes,
offsets); the engine process, which mapped the same file once, copies each chunk out before the next
is written. The file is unlinked as soon as both sides mapped it, so a killed run leaves nothing in
``/dev/shm``. The vLLM engine's ``drmas_shm`` transfer backend and the HF engine process use it."""

from __future__ import annotations

import contextlib
import os
import tempfile
from typing import Any, Callable, Iterable, Iterator, Sequence

import torch

__all__ = ["aligned", "chunk_views", "map_shared", "send_chunks", "shared_file"]

ALIGN = 64  # every tensor starts on a cache line, so a view of any dtype is aligned
DTYPES = {str(t).removeprefix("torch."): t for t in (torch.float32, torch.float16, torch.bfloat16,
                                                      torch.float64, torch.int64, torch.int32,
                                                      torch.int8, torch.uint8, torch.bool)}


def aligned(nbytes: int) -> int:
    return -(-nbytes // ALIGN) * ALIGN


def _shared_dir(size: int) -> str | None:
    """``/dev/shm`` where it has room for the buffer (memory, not disk), else the temp directory."""
    try:
        stat = os.statvfs("/dev/shm")
    except OSError:
        return None
    return "/dev/shm" if stat.f_bavail * stat.f_frsize > 2 * size else None


@contextlib.contextmanager
def shared_file(size: int) -> Iterator[tuple[torch.Tensor, str]]:
    """A new shared file of ``size`` bytes, mapped here: ``(its bytes, its path)``. Hand the path to the
    other process inside the block (it maps it there); the file is unlinked when the block ends."""
    fd, path = tempfile.mkstemp(prefix="drmas-weights-", dir=_shared_dir(size))
    try:
        os.ftruncate(fd, size)
        yield map_shared(path, size), path
    finally:
        os.close(fd)
        os.unlink(path)


def map_shared(path: str, size: int) -> torch.Tensor:
    """The bytes of the shared file at ``path``, mapped into this process."""
    return torch.from_file(path, shared=True, size=size, dtype=torch.uint8)


def _view(buffer: torch.Tensor, offset: int, dtype: torch.dtype, shape: Sequence[int]) -> torch.Tensor:
    nbytes = torch.Size(shape).numel() * dtype.itemsize
    return buffer[offset: offset + nbytes].view(dtype).view(list(shape))


def send_chunks(items: Iterable[tuple[str, torch.Tensor]], buffer: torch.Tensor,
                send: Callable[[dict[str, list[Any]]], None]) -> None:
    """Write ``items`` into ``buffer`` (at least as large as the largest tensor), calling ``send`` with
    each full chunk's layout; ``send`` returns once the other side has copied the chunk out."""
    size = buffer.numel()
    chunk: dict[str, list[Any]] = _empty()
    used = 0
    for name, tensor in items:
        nbytes = tensor.numel() * tensor.element_size()
        if used + nbytes > size and chunk["names"]:
            send(chunk)
            chunk, used = _empty(), 0
        _view(buffer, used, tensor.dtype, list(tensor.shape)).copy_(tensor)
        layout = (name, str(tensor.dtype).removeprefix("torch."), list(tensor.shape), used)
        for key, value in zip(chunk, layout):
            chunk[key].append(value)
        used += aligned(nbytes)
    if chunk["names"]:
        send(chunk)


def chunk_views(buffer: torch.Tensor, names: Sequence[str], dtype_names: Sequence[str],
                shapes: Sequence[Sequence[int]], offsets: Sequence[int]) -> list[tuple[str, torch.Tensor]]:
    """One chunk's tensors, as views of the mapped ``buffer`` (copy them out before the next chunk)."""
    return [(name, _view(buffer, offset, DTYPES[dtype], shape))
            for name, dtype, shape, offset in zip(names, dtype_names, shapes, offsets)]


def _empty() -> dict[str, list[Any]]:
    return {"names": [], "dtype_names": [], "shapes": [], "offsets": []}
