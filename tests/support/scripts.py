"""The scripts of hack/ (generate.py, release.py) as modules, for the tests of what they do."""

from __future__ import annotations

import importlib.util
from pathlib import Path
from types import ModuleType

HACK = Path(__file__).resolve().parents[2] / "hack"


def load(name: str) -> ModuleType:
    """hack/<name>.py, loaded afresh (a test may change its module-level settings)."""
    spec = importlib.util.spec_from_file_location(name, HACK / f"{name}.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module
