"""The train / val / test tasks of a math workflow, from files, benchmark names or the generator."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Union

from drmas.workflows.math.loaders import MATH_DATASETS, math_dataset_spec, load_math_dataset, load_math_file
from drmas.workflows.math.problems import arithmetic_word_problems
from drmas.workflows.math.task import MathTask

__all__ = ["load_math_source", "math_splits"]

SplitSource = Union[str, Sequence[str], None]


def load_math_source(entry: str, split: str) -> list[MathTask]:
    """One data source: an existing JSONL/parquet path, else a benchmark name of :data:`MATH_DATASETS`."""
    if Path(entry).exists():
        return load_math_file(entry)
    try:
        math_dataset_spec(entry)
    except ValueError:
        raise FileNotFoundError(
            f"{split} data {entry!r}: no such file, and not a known data set ({', '.join(MATH_DATASETS)})"
        ) from None
    # The benchmark's own evaluation split for val/test; for training, its train split.
    return load_math_dataset(entry, "train" if split == "train" else None)


def math_splits(
    data_seed: int = 0, train: SplitSource = None, val: SplitSource = None, test: SplitSource = None
) -> dict[str, tuple[MathTask, ...]]:
    """The train/val/test tasks of a math workflow: each split from its files or benchmark names
    (several are concatenated; each task keeps its ``source``), else the embedded arithmetic
    problems generated from ``data_seed``. Task uids must be unique within a split."""
    given = {"train": train, "val": val, "test": test}
    embedded = arithmetic_word_problems(seed=data_seed) if not all(given.values()) else {}
    splits: dict[str, tuple[MathTask, ...]] = {}
    for split, entries in given.items():
        if not entries:
            splits[split] = tuple(embedded[split])
            continue
        tasks = [t for e in ([entries] if isinstance(entries, str) else entries)
                 for t in load_math_source(e, split)]
        uids = [t.uid for t in tasks]
        if len(set(uids)) != len(uids):
            raise ValueError(f"{split} data: duplicate task uids (the same file or data set given twice?)")
        splits[split] = tuple(tasks)
    return splits
