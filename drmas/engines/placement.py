"""Where a child process of a rank runs, whatever engine it holds: its cores (the rank's share of
the node's) and the device it sees."""

from __future__ import annotations

import os
from typing import Any, Sequence

__all__ = ["device_env", "engine_gpu", "local_ranks", "overlap_cores", "pin_process", "rank_cores"]


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


def local_ranks(world_size: int) -> int:
    """Ranks on this node: what torchrun-style launchers say (``LOCAL_WORLD_SIZE``), else all of them."""
    return int(os.environ.get("LOCAL_WORLD_SIZE", world_size))


def device_env(device: Any, visible: str | None = None) -> dict[str, str]:
    """The environment that shows a child process only the trainer's own GPU (it then takes
    ``cuda:0`` of what it sees: the same physical GPU, whatever ``--trainer.devices`` says); none on
    CPU. ``visible``: the trainer's ``CUDA_VISIBLE_DEVICES`` (default: read from the environment)."""
    if getattr(device, "type", "cpu") != "cuda":
        return {}
    visible = os.environ.get("CUDA_VISIBLE_DEVICES") if visible is None else visible
    index = device.index or 0
    ids = [v.strip() for v in visible.split(",")] if visible else []
    if ids and index >= len(ids):
        raise ValueError(f"the trainer runs on {device} but CUDA_VISIBLE_DEVICES={visible!r} shows "
                         f"{len(ids)} GPU(s)")
    return {"CUDA_VISIBLE_DEVICES": ids[index] if ids else str(index)}


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
