"""FSDP2 sharding of the policies: ``fully_shard`` per decoder layer and at the root.

``FSDP`` is Lightning's ``ModelParallelStrategy`` with the mesh drmas needs (every rank in one
data-parallel dimension, no tensor parallelism) and the sharding options; the LightningModule
applies :func:`shard_model` to each policy in ``configure_model``. Its checkpoints (a directory
of per-rank files) are made atomic by ``drmas.callbacks.IterationCheckpoint``. Lightning's own ``fsdp``
strategy (FSDP1) wraps the whole LightningModule and breaks manual optimisation, so it is not
used.
"""

from __future__ import annotations

import datetime
import os
from pathlib import Path
from typing import Any

import torch
from lightning.pytorch.strategies import ModelParallelStrategy
from lightning.pytorch.utilities.exceptions import SIGTERMException
from torch import nn
from torch.distributed.constants import default_pg_timeout

from drmas.ranks import collective_timeout_s, flight_recorder, init_process_group
from drmas.watch import watch

__all__ = ["FSDP", "STRATEGIES", "check_precision", "check_resume", "decoder_layers", "is_sharded",
           "pool_meshes", "resolve_strategy", "shard_model", "shard_policies", "take_pools"]


class FSDP(ModelParallelStrategy):
    """Shard every policy over all ranks (FSDP2)."""

    def __init__(self, mixed_precision: bool | None = None, cpu_offload: bool = False, **kwargs: Any) -> None:
        """
        Args:
            mixed_precision: compute in bf16 with fp32 master weights and fp32 gradient
                reductions (default: on CUDA only; gloo on CPU reduces fp32).
            cpu_offload: keep parameters and optimiser state in CPU memory between uses.

        The process group's ``timeout`` defaults to ``--collective_timeout_s``
        (:func:`drmas.ranks.collective_timeout_s`).
        """
        kwargs.setdefault("tensor_parallel_size", 1)
        if kwargs.get("timeout") in (None, default_pg_timeout):  # drmas's bound, not torch's 30 minutes
            kwargs["timeout"] = datetime.timedelta(seconds=collective_timeout_s())
        super().__init__(**kwargs)
        self.mixed_precision, self.cpu_offload = mixed_precision, cpu_offload

    def setup_environment(self) -> None:
        if self._data_parallel_size == "auto":  # Lightning's default would be one rank per node
            self._data_parallel_size = self.num_nodes * self.num_processes
        super().setup_environment()

    def _setup_distributed(self) -> None:
        """The default process group made here, with its store keys under this attempt's prefix
        (:func:`drmas.ranks.init_process_group`: a torchrun restart then starts clean); Lightning's
        own set-up finds it made and keeps it."""
        import torch.distributed as dist

        if not dist.is_initialized() and self.cluster_environment is not None:
            self.set_world_ranks()
            env = self.cluster_environment
            os.environ["MASTER_ADDR"], os.environ["MASTER_PORT"] = env.main_address, str(env.main_port)
            device, backend = self.root_device, self._get_process_group_backend()
            flight_recorder(backend)
            init_process_group(backend, env.global_rank(), env.world_size(), self._timeout,
                               device_id=device if device.type != "cpu" else None)
        super()._setup_distributed()

    def save_checkpoint(self, checkpoint: dict[str, Any], filepath: Any, storage_options: Any = None) -> None:
        """A sharded checkpoint (a directory: every rank's shards, ``meta.pt`` from rank 0) whose
        optimiser states are keyed by policy (``optimizer_<policy>``), not by their place in a rank's
        list: under per-policy pools each rank holds the optimisers of its own policies only, and keys
        by place would have one rank's states (their ``param_groups``) written over another's."""
        if not self._save_distributed_checkpoint:
            return super().save_checkpoint(checkpoint, filepath, storage_options)
        from torch.distributed.checkpoint import save

        path = Path(self.broadcast(filepath))
        if path.is_file():
            path.unlink()
        path.mkdir(parents=True, exist_ok=True)
        states = checkpoint.pop("optimizer_states", [])
        save({"state_dict": checkpoint.pop("state_dict"),
              **{f"optimizer_{name}": state for name, state in zip(self._optimizer_names(), states)}},
             checkpoint_id=path)
        if self.global_rank == 0:
            torch.save(checkpoint, path / "meta.pt")

    def load_checkpoint(self, checkpoint_path: Any, weights_only: bool | None = None) -> dict[str, Any]:
        """Read back what :meth:`save_checkpoint` wrote: each optimiser's state by its policy's name,
        on whichever ranks hold it now (DCP reshards to the ranks and meshes of this run)."""
        if not self._save_distributed_checkpoint:
            return super().load_checkpoint(checkpoint_path, weights_only)
        from lightning.fabric.strategies.model_parallel import _load_checkpoint

        path = Path(self.broadcast(checkpoint_path))
        state = {"state_dict": self.model,
                 **{f"optimizer_{name}": o for name, o in zip(self._optimizer_names(), self.optimizers)}}
        return _load_checkpoint(path=path, state=state, strict=self.lightning_module.strict_loading,
                                optimizer_states_from_list=True, weights_only=weights_only)

    def _optimizer_names(self) -> list[str]:
        """The policy of each optimiser of this rank, in the order the module returned them."""
        names = list(getattr(self.lightning_module, "optimizer_names", lambda: [])())
        if len(names) != len(self.optimizers):
            raise RuntimeError(f"{type(self.lightning_module).__name__} names {len(names)} policies for its "
                               f"{len(self.optimizers)} optimisers (optimizer_names)")
        return names

    def on_exception(self, exception: BaseException) -> None:
        """A rank's own failure is posted on the failure board at once, before Lightning's teardown
        (which may wait in a collective or close engines for seconds): the others end within a
        second. A preemption is no failure: every rank stops there by agreement."""
        if not isinstance(exception, SIGTERMException):
            watch.post(exception)
        super().on_exception(exception)


