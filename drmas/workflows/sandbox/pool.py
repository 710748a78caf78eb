"""Many programs at a time: :class:`SandboxPool`."""

from __future__ import annotations

import logging
from concurrent.futures import ThreadPoolExecutor
from typing import Sequence

from . import run as _run
from .features import check_confined
from .result import Result, SandboxError

logger = logging.getLogger("drmas.workflows.sandbox")


class SandboxPool:
    """Run many programs, at most ``max_workers`` at a time (threads waiting on subprocesses).

    A run the sandbox fails to set up becomes a failed :class:`Result` (``error`` set, logged),
    so one bad run never ends a batch; :class:`SandboxUnavailable` still propagates.
    """

    def __init__(self, max_workers: int = 4, allow_unconfined: bool = False) -> None:
        if max_workers < 1:
            raise ValueError("max_workers must be >= 1")
        self.allow_unconfined = allow_unconfined
        self._executor = ThreadPoolExecutor(max_workers, thread_name_prefix="drmas-sandbox")

    def _one(self, code: str, stdin: str, timeout_s: float, memory_mb: int) -> Result:
        try:
            return _run.run_python(code, stdin, timeout_s, memory_mb, self.allow_unconfined)
        except SandboxError as e:
            logger.warning("a sandboxed program could not be started and counts as failed: %s", e)
            return Result("", "", None, False, error=str(e))

    def run(
        self,
        codes: Sequence[str],
        stdin: str | Sequence[str] = "",
        timeout_s: float = 5.0,
        memory_mb: int = 512,
    ) -> list[Result]:
        """Results in the order of ``codes``; ``stdin`` is one string for all or one per program."""
        stdins = [stdin] * len(codes) if isinstance(stdin, str) else list(stdin)
        if len(stdins) != len(codes):
            raise ValueError(f"{len(codes)} programs but {len(stdins)} stdin strings")
        if codes:  # refuse before queueing anything if programs cannot be confined
            check_confined(_run.features(), self.allow_unconfined)
        futures = [self._executor.submit(self._one, c, s, timeout_s, memory_mb)
                   for c, s in zip(codes, stdins, strict=True)]
        return [f.result() for f in futures]

    def close(self) -> None:
        self._executor.shutdown(wait=True)

    def __enter__(self) -> SandboxPool:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
