"""What ranks tell each other when one of them fails: the exception itself, in a form that crosses
the process boundary, so that every rank raises the same one at the same collective instead of
one rank raising while the others wait in the next collective until the process group's timeout.
Imports nothing of drmas."""

from __future__ import annotations

import pickle
from typing import Sequence

__all__ = ["portable", "raise_first"]


def portable(err: BaseException | None) -> BaseException | None:
    """``err`` as another process can receive it: itself if it pickles, else a RuntimeError naming it."""
    if err is None:
        return None
    try:
        clone = pickle.loads(pickle.dumps(err))
    except Exception:
        clone = RuntimeError(f"{type(err).__name__}: {err}")
    if hasattr(clone, "add_note"):  # Python 3.11+
        clone.add_note("(raised on another rank; that rank's log has its traceback)")
    return clone


def raise_first(failures: Sequence[BaseException | None], rank: int, own: BaseException | None) -> None:
    """Raise, on every rank alike, the failure of the lowest failed rank (``failures``: every
    rank's :func:`portable` failure, gathered); this rank raises its own exception object when it
    is that rank, with its traceback. Nothing when no rank failed."""
    first = next((r for r, err in enumerate(failures) if err is not None), None)
    if first is None:
        return
    if first == rank and own is not None:
        raise own
    raise failures[first]
