"""Weights from the trainer into a vLLM engine process, through vLLM's weight-transfer API.

vLLM splits a transfer into a trainer-side engine (``TrainerWeightTransferEngine``: sends) and a
worker-side engine (``WeightTransferEngine``: receives and loads, created by the worker from
``weight_transfer_config``), joined by a control-plane client with four calls
(``init_weight_transfer_engine``, ``start_weight_update``, ``update_weights``,
``finish_weight_update``). drmas uses it as vLLM documents it for a colocated trainer:

- GPUs: vLLM's own ``ipc`` backend (CUDA IPC handles: the engine process reads the trainer's
  gathered tensors on the same GPU, no copy through the host), packed into bounded chunks so the
  trainer never holds a second whole model. Its trainer side runs collectives on the default
  process group in every chunk (an all-gather of the handles, barriers), made for several ranks
  feeding one engine; here each rank feeds its own engine process, so :class:`StandaloneIPCTrainer`
  leaves them out: a rank's transfer waits on nobody, and a rank whose transfer fails is agreed
  on with the others afterwards like any sync failure (never a peer stuck in a barrier).
- A GPU of the engine's own (``--model.engine_placement split``): vLLM's ``nccl`` backend, as
  vLLM documents it for a trainer on other GPUs than the engine: one NCCL group per rank and engine
  process, the trainer's rank its one sender (group rank 0) and the engine's worker rank 1, met
  through a TCP store on this node's loopback, and a packed, double-buffered broadcast of bounded
  chunks. vLLM runs the engine's side of each call (the group's start, each ``update_weights``) in a
  thread beside the trainer's side of the same NCCL call; when the engine's side fails there, the
  trainer's side waits for a peer that never comes (vLLM's PyNccl communicator has no abort), so
  :class:`ProcessClient` ends the rank at once with its line (:meth:`drmas.watch.Watch.end`), as any
  one-rank failure ends.
- CPU: ``drmas_shm``, registered here with both of vLLM's factories: the trainer writes each
  chunk of tensors into a shared-memory file that the engine process mapped once
  (:mod:`drmas.engines.shared_weights`), and the worker loads them from it with the same layerwise
  reload the ``ipc`` backend uses.

Both take their buffer size from one rule (:func:`trainer_engine`): ``transfer_buffer_mib``,
raised to the largest tensor when smaller (vLLM's packed IPC producer refuses a tensor larger
than its buffer: a Qwen3-8B embedding is 1.16 GiB in bf16 against its 1 GiB default), so the CPU
tests exercise the sizing the GPUs use. Each tensor is cast to the engine's dtype before it is
gathered from the FSDP shards: half the bytes of gathering fp32 and casting after.

:class:`ProcessClient` is the control plane: each call is one request to the engine process.
The registries of vLLM's factories live in each process; the engine process calls
:func:`register` before it builds its ``LLM`` (the worker runs in that same process), so no
plugin entry point is needed.
"""

from __future__ import annotations

import socket
from dataclasses import asdict, dataclass
from typing import Any, Callable, ClassVar, Iterator

import torch
from vllm.distributed.weight_transfer.base import (ParamMeta, TrainerInitInfo, TrainerWeightTransferEngine,
                                                   WeightSource, WeightTransferEngine, WeightTransferInitInfo,
                                                   WeightTransferUpdateInfo)
from vllm.distributed.weight_transfer.factory import WeightTransferEngineFactory, WeightTransferTrainerFactory

from drmas.engines.base import FullState
from drmas.engines.shared_weights import aligned, chunk_views, map_shared, send_chunks, shared_file
from drmas.engines.vllm.settings import NCCL_BUFFERS

__all__ = ["BACKEND", "ProcessClient", "StateSource", "nccl_init_info", "register", "trainer_engine"]

BACKEND = "drmas_shm"


class StateSource(WeightSource):
    """A sync's pass over a model's state dict (:class:`~drmas.engines.base.FullState`) as vLLM's
    ``WeightSource``: checkpoint-format names, each tensor cast to the engine's dtype and gathered
    whole (FSDP shards; a collective, in the same order on every rank) only when its turn comes."""

    def __init__(self, weights: FullState) -> None:
        self.weights = weights

    def metadata(self) -> list[ParamMeta]:
        dtype = self.weights.dtype
        return [ParamMeta(name, dtype if dtype and t.is_floating_point() else t.dtype, tuple(t.shape))
                for name, t in self.weights.model.state_dict().items()]

    def largest(self) -> tuple[str, int]:
        """The largest tensor's name and its bytes in the engine's dtype (none: ``("", 0)``)."""
        return max(((m.name, m.dtype.itemsize * torch.Size(m.shape).numel()) for m in self.metadata()),
                   key=lambda item: item[1], default=("", 0))

    def __iter__(self) -> Iterator[tuple[str, torch.Tensor]]:
        return iter(self.weights)


