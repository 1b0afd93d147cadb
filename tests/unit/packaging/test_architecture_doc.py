"""docs/architecture.md stays the code's: its source layout table names every module of the four
programs and of the API package they share, and it names every program's console script and
every CRD of Patchbay's own API.

A row's first cell holds paths in backticks: the first is whole (a file, or a folder ending in
`/`), the others are relative to its folder. A module is named when its path is one of those, or
when its folder is and the row names the module's file in backticks (`dra/` ... `claimstatus.py`).
Generated gRPC stubs and `__init__.py` files are left out.
"""

from __future__ import annotations

import re
import tomllib
from pathlib import Path

import yaml

REPO = Path(__file__).resolve().parents[3]
DOC = REPO / "docs" / "architecture.md"
PACKAGES = {
    "api": "patchbay_api",
    "operator": "patchbay_operator",
    "plugin-agent": "patchbay_agent",
    "kubectl-patchbay": "patchbay_kubectl",
    "devcluster": "patchbay_devcluster",
}


def layout_rows() -> list[str]:
    text = DOC.read_text()
    section = text.split("\n## Source layout\n", 1)[1].split("\n## ", 1)[0]
    return [line for line in section.splitlines() if line.startswith("| `")]


def named_in(rows: list[str]) -> tuple[set[str], list[tuple[str, str]]]:
    """(paths named whole, (folder, row) for each row whose first cell names a folder)."""
    paths: set[str] = set()
    folders: list[tuple[str, str]] = []
    for row in rows:
        first = row.split(" | ", 1)[0]
        tokens = re.findall(r"`([^`]+)`", first)
        base = tokens[0]
        folder = base if base.endswith("/") else base.rsplit("/", 1)[0] + "/"
        for path in [base, *(folder + t for t in tokens[1:])]:
            paths.add(path)
            if path.endswith("/"):
                folders.append((path, row))
    return paths, folders


def modules() -> list[str]:
    out = []
    for folder, package in PACKAGES.items():
        for path in sorted((REPO / folder / package).rglob("*.py")):
            if path.name == "__init__.py" or re.search(r"_pb2(_grpc)?\.py$", path.name):
                continue
            out.append(path.relative_to(REPO).as_posix())
    return out


def test_the_layout_table_names_every_module() -> None:
    paths, folders = named_in(layout_rows())
    missing = []
    for module in modules():
        folder, name = module.rsplit("/", 1)
        if module in paths:
            continue
        if any(f == folder + "/" and f"`{name}`" in row for f, row in folders):
            continue
        missing.append(module)
    assert not missing, f"docs/architecture.md's source layout does not name: {missing}"


def test_the_table_names_no_module_that_is_gone() -> None:
    paths, _ = named_in(layout_rows())
    gone = sorted(p for p in paths if not (REPO / p.rstrip("/")).exists())
    assert not gone, f"docs/architecture.md names what is not there: {gone}"


def test_every_program_and_crd_is_named() -> None:
    text = DOC.read_text()
    for folder in PACKAGES:
        scripts = tomllib.loads((REPO / folder / "pyproject.toml").read_text())["project"].get("scripts", {})
        for script in scripts:
            assert f"`{script}`" in text, script
    for crd in sorted((REPO / "crds").glob("patchbay.dev_*.yaml")):
        kind = yaml.safe_load(crd.read_text())["spec"]["names"]["kind"]
        assert f"**`{kind}`**" in text, kind
