"""The test driver that runs inside the sandbox: one program, many test inputs, one sandbox run.

Standard library only, and self-contained: :mod:`drmas.workflows.code.judge` sends this file's
source with a last line ``run_tests(<program>)`` as the sandboxed script, and the inputs as
JSON on its stdin. Each input runs in its own forked child (a fresh process: nothing a test
does reaches the next) whose stdin is that input and whose stdout and stderr are pipes only
the driver reads; the driver prints one JSON list of results. What the program printed is sent
back as a digest of its tokens (plus a short preview), so outputs of any size are compared
exactly while the expected outputs never enter the sandbox.
"""

import hashlib
import json
import os
import select
import signal
import sys
import time

OUTPUT_CAP = 1 << 20  # bytes of stdout per test; more is "truncated" (never a pass)
PREVIEW = 160


def normalize(text: str) -> str:
    """Outputs are compared as whitespace-separated tokens (line breaks and spacing are free)."""
    return " ".join(text.split())


def digest(text: str) -> str:
    return hashlib.sha256(normalize(text).encode()).hexdigest()


def _child(code: str, path: str) -> None:
    """In the forked child: stdin from the input file, run the program as ``__main__``."""
    exit_code = 0
    try:
        os.setpgid(0, 0)
        fd = os.open(path, os.O_RDONLY)
        os.dup2(fd, 0)
        os.closerange(3, 4096)  # keep only the test's own pipes (0, 1, 2)
        sys.stdin = open(0, encoding="utf-8", errors="replace", closefd=False)
        sys.stdout = open(1, "w", encoding="utf-8", closefd=False)
        sys.stderr = open(2, "w", encoding="utf-8", closefd=False)
        exec(compile(code, "main.py", "exec"), {"__name__": "__main__", "__builtins__": __builtins__})
    except SystemExit as e:
        exit_code = e.code if isinstance(e.code, int) else (0 if e.code is None else 1)
    except BaseException:  # the program's own error: its traceback on its stderr
        import traceback

        traceback.print_exc()
        exit_code = 1
    try:
        sys.stdout.flush()
        sys.stderr.flush()
    except BaseException:
        exit_code = exit_code or 1
    os._exit(exit_code)


def _kill(target: int) -> None:
    try:
        os.kill(target, signal.SIGKILL)
    except OSError:
        pass


def _one(code: str, path: str, timeout_s: float) -> dict:
    out_r, out_w = os.pipe()
    err_r, err_w = os.pipe()
    pid = os.fork()
    if pid == 0:
        os.close(out_r)
        os.close(err_r)
        os.dup2(out_w, 1)
        os.dup2(err_w, 2)
        _child(code, path)
    os.close(out_w)
    os.close(err_w)
    out, err = bytearray(), bytearray()
    status, open_fds = "", {out_r: out, err_r: err}
    deadline = time.monotonic() + timeout_s
    while open_fds and not status:
        left = deadline - time.monotonic()
        if left <= 0:
            status = "timeout"
            break
        for fd in select.select(list(open_fds), [], [], left)[0]:
            chunk = os.read(fd, 65536)
            if not chunk:
                del open_fds[fd]
            elif fd == out_r and len(out) + len(chunk) > OUTPUT_CAP:
                status = "truncated"
            else:
                open_fds[fd] += chunk if len(open_fds[fd]) < OUTPUT_CAP else b""
    rc = None
    while not status:  # the pipes closed: wait for the exit within the time limit
        done, raw = os.waitpid(pid, os.WNOHANG)
        if done:
            rc = os.waitstatus_to_exitcode(raw)
            break
        if time.monotonic() >= deadline:
            status = "timeout"
        time.sleep(0.002)
    if rc is None:
        _kill(pid)
        rc = os.waitstatus_to_exitcode(os.waitpid(pid, 0)[1])
    _kill(-pid)  # anything the test left running in its group
    os.close(out_r)
    os.close(err_r)
    if not status:
        status = "ok" if rc == 0 else "error"
    text = out.decode("utf-8", errors="replace")
    lines = [line for line in err.decode("utf-8", errors="replace").splitlines() if line.strip()]
    return {"status": status, "digest": digest(text) if status == "ok" else "", "preview": text[:PREVIEW],
            "error": (lines[-1][:200] if lines else f"exit code {rc}") if status == "error" else ""}


def run_tests(code: str) -> None:
    """Run ``code`` on every input of the JSON ``{"inputs": [...], "timeout_s": t}`` on stdin;
    after two tests time out, the remaining ones count as timed out without running."""
    job = json.loads(sys.stdin.read())
    try:
        compile(code, "main.py", "exec")
    except (SyntaxError, ValueError) as e:
        error = f"{type(e).__name__}: {e}"[:200]
        print(json.dumps([{"status": "error", "digest": "", "preview": "", "error": error}]
                         * len(job["inputs"])))
        return
    results: list = []
    for i, text in enumerate(job["inputs"]):
        if sum(r["status"] == "timeout" for r in results) >= 2:  # bounds a run's time: the rest fail
            results.append({"status": "timeout", "digest": "", "preview": "",
                            "error": "not run after two timeouts"})
            continue
        path = f"input-{i}.txt"
        with open(path, "w", encoding="utf-8") as f:
            f.write(text)
        results.append(_one(code, path, job["timeout_s"]))
    text = json.dumps(results)
    if len(text) > 60_000:  # the sandbox keeps 64 KiB of stdout: shorter previews, same verdicts
        for r in results:
            r["preview"], r["error"] = r["preview"][:16], r["error"][:40]
        text = json.dumps(results)
    sys.stdout.write(text)
    sys.stdout.flush()