class ProcessClient:
    """vLLM's ``VLLMWeightSyncClient`` over a function that runs one request in the engine process.
    ``concurrent``: the two calls vLLM makes beside the trainer's side of one NCCL call (see the module
    docstring) end this rank when they fail, through ``end`` (default :meth:`drmas.watch.Watch.end`)."""

    def __init__(self, call: Callable[..., Any], concurrent: bool = False,
                 end: Callable[[BaseException], None] | None = None) -> None:
        self.call, self.concurrent, self._end = call, concurrent, end

    def _beside(self, method: str, **kwargs: Any) -> None:
        try:
            self.call(method, **kwargs)
        except BaseException as err:
            if not self.concurrent:
                raise
            end = self._end
            if end is None:
                from drmas.watch import watch

                end = watch.end
            end(RuntimeError(f"{err} (the trainer's side of the NCCL weight transfer cannot be "
                             "interrupted: this rank ends)"))
            raise

    def init_weight_transfer_engine(self, init_info: dict[str, Any]) -> None:
        self._beside("init_weight_transfer_engine", init_info=init_info)

    def start_weight_update(self) -> None:
        self.call("start_weight_update")

    def update_weights(self, update_info: Any) -> None:
        self._beside("update_weights", update_info=update_info)

    def finish_weight_update(self, weight_version: str | None = None) -> None:
        self.call("finish_weight_update")


# ---- the shared-memory backend ---------------------------------------------------------------


@dataclass
class SharedMemoryInitInfo(WeightTransferInitInfo):
    path: str
    """The shared file the trainer writes chunks into (the worker maps it once)."""
    size: int
    """Its size in bytes."""


@dataclass
class SharedMemoryUpdateInfo(WeightTransferUpdateInfo):
    names: list[str]
    dtype_names: list[str]
    shapes: list[list[int]]
    offsets: list[int]
    """Byte offset of each tensor in the shared file."""


@dataclass
class SharedMemoryTrainerInitInfo(TrainerInitInfo):
    backend: ClassVar[str] = BACKEND
    buffer_bytes: int = 256 * 2**20
    """Chunk size, at least the largest tensor (:func:`trainer_engine`): the trainer's extra memory
    during a sync."""


class SharedMemoryWeightTransferEngine(WeightTransferEngine[SharedMemoryInitInfo, SharedMemoryUpdateInfo]):
    """Worker side: loads each chunk from the mapped file, in checkpoint format (layerwise reload,
    as vLLM's ``ipc`` backend does)."""

    init_info_cls = SharedMemoryInitInfo
    update_info_cls = SharedMemoryUpdateInfo
    buffer: torch.Tensor | None = None

    def init_transfer_engine(self, init_info: SharedMemoryInitInfo) -> None:
        self.buffer = map_shared(init_info.path, init_info.size)

    def start_weight_update(self) -> None:
        from vllm.model_executor.model_loader.reload import initialize_layerwise_reload

        initialize_layerwise_reload(self.model)

    def finish_weight_update(self) -> None:
        from vllm.model_executor.model_loader.reload import finalize_layerwise_reload

        finalize_layerwise_reload(self.model, self.model_config)

    def receive_weights(self, update_info: SharedMemoryUpdateInfo) -> None:
        if self.buffer is None:
            raise RuntimeError("update_weights before init_weight_transfer_engine")
        info = update_info
        weights = chunk_views(self.buffer, info.names, info.dtype_names, info.shapes, info.offsets)
        self.model.load_weights(weights)  # copies out of the buffer, which the next chunk reuses

    def shutdown(self) -> None:
        self.buffer = None


class SharedMemoryTrainerEngine(TrainerWeightTransferEngine[SharedMemoryTrainerInitInfo]):
    """Trainer side: packs the source's tensors into the shared file chunk by chunk; each
    ``update_weights`` returns once the worker has loaded the chunk, so the file is reused."""

    init_info_cls = SharedMemoryTrainerInitInfo

    @classmethod
    def trainer_init(cls, init_info: SharedMemoryTrainerInitInfo, *, client: Any,
                     source: WeightSource | None = None) -> SharedMemoryTrainerEngine:
        if source is None:
            raise ValueError("the drmas_shm weight transfer sends a WeightSource")
        engine = cls(client=client, source=source, is_sender=True)
        size = aligned(init_info.buffer_bytes)
        with shared_file(size) as (engine.buffer, path):
            client.init_weight_transfer_engine(asdict(SharedMemoryInitInfo(path, size)))
        return engine

    def send_weights(self) -> None:
        assert self.source is not None
        self.client.start_weight_update()
        send_chunks(self.source, self.buffer, self.client.update_weights)
        self.client.finish_weight_update()

    def shutdown(self) -> None:
        self.buffer = None


