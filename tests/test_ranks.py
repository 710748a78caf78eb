"""The pure parts of drmas.ranks: the timeout setting, the agreed failure's rank, and the line
each rank ends with (the multi-rank behaviour: tests/recipes/test_rank_failures.py)."""

import pytest

from drmas import ranks


def test_the_timeout_comes_from_the_environment_else_the_device(monkeypatch):
    monkeypatch.delenv(ranks.TIMEOUT_ENV, raising=False)
    monkeypatch.delenv(ranks.GATHER_ENV, raising=False)
    assert ranks.collective_timeout_s(on_gpu=True) == 600.0
    assert ranks.collective_timeout_s(on_gpu=False) == 300.0
    # the waits a rollout can stretch: longer, and never below the collectives' bound
    assert ranks.gather_timeout_s(on_gpu=True) == 3600.0 and ranks.gather_timeout_s(on_gpu=False) == 900.0
    monkeypatch.setenv(ranks.TIMEOUT_ENV, "5000")
    assert ranks.gather_timeout_s(on_gpu=False) == 5000.0
    monkeypatch.setenv(ranks.GATHER_ENV, "120")
    assert ranks.gather_timeout_s(on_gpu=False) == 120.0
    monkeypatch.delenv(ranks.GATHER_ENV)
    monkeypatch.setenv(ranks.TIMEOUT_ENV, "42.5")
    assert ranks.collective_timeout_s(on_gpu=True) == 42.5
    for bad in ("0", "-3", "soon"):
        monkeypatch.setenv(ranks.TIMEOUT_ENV, bad)
        with pytest.raises(ValueError, match=rf"DRMAS_COLLECTIVE_TIMEOUT_S \(--collective_timeout_s\) "
                                             rf"must be seconds > 0, got '{bad}'"):
            ranks.collective_timeout_s()


def _gathered(*errors):
    return lambda mine: [ranks.portable(e, r) for r, e in enumerate(errors)]


def test_every_rank_raises_the_lowest_failed_ranks_error_with_its_rank():
    own = KeyError("mine")
    with pytest.raises(ValueError, match="first") as err:  # rank 2's view: rank 1 failed first
        ranks.agree(_gathered(None, ValueError("first"), own), 2, own)
    assert err.value.failed_rank == 1
    with pytest.raises(KeyError) as err:  # the failing rank raises its own object, traceback and all
        ranks.agree(_gathered(own), 0, own)
    assert err.value is own
    ranks.agree(_gathered(None, None), 0, None)  # nobody failed: nothing raised


def test_the_line_names_the_failing_rank_and_its_error_not_the_transport(monkeypatch):
    monkeypatch.setenv(ranks.TIMEOUT_ENV, "20")
    ranks.watch_state.iteration = 3
    ranks.at("the optimiser step")
    agreed = ranks.portable(OSError(28, "No space left on device"), 0)
    assert ranks.stop_line(agreed, 1, None, None) == (
        "drmas: rank 0 failed during iteration 3: OSError: [Errno 28] No space left on device; every rank "
        "stopped", False)
    assert ranks.stop_line(RuntimeError("boom\nmore"), 1, None, None) == (
        "drmas: rank 1 failed during iteration 3 in the optimiser step: RuntimeError: boom", True)
    closed = RuntimeError("[pair.cc:553] Connection closed by peer [127.0.0.1]:15744. This is typically "
                          "caused by a remote worker crashing.")
    board = "drmas: rank 1 failed during iteration 3 in the update: RuntimeError: CUDA out of memory"
    assert ranks.stop_line(closed, 0, board, None) == (f"{board}; rank 0 stopped in the optimiser step",
                                                       False)
    assert ranks.stop_line(closed, 0, None, None)[0] == (
        "drmas: rank 0 lost another rank in the optimiser step during iteration 3 (its process ended without "
        "saying why; its log has the cause)")
    late = RuntimeError("[unbound_buffer.cc:78] Timed out waiting 20000ms for recv operation to complete")
    assert ranks.stop_line(late, 0, None, [1, 3]) == (
        "drmas: rank 0 waited 20 s in the optimiser step during iteration 3 and gave up "
        "(--collective_timeout_s); ranks 1, 3 did not answer (frozen, hung or lost)", False)
    # an object gather (its own group, its own bound) says which bound it was
    monkeypatch.setenv(ranks.GATHER_ENV, "70")
    ranks.at("the rollout's gather")
    slow = RuntimeError("[unbound_buffer.cc:78] Timed out waiting 70000ms for recv operation to complete")
    assert ranks.stop_line(slow, 0, None, [1])[0] == (
        "drmas: rank 0 waited 70 s in the rollout's gather during iteration 3 and gave up "
        "(--gather_timeout_s); rank 1 did not answer (frozen, hung or lost)")