def decoder_layers(model: nn.Module) -> list[nn.Module]:
    """The model's repeated blocks: the modules whose class the model lists as not to be split."""
    names = set(getattr(model, "_no_split_modules", None) or ())
    layers = [m for m in model.modules() if type(m).__name__ in names]
    if not layers:
        raise ValueError(f"{type(model).__name__} names no decoder layer class (_no_split_modules); "
                         "it cannot be sharded layer by layer")
    return layers


def shard_model(model: nn.Module, mesh: Any, mixed_precision: bool = False,
                cpu_offload: bool = False) -> nn.Module:
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


def pool_meshes(pools: dict[str, tuple[int, ...]], device_type: str) -> tuple[dict[str, Any], dict[str, Any]]:
    """Per-policy pools: each policy's one-dimensional mesh over its pool's ranks, and each pool's gloo
    group (for the agreements of its ranks: a step skipped or raised, a stop). Collectives: every
    rank makes every pool's, in the same order, whether it is in the pool or not (torch creates a
    process group on every rank); policies with the same ranks share them."""
    from torch.distributed.device_mesh import DeviceMesh

    made: dict[tuple[int, ...], tuple[Any, Any]] = {}
    for ranks in pools.values():
        if ranks not in made:
            mesh = DeviceMesh(device_type, list(ranks), mesh_dim_names=("data_parallel",))
            timeout = datetime.timedelta(seconds=collective_timeout_s())
            made[ranks] = (mesh, torch.distributed.new_group(list(ranks), backend="gloo", timeout=timeout))
    return ({n: made[r][0] for n, r in pools.items()}, {n: made[r][1] for n, r in pools.items()})


def take_pools(policies: dict[str, Any], elsewhere: dict[str, Any], pools: dict[str, tuple[int, ...]],
               rank: int, device_type: str) -> tuple[dict[str, Any], dict[str, Any]]:
    """Per-policy pools: move the policies whose pool does not hold ``rank`` from ``policies`` to
    ``elsewhere``, without their weights (never read here: their tokenizer and settings stay); return
    each kept policy's mesh over its pool's ranks, and every pool's gloo group (:func:`pool_meshes`)."""
    meshes, groups = pool_meshes(pools, device_type)  # every rank, the same order
    for name in [n for n in policies if rank not in pools[n]]:
        policy = policies.pop(name)
        policy.model = policy.reference = None
        elsewhere[name] = policy
    return {name: meshes[name] for name in policies}, groups


