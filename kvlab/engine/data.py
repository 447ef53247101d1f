"""MiniMind's data files: `pretrain_*.jsonl`, one {"text": ...} object a line."""

from __future__ import annotations

import json
from pathlib import Path


class DataError(ValueError):
    """Validation data that cannot be used, with a one-line reason naming the file (and line)."""


def read_texts(path, n_docs: int | None = None) -> list[str]:
    """The first `n_docs` texts (all when None) of a MiniMind pretrain jsonl.
    Blank lines and a UTF-8 BOM are fine."""
    path = Path(path)
    texts: list[str] = []
    with open(path, encoding="utf-8-sig") as f:
        for line_no, line in enumerate(f, start=1):
            if not line.strip():
                continue
            try:
                record = json.loads(line)
            except json.JSONDecodeError as err:
                raise DataError(f"{path}:{line_no}: not a JSON object ({err.msg})") from None
            if not isinstance(record, dict) or not isinstance(record.get("text"), str):
                raise DataError(f'{path}:{line_no}: expected an object with a string "text" field')
            texts.append(record["text"])
            if len(texts) == n_docs:
                return texts
    if n_docs is None and texts:
        return texts
    raise DataError(f"{path}: has {len(texts)} documents, the lab needs n_docs={n_docs}")
