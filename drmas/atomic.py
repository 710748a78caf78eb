"""Replacing files and directories so a reader never sees a half-written one."""

from __future__ import annotations

import ctypes
import errno
import os
import shutil
import tempfile
import time
import uuid

__all__ = ["COMPLETE", "publish_dir", "recover_dir", "replace_dir", "write_bytes", "write_text"]


COMPLETE = ".drmas-complete"
"""The file that marks a published checkpoint directory as whole; it holds a write counter
(nanoseconds), so the newer of two complete directories is known."""


def replace_dir(tmp: str, target: str) -> None:
    """Move the finished directory ``tmp`` to ``target``, replacing whatever is there.

    Where the file system can exchange two names in one step (Linux ``renameat2`` with
    ``RENAME_EXCHANGE``), ``target`` is never missing; elsewhere (``rename`` cannot replace a
    non-empty directory) the old one is moved aside first, and ``target`` is missing only
    between two renames. It is never half written.
    """
    parent = os.path.dirname(target) or "."
    if not os.path.lexists(target):
        os.rename(tmp, target)
    elif _exchange(tmp, target):
        _remove(tmp)  # the old one, now under the temporary name
    else:
        old = tempfile.mkdtemp(prefix=f".{os.path.basename(target)}.old-", dir=parent)
        os.rmdir(old)
        os.rename(target, old)
        os.rename(tmp, target)
        _remove(old)
    _fsync(parent)


def publish_dir(tmp: str, target: str) -> None:
    """:func:`replace_dir` for a checkpoint: ``tmp``'s files reach the disk, a :data:`COMPLETE`
    mark says it is whole, then it replaces ``target``. A kill after the mark and before the
    swap leaves a complete ``tmp`` that :func:`recover_dir` moves into place."""
    for root, _, files in os.walk(tmp):
        for name in files:
            _fsync(os.path.join(root, name))
        _fsync(root)
    # newer than the checkpoint it replaces even if the clock stepped back
    write_text(os.path.join(tmp, COMPLETE), str(max(time.time_ns(), (_mark(target) or 0) + 1)))
    replace_dir(tmp, target)


def recover_dir(tmp: str, target: str) -> bool:
    """Finish a :func:`publish_dir` that a kill interrupted: when ``tmp`` is complete and newer
    than ``target`` (or ``target`` is missing), move it into place and return True. A ``tmp``
    that is older (the swap was done, the old one not yet removed) is removed; an incomplete one
    is left for the next write to replace."""
    mark = _mark(tmp)
    if mark is None:
        return False
    old = _mark(target) if os.path.isdir(target) else None
    if old is not None and old >= mark:
        _remove(tmp)
        return False
    replace_dir(tmp, target)
    return True


def _mark(path: str) -> int | None:
    try:
        with open(os.path.join(path, COMPLETE)) as f:
            return int(f.read())
    except (OSError, ValueError):
        return None


def _exchange(a: str, b: str) -> bool:
    """Swap two paths' names in one step; False where the system or file system cannot."""
    renameat2 = getattr(ctypes.CDLL(None, use_errno=True), "renameat2", None)
    if renameat2 is None:
        return False
    at_fdcwd, rename_exchange = -100, 2
    if renameat2(at_fdcwd, os.fsencode(a), at_fdcwd, os.fsencode(b), rename_exchange) == 0:
        return True
    err = ctypes.get_errno()
    if err in (errno.EINVAL, errno.ENOSYS, errno.EOPNOTSUPP, errno.ENOTSUP):
        return False
    raise OSError(err, os.strerror(err), a)


def _remove(path: str) -> None:
    if os.path.isdir(path) and not os.path.islink(path):
        shutil.rmtree(path, ignore_errors=True)
    elif os.path.lexists(path):
        os.remove(path)


def _fsync(path: str) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def write_text(path: str, text: str) -> None:
    """Write ``text`` to ``path`` through a synced temporary file and an atomic rename."""
    write_bytes(path, text.encode())


def write_bytes(path: str, data: bytes) -> None:
    """Write ``data`` to ``path`` through a synced temporary file and an atomic rename (the file
    gets the usual permissions for the umask, not mkstemp's 0600)."""
    tmp = os.path.join(os.path.dirname(path) or ".", f".{os.path.basename(path)}.{uuid.uuid4().hex[:12]}")
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o666)
    try:
        with os.fdopen(fd, "wb") as f:
            f.write(data)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        if os.path.exists(tmp):
            os.remove(tmp)
        raise
