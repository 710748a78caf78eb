"""What a run may use: per-process rlimits, and the bound on the whole run (the program and all its
children together): a cgroup where the machine delegates one, else the run's process limit.

Processes: at most ``NPROC`` (threads count) for the whole run on every path. As root each run has
a uid of its own, so ``RLIMIT_NPROC`` counts exactly the run's processes; without root the run is
in a user namespace of its own, where Linux (5.14 and later) counts ``RLIMIT_NPROC`` per user
namespace, so again only the run's processes count, not the user's others. A cgroup adds
``pids.max``.

Memory: with a cgroup, ``memory_mb`` for the whole run (its tmpfs files included; swap off), and
the kernel's OOM killer stops the run's largest process past it; without one, ``memory_mb`` per
process, so at most ``NPROC x memory_mb`` in all.

The cgroup is a child of the trainer's own (so the trainer's limits and accounting still hold):
cgroup v1 with the ``memory`` and ``pids`` controllers, or cgroup v2 where the trainer's cgroup
enables both for its children. The trainer side (:func:`find_cgroups`, :func:`make_cgroup`,
:func:`remove_cgroup`) runs as the trainer; :func:`join_cgroup` runs in the program's process.
"""

from __future__ import annotations

import contextlib
import math
import os
import resource
import time

NPROC = 32
FSIZE = 16 * 2**20
NOFILE = 64
_CONTROLLERS = ("memory", "pids")


def rlimits(timeout_s: float, memory_mb: int) -> list[tuple[int, int, int]]:
    """``(resource, soft, hard)`` of each per-process limit of a program."""
    cpu = math.ceil(timeout_s) + 1  # whole seconds; the wall-clock timeout usually fires first
    return [
        (resource.RLIMIT_CPU, cpu, cpu + 1),  # SIGXCPU at soft, SIGKILL at hard
        (resource.RLIMIT_AS, memory_mb * 2**20, memory_mb * 2**20),
        (resource.RLIMIT_NPROC, NPROC, NPROC),
        (resource.RLIMIT_FSIZE, FSIZE, FSIZE),
        (resource.RLIMIT_NOFILE, NOFILE, NOFILE),
        (resource.RLIMIT_CORE, 0, 0),
    ]


def _own_cgroups() -> dict[str, str]:
    """The trainer's cgroup directory per controller (``v2`` for the unified hierarchy)."""
    paths: dict[str, str] = {}
    with open("/proc/self/cgroup") as f:
        for line in f:
            _, names, path = line.rstrip("\n").split(":", 2)
            for name in names.split(",") if names else ["v2"]:
                paths[name] = path
    dirs: dict[str, str] = {}
    with open("/proc/self/mountinfo") as f:
        for line in f:
            fields = line.split()
            sep = fields.index("-")
            fstype, options = fields[sep + 1], fields[sep + 3].split(",")
            point = fields[4].encode().decode("unicode_escape")
            root = fields[3]
            names = ["v2"] if fstype == "cgroup2" else [o for o in options if o in _CONTROLLERS] \
                if fstype == "cgroup" else []
            for name in names:
                if name in paths and _below(paths[name], root):
                    dirs[name] = os.path.join(point, os.path.relpath(paths[name], root))
    return dirs


def _below(path: str, root: str) -> bool:
    return root == "/" or path == root or path.startswith(root + "/")


def find_cgroups() -> tuple[int, list[str]] | None:
    """Where this process may make child cgroups with memory and pids limits: ``(1, [memory dir,
    pids dir])`` for cgroup v1, ``(2, [dir])`` for v2; None where it may not (then the run's
    process limit is the bound). Proved by making and removing one."""
    dirs = _own_cgroups()
    found: tuple[int, list[str]] | None = None
    if "memory" in dirs and "pids" in dirs:
        found = (1, [dirs["memory"], dirs["pids"]])
    elif "v2" in dirs:
        base = dirs["v2"]
        with contextlib.suppress(OSError):
            with open(os.path.join(base, "cgroup.subtree_control"), "w") as f:
                f.write(" ".join(f"+{c}" for c in _CONTROLLERS))
        with contextlib.suppress(OSError), open(os.path.join(base, "cgroup.subtree_control")) as f:
            if set(_CONTROLLERS) <= set(f.read().split()):
                found = (2, [base])
    if found is None:
        return None
    try:
        remove_cgroup(make_cgroup(found, f"drmas-sandbox-probe-{os.getpid()}", 64))
    except OSError:
        return None
    return found


def make_cgroup(where: tuple[int, list[str]], name: str, memory_mb: int) -> list[str]:
    """A cgroup ``name`` in each hierarchy, limited to ``memory_mb`` and ``NPROC``."""
    version, bases = where
    made = []
    try:
        for base in bases:
            d = os.path.join(base, name)
            with contextlib.suppress(FileExistsError):  # a run killed before it could remove it
                os.mkdir(d, 0o755)
            made.append(d)
        memory = str(memory_mb * 2**20)
        if version == 1:
            _write(made[0], "memory.limit_in_bytes", memory)
            _write(made[0], "memory.memsw.limit_in_bytes", memory, optional=True)  # swap off
            _write(made[1], "pids.max", str(NPROC))
        else:
            _write(made[0], "memory.max", memory)
            _write(made[0], "memory.swap.max", "0", optional=True)
            _write(made[0], "pids.max", str(NPROC))
    except OSError:
        remove_cgroup(made)
        raise
    return made


def _write(d: str, name: str, value: str, optional: bool = False) -> None:
    path = os.path.join(d, name)
    if optional and not os.path.exists(path):
        return
    with open(path, "w") as f:
        f.write(value)


def join_cgroup(dirs: list[str]) -> None:
    """Move the calling process (the program, before exec) into the run's cgroups."""
    for d in dirs:
        _write(d, "cgroup.procs", "0")


def remove_cgroup(dirs: list[str], wait_s: float = 2.0) -> None:
    """Remove the run's cgroups once their last process is gone (reaped processes leave at once;
    the kernel may take a moment to notice)."""
    deadline = time.monotonic() + wait_s
    for d in dirs:
        while True:
            try:
                os.rmdir(d)
                break
            except FileNotFoundError:
                break
            except OSError:
                if time.monotonic() >= deadline:
                    raise
                time.sleep(0.005)


def describe(where: tuple[int, list[str]] | None) -> str:
    if where is None:
        return f"no cgroup: {NPROC} processes per run, memory per process"
    return f"cgroup v{where[0]}: {NPROC} processes and memory_mb per run"

