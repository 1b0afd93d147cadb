"""How long the local cluster takes: control plane up, N kwok nodes Ready, the real node, down.

Prints figures only (no target to compare with); run:
    PATCHBAY_KUBE_BIN=$(hack/kube-binaries.sh --print-bin-dir) \
        .venv/bin/python bench/devcluster.py --nodes 1000 --real-node
"""

from __future__ import annotations

import argparse
import tempfile
import time
from pathlib import Path

from patchbay_devcluster import DevCluster, find_bin_dir


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--nodes", type=int, default=1000)
    ap.add_argument("--real-node", action="store_true", help="also time the real kubelet node (root)")
    args = ap.parse_args()
    with tempfile.TemporaryDirectory(prefix="pb-bench-") as tmp:
        cluster = DevCluster(Path(tmp) / "c", find_bin_dir())
        figures: list[tuple[str, float]] = []
        t0 = time.monotonic()
        cluster.up()
        figures.append(("control plane + kwok up", time.monotonic() - t0))
        try:
            t0 = time.monotonic()
            cluster.add_kwok_nodes(args.nodes, workers=16)
            figures.append((f"create {args.nodes} kwok nodes", time.monotonic() - t0))
            cluster.wait_nodes_ready(args.nodes, label_selector="type=kwok", timeout=600)
            figures.append((f"... until all {args.nodes} Ready", time.monotonic() - t0))
            if args.real_node:
                t0 = time.monotonic()
                cluster.start_real_node()
                figures.append(("real node Ready (containerd + kubelet + images)", time.monotonic() - t0))
        finally:
            t0 = time.monotonic()
            cluster.down()
            figures.append(("down (every process stopped)", time.monotonic() - t0))
    width = max(len(k) for k, _ in figures)
    for k, v in figures:
        print(f"{k:<{width}}  {v:7.2f} s")


if __name__ == "__main__":
    main()
