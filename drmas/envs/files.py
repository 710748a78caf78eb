"""Reading JSONL and parquet record files with errors that name the file and the line or row."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any, Iterator

__all__ = ["read_records"]


def read_records(path: Path) -> Iterator[tuple[str, dict[str, Any]]]:
    """("line N" or "row N", record) pairs from JSONL (1-based lines) or parquet (0-based rows)."""
    if not path.is_file():
        raise FileNotFoundError(f"no such file: {path}")
    if path.suffix == ".parquet":
        try:
            import pyarrow.parquet as pq
        except ImportError as err:
            raise ImportError(f"reading {path} needs pyarrow: pip install pyarrow") from err
        for row, record in enumerate(pq.read_table(path).to_pylist()):
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
