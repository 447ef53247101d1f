"""The user's own MiniMind code (config key `minimind_src`): the file checked, imported, its classes found.

Importing the file runs its code. That is the point (kvlab is held against the very code a course
uses), so only the `fidelity` job imports it, and no other job sees it. This module needs no PyTorch,
so the workflow can check the path before any job runs.
"""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path
from types import ModuleType

# The name the user's file is imported under (its classes report it as their __module__).
MODULE_NAME = "kvlab_minimind_src"
REQUIRED_CLASSES = ("MiniMindConfig", "MiniMindForCausalLM")
EXPECTED = "expected MiniMind's model/model_minimind.py"


class MiniMindSourceError(ValueError):
    """The user's MiniMind file cannot be used; a one-line reason that starts with the file's path."""


def check_source_path(path) -> Path:
    """The path as a Path, refused unless it is an existing .py file."""
    path = Path(path).expanduser()
    if not path.exists():
        raise MiniMindSourceError(f"{path}: file not found ({EXPECTED})")
    if not path.is_file():
        raise MiniMindSourceError(f"{path}: not a file ({EXPECTED})")
    if path.suffix != ".py":
        raise MiniMindSourceError(f"{path}: not a Python file (no .py suffix; {EXPECTED})")
    return path


def _first_line(err: BaseException) -> str:
    text = str(err).strip()
    return text.splitlines()[0] if text else type(err).__name__


def import_source(path) -> ModuleType:
    """Import the file at `path` as a module (this runs its code). A module it needs that is not
    installed, or anything it raises, becomes one line naming the file."""
    path = check_source_path(path)
    spec = importlib.util.spec_from_file_location(MODULE_NAME, path)
    module = importlib.util.module_from_spec(spec)
    sys.modules[MODULE_NAME] = module  # as `import` would: dataclasses and transformers look it up
    try:
        spec.loader.exec_module(module)
    except ModuleNotFoundError as err:
        del sys.modules[MODULE_NAME]
        missing = (err.name or "").split(".")[0]
        if missing == "transformers":
            raise MiniMindSourceError(
                f"{path}: needs the transformers package, which is not installed: "
                'pip install -e ".[minimind]" (MiniMind pins transformers==4.57.6)'
            ) from None
        raise MiniMindSourceError(f"{path}: needs the module {err.name!r}, which is not installed") from None
    except (Exception, SystemExit) as err:  # the user's code may raise anything, even exit
        del sys.modules[MODULE_NAME]
        raise MiniMindSourceError(f"{path}: raised {type(err).__name__} on import: {_first_line(err)}") from None
    return module


def minimind_classes(module: ModuleType, path) -> tuple[type, type]:
    """(MiniMindConfig, MiniMindForCausalLM) of the imported file, refused if either is missing
    or the model class has no `generate`."""
    missing = [name for name in REQUIRED_CLASSES if not isinstance(getattr(module, name, None), type)]
    if missing:
        raise MiniMindSourceError(f"{path}: defines no class {' and no class '.join(missing)} ({EXPECTED})")
    model_class = module.MiniMindForCausalLM
    if not callable(getattr(model_class, "generate", None)):
        raise MiniMindSourceError(f"{path}: MiniMindForCausalLM has no generate method ({EXPECTED})")
    return module.MiniMindConfig, model_class


def load_source(path) -> tuple[type, type]:
    """Check, import and take the two classes from the user's MiniMind file."""
    path = check_source_path(path)
    return minimind_classes(import_source(path), path)
