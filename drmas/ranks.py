"""What ranks tell each other when one of them fails, and the bound on every wait between them.

Three mechanisms, from the cheapest:

* **Agreement** (:func:`portable`, :func:`raise_first`): where one rank can fail between
  collectives, the ranks gather their failures at the next one and every rank raises the lowest
  failed rank's exception there, instead of one rank raising while the others wait.
* **The failure board** (:class:`drmas.watch.Watch`): a rank that fails anywhere else (inside a collective,
  where nothing can be agreed) posts one line in the rendezvous store and waits a moment for the
  others to read it; every rank's watch thread looks at the board each second and stops its rank
  with that line, whatever the rank is blocked in.
* **The heartbeat**: every rank's watch thread counts in the store each second, and a rank whose
  count stops for ``$DRMAS_HEARTBEAT_S`` (30 s) is named by the others, who end: a rank killed
  without a word (out of memory, SIGKILL, a segfault) under a launcher that does not stop the
  others (srun, a launch of your own).
* **The timeouts**: :func:`collective_timeout_s` for tensor collectives (the process group's),
  :func:`gather_timeout_s` for the object gathers and agreements, which wait for the slowest
  rank's rollout and run on a gloo group of their own (``Watch.objects``). A rank that never
  answers (frozen, hung) is given up on; the ranks that waited then name it through a monitored
  barrier on a side group.

Everything a run keeps in the rendezvous store, the default process group's keys included
(:func:`init_process_group`), lies under a prefix of its attempt (torchrun's
``TORCHELASTIC_RESTART_COUNT``): the store of torchrun's agent outlives an attempt, and a restarted
attempt that read the last one's keys dialled its dead ranks or ended on its failure line.

Every rank ends with one line naming the failing rank and its error (:func:`stop_line`), not the
backend's transport error. Imports nothing of drmas.
"""

from __future__ import annotations

import datetime
import os
import pickle
import re
import sys
import threading
from typing import Any, Callable, Sequence

__all__ = ["GATHER_ENV", "HEARTBEAT_ENV", "TIMEOUT_ENV", "TRACES_ENV", "agree", "at", "attempt",
           "collective_timeout_s", "env_seconds", "flight_recorder", "gather_timeout_s", "group_gather",
           "heartbeat_s", "init_process_group", "mark_background", "portable", "raise_first", "silent_ranks",
           "stop_line", "store_host", "watch_state"]

TIMEOUT_ENV = "DRMAS_COLLECTIVE_TIMEOUT_S"
GATHER_ENV = "DRMAS_GATHER_TIMEOUT_S"
HEARTBEAT_ENV = "DRMAS_HEARTBEAT_S"


def attempt() -> int:
    """Which attempt of the job this is: torchrun's restart count (0 without torchrun)."""
    return int(os.environ.get("TORCHELASTIC_RESTART_COUNT", "0") or 0)


def store_host() -> str:
    """Who hosts the rendezvous store: torchrun's agent where it hosts one (as torch's ``env://``
    rendezvous reads it), else rank 0. When the store stops answering, that one is gone."""
    if os.environ.get("TORCHELASTIC_USE_AGENT_STORE") == "True":
        return "torchrun's agent"
    return "rank 0"


def _prefix() -> str:
    return f"drmas/attempt{attempt()}"


def init_process_group(backend: str, rank: int, world_size: int, timeout: datetime.timedelta,
                       **kwargs: Any) -> None:
    """torch's default process group, rendezvoused as ``env://`` does (``MASTER_ADDR``/``MASTER_PORT``;
    torchrun's agent store where it hosts one), its keys under this attempt's prefix."""
    import torch.distributed as dist

    store, _, _ = next(dist.rendezvous("env://", rank, world_size, timeout=timeout))
    store.set_timeout(timeout)
    dist.init_process_group(backend, rank=rank, world_size=world_size, timeout=timeout,
                            store=dist.PrefixStore(f"{_prefix()}/default_pg", store), **kwargs)


TRACES_ENV = "DRMAS_NCCL_TRACES"


