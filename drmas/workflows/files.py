"""Reading JSONL and parquet record files with errors that name the file and the line or row, and
hub data sets through ``datasets`` with errors that say what is missing."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any, Iterator

from drmas.workflows.sandbox.view import exposed

__all__ = ["MAX_PROMPT_CHARS", "check_hidden_from_programs", "check_prompt_size", "load_hub_dataset",
           "read_records"]

#: The longest question or problem text a data file may hold (~25k tokens): a longer one is a
#: broken row (a whole document pasted into a field), not a prompt any model here could take.
MAX_PROMPT_CHARS = 100_000


def check_hidden_from_programs(path: Path) -> None:
    """Refuse a file with answers (golden tests, reference answers) that model-written programs
    could read in the sandbox, where a policy could learn to print them instead of solving."""
    where = exposed(str(path)) if path.exists() else None
    if where is not None:
        raise ValueError(f"{path} holds answers and lies below {where}, which sandboxed programs can "
                         "read (docs/sandbox.md): move it out of /usr, /lib* and the interpreter's "
                         "directories")


def read_records(path: Path, columns: tuple[str, ...] = ()) -> Iterator[tuple[str, dict[str, Any]]]:
    """("line N" or "row N", record) pairs from JSONL (1-based lines) or parquet (0-based rows).
    ``columns``: top-level keys every record needs; a parquet file without one of them is
    refused before any row is read (its schema names them all)."""
    if not path.is_file():
        raise FileNotFoundError(f"no such file: {path}")
    if path.suffix == ".parquet":
        try:
            import pyarrow.parquet as pq
        except ImportError as err:
            raise ImportError(f"reading {path} needs pyarrow: pip install 'drmas[parquet]' "
                              "(or pyarrow)") from err
        table = pq.read_table(path)
        missing = [c for c in columns if c not in table.column_names]
        if missing:
            raise ValueError(f"{path} has no column {', '.join(map(repr, missing))} "
                             f"(its columns: {', '.join(table.column_names)})")
        for row, record in enumerate(table.to_pylist()):
            yield f"row {row}", record
        return
    with path.open(encoding="utf-8") as fh:
        for lineno, line in enumerate(fh, start=1):
            if not line.strip():
                continue
            try:
                record = json.loads(line)
            except json.JSONDecodeError as err:
                raise ValueError(f"{path}: line {lineno} is not valid JSON ({err.msg})") from None
            if not isinstance(record, dict):
                raise ValueError(f"{path}: line {lineno} is not a JSON object")
            yield f"line {lineno}", record


def check_prompt_size(path: Path, where: str, key: str, text: str) -> None:
    """An error naming the file, the row and the field when ``text`` is longer than
    :data:`MAX_PROMPT_CHARS`."""
    if len(text) > MAX_PROMPT_CHARS:
        raise ValueError(f"{path}: {where}, field {key!r} holds {len(text):,} characters, more than the "
                         f"{MAX_PROMPT_CHARS:,} a prompt may have (drmas.workflows.files.MAX_PROMPT_CHARS)")


def load_hub_dataset(name: str, hub_id: str, config: str | None, split: str) -> Any:
    """``datasets.load_dataset(hub_id, config, split=split)`` (from the hub or the local cache);
    ``name`` is what the user asked for, for the messages."""
    try:
        import datasets
    except ImportError as err:
        raise ImportError(f"loading {name!r} needs the datasets library: pip install 'drmas[hub]' "
                          "(or datasets)") from err
    try:
        return datasets.load_dataset(hub_id, config, split=split)
    except Exception as err:  # noqa: BLE001 - offline errors come in many types
        raise RuntimeError(
            f"could not load {name!r} ({hub_id}{', config ' + config if config else ''}, split {split!r}): "
            f"it needs network access to the Hugging Face hub or a copy in the local datasets cache ({err})"
        ) from err
