"""Run model-written Python programs with limits: ``run_python`` and ``SandboxPool``.

Every program runs in a fresh interpreter, ``python -I -S -B main.py``: isolated mode (no
``PYTHON*`` variables, no user site, the script's directory not on ``sys.path``), no
``site`` (the standard library only: ``math``, ``fractions``, ``itertools`` ... work, packages
installed next to the trainer such as numpy or sympy are NOT importable, and no ``.pth`` file
runs) and no ``.pyc`` writes. Its working directory (also ``HOME`` and ``TMPDIR``) is a new
temporary directory that is removed afterwards.

How a run is contained: the parent starts a small bootstrap process (this file run as a
script, as the parent's user) in a new session; the bootstrap sets up namespaces and mounts,
makes itself a child subreaper, forks the program, drops its privileges and limits, and execs
the interpreter. Because every orphaned descendant is re-parented to the bootstrap, the
bootstrap can kill and reap all of them when the program exits, times out or floods its
output; nothing is left running, not even a child that called ``setsid()``.

What is isolated when the parent runs as root (CI, this project's machines):

* identity: a uid/gid of its own per concurrent run (``2_000_000_000 + slot``, no passwd
  entry, owns no host file), supplementary groups cleared, ``no_new_privs`` (setuid binaries
  cannot raise privileges), no controlling terminal. A lock file per slot in
  ``/run/drmas-sandbox`` keeps two runs (in any process) from sharing a uid.
* processes: ``RLIMIT_NPROC`` = 32 binds because the uid is unprivileged and unique to the run;
  all processes of the run are SIGKILLed and reaped afterwards (the bootstrap sweeps the uid,
  the parent sweeps again as a safety net).
* files: the program can write only its working directory and private size-limited tmpfs
  mounts over the world-writable ``/tmp``, ``/var/tmp``, ``/dev/shm`` and ``/run/lock``
  (mount namespace); everything else is protected by ordinary permissions (the uid owns
  nothing). ``/proc`` is remounted with ``hidepid=2``: other users' processes are invisible.
  If the interpreter lives below a directory other users cannot enter (e.g. pyenv under
  ``/root``), that directory is replaced, inside the namespace only, by a tmpfs that contains
  nothing but the interpreter's prefix, bind-mounted.
* network: a new network namespace with only a loopback device that is down, so no
  connection to the host, its loopback services or the internet is possible.
* IPC: a new IPC namespace (System V objects die with the run).
* resources per process: ``RLIMIT_CPU`` ~ ``timeout_s + 1`` s, ``RLIMIT_AS`` = ``memory_mb``,
  ``RLIMIT_FSIZE`` = 16 MiB, ``RLIMIT_NOFILE`` = 64, ``RLIMIT_CORE`` = 0; wall-clock timeout;
  stdout and stderr are capped at 64 KiB each (then the run is killed, ``truncated=True``).
* environment: only ``PATH``, ``LANG``, ``HOME``, ``TMPDIR``; no variable of the parent leaks.

What is NOT isolated: reading world-readable host files (the source tree, ``/etc``, the
standard library); CPU share (no cgroup or nice: a program competes like any process for up
to ``timeout_s``); total memory (``RLIMIT_AS`` is per process, so a run can hold up to 32 x
``memory_mb``); kernel attack surface (no seccomp filter); wall clock, hostname, CPU count.

Each namespace is used only if the kernel permits it (probed once per process, then a smoke
test); the detected set is logged. Without root the program keeps the parent's uid inside a new
user namespace with its own mount, pid, network and IPC namespaces: every mount is remounted
read-only, private tmpfs mounts hold the work dir and cover the shared writable directories,
the user's home is hidden, and the program is pid 1 of its own pid namespace (it cannot signal
the trainer) with a ``/proc`` of that namespace only (an empty one where the system forbids a
fresh proc mount; never the host's). ``RLIMIT_NPROC`` then counts all processes of that user (it
is set to their current number + 32). Where no such confinement is possible, runs are refused with
:class:`SandboxUnavailable` unless the caller passes ``allow_unconfined=True``.

Why one file of ~700 lines: this file is also the bootstrap (and the probe) that the sandbox
executes as a script, with ``python -I -S -B`` and no package on ``sys.path``, inside the new
namespaces. The code that runs there must be self-contained and import only the standard
library, and it shares its constants and helpers with the parent side; splitting it would
mean a second script copying them.
"""

from __future__ import annotations

import contextlib
import ctypes
import json
import logging
import math
import os
import random
import resource
import selectors
import shutil
import signal
import stat
import subprocess
import sys
import tempfile
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import Any, Iterator, NoReturn, Sequence

__all__ = ["Result", "SandboxError", "SandboxPool", "SandboxUnavailable", "run_python"]

logger = logging.getLogger(__name__)

OUTPUT_CAP = 64 * 1024  # bytes kept per stream
NPROC = 32
FSIZE = 16 * 2**20
NOFILE = 64
TMPFS_MB = 64  # size of each private tmpfs (counts against the host's RAM, hence small)
_UID_BASE = 2_000_000_000  # below 2**31: some tools treat larger uids as negative
_UID_SLOTS = 1024
_PYTHON_FLAGS = ("-I", "-S", "-B")
_SHARED_WRITABLE_DIRS = ("/tmp", "/var/tmp", "/dev/shm", "/run/lock")
_KILL_GRACE_S = 0.7  # after SIGTERM the bootstrap kills everything; then SIGKILL
_SELF = os.path.abspath(__file__)