def shard_policies(policies: Any, strategy: Any, meshes: dict[str, Any]) -> dict[str, str]:
    """FSDP2 on every policy and its frozen reference over its mesh (``meshes``, by policy: every
    rank's, or its pool's); a policy built without its weights (``deferred_weights``) then reads
    only the rows this rank keeps. Returns how each such policy's weights were read. LoRA policies
    are refused: their adapters are not sharded yet."""
    lora = [name for name, p in policies.items() if p.adapter is not None]
    if lora:
        raise ValueError(f"LoRA policies ({', '.join(lora)}) cannot be sharded yet: run them on one device")
    mixed = getattr(strategy, "mixed_precision", None)
    mixed = strategy.root_device.type == "cuda" if mixed is None else mixed
    offload = getattr(strategy, "cpu_offload", False)
    read = {}
    for name, policy in policies.items():
        shard_model(policy.model, meshes[name], mixed, offload)
        if policy.reference is not None:
            shard_model(policy.reference, meshes[name], False, offload)
        if policy.deferred:  # offloaded shards live in CPU memory
            read[policy.name] = policy.load_weights(torch.device("cpu") if offload else strategy.root_device,
                                                    mixed)
    return read


#: The strategy names drmas runs with (``--trainer.strategy NAME``).
STRATEGIES = {
    "auto": "one device",
    "fsdp": "FSDP2 over every device and node",
    "fsdp_offload": "FSDP2 with parameters and optimiser state in CPU memory between uses",
}


def resolve_strategy(strategy: Any) -> Any:
    """A strategy name as the trainer takes it: ``fsdp`` and ``fsdp_offload`` become :class:`FSDP`
    (Lightning's own ``fsdp`` is FSDP1, which breaks manual optimisation); a Strategy object is
    kept; any other name is refused with the accepted ones."""
    if not isinstance(strategy, str):
        return strategy
    if strategy not in STRATEGIES:
        accepted = "; ".join(f"{k} ({v})" for k, v in STRATEGIES.items())
        raise ValueError(f"--trainer.strategy {strategy!r} is not supported; use one of: {accepted}; "
                         "or a class path such as drmas.modules.sharding.FSDP")
    if strategy == "auto":
        return strategy
    return FSDP(cpu_offload=strategy == "fsdp_offload")


def is_sharded(strategy: Any) -> bool:
    """Whether ``--trainer.strategy`` (a name, a ``class_path`` section or a Strategy) shards the policies."""
    if isinstance(strategy, str):
        return strategy in ("fsdp", "fsdp_offload")
    if isinstance(strategy, ModelParallelStrategy):
        return True
    class_path = strategy.get("class_path", "") if hasattr(strategy, "get") else ""
    return str(class_path).rsplit(".", 1)[-1] in ("FSDP", "ModelParallelStrategy")


def check_precision(precision: str) -> None:
    """Refuse fp16 mixed precision: drmas steps the optimisers itself, so gradients would be
    clipped (and their norms logged) while still multiplied by the fp16 loss scale."""
    if precision.startswith("16"):
        raise ValueError(f"precision {precision!r} is not supported: the optimisers are stepped by drmas, "
                         "which would clip gradients still scaled by fp16's loss scaler; "
                         "use bf16-mixed or 32-true")


def check_resume(ckpt_path: Any, strategy: Any) -> None:
    """Refuse, before anything loads, to resume a sharded checkpoint without sharding: its
    directory would be read as a file. (With sharding, any rank count resumes it: the load reshards.)"""
    if not isinstance(ckpt_path, (str, os.PathLike)) or isinstance(strategy, ModelParallelStrategy):
        return
    meta = os.path.join(ckpt_path, "meta.pt")
    if os.path.isdir(ckpt_path) and os.path.isfile(meta):
        ranks = len(torch.load(meta, map_location="cpu", weights_only=True)["drmas"]["rng"])
        raise ValueError(f"{ckpt_path} is a sharded checkpoint written by {ranks} ranks: resume it with "
                         "--trainer.strategy fsdp, on any number of ranks (--trainer.devices 1 included): "
                         "the load reshards it")
