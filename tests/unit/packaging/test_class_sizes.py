"""One class, one job: no class of the operator spans more than ``MAX_CLASS_LINES`` lines.

Counted by the AST (a class's first line to its last, docstrings and comments included), so a
class cannot pass by being split over a mixin in the same file. The operator's Controller grew to
493 lines while it did seven jobs; the parts it now wires each do one. The agent is held to the
same rule by its own work (issue 30, item 2), not here yet.
"""

from __future__ import annotations

import ast
from pathlib import Path

REPO = Path(__file__).resolve().parents[3]
MAX_CLASS_LINES = 250
CHECKED = [REPO / "operator" / "patchbay_operator"]


def class_spans(root: Path, base: Path = REPO) -> list[tuple[int, str]]:
    """(lines, "path:line Class") for every class under ``root`` (paths relative to ``base``)."""
    out = []
    for path in sorted(root.rglob("*.py")):
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            if isinstance(node, ast.ClassDef):
                assert node.end_lineno is not None
                where = f"{path.relative_to(base)}:{node.lineno} {node.name}"
                out.append((node.end_lineno - node.lineno + 1, where))
    return out


def test_no_class_of_the_operator_is_over_the_limit() -> None:
    spans = [span for root in CHECKED for span in class_spans(root)]
    assert spans, "no class found: the paths moved"
    too_long = sorted((n, where) for n, where in spans if n > MAX_CLASS_LINES)
    assert not too_long, f"classes over {MAX_CLASS_LINES} lines: {too_long}"


def test_the_count_sees_a_long_class(tmp_path: Path) -> None:
    """The check can fail: a class of MAX_CLASS_LINES + 1 lines is counted as such."""
    body = "\n".join(f"    x{i} = {i}" for i in range(MAX_CLASS_LINES))
    (tmp_path / "long.py").write_text(f"class Long:\n{body}\n")
    assert class_spans(tmp_path, tmp_path) == [(MAX_CLASS_LINES + 1, "long.py:1 Long")]
