"""Compiled steps ahead of time: a function exported (`torch.export`) and compiled by AOTInductor into a
library, kept on disk, loaded once a process, and called without Python in between.

Why: a `torch.compile`d function is entered through Python on every call (dynamo's guards, the
wrapper that hands tensors to the compiled code): measured on this project's machine, some 40 to 70 µs
a call even for a graph of one operator, a fifth of a decode step of the lab's model. A loaded
AOTInductor library's `run` takes about 5 µs. The price is compiling: some 35 s for the lab's model
with an empty cache, so every compiled package is kept in a cache directory (`KVLAB_CACHE_DIR`, else
`~/.cache/kvlab`, under `aot/`), keyed by a hash of what it was compiled from: the caller's key
(shapes, dtype, plan), torch's version and the source of the modules that define the traced code. A
later process, or a later build, loads it in a fraction of a second.
"""

from __future__ import annotations

import hashlib
import inspect
import os
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

import torch

CACHE_ENV = "KVLAB_CACHE_DIR"
_LOADED: dict[str, object] = {}


def cache_dir() -> Path:
    """Where compiled packages are kept: $KVLAB_CACHE_DIR/aot, else ~/.cache/kvlab/aot."""
    root = os.environ.get(CACHE_ENV) or Path.home() / ".cache" / "kvlab"
    return Path(root) / "aot"


def package_key(parts: tuple, modules: tuple) -> str:
    """A hash of the caller's key, torch's version and the source of `modules` (the traced code)."""
    digest = hashlib.sha256(repr((parts, torch.__version__)).encode())
    for module in modules:
        digest.update(inspect.getsource(module).encode())
    return digest.hexdigest()[:24]


class Program:
    """A loaded compiled package: `run(inputs)` takes the flat list of tensors it was exported with
    (tensors it mutates are written in place) and returns its outputs. `compile_s` is the seconds it
    cost to make it ready in this process: compiling, or loading what an earlier one compiled
    (`from_cache`)."""

    def __init__(self, loader, compile_s: float, from_cache: bool):
        self.run = loader.run
        self.compile_s = compile_s
        self.from_cache = from_cache


def program(parts: tuple, modules: tuple, export: Callable[[], torch.export.ExportedProgram]) -> Program:
    """The compiled package for `parts`: loaded in this process already, or from the cache directory, or
    exported (`export()`), compiled and stored there first (written to a temporary file and renamed, so
    a crash leaves no half-written package behind)."""
    key = package_key(parts, modules)
    if key in _LOADED:
        return Program(_LOADED[key], 0.0, True)
    began = time.perf_counter()
    path = cache_dir() / f"{key}.pt2"
    from_cache = path.is_file()
    if not from_cache:
        path.parent.mkdir(parents=True, exist_ok=True)
        handle, tmp = tempfile.mkstemp(suffix=".pt2", dir=path.parent)
        os.close(handle)
        try:
            torch._inductor.aoti_compile_and_package(export(), package_path=tmp)
            os.replace(tmp, path)
        finally:
            if os.path.exists(tmp):
                os.unlink(tmp)
    loader = torch._inductor.aoti_load_package(str(path)).loader
    _LOADED[key] = loader
    return Program(loader, time.perf_counter() - began, from_cache)
