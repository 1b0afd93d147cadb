"""Helpers every cluster-facing test shares (tests/ is on sys.path through tests/conftest.py)."""

from __future__ import annotations

import contextlib
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

from patchbay_devcluster import DevCluster


def wait_for(what: str, check: Callable[[], Any], timeout: float = 60.0, every: float = 0.2) -> Any:
    """Poll ``check`` until it returns something truthy and return that; fail naming ``what`` and
    the last value seen. A bounded wait for the cluster to converge, never a timing assertion."""
    deadline = time.monotonic() + timeout
    last: Any = None
    while time.monotonic() < deadline:
        last = check()
        if last:
            return last
        time.sleep(every)
    raise AssertionError(f"timed out after {timeout}s waiting for {what}; last={last!r}")


@contextlib.contextmanager
def running_devcluster(state_dir: Path, bin_dir: Path) -> Iterator[DevCluster]:
    """A control plane (etcd, API server, controllers, kwok) for as long as the block runs."""
    cluster = DevCluster(state_dir, bin_dir)
    cluster.up(timeout=120)
    try:
        yield cluster
    finally:
        # Keep certificates and logs under pytest's tmp dir for post-mortems; stop every PID.
        cluster.down(purge=False)


def kstatus(obj: dict[str, Any]) -> str:
    """kstatus's verdict on one object (sigs.k8s.io/cli-utils, what Flux and Argo read), for the
    generic conditions rules our CR follows: Terminating, InProgress, Failed or Current."""
    meta, st = obj.get("metadata") or {}, obj.get("status") or {}
    if meta.get("deletionTimestamp"):
        return "Terminating"
    if st.get("observedGeneration") is not None and st["observedGeneration"] != meta.get("generation"):
        return "InProgress"
    conds = {c["type"]: c["status"] for c in st.get("conditions") or []}
    if conds.get("Reconciling") == "True":
        return "InProgress"
    if conds.get("Stalled") == "True":
        return "Failed"
    if "Ready" in conds:
        return "Current" if conds["Ready"] == "True" else "InProgress"
    return "Current"
