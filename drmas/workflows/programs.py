"""Model-written programs in a workflow: the code block of a reply, and running a batch of them
in the sandbox (:mod:`drmas.workflows.sandbox`), a missing program counting as a failed run."""

from __future__ import annotations

import re
from typing import Sequence

from drmas.workflows.sandbox import Result, SandboxPool, SandboxSettings

__all__ = ["ProgramRunner", "parse_program", "run_failure"]


_CODE_BLOCK = re.compile(r"```(?:python|py)?[ \t]*\n(.*?)(?:```|\Z)", re.DOTALL)


def parse_program(text: str) -> str | None:
    """The first fenced code block (an unclosed one runs to the end); ``None`` if there is none or it
    is empty."""
    m = _CODE_BLOCK.search(text)
    return m.group(1).strip() or None if m else None


def run_failure(result: Result) -> str | None:
    """How a run failed, in words for a teammate's next prompt; ``None`` when it ran fine."""
    if result.ok:
        return None
    if result.error:
        return "nothing: it could not be started"
    if result.timed_out:
        return "nothing: it timed out"
    if result.truncated:
        return "too much: its output passed the limit"
    err = [line for line in result.stderr.splitlines() if line.strip()]
    return f"an error: {err[-1][:200] if err else 'exit code ' + str(result.returncode)}"


class ProgramRunner:
    """A sandbox pool started on first use, with the workflow's limits."""

    def __init__(self, settings: SandboxSettings = SandboxSettings()) -> None:  # noqa: B008 (frozen)
        self.settings = settings
        self._pool: SandboxPool | None = None

    def run(
        self, programs: list[str | None], stdins: list[str] | None = None, timeout_s: float | None = None
    ) -> list[Result]:
        """Results in order; a missing program is a failure that never reaches the sandbox.
        ``stdins``: one per program (default: empty); ``timeout_s`` overrides the runner's."""
        stdins = stdins if stdins is not None else [""] * len(programs)
        real = [(p, s) for p, s in zip(programs, stdins, strict=True) if p is not None]
        if self._pool is None:
            self._pool = SandboxPool(self.settings.workers, self.settings.allow_unconfined)
        results = iter(self._pool.run([p for p, _ in real], [s for _, s in real],
                                      timeout_s=timeout_s or self.settings.time_limit_s,
                                      memory_mb=self.settings.memory_mb))
        missing = Result("", "no code block", 1, False)
        return [next(results) if p is not None else missing for p in programs]

    def run_replies(self, texts: Sequence[str]) -> list[tuple[str | None, Result]]:
        """The tool user's step in every workflow that has one: each reply's program (its first
        code block, None without one) and its run, in order."""
        programs = [parse_program(t) for t in texts]
        return list(zip(programs, self.run(programs)))

    def close(self) -> None:
        if self._pool is not None:
            self._pool.close()
            self._pool = None
