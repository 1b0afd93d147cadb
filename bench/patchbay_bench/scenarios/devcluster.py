"""The local cluster itself: control plane + kwok up, N kwok nodes Ready, the real node Ready,
down. Figures only: there is no baseline for starting a cluster. Each round is a fresh cluster."""

from __future__ import annotations

import time

from patchbay_bench.harness import Run
from patchbay_bench.setup import bin_dir, real_node_busy
from patchbay_devcluster import DevCluster


def run(r: Run) -> None:
    nodes, real = r.integer("nodes"), r.flag("real_node")
    busy = real_node_busy() if real else "not asked for (real_node=false)"
    names = ("control plane + kwok up", "kwok nodes created and Ready", "real node Ready", "down")
    times: dict[str, list[float]] = {k: [] for k in names}
    for i in range(r.integer("rounds")):
        cluster = DevCluster(r.work / f"c{i}", bin_dir())
        t0 = time.monotonic()
        cluster.up()
        times[names[0]].append(time.monotonic() - t0)
        try:
            t0 = time.monotonic()
            cluster.add_kwok_nodes(nodes, workers=16)
            cluster.wait_nodes_ready(nodes, label_selector="type=kwok", timeout=max(300, nodes / 2))
            times[names[1]].append(time.monotonic() - t0)
            if not busy:
                t0 = time.monotonic()
                cluster.start_real_node()
                times[names[2]].append(time.monotonic() - t0)
        finally:
            t0 = time.monotonic()
            cluster.down()
            times[names[3]].append(time.monotonic() - t0)
    for name in names:
        if name == names[2] and busy:
            r.missing(f"cluster: {name}", busy)
        else:
            note = f"{nodes} nodes, 16 concurrent POSTs" if name == names[1] else ""
            r.figure(
                f"cluster: {name}", "s", {"devcluster": times[name]}, headline=name != names[3], note=note
            )