# Linux constants (uapi headers; identical on every architecture Python supports)
_CLONE_NEWNS = 0x00020000
_CLONE_NEWIPC = 0x08000000
_CLONE_NEWUSER = 0x10000000
_CLONE_NEWPID = 0x20000000
_CLONE_NEWNET = 0x40000000
_MS_RDONLY, _MS_NOSUID, _MS_NODEV, _MS_NOEXEC, _MS_REMOUNT = 0x1, 0x2, 0x4, 0x8, 0x20
_MS_BIND, _MS_REC, _MS_PRIVATE = 0x1000, 0x4000, 0x40000
# per-mount flags a remount inside a user namespace must keep (the kernel locks them)
_KEPT_FLAGS = {"nosuid": _MS_NOSUID, "nodev": _MS_NODEV, "noexec": _MS_NOEXEC, "noatime": 0x400,
               "nodiratime": 0x800, "relatime": 0x200000}
_MNT_DETACH = 0x2
_PR_SET_PDEATHSIG, _PR_SET_CHILD_SUBREAPER, _PR_SET_NO_NEW_PRIVS = 1, 36, 38


@dataclass(frozen=True)
class Result:
    """Outcome of one program. ``returncode`` is negative for a signal, None on timeout or when
    the sandbox could not start the program (``error`` then says why)."""

    stdout: str
    stderr: str
    returncode: int | None
    timed_out: bool
    truncated: bool = False
    """The output passed the cap and the program was killed: what it printed is incomplete."""
    error: str = ""
    """Set when the sandbox failed to set up this run (the program never ran)."""

    @property
    def ok(self) -> bool:
        """The program ran to completion, exited 0, and its whole output is here."""
        return self.returncode == 0 and not (self.timed_out or self.truncated or self.error)


class SandboxError(RuntimeError):
    """One run could not be set up (namespaces, mounts, privilege drop): the program never ran."""


class SandboxUnavailable(RuntimeError):
    """Model-written code cannot be confined on this machine and running it unconfined was not allowed."""


# --------------------------------------------------------------------------------------------
# Child side: runs in the bootstrap process (``python -I -S -B sandbox.py --bootstrap CFG``).
# --------------------------------------------------------------------------------------------

_libc: Any = None


def _sys(name: str, *args: Any) -> None:
    """Call a libc function that returns 0 on success; raise OSError otherwise."""
    global _libc
    if _libc is None:
        _libc = ctypes.CDLL(None, use_errno=True)
    if getattr(_libc, name)(*args) != 0:
        err = ctypes.get_errno()
        raise OSError(err, f"{name}{args!r}: {os.strerror(err)}")


def _prctl(option: int, value: int) -> None:
    _sys("prctl", option, ctypes.c_ulong(value), ctypes.c_ulong(0), ctypes.c_ulong(0), ctypes.c_ulong(0))


def _mount(source: str | None, target: str, fstype: str | None, flags: int, data: str | None = None) -> None:
    def enc(s: str | None) -> bytes | None:
        return None if s is None else s.encode()

    _sys("mount", enc(source), enc(target), enc(fstype), ctypes.c_ulong(flags), enc(data))


def _unshare(flags: int) -> None:
    before = os.readlink("/proc/self/ns/mnt")
    _sys("unshare", flags)
    # Mounting into the host's namespace would hide /tmp for everyone: never let that happen.
    if flags & _CLONE_NEWNS and os.readlink("/proc/self/ns/mnt") == before:
        raise OSError("unshare(CLONE_NEWNS) left the mount namespace unchanged")


def _enter_userns(flags: int) -> None:
    """Unprivileged path: a user namespace owns the new net/ipc namespaces; keep our ids."""
    uid, gid = os.getuid(), os.getgid()
    _unshare(_CLONE_NEWUSER | flags)
    for name, text in (("setgroups", "deny"), ("uid_map", f"{uid} {uid} 1"), ("gid_map", f"{gid} {gid} 1")):
        with open(f"/proc/self/{name}", "w") as f:
            f.write(text)


def _cover(blocked: str, targets: Sequence[str], stage_dir: str, index: int) -> None:
    """Cover ``blocked`` with an empty tmpfs, except ``targets`` below it, bound back in place."""
    stages = []
    for j, target in enumerate(targets):  # bind each target aside first
        stage = os.path.join(stage_dir, f".expose{index}-{j}")
        os.mkdir(stage, 0o700)
        _mount(target, stage, None, _MS_BIND | _MS_REC)
        stages.append((stage, target))
    _mount("tmpfs", blocked, "tmpfs", _MS_NOSUID | _MS_NODEV, "mode=755,size=1m")
    for stage, target in stages:
        os.makedirs(target, 0o755, exist_ok=True)
        _mount(stage, target, None, _MS_BIND | _MS_REC)
        _sys("umount2", stage.encode(), _MNT_DETACH)
        os.rmdir(stage)


