"""Jobs that load no model start without PyTorch (importing it costs seconds a job): each such
script's imports are loaded in a fresh interpreter, which must end without `torch` in sys.modules."""
import ast
import subprocess
import sys

import pytest

from helpers import ROOT

# scripts/ of the rules that load no model: the corpus, the tokenizer, the prompt, the figures,
# the report, the self-check, the comparison's table and the lab's page.
NO_MODEL_SCRIPTS = ["build_corpus.py", "train_tokenizer.py", "prompt.py", "figure.py", "report.py", "lab_tables.py",
                    "check.py", "compare_table.py", "explore.py"]
MODEL_SCRIPTS = ["same.py", "timing.py", "inspect_checkpoint.py"]


def imported_modules(script: str) -> list[str]:
    tree = ast.parse((ROOT / "scripts" / script).read_text(encoding="utf-8"))
    modules = []
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom) and node.module:
            modules.append(node.module)
        elif isinstance(node, ast.Import):
            modules += [alias.name for alias in node.names]
    return modules


def torch_after_importing(modules: list[str]) -> bool:
    code = "import importlib, sys\n" + "".join(f"importlib.import_module({m!r})\n" for m in modules) + \
        "print('torch' in sys.modules)"
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    return result.stdout.strip() == "True"


@pytest.mark.parametrize("script", NO_MODEL_SCRIPTS)
def test_a_job_that_loads_no_model_does_not_import_torch(script):
    modules = imported_modules(script)
    assert any(m.startswith("kvlab") for m in modules)
    assert not torch_after_importing(modules), f"scripts/{script} imports torch through {modules}"


@pytest.mark.parametrize("script", MODEL_SCRIPTS)
def test_the_check_would_see_torch(script):
    """The same probe on a script that does load a model finds torch, so the test above can fail."""
    assert torch_after_importing(imported_modules(script))
