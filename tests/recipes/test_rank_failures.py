"""One rank of a 2-rank FSDP run (gloo) fails or freezes, by faults that ``faulty.py`` injects:
every rank ends, non-zero, with one line that names the failing rank and its error (or the wait
and the rank that did not answer), and ``--ckpt_path last`` resumes from the last whole
iteration to the end."""

import os
import re
import signal
import time

import pytest
from recipe_runs import run_dir, scalars
from test_fsdp_faults import FSDP, exit_lines, exits, saved_iteration
from test_resume import run_faulty

pytestmark = pytest.mark.integration  # runs the recipe in processes of its own, on 2 ranks

RUN = [*FSDP, "--trainer.max_epochs", "3"]
FULL_DISK = r"OSError: \[Errno 28\] No space left on device"


def _checkpoint(tmp) -> str:
    return os.path.join(run_dir(tmp), "checkpoints", "last.ckpt")


def _resumes_to_the_end(tmp, folder, *args: str) -> None:
    """``--ckpt_path last`` from the last whole iteration (1) to the end (3), on both ranks."""
    proc = run_faulty("none", 0, tmp, *RUN, *args, "--ckpt_path", "last")
    assert proc.returncode == 0, proc.stderr[-4000:]
    assert f"--ckpt_path last: resuming from {os.path.join(folder, 'last.ckpt')}" in proc.stdout
    assert sorted(scalars(run_dir(tmp))["rollout/success_rate"]) == [2, 3]  # iteration 2 again, then 3
    assert saved_iteration(_checkpoint(tmp)) == 3


def _fails(tmp_path, fault: str, rank: str | None, *args: str, env: dict | None = None):
    (tmp_path / "exits").mkdir()
    env = {"FAULT_EXITS": str(tmp_path / "exits"), "FAULT_STAMP": str(tmp_path / "stamp"),
           **({"FAULT_RANK": rank} if rank is not None else {}), **(env or {})}
    proc = run_faulty(fault, 2, tmp_path, *RUN, *args, env=env)
    folder = os.path.dirname(_checkpoint(tmp_path))
    return proc, folder


def _every_rank_names(tmp_path, proc, failed: int, where: str, error: str) -> None:
    """Both ranks ended with exit 1: the failing one with a line naming where, the other (through
    the agreement, or first through the failure board) naming the failing rank and its error;
    ``last.ckpt`` holds the last whole iteration."""
    assert proc.returncode == 1, proc.stderr[-4000:]
    ended = exits(tmp_path / "exits")
    assert sorted(ended) == [0, 1] and {code for code, _ in ended.values()} == {1}, ended
    lines = exit_lines(tmp_path / "exits")
    at = f"drmas: rank {failed} failed during iteration 2"
    assert re.match(rf"{at} in {where}: {error}", lines[failed]), lines
    assert re.match(rf"{at}( in {where})?: {error}", lines[1 - failed]), lines
    assert "Connection closed by peer" not in proc.stderr  # not the backend's transport error
    assert saved_iteration(_checkpoint(tmp_path)) == 1


def test_rank_0s_full_disk_in_the_hf_export_stops_every_rank_naming_it(tmp_path):
    proc, folder = _fails(tmp_path, "hf_enospc", "0", "--hf_checkpoint.every_n_iterations", "1")
    _every_rank_names(tmp_path, proc, 0, "the HF export", FULL_DISK)
    _resumes_to_the_end(tmp_path, folder)


def test_rank_1s_failing_optimiser_step_stops_every_rank_naming_it(tmp_path):
    proc, _ = _fails(tmp_path, "step_error", "1")
    error = re.escape("RuntimeError: CUDA out of memory. Tried to allocate 2.00 GiB (injected)")
    # resumable as the test above shows
    _every_rank_names(tmp_path, proc, 1, "the optimiser step of policy shared", error)


LAG = ("--data.rollout.staleness", "1")


def test_rank_1s_failing_step_under_rollouts_behind_the_update_stops_every_rank_naming_it(tmp_path):
    """Staleness 1: iteration 3's rollout plays behind the update on both ranks, gathering on its own
    process group, while the update's steps agree on theirs; rank 1's step fails, and both end as in
    a synchronous run, the rollout behind stopped. (A run on 2 ranks one update behind resumes:
    tests/recipes/test_pools_recipe.py, after SIGTERM and SIGKILL.)"""
    proc, _ = _fails(tmp_path, "step_error", "1", *LAG)
    error = re.escape("RuntimeError: CUDA out of memory. Tried to allocate 2.00 GiB (injected)")
    # the line also names where the rollout behind was, when it was waiting somewhere
    where = r"the optimiser step of policy shared( \(the background rollout: [^)]+\))?"
    _every_rank_names(tmp_path, proc, 1, where, error)
    assert "the background rollout of iteration(s) 3 was stopped with the run" in proc.stderr


