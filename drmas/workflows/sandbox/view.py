"""The program's filesystem: an allowlist view, bubblewrap's model built with mount namespaces.

The program's root is a new, read-only tmpfs holding only:

* ``/usr``, the ``/lib*``, ``/bin`` and ``/sbin`` directories (or their symlinks), and the
  interpreter's prefix (e.g. pyenv's under ``/root``), all bind-mounted read-only, with every
  ``site-packages`` and ``dist-packages`` below them covered by an empty read-only tmpfs (a
  non-venv install puts drmas and its data there);
* a minimal ``/etc``: ``passwd``, ``group``, ``hosts`` and ``nsswitch.conf`` written for the run,
  the loader's ``ld.so.cache`` and ``localtime``;
* ``/dev`` with ``null``, ``zero`` and ``urandom`` and the ``fd``/``std*`` links, a private
  ``/dev/shm``; a private ``/tmp``; the working directory (each a size-limited tmpfs, the only
  writable places);
* ``/proc``: the host's with ``hidepid=2`` as root (an own uid per run), or without root a fresh
  one of the program's own pid namespace (an empty tmpfs where the system forbids that).

Nothing else: no package data (the code judge's answer keys), no user data, no run directory, no
trainer's working directory, no ``/home``, ``/root``, ``/run``, ``/var``, ``/sys``, ``/srv``,
``/opt``, ``/mnt``, nor any other mount. Then ``pivot_root`` detaches the host's root entirely.

:func:`view_spec` (the trainer's side) says what to show; :func:`build_view` (the program's process,
before it drops its privileges) builds it. Standard library only: it runs in the bootstrap.
"""

from __future__ import annotations

import glob
import os
import sys
from typing import Any

from . import linux

_TOP = ("/usr", "/bin", "/sbin", "/lib", "/lib32", "/lib64", "/libx32")
_ETC_FILES = ("/etc/ld.so.cache", "/etc/localtime")
_DEVICES = ("null", "zero", "urandom")
_PACKAGE_DIRS = ("lib*/python*/site-packages", "lib*/python*/dist-packages",
                 "local/lib*/python*/site-packages", "local/lib*/python*/dist-packages")
_FLAGS = linux.MS_NOSUID | linux.MS_NODEV


def _under(path: str, root: str) -> bool:
    return path == root or path.startswith(root.rstrip("/") + "/")


def interpreter_dirs(python: str) -> list[str]:
    """The top directories the interpreter and its standard library live in."""
    needed = {os.path.realpath(p) for p in (sys.base_prefix, sys.base_exec_prefix, os.path.dirname(python))}
    return sorted(p for p in needed if not any(p != q and _under(p, q) for q in needed))


def view_spec(python: str) -> dict[str, Any]:
    """What the program sees (JSON for the bootstrap): directories bound read-only, top-level
    symlinks copied, package directories masked, files of ``/etc`` bound."""
    links, binds = [], []
    for top in _TOP:
        if os.path.islink(top):
            links.append((top, os.readlink(top)))
        elif os.path.isdir(top):
            binds.append(top)
    for d in interpreter_dirs(python):
        if not any(_under(d, b) for b in binds):
            binds.append(d)
    masked = sorted({os.path.realpath(m) for b in binds for pattern in _PACKAGE_DIRS
                     for m in glob.glob(os.path.join(b, pattern)) if os.path.isdir(m)})
    masked = [m for m in masked if any(_under(m, b) for b in binds)]  # not via a symlink elsewhere
    etc = [(f, os.readlink(f) if os.path.islink(f) else None) for f in _ETC_FILES if os.path.lexists(f)]
    return {"binds": binds, "links": links, "masked": masked, "etc": etc}


def exposed(path: str, python: str | None = None) -> str | None:
    """The directory of the view through which programs would read ``path`` (e.g. a data file
    under ``/usr/share`` or the interpreter's prefix), None where they cannot see it."""
    spec = view_spec(os.path.realpath(python or sys.executable))
    real = os.path.realpath(path)
    if any(_under(real, m) for m in spec["masked"]):
        return None
    return next((b for b in spec["binds"] if _under(real, b)), None)


def _inside(root: str, path: str) -> str:
    """``path`` below the new root, refusing any way out (a symlink in the new tree)."""
    target = root + path
    parent = os.path.dirname(target)
    if not _under(os.path.realpath(parent), root):
        raise OSError(f"sandbox view: {path} would leave the new root")
    return target


def _mkdirs(root: str, path: str, mode: int = 0o755) -> str:
    target = _inside(root, path)
    os.makedirs(target, mode, exist_ok=True)
    if os.path.realpath(target) != target:
        raise OSError(f"sandbox view: {path} resolves outside the new root")
    return target


