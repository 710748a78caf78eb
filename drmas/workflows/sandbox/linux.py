"""The Linux calls the sandbox needs that ``os`` lacks (mount, unshare, pivot_root, prctl), through
libc. Runs in the bootstrap: the standard library only."""

from __future__ import annotations

import ctypes
import os
from typing import Any

# uapi constants (identical on every architecture Python supports)
CLONE_NEWNS = 0x00020000
CLONE_NEWIPC = 0x08000000
CLONE_NEWUSER = 0x10000000
CLONE_NEWPID = 0x20000000
CLONE_NEWNET = 0x40000000
MS_RDONLY, MS_NOSUID, MS_NODEV, MS_NOEXEC, MS_REMOUNT = 0x1, 0x2, 0x4, 0x8, 0x20
MS_BIND, MS_REC, MS_PRIVATE = 0x1000, 0x4000, 0x40000
MNT_DETACH = 0x2
PR_SET_PDEATHSIG, PR_SET_CHILD_SUBREAPER, PR_SET_NO_NEW_PRIVS = 1, 36, 38
# statvfs flag -> mount flag: what a read-only remount must keep (the kernel locks these in a
# user namespace, and a remount that drops one fails)
_KEPT = ((os.ST_NOSUID, MS_NOSUID), (os.ST_NODEV, MS_NODEV), (os.ST_NOEXEC, MS_NOEXEC),
         (os.ST_NOATIME, 0x400), (os.ST_NODIRATIME, 0x800), (os.ST_RELATIME, 0x200000))
# pivot_root has no libc wrapper; its syscall number differs by architecture
_PIVOT_ROOT = {"x86_64": 155, "aarch64": 41, "arm64": 41, "riscv64": 41, "ppc64le": 203, "ppc64": 203,
               "s390x": 217}

_libc: Any = None


def call(name: str, *args: Any) -> int:
    """Call a libc function; raise OSError when it returns -1 (failure)."""
    global _libc
    if _libc is None:
        _libc = ctypes.CDLL(None, use_errno=True)
    result = getattr(_libc, name)(*args)
    if result == -1:
        err = ctypes.get_errno()
        raise OSError(err, f"{name}{args!r}: {os.strerror(err)}")
    return result


def prctl(option: int, value: int) -> None:
    call("prctl", option, ctypes.c_ulong(value), ctypes.c_ulong(0), ctypes.c_ulong(0), ctypes.c_ulong(0))


def mount(source: str | None, target: str, fstype: str | None, flags: int, data: str | None = None) -> None:
    def enc(s: str | None) -> bytes | None:
        return None if s is None else s.encode()

    call("mount", enc(source), enc(target), enc(fstype), ctypes.c_ulong(flags), enc(data))


def unmount(target: str) -> None:
    call("umount2", target.encode(), MNT_DETACH)


def unshare(flags: int) -> None:
    before = os.readlink("/proc/self/ns/mnt")
    call("unshare", flags)
    # Mounting into the host's namespace would change it for everyone: never let that happen.
    if flags & CLONE_NEWNS and os.readlink("/proc/self/ns/mnt") == before:
        raise OSError("unshare(CLONE_NEWNS) left the mount namespace unchanged")


def enter_userns(flags: int) -> None:
    """Without root: a new user namespace that owns the other new namespaces; our ids kept."""
    uid, gid = os.getuid(), os.getgid()
    unshare(CLONE_NEWUSER | flags)
    for name, text in (("setgroups", "deny"), ("uid_map", f"{uid} {uid} 1"), ("gid_map", f"{gid} {gid} 1")):
        with open(f"/proc/self/{name}", "w") as f:
            f.write(text)


def remount_read_only(point: str) -> None:
    """Make one mount read-only, keeping the flags it has."""
    have = os.statvfs(point).f_flag
    keep = sum(flag for st, flag in _KEPT if have & st)
    mount(None, point, None, MS_REMOUNT | MS_BIND | MS_RDONLY | keep)


def pivot_root(new_root: str) -> None:
    """Make ``new_root`` the root of this mount namespace and detach the old one entirely."""
    number = _PIVOT_ROOT.get(os.uname().machine)
    if number is None:
        raise OSError(f"pivot_root: syscall number unknown on {os.uname().machine}")
    os.chdir(new_root)
    # pivot_root(".", "."): the old root is stacked on the new one, then detached (pivot_root(2))
    call("syscall", ctypes.c_long(number), b".", b".")
    unmount(".")
    os.chdir("/")