def _watch_on_a_real_store(monkeypatch, rank: int, world: int, attempt: str = "0"):
    """A Watch of ``rank`` with a client of a real TCPStore (no process group: its thread not run)."""
    import datetime
    import socket

    import torch.distributed as dist

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    host = dist.TCPStore("127.0.0.1", port, world, is_master=True, wait_for_workers=False,
                         timeout=datetime.timedelta(seconds=10))
    monkeypatch.setenv("TORCHELASTIC_RESTART_COUNT", attempt)
    monkeypatch.setattr(ranks.watch_state, "iteration", 0)
    monkeypatch.setattr(ranks.watch_state, "what", "start-up")
    from drmas.watch import Watch

    w = Watch()
    w.rank, w.world, w.store = rank, world, host
    prefix = f"drmas/attempt{attempt}"
    w._failed, w._read, w._beat = f"{prefix}/failed", f"{prefix}/read", f"{prefix}/beat"
    return w, host


def test_a_rank_whose_heartbeat_stops_is_named_and_one_that_left_is_not(monkeypatch):
    w, store = _watch_on_a_real_store(monkeypatch, rank=0, world=3)
    seen, limit = {}, 0.3
    for r in (1, 2):
        store.add(f"drmas/attempt0/beat/{r}", 1)
    assert w._silent(seen, limit) is None  # first look: counts noted
    store.set("drmas/attempt0/beat/2/left", "1")  # rank 2 finished and said so
    store.add("drmas/attempt0/beat/1", 1)
    assert w._silent(seen, limit) is None  # rank 1 beat again
    import time

    time.sleep(0.4)  # neither beats now: rank 1 is silent, rank 2 left
    line = w._silent(seen, limit)
    assert line.startswith("drmas: rank 1 stopped answering during iteration 0 (no heartbeat for 0 s")
    assert store.get("drmas/attempt0/failed").decode() == line  # posted for the others
    assert w._not_beating(0.2) == [1]  # after a transport error, the same reading names it at once


def test_the_board_of_one_attempt_is_not_read_by_the_next(monkeypatch):
    w, store = _watch_on_a_real_store(monkeypatch, rank=0, world=2, attempt="1")
    store.set("drmas/attempt0/failed", "drmas: rank 1 failed during iteration 2: OSError: old")
    assert not store.check([w._failed])  # the restarted attempt starts with a clean board
    w.post(RuntimeError("CUDA out of memory"))
    assert store.get("drmas/attempt1/failed").decode().startswith(
        "drmas: rank 0 failed during iteration 0 in start-up: RuntimeError: CUDA out of memory")
    w.post(ValueError("later"))  # the first line posted stays
    assert "CUDA out of memory" in store.get("drmas/attempt1/failed").decode()


@pytest.mark.parametrize("agent_store, rank, line", [
    (None, 1, "drmas: rank 0 is gone (the rendezvous store it hosts stopped answering) during iteration 0"),
    ("True", 0, "drmas: torchrun's agent is gone (the rendezvous store it hosts stopped answering) during "
                "iteration 0"),
    ("True", 1, "drmas: torchrun's agent is gone"),
    (None, 0, None),  # rank 0 hosts the store itself: it is ending, nothing to say
])
def test_a_store_that_stops_answering_names_its_host(monkeypatch, agent_store, rank, line):
    """Under torchrun the agent hosts the store: when it stops answering, rank 0 is not the one gone."""
    import datetime
    import threading

    import torch.distributed as dist

    if agent_store is None:
        monkeypatch.delenv("TORCHELASTIC_USE_AGENT_STORE", raising=False)
    else:
        monkeypatch.setenv("TORCHELASTIC_USE_AGENT_STORE", agent_store)
    w, host = _watch_on_a_real_store(monkeypatch, rank=rank, world=2)
    w.store = dist.TCPStore("127.0.0.1", host.port, 2, is_master=False, wait_for_workers=False,
                            timeout=datetime.timedelta(seconds=2))
    ended = []

    def end(line: str) -> None:  # os._exit in a run: here, note the line and stop the thread
        ended.append(line)
        w._stop.set()

    monkeypatch.setattr(ranks, "_exit", end)
    del host  # the store's server ends with its host
    thread = threading.Thread(target=w._run)
    thread.start()
    thread.join(timeout=30)
    assert not thread.is_alive()
    if line is None:
        assert ended == []
    else:
        assert len(ended) == 1 and ended[0].startswith(line), ended


