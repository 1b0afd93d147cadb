"""What the operator keeps of the agents' DeviceReports at the CRD's bounds, and what that costs.

Every node's agent may write a report of up to 2,048 devices, 64-character reasons, 65,536
characters of messages and 512 holders (the CRD's bounds, docs/security.md#report-size). The
operator keeps one ``devicereports.Report`` per report (its informer decodes each object into it
and drops the object). Measured here, in one process, for ``--nodes`` reports at those bounds:

- memory kept per report (tracemalloc) by the operator's decode, against two baselines from the
  same run: the whole decoded object (what a cache of full objects, client-go's or kopf's, would
  hold; measured on ``--sample`` objects and multiplied) and the operator's decode with its bound
  lifted (every unhealthy device kept);
- the status computation for one profile over all of them (``status.plugin_status``: the counts,
  the problems), as the operator runs it on every change;
- the process's peak RSS at the end.

No cluster: the same objects the informer would hand over (a JSON round trip, so no string is
shared between reports). The real operator's RSS at 5,000 nodes with small reports is in
docs/benchmarks.md (bench/health_scale.py).

    .venv/bin/python bench/operator_memory.py --nodes 5000
"""

from __future__ import annotations

import argparse
import gc
import json
import resource
import sys
import time
import tracemalloc
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(REPO / "operator"), str(REPO / "tests")]

from support.reports import largest_report  # noqa: E402

from patchbay_operator import devicereports  # noqa: E402
from patchbay_operator.capacity import NodeState  # noqa: E402
from patchbay_operator.devicereports import Report  # noqa: E402
from patchbay_operator.profiles import Profile  # noqa: E402
from patchbay_operator.status.deviceplugin import plugin_status  # noqa: E402

PROFILE, RESOURCE = "bench-mem", "example.com/serial"


def keep_every_device(obj: dict[str, Any]) -> Report:
    """Baseline: the operator's decode with the bound lifted (every unhealthy device kept; the
    operator before the bound also kept every healthy device and every holder, so more)."""
    saved, devicereports.MAX_KEPT_DEVICES = devicereports.MAX_KEPT_DEVICES, 1 << 30
    try:
        return Report.from_object(obj)
    finally:
        devicereports.MAX_KEPT_DEVICES = saved


def kept(make: Any, count: int) -> tuple[float, list[Any]]:
    """Bytes per item that ``make(i)`` returns and the caller keeps (tracemalloc), and the items."""
    gc.collect()
    tracemalloc.start()
    before = tracemalloc.get_traced_memory()[0]
    items = [make(i) for i in range(count)]
    gc.collect()
    after = tracemalloc.get_traced_memory()[0]
    tracemalloc.stop()
    return (after - before) / count, items


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--nodes", type=int, default=5000, help="reports at the CRD's bounds, one per node")
    ap.add_argument("--sample", type=int, default=20, help="reports for the per-object baselines")
    args = ap.parse_args()
    text = json.dumps(largest_report("patchbay-system", "NODE", PROFILE))
    print(f"one report at the CRD's bounds: {len(text) / 1e6:.2f} MB as JSON", flush=True)

    def decoded(i: int) -> dict[str, Any]:
        obj: dict[str, Any] = json.loads(text.replace("NODE", f"node-{i}"))
        return obj

    whole, _ = kept(decoded, args.sample)
    every, _ = kept(lambda i: keep_every_device(decoded(i)), args.sample)
    t = time.perf_counter()
    ours, reports = kept(lambda i: Report.from_object(decoded(i)), args.nodes)
    decode_s = time.perf_counter() - t
    mib = 1024 * 1024
    print(
        f"kept per report: whole object {whole / 1024:.0f} KiB, every device {every / 1024:.0f} KiB, "
        f"the operator's Report {ours / 1024:.1f} KiB ({whole / ours:.0f}x / {every / ours:.0f}x less)"
    )
    print(
        f"{args.nodes} reports: whole objects {whole * args.nodes / mib:,.0f} MiB, every device "
        f"{every * args.nodes / mib:,.0f} MiB, the operator's Reports {ours * args.nodes / mib:.1f} MiB "
        f"(decoded in {decode_s:.1f} s, {decode_s / args.nodes * 1000:.2f} ms each)"
    )

    profile = Profile.from_body(
        {
            "metadata": {"name": PROFILE, "uid": "u", "generation": 1},
            "spec": {"resourceName": RESOURCE, "mode": "DevicePlugin", "nodeSelector": {}},
        }
    )
    nodes = [
        NodeState(f"node-{i}", capacity={RESOURCE: "2048"}, allocatable={RESOURCE: "0"})
        for i in range(args.nodes)
    ]
    timings = []
    for _ in range(3):
        t = time.perf_counter()
        st = plugin_status(profile, None, nodes, {}, "2026-11-25T12:00:00Z", reports=reports)
        timings.append(time.perf_counter() - t)
    print(
        f"status over {args.nodes} nodes and reports: {min(timings) * 1000:.0f} ms (best of 3); "
        f"devices {st['devices']}, problemCount {st['problemCount']}"
    )
    print(f"peak RSS of this process: {resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024:.0f} MiB")


if __name__ == "__main__":
    main()