def _write(root: str, path: str, text: str) -> None:
    with open(_inside(root, path), "w") as f:
        f.write(text)


def _bind(root: str, source: str, path: str | None = None) -> None:
    """Bind ``source`` (a directory or a file) at ``path`` (default: the same) in the new root."""
    path = path or source
    if os.path.isdir(source):
        target = _mkdirs(root, path)
    else:
        _mkdirs(root, os.path.dirname(path))
        target = _inside(root, path)
        open(target, "a").close()
    linux.mount(source, target, None, linux.MS_BIND | linux.MS_REC)


def _tmpfs(target: str, mode: str, size_mb: float, read_only: bool = False) -> None:
    size = f"{int(size_mb * 1024)}k"
    linux.mount("tmpfs", target, "tmpfs", _FLAGS | (linux.MS_RDONLY if read_only else 0),
                f"mode={mode},size={size},nr_inodes=8192")


def _mount_points() -> list[str]:
    with open("/proc/self/mountinfo") as f:
        return [line.split()[4].encode().decode("unicode_escape") for line in f]  # "\040" is a space


def build_view(cfg: dict[str, Any], root: str) -> None:
    """In the program's own mount namespace, as (namespace) root: build the view on ``root``
    (an empty directory) and pivot into it. ``cfg``: the run (``view``, ``workdir``, ``script``,
    ``uid``/``gid`` to own the writable places, ``proc`` mode, ``tmpfs_mb``)."""
    spec, workdir, mb = cfg["view"], cfg["workdir"], cfg["tmpfs_mb"]
    linux.mount(None, "/", None, linux.MS_REC | linux.MS_PRIVATE)  # first: nothing reaches the host
    with open(cfg["script"], "rb") as f:
        code = f.read()
    if any(_under(workdir, b) for b in spec["binds"]):
        raise OSError(f"sandbox view: the work dir {workdir} lies below a read-only directory")
    _tmpfs(root, "755", 1)
    writable = []
    for path, mode in (("/tmp", "1777"), ("/dev/shm", "1777")):
        _tmpfs(_mkdirs(root, path), mode, mb)
        writable.append(root + path)
    writable.append(_mkdirs(root, workdir, 0o700))
    _tmpfs(writable[-1], "700", mb)
    for top, target in spec["links"]:
        os.symlink(target, _inside(root, top))
    for source in spec["binds"]:
        _bind(root, source)
    for masked in spec["masked"]:
        _tmpfs(_inside(root, masked), "755", 0.004, read_only=True)
    _etc(root, cfg)
    _dev(root)
    proc = _mkdirs(root, "/proc")
    if cfg["proc"] == "empty":
        _tmpfs(proc, "555", 0.004, read_only=True)
    else:
        hidepid = "hidepid=2" if cfg["proc"] == "hidepid" else None
        linux.mount("proc", proc, "proc", _FLAGS | linux.MS_NOEXEC, hidepid)
    script = root + cfg["script"]
    with open(script, "wb") as f:
        f.write(code)
    if cfg["uid"] is not None:
        os.chown(writable[-1], cfg["uid"], cfg["gid"])
        os.chown(script, cfg["uid"], cfg["gid"])
    for point in _mount_points():
        if _under(point, root) and point not in writable and not _under(point, proc):
            linux.remount_read_only(point)
    linux.pivot_root(root)


def _etc(root: str, cfg: dict[str, Any]) -> None:
    _mkdirs(root, "/etc")
    uid = os.getuid() if cfg["uid"] is None else cfg["uid"]
    gid = os.getgid() if cfg["gid"] is None else cfg["gid"]
    _write(root, "/etc/passwd", "root:x:0:0:root:/:/usr/sbin/nologin\n"
           f"sandbox:x:{uid}:{gid}:sandbox:{cfg['workdir']}:/usr/sbin/nologin\n")
    _write(root, "/etc/group", f"root:x:0:\nsandbox:x:{gid}:\n")
    _write(root, "/etc/hosts", "127.0.0.1 localhost\n::1 localhost\n")
    _write(root, "/etc/nsswitch.conf", "passwd: files\ngroup: files\nhosts: files\n")
    for path, link in cfg["view"]["etc"]:
        if link is None:
            _bind(root, path)
        else:
            os.symlink(link, _inside(root, path))


def _dev(root: str) -> None:
    dev = _mkdirs(root, "/dev")
    for name in _DEVICES:
        _bind(root, f"/dev/{name}")
    for name, target in (("fd", "/proc/self/fd"), ("stdin", "/proc/self/fd/0"),
                         ("stdout", "/proc/self/fd/1"), ("stderr", "/proc/self/fd/2")):
        os.symlink(target, os.path.join(dev, name))
