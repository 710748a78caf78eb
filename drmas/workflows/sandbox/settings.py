"""How a workflow runs model-written programs: the ``sandbox`` setting every such workflow takes."""

from __future__ import annotations

from dataclasses import dataclass

__all__ = ["SandboxSettings"]


@dataclass(frozen=True)
class SandboxSettings:
    """How a workflow runs model-written programs (docs/sandbox.md); every workflow that runs them
    takes one as ``sandbox``, e.g. ``--data.workflow.init_args.sandbox.time_limit_s 2``."""

    time_limit_s: float = 5.0
    """Wall-clock limit of each program (code: of a program on one test)."""
    memory_mb: int = 512
    """Address-space limit of each program."""
    workers: int = 4
    """Programs run at the same time."""
    allow_unconfined: bool = False
    """Run model-written programs even where the sandbox cannot confine them (not root and no
    unprivileged user namespaces): they could then change any file of this user. Off by default:
    such a machine refuses to run them."""

    def __post_init__(self) -> None:
        if self.workers < 1 or self.time_limit_s <= 0:
            raise ValueError(f"sandbox workers must be >= 1 and time_limit_s > 0, got {self.workers} and "
                             f"{self.time_limit_s}")
