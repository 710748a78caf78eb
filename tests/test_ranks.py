"""The pure parts of drmas.ranks: the timeout setting, the agreed failure's rank, and the line
each rank ends with (the multi-rank behaviour: tests/recipes/test_rank_failures.py)."""

import pytest

from drmas import ranks


def test_the_timeout_comes_from_the_environment_else_the_device(monkeypatch):
    monkeypatch.delenv(ranks.TIMEOUT_ENV, raising=False)
    assert ranks.collective_timeout_s(on_gpu=True) == 1800.0
    assert ranks.collective_timeout_s(on_gpu=False) == 300.0
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
