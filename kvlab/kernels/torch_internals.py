"""The private torch entry points kvlab relies on: the one module that touches `torch._*`, each use
wrapped here with the reason no public one serves (torch 2.13). A torch upgrade that moves one breaks
here alone, and tests/test_kernels.py holds that no other kvlab module names `torch._`.

Compiling (kvlab.engine.aot: both compiled steps are torch.export'ed programs compiled by AOTInductor;
kvlab.engine.fast's torch.compile plans):
- `aoti_compile_and_package`, `aoti_load_package`: AOTInductor's documented entry points, which torch
  still keeps under torch._inductor;
- `mark_static_address`: dynamo's mark of a tensor whose storage never moves (a torch.compile plan's
  cache);
- `compiled_graphs`, `reset_compiler`: dynamo's own count of the graphs it compiled (what the tests of
  the torch.compile plans count) and its reset; `inductor_cache_dir`: where inductor keeps its C++ (the
  tests look for what it built).
Building the C++ operators (kvlab.kernels.loader):
- `cpp_compiler`: the C++ compiler inductor would use, found as inductor finds it;
- `cxx11_abi`: the C++ ABI this torch was built with, which an extension must match.
Watching weights (kvlab.engine.step.PackedWeights):
- `version`: a tensor's version counter (its in-place changes), as autograd counts them.
"""

from __future__ import annotations

import torch


def aoti_compile_and_package(exported: torch.export.ExportedProgram, path: str, options: dict) -> None:
    """AOTInductor: compile an exported program into a package at `path`."""
    torch._inductor.aoti_compile_and_package(exported, package_path=path, inductor_configs=options)


def aoti_load_package(path: str):
    """AOTInductor: a compiled package's loader (its `run(inputs)` calls the library)."""
    return torch._inductor.aoti_load_package(path).loader


def mark_static_address(tensor: torch.Tensor) -> None:
    """Dynamo may rely on `tensor`'s storage staying where it is (a cache written in place)."""
    torch._dynamo.mark_static_address(tensor)


def compiled_graphs() -> int:
    """Graphs dynamo has compiled in this process (its own counter)."""
    return torch._dynamo.utils.counters["stats"]["unique_graphs"]


def reset_compiler() -> None:
    """Dynamo forgets every compiled graph of this process (tests that count graphs start here)."""
    torch._dynamo.reset()


def inductor_cache_dir() -> str:
    """Where inductor keeps what it compiled (TORCHINDUCTOR_CACHE_DIR, else the temporary directory's
    torchinductor_<user>)."""
    from torch._inductor.runtime.runtime_utils import cache_dir
    return cache_dir()


def cpp_compiler() -> str | None:
    """The C++ compiler inductor would use on a CPU (its own search: $CXX, g++, ...), or None."""
    try:
        from torch._inductor.cpp_builder import get_cpp_compiler
        return get_cpp_compiler()
    except Exception:  # inductor raises its own InvalidCxxCompiler, or an older torch lacks the helper
        return None


def cxx11_abi() -> int:
    """1 where this torch was built with the C++11 ABI of libstdc++ (an extension must match it)."""
    return int(torch._C._GLIBCXX_USE_CXX11_ABI)


def version(tensor: torch.Tensor) -> int:
    """How often `tensor` was changed in place (its version counter)."""
    return tensor._version