def flight_recorder(backend: str) -> str | None:
    """On NCCL, before the process group exists (torch reads these then): its flight recorder keeps
    each rank's last collectives and dumps them when one times out, into ``$DRMAS_NCCL_TRACES``
    (default ``./nccl_traces``) ``/attempt<n>/rank_<r>``; the timeout's line names the folder.
    Values already in the environment are kept. Returns the folder (None off NCCL)."""
    if "nccl" not in backend:
        return None
    where = os.path.join(os.path.abspath(os.environ.get(TRACES_ENV) or "nccl_traces"), f"attempt{attempt()}")
    os.makedirs(where, exist_ok=True)
    os.environ.setdefault("TORCH_FR_BUFFER_SIZE", "2000")
    os.environ.setdefault("TORCH_NCCL_DUMP_ON_TIMEOUT", "1")
    os.environ.setdefault("TORCH_FR_DUMP_TEMP_FILE", os.path.join(where, "rank_"))
    watch_state.traces = where
    return where


def env_seconds(env: str, flag: str, default: float) -> float:
    """Seconds > 0 from ``$env`` (which ``flag`` sets), else ``default``; a bad value refused naming both."""
    value = os.environ.get(env, "").strip()
    if not value:
        return default
    try:
        seconds = float(value)
    except ValueError:
        seconds = -1.0
    if not seconds > 0:
        raise ValueError(f"${env}{f' ({flag})' if flag else ''} must be seconds > 0, got {value!r}")
    return seconds


def _on_gpu(on_gpu: bool | None) -> bool:
    if on_gpu is None:
        import torch

        on_gpu = torch.cuda.is_available()
    return on_gpu


def heartbeat_s() -> float:
    """How long a rank's heartbeat may stop before the others name it: ``$DRMAS_HEARTBEAT_S``, else 30."""
    return env_seconds(HEARTBEAT_ENV, "", 30.0)


def collective_timeout_s(on_gpu: bool | None = None) -> float:
    """The bound on a tensor collective (the process group's timeout), in seconds:
    ``$DRMAS_COLLECTIVE_TIMEOUT_S`` (which ``--collective_timeout_s`` sets), else 600 on GPUs and
    300 on CPU. Tensor collectives wait for no rollout, so a hang surfaces within minutes."""
    return env_seconds(TIMEOUT_ENV, "--collective_timeout_s", 600.0 if _on_gpu(on_gpu) else 300.0)


def gather_timeout_s(on_gpu: bool | None = None) -> float:
    """The bound on a wait that may absorb rollout skew, in seconds: the object gathers and
    agreements (on a gloo group of their own: every rank's rollout, validation, the step's outcome)
    and each answer of a vLLM engine process. ``$DRMAS_GATHER_TIMEOUT_S`` (which
    ``--gather_timeout_s`` sets), else 3600 on GPUs and 900 on CPU, and never below the
    collective timeout."""
    default = max(3600.0 if _on_gpu(on_gpu) else 900.0, collective_timeout_s(on_gpu))
    return env_seconds(GATHER_ENV, "--gather_timeout_s", default)


def portable(err: BaseException | None, rank: int) -> BaseException | None:
    """``err`` as another process can receive it: itself if it pickles, else a RuntimeError naming
    it; ``rank``: the rank it happened on, kept as ``failed_rank``."""
    if err is None:
        return None
    try:
        clone = pickle.loads(pickle.dumps(err))
    except Exception:
        clone = RuntimeError(f"{type(err).__name__}: {err}")
    clone.failed_rank = rank
    if hasattr(clone, "add_note"):  # Python 3.11+
        clone.add_note(f"(raised on rank {rank}; that rank's log has its traceback)")
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


# ---- where each rank is, for the lines that name a wait ------------------------------------


class _Where:
    main = "start-up"
    behind = ""  # the background rollout's wait (--data.rollout.staleness), "" when none runs
    iteration = 0
    traces: str | None = None  # where NCCL's flight recorder dumps (flight_recorder)

    @property
    def what(self) -> str:
        return self.main + (f" (the background rollout: {self.behind})" if self.behind else "")

    @what.setter
    def what(self, value: str) -> None:
        self.main = value


watch_state = _Where()


def at(what: str) -> None:
    """Name the wait (or the collective work) this rank enters; the line that reports a failure
    says where it came from. The background rollout's thread (:func:`mark_background`) names its
    own, beside the rank's."""
    if getattr(_thread, "background", False):
        watch_state.behind = what
    else:
        watch_state.main = what


_thread = threading.local()


def mark_background() -> None:
    """This thread plays rollouts behind the update: its :func:`at` names the background's wait."""
    _thread.background = True


