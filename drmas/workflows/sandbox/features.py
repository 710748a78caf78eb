"""What confinement this machine allows, decided once per trainer process: a probe of the
namespaces, a cgroup, then a smoke run of each candidate from the strongest down. The chosen
one is logged (``python sandbox isolation: ...``)."""

from __future__ import annotations

import json
import logging
import os
import subprocess
import sys
import threading
from dataclasses import dataclass
from typing import Any, Callable

from . import linux
from .limits import describe as describe_limits
from .limits import find_cgroups
from .process import bootstrap_command
from .result import SandboxUnavailable
from .view import view_spec

logger = logging.getLogger("drmas.workflows.sandbox")


@dataclass(frozen=True)
class Features:
    drop_uid: bool
    """As root: a uid of its own per run."""
    unshare: int
    """Namespaces the bootstrap enters (``CLONE_*``)."""
    userns: bool
    """Without root: the bootstrap's namespaces belong to a user namespace of its own."""
    view: dict[str, Any] | None = None
    """The allowlist view (:func:`~.view.view_spec`); None: the host's filesystem."""
    proc: str = "host"
    """What the program's ``/proc`` shows: ``hidepid`` (root: the host's, other uids' processes
    hidden), ``own`` (its own pid namespace's), ``empty`` (an empty tmpfs: a fresh proc mount is
    forbidden here), ``host`` (the host's: an unconfined run only)."""
    cgroups: tuple[int, list[str]] | None = None
    """Where each run's cgroup is made (:func:`~.limits.find_cgroups`); None: no cgroup."""

    @property
    def confined(self) -> bool:
        """The program sees only the allowlist view and writes only its private directories."""
        return self.view is not None

    def describe(self) -> str:
        if self.drop_uid:
            identity = "own uid per run"
        elif self.userns:
            identity = "parent's uid in a user namespace, own pid namespace"
        else:
            identity = "parent's uid"
        proc = {"hidepid": "hidepid /proc", "own": "/proc of its own pid namespace",
                "empty": "/proc covered by an empty tmpfs (a fresh proc mount is forbidden here)"}
        return ", ".join([
            identity,
            "netns" if self.unshare & linux.CLONE_NEWNET else "NO network isolation",
            "ipcns" if self.unshare & linux.CLONE_NEWIPC else "no ipc namespace",
            f"allowlist view ({proc[self.proc]})" if self.confined
            else "NO filesystem view (reads and writes what this user can)",
            describe_limits(self.cgroups),
        ])


_lock = threading.Lock()
_cache: Features | None = None
_failures: list[str] = []  # why better confinement was not possible (for error messages)


def python() -> str:
    if not sys.executable:
        raise RuntimeError("sandbox: sys.executable is unknown")
    return os.path.realpath(sys.executable)


def _candidates(found: dict[str, bool], failures: list[str]) -> list[Features]:
    """From the strongest confinement down; each needs a smoke run to be chosen."""
    ns = (linux.CLONE_NEWNET if found["net"] else 0) | (linux.CLONE_NEWIPC if found["ipc"] else 0)
    cgroups = find_cgroups()
    view = view_spec(python())
    root = os.geteuid() == 0
    if not found["mount"]:
        failures.append("mount namespaces are not permitted" if root or found["userns"]
                        else "unprivileged user namespaces are not permitted by this kernel")
    out = []
    if root:
        if found["mount"]:
            out += [Features(True, ns, False, view, "hidepid", c) for c in (cgroups, None)]
        out.append(Features(True, ns, False))
    else:
        if found["mount"]:
            pid = ns | linux.CLONE_NEWPID
            proc = "own" if found["proc"] else "empty"
            out += [Features(False, pid, True, view, proc, c) for c in (cgroups, None)]
        if found["userns"]:
            out.append(Features(False, ns, True))
        out.append(Features(False, 0, False))
    return [f for i, f in enumerate(out) if f not in out[:i]]  # without a cgroup, one of each


def features(smoke: Callable[[Features], Any]) -> Features:
    """The confinement to use, probed once per process; ``smoke(features)`` runs a test program."""
    global _cache
    with _lock:
        if _cache is not None:
            return _cache
        probe = subprocess.run(bootstrap_command(python(), "--probe"), capture_output=True, text=True,
                               timeout=60, start_new_session=True, env={"PATH": "/usr/bin:/bin"},
                               cwd="/", check=False)
        try:
            found = json.loads(probe.stdout)
        except ValueError as e:
            raise RuntimeError(f"sandbox probe failed: {probe.stderr[-2000:]}") from e
        failures: list[str] = []
        for feats in _candidates(found, failures):
            try:
                r = smoke(feats)
            except RuntimeError as e:
                failures.append(f"{feats.describe()}: {e}")
                continue
            if r.stdout == "ok\n" and r.returncode == 0:
                _cache = feats
                _failures[:] = failures
                log = logger.info if feats.confined and feats.unshare & linux.CLONE_NEWNET else logger.warning
                log("python sandbox isolation: %s", feats.describe())
                return feats
            failures.append(f"{feats.describe()}: rc={r.returncode} stderr={r.stderr[-1000:]}")
        raise RuntimeError("sandbox smoke test failed: " + " | ".join(failures))


def check_confined(feats: Features, allow_unconfined: bool) -> None:
    if feats.confined or allow_unconfined:
        return
    why = "; ".join(_failures) or "no mount namespace"
    raise SandboxUnavailable(
        f"sandbox: model-written programs cannot be confined here ({why}). Unconfined, each program "
        f"would see every file this user can read (answer keys, training data, the run directory)"
        + ("" if feats.drop_uid else f", run as this user (uid {os.getuid()}) able to change and delete "
           "every file that user can and signal that user's processes (the trainer included)")
        + ("" if feats.unshare & linux.CLONE_NEWNET else ", and reach the network")
        + ". Run as root, or allow unprivileged user namespaces (sysctl kernel.unprivileged_userns_clone=1, "
        "user.max_user_namespaces > 0, or AppArmor's kernel.apparmor_restrict_unprivileged_userns=0), or "
        "accept the risk with allow_unconfined=True "
        "(a workflow's --data.workflow.init_args.sandbox.allow_unconfined true).")