def test_rank_1s_engine_failing_behind_the_update_stops_every_rank_naming_it(tmp_path):
    """Staleness 1: rank 1's engine fails in iteration 3's rollout, behind update 2: the ranks agree
    on it in the rollout's gather and raise it where the trainer waits for the rollout, before
    iteration 2's checkpoint (which would hold that rollout)."""
    proc, _ = _fails(tmp_path, "engine_error", "1", *LAG)
    error = (r"EngineError: the hf engine of policy 'shared' failed generating for agent '\w+' "
             r"\(\d+ prompts x \d+\): RuntimeError: CUDA error: device lost")
    _every_rank_names(tmp_path, proc, 1, re.escape("the background rollout (drain)"), error)


def test_a_frozen_rank_is_given_up_on_after_the_timeout_and_named(tmp_path):
    """Without the bound, rank 0 waits for the frozen rank 1 for the process group's 30 minutes.
    (A stopped process also stops its heartbeat; the heartbeat is set past the timeout here, so the
    timeout's own naming is what this shows.)"""
    # both bounds: rank 0 waits in a tensor collective or in an object gather, by timing; above the
    # start-up's longest wait (rank 0 waits ~12 s at the rendezvous for rank 1's imports)
    timeout = 30
    proc, _ = _fails(tmp_path, "freeze", "1", "--collective_timeout_s", str(timeout),
                     "--gather_timeout_s", str(timeout), env={"DRMAS_HEARTBEAT_S": "600"})
    assert proc.returncode == 1, proc.stderr[-4000:]
    line = exit_lines(tmp_path / "exits", ranks=1)[0]
    waits = "the [a-z' ]+"  # rank 1 froze after its update's first micro-batch
    bound = r"\(--(collective|gather)_timeout_s\)"
    assert re.fullmatch(rf"drmas: rank 0 waited {timeout} s in {waits} during iteration 2 and gave up "
                        rf"{bound}; rank 1 did not answer \(frozen, hung or lost\)", line), line
    # the frozen rank, woken, finds rank 0 gone and ends too
    frozen = int((tmp_path / "stamp").read_text())
    os.kill(frozen, signal.SIGCONT)
    deadline = time.time() + 60
    while 1 not in exits(tmp_path / "exits", wait=0) and time.time() < deadline:
        time.sleep(0.5)
    assert exits(tmp_path / "exits", wait=0)[1][0] == 1
    assert saved_iteration(_checkpoint(tmp_path)) == 1  # resumable as the tests above show


def test_a_weight_sync_failing_on_rank_1_midway_stops_every_rank_naming_it(tmp_path):
    """Rank 1 still takes part in the gathers rank 0 makes for the rest of the sync, then both raise;
    without that, rank 0 would wait inside a gather until the timeout."""
    proc, _ = _fails(tmp_path, "sync_error", "1")
    error = re.escape("RuntimeError: the engine was lost mid-transfer (injected)")
    _every_rank_names(tmp_path, proc, 1, "the weight sync", error)  # at once, not after the timeout


def test_rank_0s_full_disk_in_the_validation_record_stops_every_rank_naming_it(tmp_path):
    proc, _ = _fails(tmp_path, "record_enospc", "0", "--data.validation.tasks", "2",
                     "--data.validation.every", "2",
                     "--data.validation.before_training", "false")
    _every_rank_names(tmp_path, proc, 0, "the validation record", FULL_DISK)


def test_a_failure_inside_the_update_reaches_the_other_rank_through_the_board(tmp_path):
    """Rank 1 raises where rank 0 waits inside the backward's collectives: rank 0's watch thread
    reads rank 1's line from the board and ends it within seconds, not at the timeout."""
    proc, _ = _fails(tmp_path, "backward_error", "1")
    error = re.escape("RuntimeError: CUDA error: an illegal memory access was encountered (injected)")
    _every_rank_names(tmp_path, proc, 1, "the forward and backward of policy shared", error)
    ended = exits(tmp_path / "exits")
    assert abs(ended[0][1] - ended[1][1]) < 30  # well within the 300 s timeout
    # rank 0, ended by its watch thread (no exception reached its hooks), still says how to resume
    # and has written its events
    assert (f"drmas: stopped by another rank's failure during iteration 2; the last checkpoint is "
            f"{_checkpoint(tmp_path)} (iteration 1)") in proc.stderr, proc.stderr[-3000:]
    assert 1 in scalars(run_dir(tmp_path))["train/shared/loss"]


def test_rank_1_failing_to_load_its_model_stops_every_rank_naming_it(tmp_path):
    """Before the first iteration, in the sharded loading: the watch runs from the module's set-up,
    so the other rank ends at once too, and the line names rank 1 (the rank the process group
    gave it), not rank 0."""
    proc, _ = _fails(tmp_path, "load_error@0", "1")
    assert proc.returncode == 1, proc.stderr[-4000:]
    ended = exits(tmp_path / "exits")
    assert sorted(ended) == [0, 1] and {code for code, _ in ended.values()} == {1}, ended
    assert abs(ended[0][1] - ended[1][1]) < 60
    lines = exit_lines(tmp_path / "exits")
    error = r"OSError: \[Errno 5\] Input/output error \(injected\)"
    assert re.match(rf"drmas: rank 1 failed during iteration 0 in start-up: {error}", lines[1]), lines
    assert re.match(rf"drmas: rank 1 failed during iteration 0( in start-up)?: {error}", lines[0]), lines
