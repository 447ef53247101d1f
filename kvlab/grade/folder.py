"""A results folder read as untrusted data: the security boundary of the check and of grading. A folder
may be a student's, so its files are read, never executed; only the sheet's file names are opened
(kvlab.facts.sheet); a link leading out of the folder, a file over the size cap, a report that is not
UTF-8, malformed JSON (NaN and Infinity included) and a value of the wrong type each raise `Unusable`,
whose message names the file and why, and which costs only the rules that need that file
(kvlab.grade.check). Nothing here judges a value: that is the rules' part.
"""

from __future__ import annotations

import json
import math
import os
import stat
from pathlib import Path

from kvlab.facts.sheet import LAB_RESULTS, REPORT_FILE

# A file larger than this is not read (extras.check and grade.max_file_bytes set it).
DEFAULT_MAX_BYTES = 1 << 20


class Unusable(ValueError):
    """A file a rule needs cannot be used: the message names the file and why."""


class Folder:
    """A results folder whose files are read once, on first use, and only as data."""

    def __init__(self, path, max_bytes: int = DEFAULT_MAX_BYTES):
        self.path = Path(path)
        self.max_bytes = max_bytes
        self._cache: dict[str, object] = {}

    def _read(self, file_name: str) -> bytes:
        path = self.path / file_name
        try:
            info = path.lstat()
        except FileNotFoundError:
            raise Unusable(f"{file_name} is missing") from None
        if stat.S_ISLNK(info.st_mode):
            target = path.resolve()
            if not target.is_relative_to(self.path.resolve()):
                raise Unusable(f"{file_name} is a link to {os.readlink(path)}, outside the folder: not read")
            path = target
        if not path.is_file():
            raise Unusable(f"{file_name} is not a regular file")
        size = path.stat().st_size
        if size > self.max_bytes:
            raise Unusable(f"{file_name} is {size:,} bytes, over the {self.max_bytes:,}-byte cap: not read")
        with open(path, "rb") as handle:
            data = handle.read(self.max_bytes + 1)
        if len(data) > self.max_bytes:  # it grew since
            raise Unusable(f"{file_name} is over the {self.max_bytes:,}-byte cap: not read")
        return data

    def text(self, file_name: str) -> str:
        data = self._read(file_name)
        try:
            return data.decode("utf-8-sig")  # a byte-order mark (Windows editors) is allowed
        except UnicodeDecodeError as err:
            raise Unusable(f"{file_name} is not UTF-8 (byte 0x{data[err.start]:02x} at offset {err.start}): "
                           f"save it as UTF-8") from None

    def json(self, file_name: str) -> dict:
        if file_name not in self._cache:
            self._cache[file_name] = self._parse(file_name)
        value = self._cache[file_name]
        if isinstance(value, Unusable):
            raise value
        return value

    def _parse(self, file_name: str):
        try:
            value = json.loads(self.text(file_name), parse_constant=_no_constant)
        except Unusable as err:
            return err
        except json.JSONDecodeError as err:
            return Unusable(f"{file_name} is not valid JSON ({err.msg}: line {err.lineno}, column {err.colno})")
        except ValueError as err:
            return Unusable(f"{file_name} is not valid JSON ({err})")
        except RecursionError:
            return Unusable(f"{file_name} is not valid JSON (nested too deeply)")
        if not isinstance(value, dict):
            return Unusable(f"{file_name} should hold a JSON object, got {type(value).__name__}")
        return value

    def result(self, name: str) -> dict:
        """The lab sheet's result file `name` (kvlab.facts.sheet.LAB_RESULTS), e.g. "counts"."""
        return self.json(LAB_RESULTS[name])

    def report(self) -> str:
        if REPORT_FILE not in self._cache:
            try:
                self._cache[REPORT_FILE] = self.text(REPORT_FILE)
            except Unusable as err:
                self._cache[REPORT_FILE] = err
        value = self._cache[REPORT_FILE]
        if isinstance(value, Unusable):
            raise value
        return value


def _no_constant(name):
    raise ValueError(f"{name} is not a JSON number")


KINDS = {
    "int": ("an integer", lambda v: isinstance(v, int) and not isinstance(v, bool)),
    "number": ("a finite number", lambda v: isinstance(v, (int, float)) and not isinstance(v, bool)
               and math.isfinite(v)),
    "bool": ("true or false", lambda v: isinstance(v, bool)),
    "ints": ("a list of integers", lambda v: isinstance(v, list)
             and all(isinstance(x, int) and not isinstance(x, bool) for x in v)),
}


def field(folder: Folder, name: str, key: str, kind: str):
    """Key `key` of the sheet's file `name`, which must be of `kind` (KINDS)."""
    file_name, data = LAB_RESULTS[name], folder.result(name)
    if key not in data:
        raise Unusable(f"{file_name} has no key {key!r}")
    words, fits = KINDS[kind]
    if not fits(data[key]):
        raise Unusable(f"{file_name}: {key} should be {words}, got {shown(data[key])}")
    return data[key]


def shown(value) -> str:
    """`value` as a detail quotes it: its JSON, cut to 40 characters."""
    text = json.dumps(value, ensure_ascii=False)
    return text if len(text) <= 40 else text[:37] + "..."
