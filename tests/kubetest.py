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
