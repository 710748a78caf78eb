"""The bootstrap: the process between the trainer and the program, and the probe.

The trainer starts ``python -I -S -B -c <entry> --bootstrap CFG`` (:data:`ENTRY`: this package
imported from its directory, nothing else on ``sys.path``) in a new session. The bootstrap enters
the namespaces, makes itself the child subreaper and forks the program's process, which joins the
run's cgroup, builds its view (:mod:`.view`), sets its limits, drops its privileges and execs the
interpreter. Every orphaned descendant is re-parented to the bootstrap, so it kills and reaps all
of them when the program exits, times out or floods its output; nothing is left running, not even a
child that called ``setsid()``. Standard library only.
"""

from __future__ import annotations

import contextlib
import json
import os
import resource
import signal
import sys
import tempfile
import time
from typing import Any, NoReturn, Sequence

from . import linux
from .limits import join_cgroup
from .view import build_view

PYTHON_FLAGS = ("-I", "-S", "-B")
ENTRY = ("import sys; sys.path.append(sys.argv[1]); from sandbox.process import main; "
         "main(sys.argv[2:])")
"""The bootstrap's ``-c`` program; its first argument is the directory holding this package."""
PACKAGE_PARENT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def bootstrap_command(python: str, *args: str) -> list[str]:
    return [python, *PYTHON_FLAGS, "-c", ENTRY, PACKAGE_PARENT, *args]


def proc_ids(pid: int) -> tuple[int, int] | None:
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


def pids(match: Any) -> list[int]:
    out = []
    for name in os.listdir("/proc"):
        if name.isdigit():
            ids = proc_ids(int(name))
            if ids is not None and match(*ids):
                out.append(int(name))
    return out


def kill_all(targets: Sequence[int]) -> None:
    for pid in targets:
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGKILL)


def _kill_and_reap(child: int, uid: int | None, statuses: dict[int, int]) -> None:
    """SIGKILL every descendant and reap it (we are their subreaper)."""
    me = os.getpid()
    deadline = time.monotonic() + 5.0
    while time.monotonic() < deadline:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(child, signal.SIGKILL)
        kill_all(pids(lambda ppid, u: ppid == me or (uid is not None and u == uid)))
        try:
            while True:
                pid, status = os.waitpid(-1, os.WNOHANG)
                if pid == 0:
                    break
                statuses[pid] = status
        except ChildProcessError:  # no child left: every orphan came to us and was reaped
            if uid is None or not pids(lambda _, u: u == uid):
                return
        time.sleep(0.002)


class _Stop(Exception):
    """Raised in the bootstrap by SIGTERM (parent's timeout / output cap / parent death)."""


def _raise_stop(signum: int, frame: Any) -> None:
    raise _Stop


def _exec_program(cfg: dict[str, Any], status_fd: int, bootstrap_pid: int) -> NoReturn:
    """In the forked program's process: cgroup, view, limits, privilege drop, exec."""
    for sig in (signal.SIGTERM, signal.SIGPIPE, signal.SIGXFSZ):
        signal.signal(sig, signal.SIG_DFL)
    join_cgroup(cfg["cgroups"])
    if cfg["view"] is not None:
        linux.unshare(linux.CLONE_NEWNS)  # the bootstrap keeps the host's /proc to sweep the run
        build_view(cfg, cfg["workdir"])
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
    linux.prctl(linux.PR_SET_PDEATHSIG, signal.SIGKILL)  # after setresuid, which clears it
    # the bootstrap died before prctl (in a new pid namespace the parent is invisible: pid 0)
    if os.getppid() != bootstrap_pid and not cfg["unshare"] & linux.CLONE_NEWPID:
        os._exit(125)
    linux.prctl(linux.PR_SET_NO_NEW_PRIVS, 1)
    os.umask(0o077)
    os.chdir(cfg["workdir"])
    python = cfg["python"]
    os.execve(python, [python, *PYTHON_FLAGS, cfg["script"]], dict(os.environ))
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
        linux.prctl(linux.PR_SET_PDEATHSIG, signal.SIGTERM)  # parent gone -> clean up like a timeout
        if os.getppid() != cfg["parent_pid"]:
            os._exit(0)
        resource.setrlimit(resource.RLIMIT_CORE, (0, 0))
        linux.prctl(linux.PR_SET_CHILD_SUBREAPER, 1)  # orphans of the program become our children
        try:
            if cfg["userns"]:
                linux.enter_userns(cfg["unshare"])
            elif cfg["unshare"]:
                linux.unshare(cfg["unshare"])
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

    def attempt(fn: Any) -> bool:
        pid = os.fork()
        if pid == 0:
            try:
                fn()
                os._exit(0)
            except BaseException:
                os._exit(1)
        return os.waitpid(pid, 0)[1] == 0

    def mounts(proc: str | None) -> None:
        linux.unshare(linux.CLONE_NEWNS)
        linux.mount(None, "/", None, linux.MS_REC | linux.MS_PRIVATE)
        linux.mount("tmpfs", tempfile.gettempdir(), "tmpfs", linux.MS_NOSUID | linux.MS_NODEV, "size=1m")
        if proc is not None:
            linux.mount("proc", "/proc", "proc", linux.MS_NOSUID | linux.MS_NODEV | linux.MS_NOEXEC, proc)

    if os.geteuid() == 0:
        found = {"net": attempt(lambda: linux.unshare(linux.CLONE_NEWNET)),
                 "ipc": attempt(lambda: linux.unshare(linux.CLONE_NEWIPC)),
                 "mount": attempt(lambda: mounts("hidepid=2")), "userns": False, "proc": True}
    else:
        def userns(proc: bool) -> None:
            linux.enter_userns(linux.CLONE_NEWNET | linux.CLONE_NEWIPC | linux.CLONE_NEWPID)
            # as the program will: pid 1 of the new pid namespace, forked
            if not attempt(lambda: mounts("" if proc else None)):
                raise OSError("no mounts" if not proc else "no fresh /proc")

        ok = attempt(lambda: linux.enter_userns(linux.CLONE_NEWNET | linux.CLONE_NEWIPC))
        mount = ok and attempt(lambda: userns(False))
        found = {"net": ok, "ipc": ok, "mount": mount, "userns": ok,
                 "proc": mount and attempt(lambda: userns(True))}
    sys.stdout.write(json.dumps(found))
    sys.stdout.flush()
    os._exit(0)


def main(argv: list[str]) -> NoReturn:
    if argv[:1] == ["--bootstrap"]:
        _bootstrap(json.loads(argv[1]))
    elif argv[:1] == ["--probe"]:
        _probe()
    raise SystemExit("usage: internal to drmas.workflows.sandbox")
