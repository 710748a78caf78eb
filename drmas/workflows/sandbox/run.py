"""One program in the sandbox, from the trainer's side: :func:`run_python`."""

from __future__ import annotations

import contextlib
import json
import os
import random
import selectors
import shutil
import signal
import stat
import subprocess
import sys
import tempfile
import time
from typing import Any, Iterator

from . import features as _features
from .limits import make_cgroup, remove_cgroup, rlimits
from .process import bootstrap_command, kill_all, pids
from .result import OUTPUT_CAP, Result, SandboxError

TMPFS_MB = 64  # size of each private tmpfs (counts against the host's RAM, hence small)
_UID_BASE = 2_000_000_000  # below 2**31: some tools treat larger uids as negative
_UID_SLOTS = 1024
_KILL_GRACE_S = 0.7  # after SIGTERM the bootstrap kills everything; then SIGKILL


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
        found = pids(lambda _, u: u == uid)
        if not found:
            return
        kill_all(found)
        time.sleep(0.005)


def _env(workdir: str) -> dict[str, str]:
    return {"PATH": "/usr/local/bin:/usr/bin:/bin", "LANG": "C.UTF-8", "HOME": workdir, "TMPDIR": workdir}


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
    def make_writable(func: Any, p: str, exc: Any) -> None:  # unconfined: the program may chmod 000
        with contextlib.suppress(OSError):
            os.chmod(os.path.dirname(p), 0o700)
            os.chmod(p, 0o700)
            func(p)

    if sys.version_info >= (3, 12):
        shutil.rmtree(path, onexc=make_writable)
    else:
        shutil.rmtree(path, onerror=make_writable)


def _run(code: str, stdin: str, timeout_s: float, memory_mb: int, feats: _features.Features) -> Result:
    with _acquire_uid() if feats.drop_uid else contextlib.nullcontext(None) as uid:
        workdir = tempfile.mkdtemp(prefix="drmas-sandbox-")
        cgroups: list[str] = []
        try:
            script = os.path.join(workdir, "main.py")
            with open(script, "w", encoding="utf-8") as f:
                f.write(code)
            os.chmod(script, 0o644)
            if feats.cgroups is not None:
                try:
                    cgroups = make_cgroup(feats.cgroups, os.path.basename(workdir), memory_mb)
                except OSError as e:
                    raise SandboxError(f"sandbox setup: the run's cgroup: {e}") from e
            status_r, status_w = os.pipe()
            cfg = {
                "python": _features.python(), "script": script, "workdir": workdir, "uid": uid, "gid": uid,
                "unshare": feats.unshare, "userns": feats.userns, "view": feats.view, "proc": feats.proc,
                "rlimits": rlimits(timeout_s, memory_mb), "tmpfs_mb": TMPFS_MB, "cgroups": cgroups,
                "status_fd": status_w, "parent_pid": os.getpid(),
            }
            deadline = time.monotonic() + timeout_s
            try:
                proc = subprocess.Popen(
                    bootstrap_command(_features.python(), "--bootstrap", json.dumps(cfg)),
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
            with contextlib.suppress(OSError):  # a busy cgroup is reused by the next run of its name
                remove_cgroup(cgroups)
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


def _smoke(feats: _features.Features) -> Result:
    return _run("import fractions, itertools, math\nprint('ok')", "", 20.0, 256, feats)


def features() -> _features.Features:
    """The confinement this machine allows (probed and smoke-tested once per process)."""
    return _features.features(_smoke)


def run_python(
    code: str, stdin: str = "", timeout_s: float = 5.0, memory_mb: int = 512, allow_unconfined: bool = False
) -> Result:
    """Run ``code`` as a Python program in the sandbox and return its output (docs/sandbox.md).

    Raises :class:`~.result.SandboxUnavailable` where programs cannot be confined (no mount
    namespace for the allowlist view) unless ``allow_unconfined``, and
    :class:`~.result.SandboxError` when this one run could not be set up.
    """
    if timeout_s <= 0:
        raise ValueError("timeout_s must be positive")
    if memory_mb < 32:
        raise ValueError("memory_mb must be at least 32 (the interpreter itself needs ~20 MiB)")
    feats = features()
    _features.check_confined(feats, allow_unconfined)
    return _run(code, stdin, timeout_s, memory_mb, feats)