def _private_tmp_dirs(tmpfs_mb: int, skip: Sequence[str]) -> list[str]:
    """A private size-limited tmpfs over each world-writable shared directory not in ``skip``."""
    covered = []
    for d in _SHARED_WRITABLE_DIRS:
        try:
            st = os.stat(d)
        except FileNotFoundError:
            continue
        inside = any(t == d or t.startswith(d + "/") for t in skip)
        if stat.S_ISDIR(st.st_mode) and st.st_mode & stat.S_IWOTH and not inside:
            _mount("tmpfs", d, "tmpfs", _MS_NOSUID | _MS_NODEV, f"mode=1777,size={tmpfs_mb}m,nr_inodes=8192")
            covered.append(d)
    return covered


def _private_mounts(cfg: dict[str, Any]) -> None:
    """Mount-namespace setup as root. Called after unshare(CLONE_NEWNS) succeeded."""
    workdir, script = cfg["workdir"], cfg["script"]
    if os.readlink("/proc/self/ns/mnt") == os.readlink(f"/proc/{cfg['parent_pid']}/ns/mnt"):
        raise OSError("refusing to mount in the parent's mount namespace")
    _mount(None, "/", None, _MS_REC | _MS_PRIVATE)  # first: nothing below reaches the host
    with open(script, "rb") as f:
        code = f.read()
    exposed: list[str] = []
    for i, (blocked, targets) in enumerate(cfg["expose"]):
        _cover(blocked, targets, workdir, i)
        exposed += targets
    _private_tmp_dirs(cfg["tmpfs_mb"], exposed)
    if not os.path.isdir(workdir):  # it was under a now-private /tmp: recreate it there
        os.makedirs(workdir, 0o700)
        with open(script, "wb") as f:
            f.write(code)
    _mount("proc", "/proc", "proc", _MS_NOSUID | _MS_NODEV | _MS_NOEXEC, "hidepid=2")


def _mounts() -> list[tuple[str, bool, int]]:
    """(mount point, read-only?, flags a remount must keep) of every mount, parents first."""
    out = []
    with open("/proc/self/mountinfo") as f:
        for line in f:
            fields = line.split()
            point = fields[4].encode().decode("unicode_escape")  # "\040" is a space
            options = fields[5].split(",")
            out.append((point, "ro" in options, sum(_KEPT_FLAGS.get(o, 0) for o in options)))
    return out


def _confine_userns(cfg: dict[str, Any]) -> None:
    """Without root, as root of a new user + mount namespace: every mount becomes read-only,
    private tmpfs mounts cover the shared writable directories and hold the work dir, and the
    user's home is hidden (except the interpreter, when it lives there)."""
    workdir, script = cfg["workdir"], cfg["script"]
    _mount(None, "/", None, _MS_REC | _MS_PRIVATE)
    with open(script, "rb") as f:
        code = f.read()
    for point, read_only, keep in _mounts():
        if read_only or point == "/proc" or point.startswith(("/proc/", "/sys/")) or point == "/sys":
            continue
        try:
            _mount(None, point, None, _MS_REMOUNT | _MS_BIND | _MS_RDONLY | keep)
        except OSError as e:
            if e.errno not in (2, 13):  # ENOENT, EACCES: a mount this user cannot reach anyway
                raise OSError(e.errno, f"cannot make {point} read-only: {e.strerror}") from None
    covered = _private_tmp_dirs(cfg["tmpfs_mb"], cfg["keep"])  # never over the interpreter
    if any(workdir.startswith(d + "/") for d in covered):
        os.makedirs(workdir, 0o700)  # its host copy is hidden now
    else:
        _mount("tmpfs", workdir, "tmpfs", _MS_NOSUID | _MS_NODEV, f"mode=700,size={cfg['tmpfs_mb']}m")
    with open(script, "wb") as f:
        f.write(code)
    for i, (blocked, targets) in enumerate(cfg["expose"]):
        if os.path.isdir(blocked):  # else it was below a private tmp dir: hidden already
            _cover(blocked, targets, workdir, i)


def _own_proc(mode: str) -> None:
    """In the forked program, pid 1 of its own pid namespace (without root): a ``/proc`` of that
    namespace only, in a mount namespace of the program's own, so the bootstrap keeps the host's
    ``/proc`` to sweep the run's processes. ``empty``: where a fresh proc mount is forbidden (a
    container that masks parts of ``/proc``), an empty tmpfs covers it instead."""
    _unshare(_CLONE_NEWNS)
    if mode == "own":
        _mount("proc", "/proc", "proc", _MS_NOSUID | _MS_NODEV | _MS_NOEXEC)
    else:
        _mount("tmpfs", "/proc", "tmpfs", _MS_NOSUID | _MS_NODEV | _MS_NOEXEC,
               "mode=555,size=4k,nr_inodes=16")


def _proc_ids(pid: int) -> tuple[int, int] | None:
    """(parent pid, real uid) of a process, None if it is gone."""
    try:
        with open(f"/proc/{pid}/status") as f:
            text = f.read()
    except OSError:
        return None
    ppid = uid = -1
    for line in text.splitlines():
        if line.startswith("PPid:"):
            ppid = int(line.split()[1])
        elif line.startswith("Uid:"):
            uid = int(line.split()[1])
    return ppid, uid


