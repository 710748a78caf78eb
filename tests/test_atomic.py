"""Directories replaced so that the target is never missing or half written, and a checkpoint
that a kill left complete but not yet swapped in is recovered, never an older or partial one."""

import os

import pytest

from drmas import atomic
from drmas.atomic import COMPLETE, publish_dir, recover_dir, replace_dir


def make(path, text):
    os.makedirs(path)
    with open(os.path.join(path, "weights"), "w") as f:
        f.write(text)


def read(path):
    with open(os.path.join(path, "weights")) as f:
        return f.read()


def test_replace_dir_exchanges_the_names_in_one_step(tmp_path, monkeypatch):
    probe = [str(tmp_path / "a"), str(tmp_path / "b")]
    for p in probe:
        os.mkdir(p)
    if not atomic._exchange(*probe):
        pytest.skip("this file system cannot exchange two names (the two-rename path is tested below)")
    for p in probe:
        os.rmdir(p)
    target, new = str(tmp_path / "last.ckpt"), str(tmp_path / ".last.ckpt.partial")
    make(target, "old")
    make(new, "new")
    seen = []
    exchange = atomic._exchange

    def watched(a, b):  # the target exists before and right after the one rename
        seen.append(os.path.isdir(b))
        done = exchange(a, b)
        seen.append(os.path.isdir(b) and read(b) == "new")
        return done

    monkeypatch.setattr(atomic, "_exchange", watched)
    replace_dir(new, target)
    assert seen == [True, True]
    assert read(target) == "new" and sorted(os.listdir(tmp_path)) == ["last.ckpt"]


def test_replace_dir_without_an_exchange_rename_still_replaces(tmp_path, monkeypatch):
    monkeypatch.setattr(atomic, "_exchange", lambda a, b: False)  # a file system without RENAME_EXCHANGE
    target, new = str(tmp_path / "t"), str(tmp_path / "n")
    make(target, "old")
    make(new, "new")
    replace_dir(new, target)
    assert read(target) == "new" and sorted(os.listdir(tmp_path)) == ["t"]


def killed_before_the_swap(tmp_path, monkeypatch, first_exists=True):
    target, new = str(tmp_path / "last.ckpt"), str(tmp_path / ".last.ckpt.partial")
    if first_exists:
        make(target, "iteration 1")
        with open(os.path.join(target, COMPLETE), "w") as f:
            f.write("1")
    make(new, "iteration 2")

    def kill(a, b):
        raise KeyboardInterrupt  # stands for the SIGKILL: nothing after this line runs

    monkeypatch.setattr(atomic, "replace_dir", kill)
    with pytest.raises(KeyboardInterrupt):
        publish_dir(new, target)
    monkeypatch.undo()
    return target, new


def test_a_complete_checkpoint_left_before_its_swap_is_recovered(tmp_path, monkeypatch):
    target, new = killed_before_the_swap(tmp_path, monkeypatch)
    assert read(target) == "iteration 1" and os.path.isfile(os.path.join(new, COMPLETE))
    assert recover_dir(new, target)
    assert read(target) == "iteration 2" and not os.path.exists(new)
    assert not recover_dir(new, target)  # nothing left to do


def test_the_first_checkpoint_is_recovered_when_no_target_exists(tmp_path, monkeypatch):
    target, new = killed_before_the_swap(tmp_path, monkeypatch, first_exists=False)
    assert not os.path.exists(target)
    assert recover_dir(new, target) and read(target) == "iteration 2"


def test_an_incomplete_or_older_directory_is_never_moved_in(tmp_path):
    target, new = str(tmp_path / "last.ckpt"), str(tmp_path / ".last.ckpt.partial")
    make(target, "whole")
    with open(os.path.join(target, COMPLETE), "w") as f:
        f.write("200")
    make(new, "half")  # killed mid-write: no mark
    assert not recover_dir(new, target) and read(target) == "whole" and os.path.isdir(new)
    with open(os.path.join(new, COMPLETE), "w") as f:  # the old one after an exchange, not yet removed
        f.write("100")
    assert not recover_dir(new, target) and read(target) == "whole" and not os.path.exists(new)
