"""kvlab.kernels as a package: its C++ lives in csrc/ alone (no Python module holds any), ships as package
data, compiles file by file with no warning, and its typed wrappers leave the custom operators themselves
in what torch.compile and torch.export trace. Each operator against its torch reference is a test of its
caller's: kvlab::paged_attention and kvlab::linear in tests/test_serving_parts.py, kvlab::greedy_pick in
tests/test_sampling.py."""
import fnmatch
import re
import subprocess
import tomllib

import pytest
import torch

from kvlab.kernels import loader, ops

from helpers import ROOT


def test_no_python_module_holds_cpp():
    """The C++ is in csrc/'s files, none in a Python string: no kvlab/**/*.py has an #include or a
    TORCH_LIBRARY line."""
    cpp = re.compile(r"^\s*(#include <|TORCH_LIBRARY)", re.MULTILINE)
    holding = [str(path.relative_to(ROOT)) for path in sorted((ROOT / "kvlab").rglob("*.py"))
               if cpp.search(path.read_text(encoding="utf-8"))]
    assert holding == []


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
    another before it) and compiles with the library's flags, -Wall, and no warning (-Werror)."""
    compiler = loader.find_cpp_compiler()
    if compiler is None:
        pytest.skip("no C++ compiler found")
    flags = [flag for flag in loader.FLAGS if flag != "-shared"]
    runs = {path.name: subprocess.Popen([compiler, *flags, "-Werror", "-fsyntax-only", str(path), *loader.torch_flags()],
                                        stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
            for path in loader.sources() if path.suffix == ".cpp"}
    said = {name: run.communicate()[0] for name, run in runs.items()}
    assert {name: text for name, text in said.items() if runs[name].returncode or text.strip()} == {}


def traced_targets(graph: torch.fx.Graph) -> set:
    return {node.target for node in graph.nodes if node.op == "call_function"}


def test_the_wrappers_leave_the_custom_operators_in_the_traced_graphs():
    """ops.paged_attention, ops.linear and ops.greedy_pick are traced through, not around: dynamo's graph
    (torch.compile, fullgraph) and torch.export's hold torch.ops.kvlab.*.default, shaped by the fakes."""
    if not loader.library():
        pytest.skip("no C++ compiler built kvlab.kernels' operators")

    def step(q, keys, values, positions, pair_rows, pair_blocks, weight, pack_id, temperatures):
        attended = ops.paged_attention(q, keys, values, positions, pair_rows, pair_blocks)  # (N, 1, H * D)
        logits = ops.linear(attended[:, 0], weight, pack_id)
        return logits, ops.greedy_pick(logits, temperatures)

    generator = torch.Generator().manual_seed(0)
    keys, values = torch.randn(2, 3, 4, 2, 32, generator=generator)
    inputs = (torch.randn(2, 1, 4, 32, generator=generator), keys, values, torch.tensor([5, 2]),
              torch.tensor([0, 0, 1]), torch.tensor([0, 2, 1]), torch.randn(50, 128, generator=generator),
              torch.tensor(10 ** 9 + 7), torch.tensor([1.0, 0.7]))
    kvlab_ops = {torch.ops.kvlab.paged_attention.default, torch.ops.kvlab.linear.default,
                 torch.ops.kvlab.greedy_pick.default}
    graphs = []

    def backend(graph_module, example_inputs):
        graphs.append(graph_module.graph)
        return graph_module.forward

    torch._dynamo.reset()
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
