"""What a sandboxed program sees of other processes through ``/proc``, on both paths: as root (an
own uid, ``hidepid=2``) and without root (a ``/proc`` of the program's own pid namespace). A
program looks for a secret in every process's command line and environment, appends to a file of
the trainer's through ``/proc/<pid>/root`` and ``/proc/<pid>/cwd``, lists the trainer's open files
and signals the trainer by its host pid; all of it fails."""

from __future__ import annotations

import json
import os
import subprocess
import uuid
from pathlib import Path

from test_sandbox import _unprivileged_python, user_dirs  # noqa: F401 (a fixture)

from drmas.workflows.sandbox import process
from drmas.workflows.sandbox import run_python

# {trainer}: the trainer's host pid; {name}: a file in the trainer's working directory
_SNOOP = """
import os
secret, found, listed = {secret!r}, [], []
for pid in os.listdir("/proc"):
    if not pid.isdigit():
        continue
    listed.append(int(pid))
    for part in ("cmdline", "environ"):
        try:
            if secret.encode() in open(f"/proc/{{pid}}/{{part}}", "rb").read():
                found.append(part)
        except OSError:
            pass
wrote = []
for via in ("root", "cwd"):
    path = f"/proc/{trainer}/{{via}}" + ({path!r} if via == "root" else "/" + {name!r})
    try:
        with open(path, "a") as f:
            f.write("pwned")
        wrote.append(via)
    except OSError:
        pass
try:
    fds = len(os.listdir("/proc/{trainer}/fd"))
except OSError:
    fds = None
try:
    os.kill({trainer}, 0)
    signalled = True
except OSError:
    signalled = False
print({{"found": found, "wrote": wrote, "fds": fds, "signalled": signalled, "pids": sorted(listed)}})
"""


def snoop(secret: str, trainer: int, target: Path) -> str:
    return _SNOOP.format(secret=secret, trainer=trainer, path=str(target), name=target.name)


def check(report: dict, target: Path) -> None:
    assert report["found"] == [] and report["wrote"] == [], report
    assert report["fds"] is None and report["signalled"] is False, report
    assert target.read_text() == "trainer's"


def test_as_root_the_program_sees_no_other_process(tmp_path, monkeypatch) -> None:
    secret = f"drmas-secret-{uuid.uuid4().hex}"
    monkeypatch.setenv("DRMAS_SECRET", secret)
    target = tmp_path / "trainer.txt"
    target.write_text("trainer's")
    monkeypatch.chdir(tmp_path)
    r = run_python(snoop(secret, os.getpid(), target), timeout_s=10)
    assert r.returncode == 0, r.stderr
    check(eval(r.stdout), target)  # noqa: S307 - the program printed a dict literal


_AS_USER = """
import dataclasses, json, os, sys
sys.path.append(sys.argv[1])
import sandbox as sb
os.chdir(os.path.dirname(sys.argv[3]))
code = sys.argv[2].replace("TRAINER", str(os.getpid()))
r = sb.run_python(code, timeout_s=10)
# and as on a system that forbids a fresh proc mount
e = sb.run._run(code, "", 10.0, 256, dataclasses.replace(sb.run.features(), proc="empty"))
print(json.dumps({"stdout": r.stdout, "stderr": r.stderr, "rc": r.returncode, "proc": sb.run.features().proc,
                  "empty": [e.stdout, e.stderr, e.returncode]}))
"""


def test_without_root_the_program_sees_its_own_pid_namespace_only(user_dirs) -> None:  # noqa: F811
    python = _unprivileged_python()
    uid, own, home = user_dirs
    secret = f"drmas-secret-{uuid.uuid4().hex}"
    target = own / "trainer.txt"
    target.write_text("trainer's")
    os.chown(target, uid, uid)
    code = snoop(secret, 999_999_999, target).replace("999999999", "TRAINER")
    proc = subprocess.run(
        # the secret in its command line
        [python, "-I", "-c", _AS_USER, process.PACKAGE_PARENT, code, str(target), secret],
        capture_output=True, text=True, timeout=60, user=uid, group=uid, extra_groups=[], check=False,
        env={"PATH": "/usr/bin:/bin", "HOME": str(home), "DRMAS_SECRET": secret}, cwd="/",
    )
    assert proc.returncode == 0, proc.stderr
    out = json.loads(proc.stdout)
    assert out["rc"] == 0, out["stderr"]
    report = eval(out["stdout"])  # noqa: S307
    check(report, target)
    # a fresh /proc of the program's pid namespace: itself, as pid 1 (a system that forbids the
    # mount gets the empty one)
    assert out["proc"] in ("own", "empty") and report["pids"] == ([1] if out["proc"] == "own" else [])
    stdout, stderr, rc = out["empty"]
    assert rc == 0, stderr
    empty = eval(stdout)  # noqa: S307
    check(empty, target)
    assert empty["pids"] == []
