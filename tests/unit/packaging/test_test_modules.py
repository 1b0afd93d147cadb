"""The suite's own layout: pytest (rootdir-relative imports, no packages) refuses to collect two
test modules of one basename, and then the WHOLE run stops at collection. A unit run catches it
before a suite run does."""

from __future__ import annotations

from collections import Counter
from pathlib import Path

TESTS = Path(__file__).resolve().parents[2]


def test_no_two_test_modules_share_a_basename() -> None:
    names = Counter(p.name for p in TESTS.rglob("test_*.py") if "__pycache__" not in p.parts)
    assert len(names) > 100  # the tree was found
    twice = sorted(n for n, count in names.items() if count > 1)
    assert not twice, f"test modules sharing a basename (pytest collects neither): {twice}"
