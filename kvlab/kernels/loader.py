"""kvlab's C++ operators built, kept and loaded: the library `kvlab` (torch.ops.kvlab.paged_attention,
.linear, .greedy_pick; kvlab.kernels.ops calls them), from the files of csrc/.

It is built once per machine with the C++ compiler inductor uses (`find_cpp_compiler`), against this
torch's headers (`-O3 -march=native`, or $KVLAB_KERNELS_MARCH's CPU; some 9 s): every csrc/*.cpp in one translation unit (each file
includes what it uses; one unit parses torch's headers once, where a unit a file took three times as
long), warnings on (`-Wall`; torch's own headers as system headers, whose warnings are torch's). It is
kept in kvlab's cache (`cache_root()`, kernels/) under a name holding the hash of csrc's files, the flags, torch, the
compiler and the CPU's flags, and loaded with `torch.ops.load_library`: csrc/ops.cpp registers the
operators itself (`TORCH_LIBRARY`), so a compiled graph calls them through the dispatcher with no
Python between, and their results' shapes for the compiler are registered here (kvlab.kernels.ops).
Where no compiler builds it (said once), `library()` says False and the callers keep torch's own
operators (kvlab.serving.compiled_step).
"""

from __future__ import annotations

import hashlib
import os
import subprocess
import tempfile
import threading
import warnings
from pathlib import Path

import torch

from kvlab.kernels import ops, torch_internals

CACHE_ENV = "KVLAB_CACHE_DIR"
# the CPU the library is built for: this one (`native`), unless the environment names another (`x86-64`: the
# portable path, no AVX, which the tests build in a process of their own)
MARCH_ENV = "KVLAB_KERNELS_MARCH"
CSRC = Path(__file__).with_name("csrc")  # the C++: one file an operator, vec.h, and ops.cpp registering them
# -Wno-psabi: the eight-lane vectors (csrc/vec.h) never cross the library's boundary, so the compiler's notes on
# how a CPU without AVX would pass them to another library are about no call here
FLAGS = ["-O3", "-fopenmp-simd", "-fno-math-errno", "-fPIC", "-shared", "-std=c++17", "-Wall",
         "-Wno-psabi"]


def flags() -> list[str]:
    """The compiler's flags: FLAGS and the CPU to build for ($KVLAB_KERNELS_MARCH, else native)."""
    return [*FLAGS, f"-march={os.environ.get(MARCH_ENV) or 'native'}"]


def find_cpp_compiler() -> str | None:
    """The C++ compiler inductor would use on a CPU (its own search: $CXX, g++, ...), or None."""
    return torch_internals.cpp_compiler()


def sources() -> list[Path]:
    """The files the library is built from: csrc's headers and its .cpp files, in name order."""
    return sorted(path for path in CSRC.iterdir() if path.suffix in (".cpp", ".h"))


def torch_flags() -> list[str]:
    """What compiling and linking against this torch takes: its headers (as system headers), its
    libraries, its ABI."""
    from torch.utils.cpp_extension import include_paths, library_paths

    return ([flag for path in include_paths() for flag in ("-isystem", path)]
            + [f"-L{path}" for path in library_paths()]
            + [f"-Wl,-rpath,{path}" for path in library_paths()] + ["-lc10", "-ltorch_cpu",
            f"-D_GLIBCXX_USE_CXX11_ABI={torch_internals.cxx11_abi()}"])


_LOCK = threading.Lock()
_LOADED: bool | None = None  # None: not tried yet


def cpu_flags() -> str:
    """The CPU's feature flags (Linux), so that a library built for one CPU is never loaded on another."""
    try:
        with open("/proc/cpuinfo", encoding="utf-8") as info:
            return next((line for line in info if line.startswith(("flags", "Features"))), "")
    except OSError:
        return ""


def cache_root() -> Path:
    """kvlab's one home for what it builds, kept across processes and builds: $KVLAB_CACHE_DIR, else
    ~/.cache/kvlab (this library under kernels/, the compiled steps under aot/, kvlab.engine.aot)."""
    return Path(os.environ.get(CACHE_ENV) or Path.home() / ".cache" / "kvlab")


def library_path(compiler: str) -> Path:
    """Where the built library lives: kvlab's cache, named by csrc's files, the flags, torch, the
    compiler and the CPU."""
    files = [f"{path.name}\n{path.read_text(encoding='utf-8')}" for path in sources()]
    key = "\n".join([*files, *flags(), *torch_flags(), torch.__version__, compiler, os.uname().machine, cpu_flags()])
    key = hashlib.sha256(key.encode()).hexdigest()[:16]
    return cache_root() / "kernels" / f"kvlab_{key}.so"


def build(compiler: str) -> Path:
    """Compile csrc's .cpp files into the library once (a finished file is never rewritten: built under
    a temporary name, then renamed, so parallel processes never load half a library)."""
    path = library_path(compiler)
    if path.exists():
        return path
    path.parent.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(dir=path.parent) as work:
        unit, built = Path(work) / "kvlab.cpp", Path(work) / path.name
        unit.write_text("".join(f'#include "{source.name}"\n' for source in sources() if source.suffix == ".cpp"),
                        encoding="utf-8")
        subprocess.run([compiler, *flags(), "-iquote", str(CSRC), str(unit), "-o", str(built), *torch_flags()],
                       check=True, capture_output=True, text=True)
        os.replace(built, path)
    return path


def prebuild() -> None:
    """Build the library now, without loading it (a thread of its own can run the compiler while the
    caller compiles something else); a failure is left for `library` to say."""
    compiler = find_cpp_compiler()
    if compiler:
        try:
            build(compiler)
        except (OSError, subprocess.CalledProcessError):
            pass


def library() -> bool:
    """Whether the library is built and its operators registered (False where no C++ compiler builds
    it, said once)."""
    global _LOADED
    with _LOCK:
        if _LOADED is None:
            compiler = find_cpp_compiler()
            _LOADED = False
            try:
                if compiler:
                    torch.ops.load_library(str(build(compiler)))
                    for name, fake in ops.FAKES.items():
                        torch.library.register_fake(name)(fake)
                    _LOADED = True
            except (OSError, RuntimeError, subprocess.CalledProcessError) as error:
                said = (getattr(error, "stderr", None) or str(error)).strip()
                warnings.warn(f"kvlab.kernels: {compiler} could not build or load the library of kvlab's C++ "
                              f"operators ({', '.join(ops.FAKES)}) ({said.splitlines()[0] if said else error}); "
                              "the compiled step runs torch's own operators instead", RuntimeWarning, stacklevel=2)
        return _LOADED


def usable(pool_keys: torch.Tensor) -> bool:
    """Whether the operators serve this pool: float32 on a CPU, head dims up to 256 (kvlab::paged_attention's
    bound), and the library loaded."""
    return (pool_keys.device.type == "cpu" and pool_keys.dtype == torch.float32 and pool_keys.shape[-1] <= 256
            and library())
