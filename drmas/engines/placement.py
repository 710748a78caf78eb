"""Where a child process of a rank runs, whatever engine it holds: its cores (the rank's share of
the node's) and the device it sees."""

from __future__ import annotations

import os
from typing import Any, Sequence

__all__ = ["device_env", "engine_gpu", "gpu_uuid", "local_ranks", "overlap_cores", "pin_process",
           "rank_cores", "slurm_node_tasks"]


def rank_cores(local_rank: int = 0, local_ranks: int = 1, allowed: Sequence[int] | None = None,
               machine: int | None = None) -> list[int]:
    """The cores an engine process of this rank runs on: the rank's even share of the cores this
    process may use (``allowed``, default its affinity), or all of them where a launcher already bound
    the rank to fewer than the ``machine``'s cores. Engines of one rank share its cores: the rank
    generates with one engine at a time, and trains while they wait."""
    cores = sorted(os.sched_getaffinity(0) if allowed is None else allowed)
    machine = os.cpu_count() or len(cores) if machine is None else machine
    if len(cores) < machine or local_ranks <= 1:
        return cores
    if len(cores) < local_ranks:
        return [cores[local_rank % len(cores)]]
    share = len(cores) // local_ranks
    return cores[local_rank * share:(local_rank + 1) * share]


def overlap_cores(cores: Sequence[int]) -> tuple[list[int], list[int]]:
    """``(trainer's, engines')``: a rank's cores split in two halves when its engines play rollouts
    while it trains (``--data.rollout.staleness``), so neither slows the other by taking its cores;
    one core cannot be split (both then share it)."""
    cores = list(cores)
    if len(cores) < 2:
        return cores, cores
    half = len(cores) // 2
    return cores[:half], cores[half:]


def pin_process(cores: Sequence[int]) -> None:
    """Run this process on ``cores`` alone, each of its threads (those started later inherit it), with
    as many compute threads as cores."""
    import torch

    for tid in os.listdir("/proc/self/task"):
        try:
            os.sched_setaffinity(int(tid), cores)
        except OSError:  # a thread that ended meanwhile
            pass
    torch.set_num_threads(len(cores))


def local_ranks(world_size: int, env: dict[str, str] | None = None) -> int:
    """Ranks on this node: what torchrun-style launchers say (``LOCAL_WORLD_SIZE``); under srun, which
    sets no such variable, ``SLURM_NTASKS_PER_NODE`` (set with ``--ntasks-per-node``), else this
    node's entry of ``SLURM_STEP_TASKS_PER_NODE`` (always set, e.g. ``2(x3),1``: two tasks on each
    of nodes 0-2, one on node 3, read at ``SLURM_NODEID``); else all of them."""
    env = os.environ if env is None else env
    if "LOCAL_WORLD_SIZE" in env:
        return int(env["LOCAL_WORLD_SIZE"])
    if "SLURM_LOCALID" in env:  # a task that srun started
        if env.get("SLURM_NTASKS_PER_NODE", "").isdigit():
            return int(env["SLURM_NTASKS_PER_NODE"])
        for key in ("SLURM_STEP_TASKS_PER_NODE", "SLURM_TASKS_PER_NODE"):
            if env.get(key):
                return slurm_node_tasks(env[key], int(env.get("SLURM_NODEID", 0)))
    return world_size


def slurm_node_tasks(spec: str, node: int) -> int:
    """The tasks on node ``node`` in SLURM's compressed per-node list (``2(x3),1``)."""
    seen = 0
    for part in spec.split(","):
        tasks, _, repeat = part.partition("(x")
        seen += int(repeat.rstrip(")")) if repeat else 1
        if node < seen:
            return int(tasks)
    raise ValueError(f"SLURM's task list {spec!r} names {seen} node(s), not node {node} (SLURM_NODEID)")


def gpu_uuid(index: int) -> str:
    """The GPU this process's torch calls ``cuda:index``, by the UUID NVML and CUDA name it (``GPU-...``):
    read from the enumeration the trainer's CUDA made when it started, whatever
    ``CUDA_DEVICE_ORDER`` says now (Lightning sets ``PCI_BUS_ID`` after CUDA has started)."""
    import torch

    uuid = str(torch.cuda.get_device_properties(index).uuid)
    return uuid if uuid.startswith(("GPU-", "MIG-")) else f"GPU-{uuid}"


def device_env(device: Any, visible: str | None = None, uuid_of: Any = gpu_uuid) -> dict[str, str]:
    """The environment that shows a child process only this GPU (it then takes ``cuda:0`` of what it
    sees), named by UUID: an index would be read in the child's ``CUDA_DEVICE_ORDER``, which need not
    be the order the trainer's index came from (CUDA's default, fastest first, against the PCI bus
    order Lightning sets afterwards), and two engines could then share a GPU. A UUID the trainer was
    itself given in ``CUDA_VISIBLE_DEVICES`` (``visible``, default the environment's; ``MIG-...``
    too) is passed on as it is; otherwise ``uuid_of(index)`` (:func:`gpu_uuid`). None on CPU."""
    if getattr(device, "type", "cpu") != "cuda":
        return {}
    visible = os.environ.get("CUDA_VISIBLE_DEVICES") if visible is None else visible
    index = device.index or 0
    ids = [v.strip() for v in visible.split(",")] if visible else []
    if ids and index >= len(ids):
        raise ValueError(f"the trainer runs on {device} but CUDA_VISIBLE_DEVICES={visible!r} shows "
                         f"{len(ids)} GPU(s)")
    named = ids[index] if ids and ids[index].startswith(("GPU-", "MIG-")) else uuid_of(index)
    return {"CUDA_VISIBLE_DEVICES": named}


def engine_gpu(device: Any, trainer_ids: Sequence[int], count: int, local_rank: int) -> Any:
    """The GPU a rank's engines run on under ``--model.engine_placement split``: the ``local_rank``-th
    of the node's GPUs that no trainer rank takes (``trainer_ids``: the trainer's device indices on
    this node, of the ``count`` this process sees). Refused, with the numbers, on CPU or when the
    node has fewer free GPUs than trainer ranks."""
    import torch

    if getattr(device, "type", "cpu") != "cuda":
        raise ValueError(f"--model.engine_placement split puts each rank's engines on a GPU of their own, "
                         f"but this run trains on {device}: on CPU, rollouts behind the update "
                         "(--data.rollout.staleness) give the engine processes cores of their own")
    taken = set(trainer_ids)
    free = [i for i in range(count) if i not in taken]
    if len(free) < len(trainer_ids):
        raise ValueError(f"--model.engine_placement split gives each trainer rank a GPU of its own for its "
                         f"engines: this node shows {count} GPU(s) and the trainer takes {len(trainer_ids)} "
                         f"({list(trainer_ids)}), leaving {len(free)}; train on at most {count // 2} "
                         "(--trainer.devices)")
    return torch.device("cuda", free[local_rank])