def _pids(match: Any) -> list[int]:
    out = []
    for name in os.listdir("/proc"):
        if name.isdigit():
            ids = _proc_ids(int(name))
            if ids is not None and match(*ids):
                out.append(int(name))
    return out


def _kill_all(pids: Sequence[int]) -> None:
    for pid in pids:
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGKILL)


def _kill_and_reap(child: int, uid: int | None, statuses: dict[int, int]) -> None:
    """Bootstrap cleanup: SIGKILL every descendant and reap it (we are their subreaper)."""
    me = os.getpid()
    deadline = time.monotonic() + 5.0
    while time.monotonic() < deadline:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(child, signal.SIGKILL)
        _kill_all(_pids(lambda ppid, u: ppid == me or (uid is not None and u == uid)))
        try:
            while True:
                pid, status = os.waitpid(-1, os.WNOHANG)
                if pid == 0:
                    break
                statuses[pid] = status
        except ChildProcessError:  # no child left: every orphan came to us and was reaped
            if uid is None or not _pids(lambda _, u: u == uid):
                return
        time.sleep(0.002)


class _Stop(Exception):
    """Raised in the bootstrap by SIGTERM (parent's timeout / output cap / parent death)."""


def _raise_stop(signum: int, frame: Any) -> None:
    raise _Stop


def _exec_program(cfg: dict[str, Any], status_fd: int, bootstrap_pid: int) -> NoReturn:
    """In the forked child: limits, privilege drop, exec. Never returns."""
    for sig in (signal.SIGTERM, signal.SIGPIPE, signal.SIGXFSZ):
        signal.signal(sig, signal.SIG_DFL)
    if cfg["proc"] in ("own", "empty"):
        _own_proc(cfg["proc"])
    os.set_inheritable(status_fd, False)  # closed by exec: the program cannot forge a status
    os.setpgid(0, 0)
    for res, soft, hard in cfg["rlimits"]:
        resource.setrlimit(res, (soft, hard))
    uid, gid = cfg["uid"], cfg["gid"]
    if uid is not None:
        os.setgroups([])
        os.setresgid(gid, gid, gid)
        os.setresuid(uid, uid, uid)
        if os.getresuid() != (uid, uid, uid) or os.getresgid() != (gid, gid, gid) or os.getgroups():
            raise OSError("privilege drop did not take effect")
    _prctl(_PR_SET_PDEATHSIG, signal.SIGKILL)  # after setresuid, which clears it
    # the bootstrap died before prctl (in a new pid namespace the parent is invisible: pid 0)
    if os.getppid() != bootstrap_pid and not cfg["unshare"] & _CLONE_NEWPID:
        os._exit(125)
    _prctl(_PR_SET_NO_NEW_PRIVS, 1)
    os.umask(0o077)
    os.chdir(cfg["workdir"])
    python = cfg["python"]
    os.execve(python, [python, *_PYTHON_FLAGS, cfg["script"]], dict(os.environ))
    raise AssertionError("unreachable")


def _bootstrap(cfg: dict[str, Any]) -> NoReturn:
    status_fd = cfg["status_fd"]

    def report(text: str) -> None:
        with contextlib.suppress(OSError):
            os.write(status_fd, text.encode()[:4000] + b"\n")

    signal.signal(signal.SIGTERM, _raise_stop)
    child = 0
    statuses: dict[int, int] = {}
    try:
        _prctl(_PR_SET_PDEATHSIG, signal.SIGTERM)  # parent gone -> clean up like a timeout
        if os.getppid() != cfg["parent_pid"]:
            os._exit(0)
        resource.setrlimit(resource.RLIMIT_CORE, (0, 0))
        _prctl(_PR_SET_CHILD_SUBREAPER, 1)  # orphans of the program become our children
        try:
            if cfg["userns"]:
                _enter_userns(cfg["unshare"])
            elif cfg["unshare"]:
                _unshare(cfg["unshare"])
            if cfg["mount"]:
                (_confine_userns if cfg["userns"] else _private_mounts)(cfg)
            if cfg["uid"] is not None:
                os.chown(cfg["workdir"], cfg["uid"], cfg["gid"])
                os.chown(cfg["script"], cfg["uid"], cfg["gid"])
        except OSError as e:
            report(f"error setup: {e}")
            os._exit(125)
        child = os.fork()
        if child == 0:
            try:
                _exec_program(cfg, status_fd, os.getppid())
            except BaseException as e:  # report whatever stopped the exec
                report(f"error exec: {e!r}")
                os._exit(126)
        # Hold no end of the program's pipes: the parent's EOF must mean "all writers gone".
        null = os.open(os.devnull, os.O_RDWR)
        for fd in (0, 1, 2):
            os.dup2(null, fd)
        while True:
            pid, status = os.waitpid(-1, 0)
            statuses[pid] = status
            if pid == child:
                break
    except _Stop:
        pass
    signal.signal(signal.SIGTERM, signal.SIG_IGN)
    if child:
        _kill_and_reap(child, cfg["uid"], statuses)
        if child in statuses:
            report(f"exit {statuses[child]}")
    os._exit(0)


