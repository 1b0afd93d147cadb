"""Patchbay's benchmarks: one harness, one short module per scenario (docs/benchmarks.md).

- ``harness``: a run of one scenario: its parameters (full or quick size), comparisons run
  interleaved (A B A B ...), figures with the median and min-max of each side and of the ratio
  (pair by pair), the machine's state, and the JSON record each run writes;
- ``records``: the full runs' records, committed under ``docs/benchmarks/records/``, and the
  headline tables drawn from them;
- ``setup``: clusters (``patchbay_devcluster``), the chart, the operator and agent processes,
  fake devices and the Go peers' builds, written once for every scenario;
- ``peers``: the kubelet peers the test suites use (tests/support), reused here, not copied;
- ``scenarios``: one module per scenario.

Run with ``make bench`` (``PYTHONPATH=bench:tests python -m patchbay_bench``).
"""

from __future__ import annotations

from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
RESULTS = REPO / "bench" / "results"
"""Where quick runs write their records (``quick/``; gitignored): CI's, never a table's."""
RECORDS = REPO / "docs" / "benchmarks" / "records"
"""Where full runs write their records: committed beside docs/benchmarks.md, whose headline tables
``make bench-table`` draws from them, so anyone can redraw a table and see every round behind it.
A record no row uses is deleted, not committed."""
