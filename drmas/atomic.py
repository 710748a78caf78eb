"""Replacing files and directories so a reader never sees a half-written one."""

from __future__ import annotations

import os
import shutil
import tempfile
import uuid

__all__ = ["replace_dir", "write_bytes", "write_text"]


def replace_dir(tmp: str, target: str) -> None:
    """Move the finished directory ``tmp`` to ``target``, replacing whatever is there.

    ``rename`` cannot replace a non-empty directory, so an old ``target`` is moved aside first:
    ``target`` is missing only between two renames and is never half written.
    """
    if not os.path.lexists(target):
        os.rename(tmp, target)
        return
    old = tempfile.mkdtemp(prefix=f".{os.path.basename(target)}.old-", dir=os.path.dirname(target) or ".")
    os.rmdir(old)
    os.rename(target, old)
    os.rename(tmp, target)
    if os.path.isdir(old):
        shutil.rmtree(old, ignore_errors=True)
    else:
        os.remove(old)


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
