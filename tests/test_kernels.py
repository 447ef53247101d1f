"""kvlab.kernels as a package: its C++ lives in csrc/ alone (no Python module holds any), ships as package
data, compiles file by file with no warning, and its typed wrappers leave the custom operators themselves
in what torch.compile and torch.export trace. Each operator against its torch reference is a test of its
caller's: kvlab::paged_attention and kvlab::linear in tests/test_serving_parts.py, kvlab::greedy_pick in
tests/test_sampling.py."""
import fnmatch
import os
import re
import subprocess
import sys
import tomllib

import pytest
import torch

from kvlab.kernels import loader, ops, torch_internals

from helpers import ROOT


def test_no_python_module_holds_cpp():
    """The C++ is in csrc/'s files, none in a Python string: no kvlab/**/*.py has an #include or a
    TORCH_LIBRARY line."""
    cpp = re.compile(r"^\s*(#include <|TORCH_LIBRARY)", re.MULTILINE)
    holding = [str(path.relative_to(ROOT)) for path in sorted((ROOT / "kvlab").rglob("*.py"))
               if cpp.search(path.read_text(encoding="utf-8"))]
    assert holding == []


def test_only_one_module_touches_torchs_private_entry_points():
    """`torch._*` and a tensor's `_version` are named in kvlab.kernels.torch_internals alone (each wrapped
    there with its reason), in no other module of kvlab, its scripts, tools or tests."""
    private = re.compile(r"\btorch\._[A-Za-z]|\._" + r"version\b")  # (split, so this file does not name it)
    named = [str(path.relative_to(ROOT)) for folder in ("kvlab", "scripts", "tools", "tests")
             for path in sorted((ROOT / folder).rglob("*.py"))
             if path.name != "torch_internals.py" and private.search(path.read_text(encoding="utf-8"))]
    assert named == []


def test_every_csrc_file_is_package_data_and_built():
    """pyproject.toml's package data names every file of csrc/ (a regular install ships them), and the
    loader builds and keys the library by all of them."""
    pyproject = tomllib.loads((ROOT / "pyproject.toml").read_text(encoding="utf-8"))
    patterns = pyproject["tool"]["setuptools"]["package-data"]["kvlab.kernels"]
    files = sorted(path for path in loader.CSRC.iterdir() if path.is_file())
    assert {path.suffix for path in files} == {".cpp", ".h"}
    unshipped = [path.name for path in files
                 if not any(fnmatch.fnmatch(f"csrc/{path.name}", pattern) for pattern in patterns)]
    assert unshipped == []
    assert loader.sources() == files


