"""The tree's own rules, checked by the tools that own them: the package's layering
(import-linter's contracts in pyproject.toml) and the workflow files' format (snakefmt)."""
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

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
        ("engine/model.py", "from kvlab.lab import steps", "Parts:"),  # the engine reaching up
        ("lab/report.py", "from kvlab.default_model import corpus", "Parts:"),  # siblings stay apart
        ("default_model/train.py", "import kvlab.lab.formulas", "Parts:"),
        ("engine/tokenizer.py", "import kvlab.workflow", "Parts:"),
        ("lab/check.py", "import snakemake", "No kvlab module imports Snakemake"),
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
