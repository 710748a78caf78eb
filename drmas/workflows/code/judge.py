"""Judging programs on tests, at most ``MAX_TESTS`` of one program in each sandbox run.

The sandboxed script is :mod:`drmas.workflows.code.driver` (each test in a fresh forked process,
with its own time limit); only inputs go in and digests come out, so expected outputs never
reach the program. Outputs match when their whitespace-separated tokens are equal. A program
with more tests than one run takes is judged in as many runs as it needs.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Sequence

from drmas.workflows.code import driver
from drmas.workflows.code.task import TestCase
from drmas.workflows.programs import ProgramRunner, run_failure
from drmas.workflows.sandbox import SandboxSettings

__all__ = ["MAX_TESTS", "Judge", "Verdict", "pass_rate"]

MAX_TESTS = 64  # per run: the driver's report must fit the sandbox's 64 KiB output cap
_DRIVER = Path(driver.__file__).read_text(encoding="utf-8")


@dataclass(frozen=True)
class Verdict:
    """One program on one test."""

    status: str
    """``ok`` (ran, exit 0), ``error``, ``timeout``, ``truncated`` (output past 1 MiB),
    ``no program``, or ``failed run`` (the sandbox run as a whole failed)."""
    passed: bool
    output: str = ""
    """The start of what the program printed."""
    error: str = ""
    """The last line of its stderr, or why the run failed."""


def pass_rate(verdicts: Sequence[Verdict]) -> float:
    return sum(v.passed for v in verdicts) / len(verdicts) if verdicts else 0.0


class Judge:
    """Runs (program, tests) jobs in the sandbox, several at a time."""

    def __init__(self, settings: SandboxSettings = SandboxSettings(time_limit_s=2.0)) -> None:  # noqa: B008
        """``settings.time_limit_s``: the limit of a program on one test."""
        self.time_limit_s = settings.time_limit_s
        self.runner = ProgramRunner(settings)

    def run(self, jobs: Sequence[tuple[str | None, Sequence[TestCase]]]) -> list[list[Verdict]]:
        """One list of verdicts per job, one verdict per test, in order; any number of tests (a
        job with more than ``MAX_TESTS`` is split into runs of at most that many)."""
        chunks = [(p, list(t[i:i + MAX_TESTS])) for p, t in jobs for i in range(0, max(len(t), 1), MAX_TESTS)]
        verdicts = iter(self._run(chunks))
        out = []
        for _, tests in jobs:
            runs = max(1, -(-len(tests) // MAX_TESTS))
            out.append([v for _ in range(runs) for v in next(verdicts)])
        return out

    def _run(self, jobs: Sequence[tuple[str | None, Sequence[TestCase]]]) -> list[list[Verdict]]:
        live = [(p, t) for p, t in jobs if p is not None and t]
        scripts = [f"{_DRIVER}\nrun_tests({p!r})\n" for p, _ in live]
        stdins = [json.dumps({"inputs": [c.input for c in t], "timeout_s": self.time_limit_s})
                  for _, t in live]
        # the whole run: every test at its limit, plus forks and two interpreter starts (a
        # program that loops forever costs two limits: the driver stops after two timeouts)
        timeout = max(len(t) for _, t in live) * (self.time_limit_s + 0.05) + 2.0 if live else 1.0
        results = iter(self.runner.run(scripts, stdins, timeout_s=timeout))
        out = []
        for program, tests in jobs:
            if not tests:
                out.append([])
            elif program is None:
                out.append([Verdict("no program", False, error="no code block")] * len(tests))
            else:
                out.append(_verdicts(next(results), tests))
        return out

    def close(self) -> None:
        self.runner.close()


def _verdicts(result, tests: Sequence[TestCase]) -> list[Verdict]:
    failure = run_failure(result)
    if failure is None:
        try:
            reports = json.loads(result.stdout)
        except ValueError:
            reports, failure = None, "an error: the test driver's report was unreadable"
        if reports is not None and len(reports) != len(tests):
            failure = "an error: the test driver's report was incomplete"
    if failure is not None:
        return [Verdict("failed run", False, error=failure)] * len(tests)
    return [Verdict(r["status"], r["status"] == "ok" and r["digest"] == driver.digest(t.output),
                    r["preview"], r["error"]) for r, t in zip(reports, tests)]
