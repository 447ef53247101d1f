"""Atomic file writes: a result either stands whole or not at all.

Every output is written to a temporary file in the same folder and renamed
into place, so a run killed halfway never leaves a truncated file that
Snakemake (or a student) would take for a result.
"""

from __future__ import annotations

import json
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


def write_csv_atomic(path, rows: list[dict]) -> None:
    """One row per dict, columns in the first row's key order."""
    import pandas as pd  # only the CSV results need it

    with atomic_path(path) as tmp:
        pd.DataFrame(rows).to_csv(tmp, index=False)


def read_csv_rows(path) -> list[dict]:
    import pandas as pd

    return pd.read_csv(path).to_dict("records")


def read_json(path):
    with open(path, encoding="utf-8") as f:
        return json.load(f)