def _probe() -> NoReturn:
    """Which namespaces may this (root or not) process create? Prints JSON; each try forks."""
    root = os.geteuid() == 0

    def attempt(fn: Any) -> bool:
        pid = os.fork()
        if pid == 0:
            try:
                fn()
                os._exit(0)
            except BaseException:
                os._exit(1)
        return os.waitpid(pid, 0)[1] == 0

    def mounts() -> None:
        _unshare(_CLONE_NEWNS)
        _mount(None, "/", None, _MS_REC | _MS_PRIVATE)
        _mount("tmpfs", tempfile.gettempdir(), "tmpfs", _MS_NOSUID | _MS_NODEV, "size=1m")  # private copy
        _mount("proc", "/proc", "proc", _MS_NOSUID | _MS_NODEV | _MS_NOEXEC, "hidepid=2")

    if root:
        found = {
            "net": attempt(lambda: _unshare(_CLONE_NEWNET)),
            "ipc": attempt(lambda: _unshare(_CLONE_NEWIPC)),
            "mount": attempt(mounts),
            "userns": False,
        }
    else:
        def userns_mounts(proc: bool = False) -> None:
            _enter_userns(_CLONE_NEWNET | _CLONE_NEWIPC | _CLONE_NEWNS | _CLONE_NEWPID)
            _mount(None, "/", None, _MS_REC | _MS_PRIVATE)
            _mount("tmpfs", tempfile.gettempdir(), "tmpfs", _MS_NOSUID | _MS_NODEV, "size=1m")
            if proc and not attempt(lambda: _own_proc("own")):  # as the program will: pid 1, forked
                raise OSError("no fresh /proc")

        ok = attempt(lambda: _enter_userns(_CLONE_NEWNET | _CLONE_NEWIPC))
        mount = ok and attempt(userns_mounts)
        found = {"net": ok, "ipc": ok, "mount": mount, "userns": ok,
                 "proc": mount and attempt(lambda: userns_mounts(proc=True))}
    sys.stdout.write(json.dumps(found))
    sys.stdout.flush()
    os._exit(0)


# --------------------------------------------------------------------------------------------
# Parent side.
# --------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class _Features:
    drop_uid: bool
    unshare: int
    userns: bool
    mount: bool
    expose: tuple[tuple[str, tuple[str, ...]], ...] = ()
    proc: str = "host"
    """What the program's ``/proc`` shows: ``hidepid`` (root: the host's, other uids' processes
    hidden), ``own`` (its own pid namespace's), ``empty`` (an empty tmpfs: a fresh proc mount is
    forbidden here), ``host`` (the host's: an unconfined run only)."""

    @property
    def confined(self) -> bool:
        """Writes are confined: an own uid (root), or read-only mounts in a user namespace."""
        return self.drop_uid or (self.userns and self.mount)

    def describe(self) -> str:
        if self.drop_uid:
            identity = "own uid per run"
        elif self.confined:
            identity = "parent's uid in a user namespace, every mount read-only, own pid namespace"
        else:
            identity = "parent's uid (NOT confined: writes wherever that user can)"
        proc = {"hidepid": ", hidepid /proc", "own": ", /proc of its own pid namespace",
                "empty": ", /proc covered by an empty tmpfs (a fresh proc mount is forbidden here)"}
        mounts = "private tmp dirs" + proc.get(self.proc, "")
        return ", ".join([
            identity,
            "netns" if self.unshare & _CLONE_NEWNET else "NO network isolation",
            "ipcns" if self.unshare & _CLONE_NEWIPC else "no ipc namespace",
            f"mountns ({mounts})" if self.mount else "no mount namespace",
            *(f"{blocked} {'hidden' if self.userns else 'covered'} except the interpreter"
              for blocked, _ in self.expose),
        ])


_features_lock = threading.Lock()
_features_cache: _Features | None = None
_features_failures: list[str] = []  # why better confinement was not possible (for error messages)


def _python() -> str:
    if not sys.executable:
        raise RuntimeError("sandbox: sys.executable is unknown")
    return os.path.realpath(sys.executable)


def _interpreter_dirs() -> list[str]:
    """The top directories the interpreter and its standard library need."""
    needed = {os.path.realpath(p)
              for p in (sys.base_prefix, sys.base_exec_prefix, os.path.dirname(_python()))}
    return sorted(p for p in needed if not any(p.startswith(q + "/") for q in needed))


def _exposures() -> tuple[tuple[str, tuple[str, ...]], ...]:
    """Directories other users cannot enter above the interpreter's files, with what to expose."""
    found: dict[str, list[str]] = {}
    for path in _interpreter_dirs():
        current = ""
        for part in path.strip("/").split("/")[:-1]:
            current += "/" + part
            if not os.stat(current).st_mode & stat.S_IXOTH:
                found.setdefault(current, []).append(path)
                break
    return tuple((blocked, tuple(targets)) for blocked, targets in sorted(found.items()))


def _home_cover() -> tuple[tuple[str, tuple[str, ...]], ...]:
    """The user's home to hide from programs (keeping the interpreter's files when they live there)."""
    home = os.path.realpath(os.path.expanduser("~"))
    tmp = os.path.realpath(tempfile.gettempdir())
    if home == "/" or not os.path.isdir(home) or tmp == home or tmp.startswith(home + "/"):
        return ()
    inside = tuple(p for p in _interpreter_dirs() if p.startswith(home + "/"))
    if any(p == home for p in _interpreter_dirs()):
        return ()
    return ((home, inside),)