def group_gather(group: Any) -> Callable[[Any], list[Any]]:
    """A gather of every member's object of a process ``group``, in rank order (a collective of the
    group: e.g. a per-policy pool's ranks)."""
    import torch.distributed as dist

    def gather(obj: Any) -> list[Any]:
        out: list[Any] = [None] * dist.get_world_size(group)
        dist.all_gather_object(out, obj, group=group)
        return out
    return gather


def agree(gather: Callable[[Any], list[Any]], rank: int, failure: BaseException | None) -> None:
    """A collective (``gather``: every rank's object in rank order): raise this rank's
    ``failure``, or another rank's, on every rank alike."""
    raise_first(gather(portable(failure, rank)), rank, failure)


# ---- the line every rank ends with -------------------------------------------------------------

_TRANSPORT = ("Connection closed by peer", "Connection reset by peer", "Broken pipe", "Socket closed",
              "NCCL communicator was aborted", "Connection refused")
_TIMEOUT = ("Timed out waiting", "timed out", "Watchdog caught collective operation timeout")


def _text(err: BaseException) -> str:
    lines = str(err).strip().splitlines()
    first = lines[0] if lines else ""
    return f"{type(err).__name__}: {first[:400]}"


def stop_line(err: BaseException, rank: int, board: str | None, silent: list[int] | None) -> tuple[str, bool]:
    """The line rank ``rank`` ends with after ``err``, and whether ``err`` is this rank's own
    failure (whose traceback it shows). ``board``: a failure another rank posted; ``silent``: the
    ranks that did not answer a monitored barrier after a timeout, or whose heartbeat had stopped
    after a transport error (None: not asked)."""
    at = _at()
    failed = getattr(err, "failed_rank", None)
    if failed is not None and failed != rank:  # agreed: the same exception raised on every rank
        return f"drmas: rank {failed} failed {at}: {_text(err)}; every rank stopped", False
    message = str(err)
    if any(t in message for t in _TRANSPORT) or any(t in message for t in _TIMEOUT):
        if board:
            return f"{board}; rank {rank} stopped in {watch_state.what}", False
        if silent and not any(t in message for t in _TIMEOUT):  # the heartbeats tell who died
            who = f"rank{'s' if len(silent) > 1 else ''} {', '.join(map(str, silent))}"
            return (f"drmas: {who} died {at} without a word (no heartbeat: killed, out of memory or "
                    f"crashed; its log or the system's has the cause); rank {rank} stopped in "
                    f"{watch_state.what}"), False
        if any(t in message for t in _TIMEOUT):
            who = (f"rank{'s' if len(silent) > 1 else ''} {', '.join(map(str, silent))} did not answer "
                   "(frozen, hung or lost)" if silent else "no rank could be named")
            waited, flag = collective_timeout_s(), "--collective_timeout_s"
            said = re.search(r"(\d+)\s*ms", message)  # the bound of the group that timed out (gloo says it)
            if said and int(said.group(1)) / 1000 == gather_timeout_s() != waited:
                waited, flag = gather_timeout_s(), "--gather_timeout_s"
            dumped = (f"; NCCL's flight recorder dumped each rank's last collectives into "
                      f"{watch_state.traces}" if watch_state.traces else "")
            return (f"drmas: rank {rank} waited {waited:.0f} s in {watch_state.what} {at} "
                    f"and gave up ({flag}); {who}{dumped}"), False
        return (f"drmas: rank {rank} lost another rank in {watch_state.what} {at} (its process ended "
                "without saying why; its log has the cause)"), False
    return f"drmas: rank {rank} failed {at} in {watch_state.what}: {_text(err)}", True


def silent_ranks(group: Any, rank: int, timeout_s: float) -> list[int] | None:
    """The ranks that do not pass a monitored barrier on ``group`` (a gloo side group) within
    ``timeout_s``; None when it cannot tell."""
    import torch.distributed as dist

    try:
        dist.monitored_barrier(group=group, timeout=datetime.timedelta(seconds=timeout_s),
                               wait_all_ranks=True)
        return []
    except Exception as err:
        found = re.search(r"Ranks? ([\d, ]+) failed to pass monitoredBarrier", str(err))
        if found:
            return [int(r) for r in found.group(1).replace(" ", "").split(",") if r]
        return [0] if rank != 0 else None  # the other ranks wait on rank 0 alone


def _at() -> str:
    return f"during iteration {watch_state.iteration}"


def _exit(line: str) -> None:
    print(line, file=sys.stderr, flush=True)
    sys.stdout.flush()
    os._exit(1)

