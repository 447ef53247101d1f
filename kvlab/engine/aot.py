"""Compiled steps ahead of time, kept on disk and loaded once a process: `program`, a module exported
(`torch.export`, its varying sizes symbolic) and compiled by AOTInductor into a package, whose library
is called without Python in between. Both compiled steps are made so: the single-request path's decode
step (kvlab.engine.fast) and the serving engine's step (kvlab.serving.compiled_step, its custom
operators traced through their fakes).

Why: a `torch.compile`d function is entered through Python on every call (dynamo's guards, the
wrapper that hands tensors to the compiled code): measured on this project's machine, some 40 to 70 µs
a call even for a graph of one operator, a fifth of a decode step of the lab's model. A loaded
AOTInductor library's `run` takes about 5 µs. The price is compiling: some 35 s for the lab's model
with an empty cache, so every compiled package is kept in a cache directory (`KVLAB_CACHE_DIR`, else
`~/.cache/kvlab`, under `aot/`), keyed by a hash of what it was compiled from: the caller's key
(shapes, dtype, plan), torch's version and the source of the modules that define the traced code. A
later process, or a later build, loads it in a second or two (most of it inductor's own start: its imports and its
probe of the CPU's vector instructions). A file that cannot be loaded (cut short, or from another torch)
is compiled again and replaced, never used.
"""

from __future__ import annotations

import hashlib
import inspect
import os
import tempfile
import time
import warnings
from collections.abc import Callable
from pathlib import Path

import torch

from kvlab.kernels import torch_internals
from kvlab.kernels.loader import cache_root

_LOADED: dict[str, object] = {}
# Inductor's precompiled headers: each costs a compiler run of some 5 s the first time, and a process
# here compiles one step, which they do not make faster (measured on the lab's steps): made no more.
NO_HEADERS = {"aot_inductor.precompile_headers": False, "cpp_cache_precompile_headers": False}


def cache_dir() -> Path:
    """Where compiled packages are kept: $KVLAB_CACHE_DIR/aot, else ~/.cache/kvlab/aot."""
    return cache_root() / "aot"


def package_key(parts: tuple, modules: tuple) -> str:
    """A hash of the caller's key, torch's version and the source of `modules` (the traced code)."""
    digest = hashlib.sha256(repr((parts, torch.__version__)).encode())
    for module in modules:
        digest.update(inspect.getsource(module).encode())
    return digest.hexdigest()[:24]


class Program:
    """A loaded compiled step: `run(inputs)` calls it on the flat list of tensors it was exported with
    (tensors it mutates are written in place) and returns its outputs. `compile_s` is the seconds it
    cost to make it ready in this process: compiling, or loading what an earlier process compiled
    (`from_cache`); `path`, where it is kept."""

    def __init__(self, run: Callable, compile_s: float, from_cache: bool, path: Path):
        self.run = run
        self.compile_s = compile_s
        self.from_cache = from_cache
        self.path = path


def program(parts: tuple, modules: tuple, export: Callable[[], torch.export.ExportedProgram]) -> Program:
    """The compiled package for `parts`: loaded in this process already, or from the cache directory, or
    exported (`export()`), compiled and stored there first (written to a temporary file and renamed, so
    a crash leaves no half-written package behind). A kept file that cannot be loaded (cut short, or
    from another torch) is said so in one line, compiled again and replaced."""
    key = package_key(parts, modules)
    path = cache_dir() / f"{key}.pt2"
    if key in _LOADED:
        return Program(_LOADED[key].run, 0.0, True, path)
    began = time.perf_counter()
    loader = None
    # torch's own pytree code warns of its own deprecated LeafSpec check while exporting and loading
    warnings.filterwarnings("ignore", message=r".*isinstance\(treespec, LeafSpec\)", category=FutureWarning)
    if path.is_file():
        try:
            loader = torch_internals.aoti_load_package(str(path))
        except Exception as error:  # cut short, or written by another torch: compiled again
            warnings.warn(f"{path}: cannot be loaded ({type(error).__name__}: {error}); compiling it again",
                          RuntimeWarning, stacklevel=2)
    from_cache = loader is not None
    if loader is None:
        path.parent.mkdir(parents=True, exist_ok=True)
        handle, tmp = tempfile.mkstemp(suffix=".pt2", dir=path.parent)
        os.close(handle)
        try:
            torch_internals.aoti_compile_and_package(export(), tmp, NO_HEADERS)
            os.replace(tmp, path)
        finally:
            if os.path.exists(tmp):
                os.unlink(tmp)
        loader = torch_internals.aoti_load_package(str(path))
    _LOADED[key] = loader
    return Program(loader.run, time.perf_counter() - began, from_cache, path)
