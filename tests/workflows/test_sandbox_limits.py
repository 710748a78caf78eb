"""Limits that hold for a run in total, the program and all its children together: memory through
the run's cgroup (as root here), processes through the run's own process limit on both paths; the
trainer is not disturbed while a run hits them."""

from __future__ import annotations

import dataclasses
import json
import os
import re
import subprocess

import pytest
from test_sandbox import NORMAL, _unprivileged_python, user_dirs  # noqa: F401 (a fixture)

from drmas.workflows.sandbox import Result, SandboxPool, limits, process
from drmas.workflows.sandbox import run as sandbox_run

_BLOCK_MB, _CHILDREN, _MEMORY_MB = 200, 8, 300
# each child fits the per-process limit; all of them together are 5x the run's memory
_HOG = f"""
import os, time
kids = []
for _ in range({_CHILDREN}):
    pid = os.fork()
    if pid == 0:
        block = b"x" * ({_BLOCK_MB} * 2**20)
        time.sleep(4)
        os._exit(0)
    kids.append(pid)
time.sleep(2.5)
alive = killed = 0
for pid in kids:
    done, status = os.waitpid(pid, os.WNOHANG)
    alive += done == 0
    killed += done != 0 and os.WIFSIGNALED(status) and os.WTERMSIG(status) == 9
print(alive, killed)
"""


def _counts(r: Result) -> tuple[int, int]:
    assert r.returncode == 0, r.stderr
    alive, killed = map(int, r.stdout.split())
    return alive, killed


@pytest.mark.integration  # a sandboxed program starts many children (5 s)
def test_a_many_children_memory_hog_is_bounded_by_the_runs_cgroup() -> None:
    feats = sandbox_run.features()
    if feats.cgroups is None:
        pytest.skip(f"no cgroup on this machine ({feats.describe()})")
    with SandboxPool(2) as pool:
        hog, normal = pool.run([_HOG, NORMAL], timeout_s=10, memory_mb=_MEMORY_MB)
    alive, killed = _counts(hog)
    # at most one 200 MiB child fits in 300 MiB; the kernel killed the others, not the trainer
    assert alive * _BLOCK_MB <= _MEMORY_MB and alive + killed == _CHILDREN, (alive, killed)
    assert normal.ok and normal.stdout == "45\n"
    # without the cgroup the same program holds all its children's memory: 8 x 200 MiB
    unbounded = sandbox_run._run(_HOG, "", 10, _MEMORY_MB, dataclasses.replace(feats, cgroups=None))
    assert _counts(unbounded) == (_CHILDREN, 0)


def test_the_runs_cgroup_is_removed_afterwards() -> None:
    feats = sandbox_run.features()
    if feats.cgroups is None:
        pytest.skip(f"no cgroup on this machine ({feats.describe()})")
    bases = feats.cgroups[1]
    r = sandbox_run.run_python("import os\nprint(open('/proc/self/cgroup').read())", timeout_s=5)
    own = set(re.findall(r"drmas-sandbox-\w+", r.stdout))
    assert r.ok and len(own) == 1  # the program ran inside a cgroup of its own
    # gone from every hierarchy (other runs, of another pytest worker, may hold theirs meanwhile)
    assert not any(own & set(os.listdir(b)) for b in bases)


# each child sleeps, so the parent counts the processes the run may hold: it forks until refused
_COUNT = """
import os, time
n = 1
try:
    while True:
        if os.fork() == 0:
            os.close(1); os.close(2)
            time.sleep(10)
            os._exit(0)
        n += 1
except BlockingIOError:
    print(n, flush=True)
"""
_BOMB_AS_USER = """
import json, subprocess, sys, threading, time
sys.path.append(sys.argv[1])
import sandbox as sb
sb.run.features()
out = {}
def bomb():
    out["r"] = sb.run_python("import os\\nwhile True: os.fork()", timeout_s=3)
thread = threading.Thread(target=bomb)
thread.start()
time.sleep(1.0)
spawned = sum(subprocess.run(["/bin/true"]).returncode == 0 for _ in range(5))  # the trainer forks on
thread.join()
r = out["r"]
count = sb.run_python(sys.argv[2], timeout_s=5)
print(json.dumps({"spawned": spawned, "timed_out": r.timed_out, "rc": r.returncode,
                  "stderr": r.stderr[-2000:], "count": count.stdout, "count_err": count.stderr[-2000:]}))
"""


def test_a_run_holds_at_most_nproc_processes() -> None:
    """As root the run's uid is its own and the bootstrap runs as root: the program gets all NPROC."""
    r = sandbox_run.run_python(_COUNT, timeout_s=5)
    assert r.returncode == 0, r.stderr
    assert int(r.stdout) == limits.NPROC


def test_without_root_a_fork_bomb_hits_the_runs_own_process_limit(user_dirs) -> None:  # noqa: F811
    """The run's user namespace counts its own processes only: NPROC of them, however many the user
    has elsewhere, and the trainer keeps starting processes while a bomb runs into the bound."""
    python = _unprivileged_python()
    uid, _, home = user_dirs
    helper = subprocess.run(
        [python, "-I", "-c", _BOMB_AS_USER, process.PACKAGE_PARENT, _COUNT], capture_output=True,
        text=True, user=uid, group=uid, extra_groups=[], env={"PATH": "/usr/bin:/bin", "HOME": str(home)},
        cwd=str(home), timeout=60,
    )
    assert helper.returncode == 0, helper.stderr
    out = json.loads(helper.stdout)
    assert out["spawned"] == 5
    assert "BlockingIOError" in out["stderr"] or "Resource temporarily unavailable" in out["stderr"]
    # the bootstrap lives in the run's user namespace, so it is one of the NPROC
    assert out["count"].strip() == str(limits.NPROC - 1), out
    assert process.pids(lambda _, u: u == uid) == []
