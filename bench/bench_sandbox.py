"""What the sandbox costs: the embedded coding problems' reference solutions judged on their golden
tests through :class:`~drmas.workflows.code.judge.Judge`, against the same test driver run as a plain
``python -I -S -B`` subprocess with no confinement (the peer), both measured in this run.

Also the cost of one empty program (``pass``) both ways, which is the per-run set-up: the bootstrap,
namespaces, the allowlist view, the cgroup. Each figure is the median of ``--repeats`` runs after a
warm-up; the ratio is sandbox / peer.

    python bench/bench_sandbox.py [--workers 2] [--repeats 3] [--problems 64]
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor

from drmas.workflows.code import driver
from drmas.workflows.code.judge import _DRIVER, Judge, pass_rate
from drmas.workflows.code.loaders import embedded_problems
from drmas.workflows.programs import SandboxSettings
from drmas.workflows.sandbox import run_python
from drmas.hardware import machine


def median_time(fn, repeats: int) -> tuple[float, object]:
    out = fn()  # warm-up
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        out = fn()
        times.append(time.perf_counter() - start)
    return statistics.median(times), out


def plain(code: str, stdin: str, timeout_s: float) -> str:
    """The peer: the program in a fresh interpreter and directory, nothing else."""
    with tempfile.TemporaryDirectory(prefix="bench-plain-") as d:
        path = os.path.join(d, "main.py")
        with open(path, "w") as f:
            f.write(code)
        return subprocess.run([sys.executable, "-I", "-S", "-B", path], input=stdin, capture_output=True,
                              text=True, timeout=timeout_s, cwd=d, check=False).stdout


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--workers", type=int, default=2)
    p.add_argument("--repeats", type=int, default=3)
    p.add_argument("--problems", type=int, default=64)
    a = p.parse_args()
    tasks = [t for split in ("train", "val", "test") for t in embedded_problems(split)][: a.problems]
    jobs = [(t.solution, t.tests) for t in tasks]
    judge = Judge(SandboxSettings(time_limit_s=2.0, workers=a.workers))
    limit = 2.0

    def sandboxed():
        return judge.run(jobs)

    def peer():
        def one(job):
            program, tests = job
            stdin = json.dumps({"inputs": [c.input for c in tests], "timeout_s": limit})
            reports = json.loads(plain(f"{_DRIVER}\nrun_tests({program!r})\n", stdin, 60))
            return [r["status"] == "ok" and r["digest"] == driver.digest(c.output)
                    for r, c in zip(reports, tests, strict=True)]
        with ThreadPoolExecutor(a.workers) as pool:
            return list(pool.map(one, jobs))

    print(f"machine: {machine()}; {len(jobs)} problems, {sum(len(t) for _, t in jobs)} tests, "
          f"{a.workers} workers, median of {a.repeats}")
    t_box, verdicts = median_time(sandboxed, a.repeats)
    t_peer, passed = median_time(peer, a.repeats)
    rate = statistics.mean(pass_rate(v) for v in verdicts)
    peer_rate = statistics.mean(sum(p) / len(p) for p in passed)
    print(f"judge a batch: sandbox {t_box:.2f} s, plain subprocess {t_peer:.2f} s, "
          f"ratio {t_box / t_peer:.2f}; pass rate {rate:.3f} (peer {peer_rate:.3f})")
    t_one, _ = median_time(lambda: run_python("pass"), a.repeats)
    t_one_peer, _ = median_time(lambda: plain("pass", "", 10), a.repeats)
    print(f"one empty program: sandbox {t_one * 1000:.0f} ms, plain subprocess {t_one_peer * 1000:.0f} ms, "
          f"ratio {t_one / t_one_peer:.2f}")
    judge.close()


if __name__ == "__main__":
    main()