def register() -> None:
    """Add ``drmas_shm`` to vLLM's worker and trainer factories of this process (idempotent)."""
    if BACKEND not in WeightTransferEngineFactory._registry:
        WeightTransferEngineFactory.register_engine(BACKEND, SharedMemoryWeightTransferEngine)
    if BACKEND not in WeightTransferTrainerFactory._registry:
        WeightTransferTrainerFactory.register_engine(BACKEND, SharedMemoryTrainerEngine)


def transfer_size(source: StateSource, asked: int, name: str = "") -> int:
    """The buffer of one engine's transfers: ``asked`` bytes, raised to the largest tensor (in the
    engine's dtype) when smaller, with a line saying so."""
    tensor, largest = source.largest()
    if largest <= asked:
        return asked
    print(f"weight transfer{f' of {name}' if name else ''}: buffer raised from {asked / 2**20:.0f} MiB to "
          f"{largest / 2**20:.1f} MiB, the size of its largest tensor ({tensor}); "
          "--model.engine_settings.transfer_buffer_mib sets it", flush=True)
    return largest


def nccl_init_info(size: int, port: int | None = None) -> Any:
    """The trainer's side of one engine's NCCL group (``split``): this rank its one sender (group rank
    0; every rank sends to its own engine), the engine's single worker rank 1, met at a free port of
    this node's loopback (``port``: that one), chunks of ``size`` bytes, :data:`NCCL_BUFFERS` in
    flight."""
    from vllm.distributed.weight_transfer.nccl_engine import NCCLTrainerInitInfo

    if port is None:
        with socket.socket() as sock:  # free now; the store binds it at once, in the same call
            sock.bind(("127.0.0.1", 0))
            port = sock.getsockname()[1]
    return NCCLTrainerInitInfo(rank=0, master_address="127.0.0.1", master_port=port, world_size=2,
                               packed=True, packed_buffer_size_bytes=size, packed_num_buffers=NCCL_BUFFERS)


def trainer_engine(weights: FullState, call: Callable[..., Any], on_gpu: bool, buffer_bytes: int,
                   name: str = "", split: bool = False) -> TrainerWeightTransferEngine:
    """The trainer side of one engine process's transfer, rendezvoused (``ipc`` on the trainer's GPU,
    ``nccl`` on a GPU of the engine's own, ``drmas_shm`` on CPU: :func:`transfer_backend`), with a
    buffer of :func:`transfer_size`. ``rank=0``: every trainer rank is the one sender to its own
    engine process."""
    register()
    source, client = StateSource(weights), ProcessClient(call, concurrent=split and on_gpu)
    size = transfer_size(source, buffer_bytes, name)
    if on_gpu and split:  # --- GPU path: not exercised by the CPU test suite ---
        return WeightTransferTrainerFactory.trainer_init(nccl_init_info(size), client=client, source=source)
    if on_gpu:  # --- GPU path: not exercised by the CPU test suite ---
        from vllm.distributed.weight_transfer.ipc_engine import IPCTrainerInitInfo

        info = IPCTrainerInitInfo(rank=0, packed=True, packed_buffer_size_bytes=size)
        return standalone_ipc_trainer().trainer_init(info, client=client, source=source)
    return WeightTransferTrainerFactory.trainer_init(SharedMemoryTrainerInitInfo(rank=0, buffer_bytes=size),
                                                    client=client, source=source)


def standalone_ipc_trainer() -> type:
    """vLLM's IPC trainer engine without its collectives on the default process group (see the
    module docstring). Two of its hooks change, as vLLM 0.32 defines them
    (``vllm/distributed/weight_transfer/ipc_engine.py``): the handles stay this rank's own (each
    rank's engine reads only its own GPU), after the copies into the buffer are done
    (``torch.cuda.synchronize``, which the all-gather did); after a chunk only the IPC
    collection remains, since each ``update_weights`` returns once the engine has loaded the chunk,
    so the buffer is free to reuse without a barrier."""
    from vllm.distributed.weight_transfer.ipc_engine import IPCTrainerWeightTransferEngine

    class StandaloneIPCTrainer(IPCTrainerWeightTransferEngine):
        def _all_gather_and_merge_handles(self, handles: list[dict[str, tuple]]) -> list[dict[str, tuple]]:
            torch.cuda.synchronize()
            return handles

        @staticmethod
        def _post_send_sync() -> None:
            torch.cuda.ipc_collect()

    return StandaloneIPCTrainer
