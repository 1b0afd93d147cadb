"""Helpers shared by the e2e tests on the real node."""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

from patchbay_devcluster.images import BUSYBOX_IMAGE


def wait_for(what: str, check: Callable[[], Any], timeout: float = 120.0, every: float = 0.5) -> Any:
    """Poll ``check`` until it returns something truthy; fail naming ``what`` and the last value."""
    deadline = time.monotonic() + timeout
    last: Any = None
    while time.monotonic() < deadline:
        last = check()
        if last:
            return last
        time.sleep(every)
    raise AssertionError(f"timed out after {timeout}s waiting for {what}; last={last!r}")


def busybox_pod(name: str, node: str, script: str) -> dict[str, Any]:
    """A hostNetwork busybox pod pinned to ``node`` running ``sh -c script``."""
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": name},
        "spec": {
            "hostNetwork": True,
            "nodeSelector": {"kubernetes.io/hostname": node},
            "restartPolicy": "Never",
            "terminationGracePeriodSeconds": 1,
            "containers": [{"name": "main", "image": BUSYBOX_IMAGE, "command": ["sh", "-c", script]}],
        },
    }
