"""Helpers shared by the e2e tests on the real node."""

from __future__ import annotations

from typing import Any

from kubetest import wait_for

from patchbay_devcluster.images import BUSYBOX_IMAGE

__all__ = ["busybox_pod", "wait_for"]


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
