"""Compiled steps ahead of time, kept on disk and loaded once a process, in two forms:

- `program`: a function exported (`torch.export`) and compiled by AOTInductor into a library, called
  without Python in between (the single-request path's decode step, kvlab.engine.fast);
- `function`: a function compiled by `torch.compile` ahead of time (`aot_compile`: dynamo's code of it,
  its guards and inductor's graph, saved with `save_compiled_function`), called as the plain function
  dynamo made of it (the serving engine's step, kvlab.serving.compiled_step, whose custom operators
  and symbolic sizes stay as `torch.compile` handles them). Its C++ lives in inductor's own cache
  (TORCHINDUCTOR_CACHE_DIR, else the temporary directory's torchinductor_<user>): where that was
  cleared, loading compiles the C++ again (some 14 s for the lab's model), never the graph.

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
    """A loaded compiled step: `run` calls it (a package's `run(inputs)` takes the flat list of tensors
    it was exported with; a function takes its own arguments; tensors it mutates are written in
    place). `compile_s` is the seconds it cost to make it ready in this process: compiling, or loading
    what an earlier process compiled (`from_cache`); `path`, where it is kept; for a function,
    `guard_check(*args)` says whether the guards it was compiled with pass on `args`."""

    def __init__(self, run: Callable, compile_s: float, from_cache: bool, path: Path,
                 guard_check: Callable[..., bool] | None = None):
        self.run = run
        self.compile_s = compile_s
        self.from_cache = from_cache
        self.path = path
        self.guard_check = guard_check


def program(parts: tuple, modules: tuple, export: Callable[[], torch.export.ExportedProgram]) -> Program:
    """The compiled package for `parts`: loaded in this process already, or from the cache directory, or
    exported (`export()`), compiled and stored there first (written to a temporary file and renamed, so
    a crash leaves no half-written package behind)."""
    key = package_key(parts, modules)
    path = cache_dir() / f"{key}.pt2"
    if key in _LOADED:
        return Program(_LOADED[key].run, 0.0, True, path)
    began = time.perf_counter()
    from_cache = path.is_file()
    if not from_cache:
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


def function(parts: tuple, modules: tuple, compile: Callable[[], object]) -> Program:
    """The function compiled ahead of time for `parts`: loaded in this process already, or from the
    cache directory, or compiled (`compile()`: a `torch.compile(...).aot_compile(...)` result) and
    saved there first (written to a temporary file and renamed). Its guards are not checked on a call:
    what they would check is the caller's key, `parts`, and the caller keeps to it. A file that cannot
    be loaded is said so in one line, compiled again and replaced."""
    key = package_key(parts, modules)
    path = cache_dir() / f"{key}.fn"
    if key in _LOADED:
        return Program(_LOADED[key].fn, 0.0, True, path, _LOADED[key].guard_check)
    began = time.perf_counter()
    compiled = None
    if path.is_file():
        try:
            # loaded under the options it was compiled with: inductor finds its C++ built by them (under
            # others it would build it again)
            with open(path, "rb") as file, torch_internals.inductor_options(NO_HEADERS):
                compiled = torch.compiler.load_compiled_function(file)
        except Exception as error:  # cut short, or saved by another torch: compiled again
            warnings.warn(f"{path}: cannot be loaded ({type(error).__name__}: {error}); compiling it again",
                          RuntimeWarning, stacklevel=2)
    from_cache = compiled is not None
    if compiled is None:
        compiled = compile()
        path.parent.mkdir(parents=True, exist_ok=True)
        compiled.save_compiled_function(str(path))  # torch writes a temporary file and renames it
    compiled.disable_guard_check()
    _LOADED[key] = compiled
    return Program(compiled.fn, time.perf_counter() - began, from_cache, path, compiled.guard_check)
