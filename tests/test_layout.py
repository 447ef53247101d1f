"""The tree's own rules, checked by the tools that own them: the package's layering and the modules
that never import PyTorch (import-linter's contracts in pyproject.toml), the workflow files' format
(snakefmt), one home for the config's defaults, and no module longer than one idea."""
import ast
import os
import shutil
import subprocess
import sys
from pathlib import Path

import jsonschema
import pytest
import yaml

from helpers import ROOT

BIN = Path(sys.executable).parent


def lint_imports(folder: Path) -> subprocess.CompletedProcess:
    """`lint-imports` with the contracts of `folder`/pyproject.toml, on the kvlab package in `folder`."""
    env = {**os.environ, "PYTHONPATH": str(folder)}
    return subprocess.run([str(BIN / "lint-imports"), "--no-cache"], cwd=folder, env=env,
                          capture_output=True, text=True)


def test_layering_contracts_are_kept():
    result = lint_imports(ROOT)
    assert result.returncode == 0, result.stdout + result.stderr
    assert "0 broken" in result.stdout


@pytest.mark.parametrize(
    "module, line, contract",
    [
        ("engine/model.py", "from kvlab.measure import steps", "Parts:"),  # the engine reaching up
        ("present/report.py", "from kvlab.default_model import corpus", "Parts:"),  # siblings stay apart
        ("measure/steps.py", "from kvlab.present import tables", "Parts:"),  # measuring never presents
        ("measure/steps.py", "from kvlab.grade import check", "Parts:"),  # nor grades
        ("facts/formulas.py", "import kvlab.engine.model", "Never PyTorch"),  # the facts stay torch-free
        ("engine/tokenizer.py", "import kvlab.workflow", "Parts:"),
        ("kernels/ops.py", "from kvlab.engine import step", "Parts:"),  # the C++ operators are the engine's floor
        ("serving/stats.py", "from kvlab.measure import steps", "Parts:"),  # the serving engine sees the facts and the engine
        ("serving/engine.py", "import kvlab.server.protocol", "Parts:"),  # nor the HTTP server on top of it
        ("grade/check.py", "import snakemake", "No kvlab module imports Snakemake"),
        ("grade/classroom.py", "from kvlab.measure import prompt", "torch-free rooms"),  # grading measures nothing
        ("grade/check.py", "import torch", "Never PyTorch"),  # the check job starts without it
        ("resources.py", "from kvlab.engine import model", "Never PyTorch"),  # so does Snakemake's process
    ],
)
def test_a_forbidden_import_breaks_a_contract(tmp_path, module, line, contract):
    """The contracts have teeth: one forbidden import in a copy of the package fails the check."""
    shutil.copytree(ROOT / "kvlab", tmp_path / "kvlab", ignore=shutil.ignore_patterns("__pycache__"))
    shutil.copy(ROOT / "pyproject.toml", tmp_path)
    assert lint_imports(tmp_path).returncode == 0  # the copy itself is clean
    target = tmp_path / "kvlab" / module
    target.write_text(target.read_text(encoding="utf-8") + f"\n{line}  # added by the test\n", encoding="utf-8")
    result = lint_imports(tmp_path)
    assert result.returncode != 0
    assert "1 broken" in result.stdout
    broken = result.stdout.split("Broken contracts")[-1]
    assert contract in broken and module.replace("/", ".").removesuffix(".py") in broken


def test_workflow_files_are_snakefmt_clean():
    result = subprocess.run([str(BIN / "snakefmt"), "--check", "."], cwd=ROOT, capture_output=True, text=True)
    assert result.returncode == 0, result.stdout + result.stderr


def schema_paths(node, path=""):
    """(path, key) of every keyword in the schema."""
    if isinstance(node, dict):
        for key, value in node.items():
            yield path, key
            yield from schema_paths(value, f"{path}.{key}")
    elif isinstance(node, list):
        for item in node:
            yield from schema_paths(item, path)


def test_the_defaults_live_in_config_yaml_alone():
    """config.yaml holds every key's default; the schema describes and checks them and holds none, and
    requires every key of each settings object, so config.yaml cannot leave one out."""
    schema = yaml.safe_load((ROOT / "schemas" / "config.schema.yaml").read_text(encoding="utf-8"))
    config = yaml.safe_load((ROOT / "config.yaml").read_text(encoding="utf-8"))
    assert [path for path, key in schema_paths(schema) if key == "default"] == []
    jsonschema.Draft202012Validator(schema).validate(config)
    for name, knobs in config["lab"].items():
        assert set(schema["properties"]["lab"]["properties"][name]["required"]) == set(knobs), name
    without_seed = {**config, "default_model": {k: v for k, v in config["default_model"].items() if k != "seed"}}
    with pytest.raises(jsonschema.ValidationError, match="'seed' is a required property"):
        jsonschema.Draft202012Validator(schema).validate(without_seed)


# A module longer than this holds more than one idea, unless its docstring says why it is one ("one idea").
MAX_MODULE_LINES = 450


def test_no_module_is_longer_than_one_idea():
    long = {}
    for path in sorted((ROOT / "kvlab").rglob("*.py")):
        text = path.read_text(encoding="utf-8")
        docstring = ast.get_docstring(ast.parse(text)) or ""
        if len(text.splitlines()) > MAX_MODULE_LINES and "one idea" not in docstring:
            long[str(path.relative_to(ROOT))] = len(text.splitlines())
    assert not long, (f"over {MAX_MODULE_LINES} lines, and the docstring does not say why the module is one idea: "
                      f"{long}")