def test_every_source_compiles_on_its_own_without_a_warning():
    """Each .cpp includes what it uses (the library is one translation unit of them all, but none relies on
    another before it) and compiles with the library's flags, -Wall, and no warning (-Werror), for this
    CPU and for one without AVX (the portable path, -march=x86-64)."""
    compiler = loader.find_cpp_compiler()
    if compiler is None:
        pytest.skip("no C++ compiler found")
    flags = [flag for flag in loader.FLAGS if flag != "-shared"]
    runs = {(path.name, march): subprocess.Popen([compiler, *flags, f"-march={march}", "-Werror", "-fsyntax-only",
                                                  str(path), *loader.torch_flags()],
                                                 stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
            for path in loader.sources() if path.suffix == ".cpp" for march in ("native", "x86-64")}
    said = {name: run.communicate()[0] for name, run in runs.items()}
    assert {name: text for name, text in said.items() if runs[name].returncode or text.strip()} == {}


def traced_targets(graph: torch.fx.Graph) -> set:
    return {node.target for node in graph.nodes if node.op == "call_function"}


def test_the_wrappers_leave_the_custom_operators_in_the_traced_graphs():
    """ops.paged_attention, ops.linear and ops.greedy_pick are traced through, not around: dynamo's graph
    (torch.compile, fullgraph) and torch.export's hold torch.ops.kvlab.*.default, shaped by the fakes."""
    if not loader.library():
        pytest.skip("no C++ compiler built kvlab.kernels' operators")

    def step(q, keys, values, positions, pair_rows, pair_blocks, weight, panels, temperatures):
        attended = ops.paged_attention(q, keys, values, positions, pair_rows, pair_blocks)  # (N, 1, H * D)
        logits = ops.linear(attended[:, 0], weight, panels)
        return logits, ops.greedy_pick(logits, temperatures)

    generator = torch.Generator().manual_seed(0)
    keys, values = torch.randn(2, 3, 4, 2, 32, generator=generator)
    weight = torch.randn(50, 128, generator=generator)
    inputs = (torch.randn(2, 1, 4, 32, generator=generator), keys, values, torch.tensor([5, 2]),
              torch.tensor([0, 0, 1]), torch.tensor([0, 2, 1]), weight, ops.linear_panels(weight),
              torch.tensor([1.0, 0.7]))
    kvlab_ops = {torch.ops.kvlab.paged_attention.default, torch.ops.kvlab.linear.default,
                 torch.ops.kvlab.greedy_pick.default}
    graphs = []

    def backend(graph_module, example_inputs):
        graphs.append(graph_module.graph)
        return graph_module.forward

    torch_internals.reset_compiler()
    compiled = torch.compile(step, backend=backend, fullgraph=True)(*inputs)
    (graph,) = graphs
    assert kvlab_ops <= {getattr(target, "default", target) for target in traced_targets(graph)}

    class Step(torch.nn.Module):
        def forward(self, *args):
            return step(*args)

    exported = torch.export.export(Step(), inputs)
    assert kvlab_ops <= traced_targets(exported.graph)
    eager = step(*inputs)
    assert all(torch.equal(a, b) for a, b in zip(compiled, eager))
    assert all(torch.equal(a, b) for a, b in zip(exported.module()(*inputs), eager))
    assert eager[0].shape == (2, 50) and eager[1].dtype == torch.int64


def test_the_panel_width_follows_the_cpu_the_library_was_built_for():
    """kvlab::linear's panels are 32 columns with AVX-512, 16 with AVX2 and FMA, none on the portable
    path ($KVLAB_KERNELS_MARCH=x86-64: no AVX; its product is then MKL's at every size)."""
    if not loader.library():
        pytest.skip("no C++ compiler built kvlab.kernels' operators")
    march = os.environ.get(loader.MARCH_ENV) or "native"
    cpu = set(loader.cpu_flags().split()) if march == "native" else set()
    expected = 32 if "avx512f" in cpu else 16 if {"avx2", "fma"} <= cpu else 0
    assert ops.panel_width() == expected


PORTABLE_TESTS = ["tests/test_kernels.py::test_the_panel_width_follows_the_cpu_the_library_was_built_for",
                  "tests/test_kernels.py::test_the_wrappers_leave_the_custom_operators_in_the_traced_graphs",
                  "tests/test_serving_parts.py::test_the_cpu_kernel_is_minimind_attention_row_by_row",
                  "tests/test_serving_parts.py::test_the_product_operator_is_f_linear_and_a_function_of_its_inputs",
                  "tests/test_sampling.py::test_the_greedy_choice_is_next_tokens_at_each_rows_temperature"]


def test_the_portable_path_passes_the_operators_tests(tmp_path):
    """Built for a CPU without AVX (-march=x86-64, in a cache of its own), the library passes each
    operator's test against its torch reference, as the build for this CPU does: run in a process of
    its own (one process loads one library `kvlab`)."""
    if loader.find_cpp_compiler() is None:
        pytest.skip("no C++ compiler found")
    if os.environ.get(loader.MARCH_ENV):
        pytest.skip("this run is the portable path's own")
    env = {**os.environ, loader.MARCH_ENV: "x86-64", loader.CACHE_ENV: str(tmp_path)}
    run = subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", *PORTABLE_TESTS],
                         cwd=ROOT, env=env, capture_output=True, text=True)
    assert run.returncode == 0, run.stdout[-3000:]
    assert f"{len(PORTABLE_TESTS)} passed" in run.stdout, run.stdout[-3000:]
    assert [path.name for path in (tmp_path / "kernels").iterdir()], "the portable library was not built there"
