"""Child processes end with the process that started them, however it ends: normal exit, an
exception, SIGTERM (exit 143), SIGKILL; and they run on the cores and threads they were given.
Real processes: a parent script starts a child, then ends one way or another."""

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from processes import gone_within, running

from drmas.children import Child

HERE = Path(__file__).resolve().parent
ENV = {"PYTHONPATH": os.pathsep.join([str(HERE), os.environ.get("PYTHONPATH", "")])}

PARENT = """
import signal, sys, time
from drmas.children import Child

child = Child("test_children:sleep_forever", env={env!r})
print(child.pid, flush=True)
mode = sys.argv[1]
if mode == "raise":
    raise RuntimeError("the run failed")
if mode == "sigterm":  # as drmas's CLI does: a SIGTERM becomes exit 143 through Python
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))
if mode != "exit":
    time.sleep(600)
"""


def sleep_forever() -> None:
    time.sleep(600)


def report(path: str) -> None:
    Path(path).write_text(json.dumps({"cpus": sorted(os.sched_getaffinity(0)),
                                      "threads": os.environ.get("OMP_NUM_THREADS")}))


@pytest.mark.parametrize("ending", ["exit", "raise", "sigterm", "sigkill"])
def test_the_child_ends_with_its_parent(ending):
    parent = subprocess.Popen([sys.executable, "-c", PARENT.format(env=ENV), ending], stdout=subprocess.PIPE,
                              stderr=subprocess.PIPE, text=True)
    try:
        pid = int(parent.stdout.readline())
        if ending in ("sigterm", "sigkill"):
            assert running(pid)  # started, and alive while its parent is
            time.sleep(0.5)  # the parent reaches its sleep (and its handler is installed)
            parent.send_signal(signal.SIGTERM if ending == "sigterm" else signal.SIGKILL)
        code = parent.wait(60)
        assert code == {"exit": 0, "raise": 1, "sigterm": 143, "sigkill": -signal.SIGKILL}[ending]
        assert gone_within(pid, 30), f"child {pid} outlived its parent ({ending})"
    finally:
        parent.kill()


def test_a_child_whose_parent_is_already_gone_exits_at_once():
    # parent pid 1 is not this child's parent: as if the trainer died before the child's bootstrap
    proc = subprocess.run([sys.executable, "-m", "drmas.children", "1", "test_children:sleep_forever"],
                          env={**os.environ, **ENV}, timeout=60)
    assert proc.returncode == 1


def test_a_child_runs_on_its_cores_with_its_threads(tmp_path):
    out = tmp_path / "report.json"
    child = Child("test_children:report", [str(out)], threads=1, cpus=[0], env=ENV)
    try:
        child.proc.wait(60)
    finally:
        child.close()
    assert child.proc.returncode == 0
    assert json.loads(out.read_text()) == {"cpus": [0], "threads": "1"}
    assert not child.alive() and child.close() == 0  # closing twice is harmless


def test_bad_arguments_are_refused_before_anything_starts():
    with pytest.raises(ValueError, match="target must be 'module:function', got 'sleep'"):
        Child("sleep")
    with pytest.raises(ValueError, match="threads must be >= 1, got 0"):
        Child("test_children:sleep_forever", threads=0)
    with pytest.raises(ValueError, match="cpus must name at least one core"):
        Child("test_children:sleep_forever", cpus=[])
