"""Run ``python SCRIPT ARGS...`` in a fresh process that starts with the heavy imports done.

Every recipe run begins with ~12 s of imports on a 2-core machine (torch, transformers' model
classes, Lightning, which imports torchmetrics, which imports transformers again), longer than
most tiny-random runs themselves. A zygote, started once per test session, makes those imports
and nothing else, then forks one child per run: the child changes to the run's folder, takes its
environment, argv and output files, and runs the script as ``__main__``, ending as that script
would (its exit code, a traceback with exit code 1, or the signal that killed it), atexit handlers
included. Each child starts from the same state just after import, so runs cannot leak into each
other. ``DRMAS_TEST_FORK=0`` runs plain subprocesses instead.

    python tests/forked.py      # the zygote: JSON requests on stdin, replies on stdout
"""

from __future__ import annotations

import atexit
import contextlib
import json
import os
import select
import signal
import subprocess
import sys
import tempfile

__all__ = ["run_script"]


def _serve() -> dict:
    """The zygote's loop: one request at a time; returns only in a forked child, with its request."""
    control_in, control_out = sys.stdin.buffer, sys.stdout.buffer
    control_out.write(b"ready\n")
    control_out.flush()
    for line in control_in:
        request = json.loads(line)
        pid = os.fork()
        if pid == 0:
            return request
        control_out.write(f"{pid}\n".encode())
        control_out.flush()
        _, status = os.waitpid(pid, 0)
        control_out.write(f"{os.waitstatus_to_exitcode(status)}\n".encode())
        control_out.flush()
    sys.exit(0)


def _become(request: dict) -> None:
    """In the child: take the run's folder, environment, streams and argv."""
    os.chdir(request["cwd"])
    os.environ.clear()
    os.environ.update(request["env"])
    tempfile.tempdir = None  # recomputed from the run's TMPDIR
    stdin = os.open(os.devnull, os.O_RDONLY)
    os.dup2(stdin, 0)
    for fd, path in ((1, request["stdout"]), (2, request["stderr"])):
        os.dup2(os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644), fd)
    signal.signal(signal.SIGINT, signal.default_int_handler)
    sys.argv = list(request["argv"])
    sys.path[0] = os.path.dirname(os.path.abspath(sys.argv[0]))


def _kill(pid: int) -> None:
    with contextlib.suppress(ProcessLookupError):  # it may have ended in the meantime
        os.kill(pid, signal.SIGKILL)


def _read(path: str) -> str:
    with open(path, errors="replace") as f:
        return f.read()


class _Zygote:
    def __init__(self) -> None:
        self.proc = subprocess.Popen([sys.executable, os.path.abspath(__file__)], stdin=subprocess.PIPE,
                                     stdout=subprocess.PIPE, bufsize=0)  # unbuffered: select sees every line
        line = b""
        while line != b"ready\n":  # past anything its imports printed
            line = self.proc.stdout.readline()
            if not line:
                raise RuntimeError(f"the test zygote did not start (exit code {self.proc.wait()})")
        atexit.register(self.proc.kill)

    def run(self, argv: list[str], cwd: str, env: dict, timeout: float) -> subprocess.CompletedProcess:
        with tempfile.TemporaryDirectory() as out:
            files = {k: os.path.join(out, k) for k in ("stdout", "stderr")}
            request = {"argv": argv, "cwd": str(cwd), "env": dict(env), **files}
            self.proc.stdin.write((json.dumps(request) + "\n").encode())
            self.proc.stdin.flush()
            pid = int(self.proc.stdout.readline())
            try:
                ready, _, _ = select.select([self.proc.stdout], [], [], timeout)
            except BaseException:  # e.g. Ctrl-C: the run dies with the test, as subprocess.run's would
                _kill(pid)
                self.proc.kill()
                raise
            if not ready:
                _kill(pid)
                self.proc.stdout.readline()
                raise subprocess.TimeoutExpired(argv, timeout, *(_read(files[k]) for k in files))
            code = int(self.proc.stdout.readline())
            stdout, stderr = (_read(files[k]) for k in ("stdout", "stderr"))
        return subprocess.CompletedProcess([sys.executable, *argv], code, stdout, stderr)


_zygote: _Zygote | None = None


def run_script(argv: list[str], cwd, env: dict | None = None,
               timeout: float = 900) -> subprocess.CompletedProcess:
    """``subprocess.run([python, *argv], cwd=cwd, env=env, capture_output=True, text=True)``,
    forked from the zygote unless ``DRMAS_TEST_FORK=0``."""
    global _zygote
    env = dict(os.environ if env is None else env)
    if os.environ.get("DRMAS_TEST_FORK", "1") == "0":
        return subprocess.run([sys.executable, *argv], check=False, cwd=cwd, env=env, capture_output=True,
                              text=True, timeout=timeout)
    if _zygote is None or _zygote.proc.poll() is not None:
        _zygote = _Zygote()
    return _zygote.run(argv, cwd, env, timeout)


if __name__ == "__main__":
    sys.path[0] = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))  # the checkout, as recipes do
    import runpy

    from transformers import AutoModelForCausalLM, AutoTokenizer  # noqa: F401

    import drmas.cli  # noqa: F401  (Lightning, torchmetrics, transformers)

    AutoModelForCausalLM.from_config  # noqa: B018  (transformers resolves its model classes lazily)
    request = _serve()
    _become(request)
    del request
    runpy.run_path(sys.argv[0], run_name="__main__")
