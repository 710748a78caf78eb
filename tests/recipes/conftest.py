"""Recipe runs shared by the tests that read them (a recipe run costs seconds to a minute)."""

import json
import os
import subprocess

import pytest
from filelock import FileLock
from recipe_runs import rigged_run


@pytest.fixture(scope="session")
def rigged(tmp_path_factory):
    """``rigged(run)``: the folder and process of that rigged recipe run, run once per test session.
    Under pytest-xdist the workers share it: the first to ask runs it, the others wait for it."""
    root = tmp_path_factory.getbasetemp()
    if os.environ.get("PYTEST_XDIST_WORKER"):
        root = root.parent  # the session's folder, above each worker's own
    done = {}

    def get(run: str):
        if run not in done:
            tmp = root / f"rigged-{run}"
            with FileLock(f"{tmp}.lock"):
                record = tmp / "process.json"
                if not record.exists():
                    tmp.mkdir()
                    proc = rigged_run(run, tmp)
                    record.write_text(json.dumps([proc.args, proc.returncode, proc.stdout, proc.stderr]))
            done[run] = (tmp, subprocess.CompletedProcess(*json.loads(record.read_text())))
        return done[run]

    return get