def test_nccl_gets_a_flight_recorder_dumping_where_the_timeout_line_says(tmp_path, monkeypatch):
    for var in ("TORCH_FR_BUFFER_SIZE", "TORCH_NCCL_DUMP_ON_TIMEOUT", "TORCH_FR_DUMP_TEMP_FILE"):
        monkeypatch.delenv(var, raising=False)
    monkeypatch.setenv(ranks.TRACES_ENV, str(tmp_path / "traces"))
    monkeypatch.setenv("TORCHELASTIC_RESTART_COUNT", "2")
    monkeypatch.setattr(ranks.watch_state, "traces", None)
    assert ranks.flight_recorder("gloo") is None and "TORCH_FR_DUMP_TEMP_FILE" not in ranks.os.environ
    where = ranks.flight_recorder("cuda:nccl,cpu:gloo")
    assert where == str(tmp_path / "traces" / "attempt2") and (tmp_path / "traces" / "attempt2").is_dir()
    env = ranks.os.environ
    assert (env["TORCH_NCCL_DUMP_ON_TIMEOUT"], env["TORCH_FR_BUFFER_SIZE"]) == ("1", "2000")
    assert env["TORCH_FR_DUMP_TEMP_FILE"] == f"{where}/rank_"
    monkeypatch.setattr(ranks.watch_state, "what", "the rollout's gather")
    line, own = ranks.stop_line(RuntimeError("Watchdog caught collective operation timeout"), 0, None, [1])
    assert not own and line.endswith(f"rank 1 did not answer (frozen, hung or lost); NCCL's flight recorder "
                                     f"dumped each rank's last collectives into {where}")


def test_under_slurm_lightnings_requeue_is_off(monkeypatch):
    from lightning.fabric.plugins.environments import SLURMEnvironment

    from drmas.cli import cluster_plugins

    for var in ("SLURM_NTASKS", "SLURM_JOB_NAME"):
        monkeypatch.delenv(var, raising=False)
    assert cluster_plugins(None) is None  # not under SLURM: Lightning's own choice
    monkeypatch.setenv("SLURM_NTASKS", "2")
    monkeypatch.setenv("SLURM_NTASKS_PER_NODE", "2")
    monkeypatch.setenv("SLURM_JOB_NAME", "drmas")
    monkeypatch.setattr(SLURMEnvironment, "_validate_srun_used", staticmethod(lambda: None))
    (env,) = cluster_plugins(None)
    assert isinstance(env, SLURMEnvironment) and env.auto_requeue is False
    mine = SLURMEnvironment(auto_requeue=True)
    assert cluster_plugins([mine]) == [mine]  # the user's own choice kept


def test_the_heartbeat_limit_comes_from_the_environment(monkeypatch):
    monkeypatch.delenv(ranks.HEARTBEAT_ENV, raising=False)
    assert ranks.heartbeat_s() == 30.0
    monkeypatch.setenv(ranks.HEARTBEAT_ENV, "12")
    assert ranks.heartbeat_s() == 12.0
    for bad in ("0", "soon"):
        monkeypatch.setenv(ranks.HEARTBEAT_ENV, bad)
        with pytest.raises(ValueError, match=rf"DRMAS_HEARTBEAT_S must be seconds > 0, got '{bad}'"):
            ranks.heartbeat_s()


_LEAVING = """
import datetime, sys, threading, time
import torch.distributed as dist
import drmas.watch as watch
watch._POLL_S = 0.0  # the thread is inside a store request nearly all the time
host = dist.TCPStore("127.0.0.1", 0, 1, is_master=True, wait_for_workers=False)
w = watch.Watch()
w.rank, w.world, w._limit = 0, 2, 60.0
w.store = dist.TCPStore("127.0.0.1", host.port, 1, is_master=False, wait_for_workers=False,
                        timeout=datetime.timedelta(seconds=10))
w._failed, w._read, w._beat = "t/failed", "t/read", "t/beat"
w.store.add("t/beat/1", 0)
w._thread = threading.Thread(target=w._run, daemon=True)
w._thread.start()
time.sleep(0.3)
w.stop()
sys.exit(0)
"""


@pytest.mark.integration  # a process of its own
def test_a_rank_that_stops_watching_exits_cleanly():
    """A finished run's rank leaves with the watch thread ended: left running, a daemon thread inside
    a store request when the interpreter exits aborts the process as the request returns
    ("terminate called without an active exception", exit -6; seen in a torchrun restart's second
    attempt). Here the thread polls without pause, so an exit mid-request is all but certain."""
    import subprocess
    import sys

    proc = subprocess.run([sys.executable, "-c", _LEAVING], capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr[-2000:]  # without the join: -6, six times in six


_FINISHED = """
import atexit, sys, threading, time
from drmas.cli import exit_now
out = sys.argv[1]
atexit.register(lambda: open(out, "a").write("exit handler\\n"))
threading.Thread(target=lambda: (time.sleep(0.5), open(out, "a").write("thread done\\n"))).start()
print("printed, not yet flushed", end="")
exit_now(0)
"""


@pytest.mark.integration  # a process of its own
def test_a_finished_rank_ends_with_its_threads_joined_and_its_exit_handlers_run(tmp_path):
    """drmas.cli.exit_now, how a rank of a finished multi-rank run ends (no interpreter teardown)."""
    import subprocess
    import sys

    out = tmp_path / "order.txt"
    proc = subprocess.run([sys.executable, "-c", _FINISHED, str(out)], capture_output=True, text=True,
                          timeout=120)
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert out.read_text() == "thread done\nexit handler\n" and proc.stdout == "printed, not yet flushed"
