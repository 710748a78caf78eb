"""What a run returns, and the two ways it can fail to run."""

from __future__ import annotations

from dataclasses import dataclass

OUTPUT_CAP = 64 * 1024  # bytes kept per stream


@dataclass(frozen=True)
class Result:
    """Outcome of one program. ``returncode`` is negative for a signal, None on timeout or when
    the sandbox could not start the program (``error`` then says why)."""

    stdout: str
    stderr: str
    returncode: int | None
    timed_out: bool
    truncated: bool = False
    """The output passed the cap and the program was killed: what it printed is incomplete."""
    error: str = ""
    """Set when the sandbox failed to set up this run (the program never ran)."""

    @property
    def ok(self) -> bool:
        """The program ran to completion, exited 0, and its whole output is here."""
        return self.returncode == 0 and not (self.timed_out or self.truncated or self.error)


class SandboxError(RuntimeError):
    """One run could not be set up (namespaces, mounts, privilege drop): the program never ran."""


class SandboxUnavailable(RuntimeError):
    """Model-written code cannot be confined on this machine and running it unconfined was not allowed."""
