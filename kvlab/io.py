"""Atomic file writes: a result either stands whole or not at all.

Every output is written to a temporary file in the same folder and renamed
into place, so a run killed halfway never leaves a truncated file that
Snakemake (or a student) would take for a result.
"""

from __future__ import annotations

import csv
import json
import math
import os
import tempfile
from contextlib import contextmanager
from pathlib import Path


@contextmanager
def atomic_path(path):
    """Yield a temporary path beside `path`; rename it onto `path` only if the block succeeds."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
    os.close(fd)
    try:
        yield Path(tmp)
        os.chmod(tmp, 0o666 & ~_umask())  # mkstemp makes 0600; give the usual permissions
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


def _umask() -> int:
    mask = os.umask(0)
    os.umask(mask)
    return mask


def write_text_atomic(path, text: str) -> None:
    with atomic_path(path) as tmp:
        tmp.write_text(text, encoding="utf-8")


def write_json_atomic(path, obj) -> None:
    write_text_atomic(path, json.dumps(obj, ensure_ascii=False, indent=2) + "\n")


def write_jsonl_atomic(path, records) -> None:
    """One JSON object a line (JSON Lines), for a log of records too long to read as one document."""
    write_text_atomic(path, "".join(json.dumps(record, ensure_ascii=False) + "\n" for record in records))


def _delimiter(path) -> str:
    """A tab for a .tsv file, else a comma."""
    return "\t" if Path(path).suffix == ".tsv" else ","


def write_csv_atomic(path, rows: list[dict]) -> None:
    """One row per dict, columns in the first row's key order (numbers written as Python prints them);
    tab-separated when `path` ends in .tsv."""
    with atomic_path(path) as tmp, open(tmp, "w", encoding="utf-8", newline="") as f:
        writer = csv.DictWriter(f, fieldnames=list(rows[0]) if rows else [], lineterminator="\n",
                                delimiter=_delimiter(path))
        writer.writeheader()
        writer.writerows(rows)


def read_csv_rows(path) -> list[dict]:
    """The rows of a CSV file as dicts, each column typed as a whole, as pandas reads it: booleans
    (True/False), integers, floats (an empty cell is NaN), or text. A .tsv file is tab-separated."""
    with open(path, encoding="utf-8", newline="") as f:
        rows = list(csv.DictReader(f, delimiter=_delimiter(path)))
    for column in rows[0] if rows else []:
        values = _typed([row[column] for row in rows])
        for row, value in zip(rows, values):
            row[column] = value
    return rows


def _typed(cells: list[str]) -> list:
    if all(cell in ("True", "False") for cell in cells):
        return [cell == "True" for cell in cells]
    for convert in (int, float):
        try:
            return [convert(cell) if cell or convert is int else math.nan for cell in cells]
        except ValueError:
            continue
    return cells


def read_json(path):
    with open(path, encoding="utf-8") as f:
        return json.load(f)