def _features() -> _Features:
    """Probe once per process what isolation the kernel allows, then prove it with a smoke run."""
    global _features_cache
    with _features_lock:
        if _features_cache is not None:
            return _features_cache
        probe = subprocess.run(
            [_python(), *_PYTHON_FLAGS, _SELF, "--probe"],
            capture_output=True, text=True, timeout=60, start_new_session=True, env=_env("/"), check=False,
        )
        try:
            found = json.loads(probe.stdout)
        except ValueError as e:
            raise RuntimeError(f"sandbox probe failed: {probe.stderr[-2000:]}") from e
        ns = (_CLONE_NEWNET if found["net"] else 0) | (_CLONE_NEWIPC if found["ipc"] else 0)
        failures: list[str] = []
        if os.geteuid() == 0:
            expose = _exposures()
            if expose and not found["mount"]:
                raise RuntimeError(
                    f"sandbox: an unprivileged uid cannot reach the interpreter {_python()} "
                    f"(blocked by {expose[0][0]}) and mount namespaces are not permitted; "
                    "install Python somewhere world-readable")
            mount = found["mount"]
            flags = ns | (_CLONE_NEWNS if mount else 0)
            candidates = [_Features(True, flags, False, mount, expose if mount else (),
                                    "hidepid" if mount else "host")]
            if not expose and (ns or mount):
                candidates.append(_Features(True, 0, False, False))
        else:
            candidates = []
            if found["mount"]:
                candidates.append(_Features(False, ns | _CLONE_NEWNS | _CLONE_NEWPID, True, True,
                                            _home_cover(), "own" if found["proc"] else "empty"))
            else:
                failures.append("unprivileged user namespaces with mounts are not permitted by this kernel"
                                if not found["userns"] else "mounts in a user namespace are not permitted")
            candidates.append(_Features(False, ns, found["userns"], False))
            if ns:
                candidates.append(_Features(False, 0, False, False))
        for feats in candidates:
            try:
                r = _run("import fractions, itertools, math\nprint('ok')", "", 20.0, 256, feats)
            except RuntimeError as e:
                failures.append(f"{feats.describe()}: {e}")
                continue
            if r.stdout == "ok\n" and r.returncode == 0:
                _features_cache = feats
                _features_failures[:] = failures
                log = logger.info if feats.confined and feats.unshare & _CLONE_NEWNET else logger.warning
                log("python sandbox isolation: %s", feats.describe())
                return feats
            failures.append(f"{feats.describe()}: rc={r.returncode} stderr={r.stderr[-1000:]}")
        raise RuntimeError("sandbox smoke test failed: " + " | ".join(failures))


def _check_confined(feats: _Features, allow_unconfined: bool) -> None:
    if feats.confined or allow_unconfined:
        return
    why = "; ".join(_features_failures) or "not root"
    raise SandboxUnavailable(
        f"sandbox: model-written programs cannot be confined here ({why}). Unconfined, each program "
        f"would run as this user (uid {os.getuid()}) and could read, change and delete every file that user "
        "can, and signal that user's processes (the trainer included)"
        + ("" if feats.unshare & _CLONE_NEWNET else ", and reach the network")
        + ". Run as root, or allow unprivileged user namespaces (sysctl kernel.unprivileged_userns_clone=1, "
        "user.max_user_namespaces > 0, or AppArmor's kernel.apparmor_restrict_unprivileged_userns=0), or "
        "accept the risk with allow_unconfined=True "
        "(a workflow's --data.workflow.init_args.allow_unconfined true).")


def _lock_dir() -> str:
    for path in ("/run/drmas-sandbox", os.path.join(tempfile.gettempdir(), "drmas-sandbox-uids")):
        with contextlib.suppress(FileExistsError, FileNotFoundError, PermissionError):
            os.mkdir(path, 0o700)
        try:
            st = os.lstat(path)
        except OSError:
            continue
        # A directory a sandboxed uid could have pre-created in /tmp must not be trusted.
        if stat.S_ISDIR(st.st_mode) and st.st_uid == os.geteuid() and not st.st_mode & 0o022:
            return path
    raise RuntimeError("sandbox: no safe directory for uid lock files")


@contextlib.contextmanager
def _acquire_uid() -> Iterator[int]:
    """A sandbox uid no other run (in any process) uses until we are done; flock per slot."""
    import fcntl

    lock_dir = _lock_dir()
    start = random.randrange(_UID_SLOTS)
    for i in range(_UID_SLOTS):
        slot = (start + i) % _UID_SLOTS
        fd = os.open(os.path.join(lock_dir, f"{slot}.lock"), os.O_RDWR | os.O_CREAT | os.O_NOFOLLOW, 0o600)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            os.close(fd)
            continue
        try:
            uid = _UID_BASE + slot
            _kill_uid(uid)  # leftovers of a run whose parent was killed
            yield uid
        finally:
            os.close(fd)
        return
    raise RuntimeError("sandbox: all uid slots are busy")


