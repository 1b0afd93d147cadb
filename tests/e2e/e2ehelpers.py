"""Helpers shared by the e2e tests on the real node."""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from kubetest import wait_for

from patchbay_devcluster.images import BUSYBOX_IMAGE

__all__ = ["add_fake_device", "busybox_pod", "fake_device_tree", "host_agent", "wait_for"]


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


def add_fake_device(root: Path, name: str) -> None:
    """A FAKE device: a character device node under ``root/dev`` that is really the null device
    (1,3), so runc can create it in a container exactly as it would a serial adapter."""
    os.mknod(root / "dev" / name, 0o666 | 0o020000, os.makedev(1, 3))


def fake_device_tree(root: Path, names: list[str]) -> Path:
    """A FAKE host root (``dev/``, ``sys/``) holding ``names`` as fake devices."""
    (root / "dev").mkdir(parents=True)
    (root / "sys").mkdir()
    for name in names:
        add_fake_device(root, name)
    return root


@contextlib.contextmanager
def host_agent(config: Path, node: str, tree: Path, log: Path) -> Iterator[subprocess.Popen[bytes]]:
    """``patchbay-agent`` as a host process on the real node (as the demo runs it), stopped by PID.

    The device tree is a directory ON the node, so device paths in Allocate carry it as a prefix.
    """
    with log.open("wb") as out:
        proc = subprocess.Popen(
            [
                sys.executable,
                "-m",
                "patchbay_agent.main",
                "--config",
                str(config),
                "--node-name",
                node,
                "--host-root",
                str(tree),
                "--host-path-prefix",
                str(tree),
                "--http-address",
                "off",
            ],
            stdout=out,
            stderr=subprocess.STDOUT,
        )
        try:
            yield proc
        finally:
            proc.send_signal(signal.SIGTERM)
            try:
                proc.wait(15)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait(5)
