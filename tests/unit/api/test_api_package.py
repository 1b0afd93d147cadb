"""The API package stays pure and small: the standard library only (the agent imports it on every
node), nothing of the programs, and little to import."""

from __future__ import annotations

import ast
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[3]
PACKAGE = REPO / "api" / "patchbay_api"


def test_it_imports_the_standard_library_and_itself_only() -> None:
    outside = set()
    for path in PACKAGE.glob("*.py"):
        for node in ast.walk(ast.parse(path.read_text())):
            names = [a.name for a in node.names] if isinstance(node, ast.Import) else []
            if isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
                names = [node.module]
            outside |= {n.split(".")[0] for n in names} - {"patchbay_api", "__future__"}
    assert outside and outside <= sys.stdlib_module_names, outside - sys.stdlib_module_names


def test_importing_all_of_it_loads_no_third_party_module() -> None:
    code = (
        "import sys; before = set(sys.modules); "
        "import patchbay_api.agentpods, patchbay_api.constants, patchbay_api.models, "
        "patchbay_api.quantity, patchbay_api.selectors, patchbay_api.discovery; "
        "print(sorted({m.split('.')[0] for m in set(sys.modules) - before}))"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    loaded = set(ast.literal_eval(out)) - {"patchbay_api"}
    assert loaded <= sys.stdlib_module_names, loaded