def _kill_uid(uid: int) -> None:
    for _ in range(100):
        pids = _pids(lambda _, u: u == uid)
        if not pids:
            return
        _kill_all(pids)
        time.sleep(0.005)


def _env(workdir: str) -> dict[str, str]:
    return {"PATH": "/usr/local/bin:/usr/bin:/bin", "LANG": "C.UTF-8", "HOME": workdir, "TMPDIR": workdir}


def _user_process_count() -> int:
    me = os.getuid()
    return len(_pids(lambda _, u: u == me))


def _stop(proc: subprocess.Popen[bytes]) -> None:
    """Ask the bootstrap to kill everything (SIGTERM); SIGKILL it if it does not finish."""
    if proc.poll() is not None:
        return
    with contextlib.suppress(ProcessLookupError):
        proc.send_signal(signal.SIGTERM)
    try:
        proc.wait(_KILL_GRACE_S)
    except subprocess.TimeoutExpired:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, signal.SIGKILL)
        proc.wait()


def _communicate(
    proc: subprocess.Popen[bytes], data: bytes, deadline: float
) -> tuple[bytes, bytes, bool, bool]:
    """Feed stdin and read both pipes incrementally; keep at most OUTPUT_CAP bytes of each."""
    assert proc.stdin and proc.stdout and proc.stderr
    bufs = {proc.stdout.fileno(): bytearray(), proc.stderr.fileno(): bytearray()}
    stdin_fd = proc.stdin.fileno()
    timed_out = truncated = False
    with selectors.DefaultSelector() as sel:
        for fd in bufs:
            os.set_blocking(fd, False)
            sel.register(fd, selectors.EVENT_READ)
        pending = memoryview(data)
        if pending:
            os.set_blocking(stdin_fd, False)
            sel.register(stdin_fd, selectors.EVENT_WRITE)
        else:
            proc.stdin.close()

        def pump(limit: float) -> None:
            nonlocal pending, truncated
            for key, _ in sel.select(max(0.0, limit - time.monotonic())):
                fd = key.fd
                if fd == stdin_fd:
                    try:
                        pending = pending[os.write(fd, pending[:65536]):]
                    except BrokenPipeError:  # the program exited without reading everything
                        pending = pending[:0]
                    if not pending:
                        sel.unregister(fd)
                        with contextlib.suppress(OSError):
                            proc.stdin.close()  # type: ignore[union-attr]
                    continue
                try:
                    chunk = os.read(fd, 65536)
                except BlockingIOError:
                    continue
                if not chunk:
                    sel.unregister(fd)
                    continue
                buf = bufs[fd]
                if len(buf) + len(chunk) > OUTPUT_CAP:
                    truncated = True
                buf += chunk[: max(0, OUTPUT_CAP - len(buf))]

        while any(fd in bufs for fd in sel.get_map()) and not truncated:
            if time.monotonic() >= deadline:
                timed_out = True
                break
            pump(deadline)
        if timed_out or truncated:
            _stop(proc)
        # Every writer is dead or exiting now; collect what is still in the pipes.
        drain_until = time.monotonic() + _KILL_GRACE_S
        while any(fd in bufs for fd in sel.get_map()) and time.monotonic() < drain_until:
            pump(drain_until)
    if not (timed_out or truncated):
        try:  # the program closed its pipes but may still run
            proc.wait(max(0.0, deadline - time.monotonic()))
        except subprocess.TimeoutExpired:
            timed_out = True
            _stop(proc)
    proc.wait()
    return bytes(bufs[proc.stdout.fileno()]), bytes(bufs[proc.stderr.fileno()]), timed_out, truncated


def _read_status(fd: int) -> str:
    os.set_blocking(fd, False)
    parts = []
    with contextlib.suppress(BlockingIOError):
        while chunk := os.read(fd, 4096):
            parts.append(chunk)
    return b"".join(parts).decode(errors="replace")


def _rmtree(path: str) -> None:
    def make_writable(func: Any, p: str, exc: Any) -> None:  # non-root: the program may chmod 000
        with contextlib.suppress(OSError):
            os.chmod(os.path.dirname(p), 0o700)
            os.chmod(p, 0o700)
            func(p)

    if sys.version_info >= (3, 12):
        shutil.rmtree(path, onexc=make_writable)
    else:
        shutil.rmtree(path, onerror=make_writable)


def _run(code: str, stdin: str, timeout_s: float, memory_mb: int, feats: _Features) -> Result:
    with _acquire_uid() if feats.drop_uid else contextlib.nullcontext(None) as uid:
        workdir = tempfile.mkdtemp(prefix="drmas-sandbox-")
        try:
            script = os.path.join(workdir, "main.py")
            with open(script, "w", encoding="utf-8") as f:
                f.write(code)
            os.chmod(script, 0o644)
            cpu = math.ceil(timeout_s) + 1  # whole seconds; the wall-clock timeout usually fires first
            nproc = NPROC if feats.drop_uid else _user_process_count() + NPROC
            rlimits = [
                (resource.RLIMIT_CPU, cpu, cpu + 1),  # SIGXCPU at soft, SIGKILL at hard
                (resource.RLIMIT_AS, memory_mb * 2**20, memory_mb * 2**20),
                (resource.RLIMIT_NPROC, nproc, nproc),
                (resource.RLIMIT_FSIZE, FSIZE, FSIZE),
                (resource.RLIMIT_NOFILE, NOFILE, NOFILE),
                (resource.RLIMIT_CORE, 0, 0),
            ]
            status_r, status_w = os.pipe()
            cfg = {
                "python": _python(), "script": script, "workdir": workdir, "uid": uid, "gid": uid,
                "unshare": feats.unshare, "userns": feats.userns, "mount": feats.mount,
                "expose": feats.expose, "proc": feats.proc, "rlimits": rlimits, "tmpfs_mb": TMPFS_MB,
                "keep": _interpreter_dirs(), "status_fd": status_w, "parent_pid": os.getpid(),
            }
            deadline = time.monotonic() + timeout_s
            try:
                proc = subprocess.Popen(
                    [_python(), *_PYTHON_FLAGS, _SELF, "--bootstrap", json.dumps(cfg)],
                    stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                    pass_fds=(status_w,), start_new_session=True, env=_env(workdir), cwd=workdir,
                )
            finally:
                os.close(status_w)
            try:
                out, err, timed_out, truncated = _communicate(proc, stdin.encode(), deadline)
                status = _read_status(status_r)
            finally:
                _stop(proc)  # no-op unless _communicate raised
                for pipe in (proc.stdin, proc.stdout, proc.stderr):
                    with contextlib.suppress(OSError):
                        pipe.close()  # type: ignore[union-attr]
                os.close(status_r)
                if uid is not None:
                    _kill_uid(uid)  # safety net: the bootstrap already reaped everything
        finally:
            _rmtree(workdir)
    for line in status.splitlines():
        if line.startswith("error "):
            raise SandboxError(f"sandbox {line[6:]}")
    returncode: int | None = None
    if not timed_out:
        exits = [int(line[5:]) for line in status.splitlines() if line.startswith("exit ")]
        returncode = os.waitstatus_to_exitcode(exits[0]) if exits else proc.returncode
    stdout, stderr = out.decode(errors="replace"), err.decode(errors="replace")
    return Result(stdout, stderr, returncode, timed_out, truncated)


def run_python(
    code: str, stdin: str = "", timeout_s: float = 5.0, memory_mb: int = 512, allow_unconfined: bool = False
) -> Result:
    """Run ``code`` as a Python program in the sandbox and return its output (see module doc).

    Raises :class:`SandboxUnavailable` where programs cannot be confined (not root and no
    unprivileged user namespaces) unless ``allow_unconfined``, and :class:`SandboxError` when
    this one run could not be set up.
    """
    if timeout_s <= 0:
        raise ValueError("timeout_s must be positive")
    if memory_mb < 32:
        raise ValueError("memory_mb must be at least 32 (the interpreter itself needs ~20 MiB)")
    feats = _features()
    _check_confined(feats, allow_unconfined)
    return _run(code, stdin, timeout_s, memory_mb, feats)


class SandboxPool:
    """Run many programs, at most ``max_workers`` at a time (threads waiting on subprocesses).

    A run the sandbox fails to set up becomes a failed :class:`Result` (``error`` set, logged),
    so one bad run never ends a batch; :class:`SandboxUnavailable` still propagates.
    """

    def __init__(self, max_workers: int = 4, allow_unconfined: bool = False) -> None:
        if max_workers < 1:
            raise ValueError("max_workers must be >= 1")
        self.allow_unconfined = allow_unconfined
        self._executor = ThreadPoolExecutor(max_workers, thread_name_prefix="drmas-sandbox")

    def _one(self, code: str, stdin: str, timeout_s: float, memory_mb: int) -> Result:
        try:
            return run_python(code, stdin, timeout_s, memory_mb, self.allow_unconfined)
        except SandboxError as e:
            logger.warning("a sandboxed program could not be started and counts as failed: %s", e)
            return Result("", "", None, False, error=str(e))

    def run(
        self,
        codes: Sequence[str],
        stdin: str | Sequence[str] = "",
        timeout_s: float = 5.0,
        memory_mb: int = 512,
    ) -> list[Result]:
        """Results in the order of ``codes``; ``stdin`` is one string for all or one per program."""
        stdins = [stdin] * len(codes) if isinstance(stdin, str) else list(stdin)
        if len(stdins) != len(codes):
            raise ValueError(f"{len(codes)} programs but {len(stdins)} stdin strings")
        if codes:  # refuse before queueing anything if programs cannot be confined
            _check_confined(_features(), self.allow_unconfined)
        futures = [self._executor.submit(self._one, c, s, timeout_s, memory_mb)
                   for c, s in zip(codes, stdins, strict=True)]
        return [f.result() for f in futures]

    def close(self) -> None:
        self._executor.shutdown(wait=True)

    def __enter__(self) -> SandboxPool:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


if __name__ == "__main__":
    if sys.argv[1:2] == ["--bootstrap"]:
        _bootstrap(json.loads(sys.argv[2]))
    elif sys.argv[1:2] == ["--probe"]:
        _probe()
    raise SystemExit("usage: internal to drmas.envs.sandbox")
