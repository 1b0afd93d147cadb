"""The cluster as its API server shows it: the admin's client (:class:`AdminApi`, kept while it
stays valid) and the cluster's Nodes (:class:`Nodes`: kwok's created, which are Ready, waits).
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

from kubernetes import client

from patchbay_devcluster import kubeapi
from patchbay_devcluster.controlplane import kwok_node
from patchbay_devcluster.kubelet import NODE_NAME
from patchbay_devcluster.poll import poll_until
from patchbay_devcluster.process import ClusterError, State, StateDir, wait
from patchbay_devcluster.procs import tail

log = logging.getLogger(__name__)


class AdminApi:
    """The official client as the admin: called, it gives the one it keeps (with its connections)
    while the API server's port and the kubeconfig stay the same, else a new one."""

    def __init__(self, home: StateDir) -> None:
        self.home = home
        self._api: tuple[tuple[int, int], client.ApiClient] | None = None

    def __call__(self) -> client.ApiClient:
        port = State.load(self.home.state_file).ports.get("apiserver")
        if not port:
            raise ClusterError(f"no cluster in {self.home.path}: run `patchbay-devcluster up`")
        kubeconfig = self.home.kubeconfig
        try:
            key = (port, kubeconfig.stat().st_mtime_ns)
        except FileNotFoundError:
            raise ClusterError(f"no kubeconfig at {kubeconfig}: run `patchbay-devcluster up`") from None
        if self._api is None or self._api[0] != key:
            self.close()
            self._api = (key, kubeapi.connect(kubeconfig))
        return self._api[1]

    def close(self) -> None:
        if self._api is not None:
            kubeapi.close(self._api[1])
            self._api = None


class Nodes:
    """The cluster's Node objects, through the admin's client ``api``."""

    def __init__(self, api: Callable[[], client.ApiClient], kubelet_log: Path) -> None:
        self.api = api
        self.kubelet_log = kubelet_log

    def add_kwok(self, names: list[str], labels: dict[str, str], workers: int = 8) -> None:
        """Create kwok-managed Nodes named ``names`` (``controlplane.kwok_node``; existing ones
        are kept), ``workers`` at once."""
        api = self.api()

        def create(name: str) -> None:
            kubeapi.create_node(api, kwok_node(name, labels))

        t0 = time.monotonic()
        with ThreadPoolExecutor(max_workers=workers) as pool:
            list(pool.map(create, names))
        log.info("Created %d kwok nodes in %.1fs", len(names), time.monotonic() - t0)

    def ready(self, label_selector: str = "") -> set[str]:
        return kubeapi.ready_nodes(self.api(), label_selector, timeout=60)

    def wait_ready(self, count: int, label_selector: str = "", timeout: float = 120.0) -> None:
        """Until ``count`` Nodes (matching ``label_selector``) are Ready. Each look LISTs them
        all, so the looks are spaced by the fleet's size (0.5 s up to 500 nodes, 20 s at 20,000):
        at 20,000 kwok nodes, with a look every 0.5 s, the waiting process used 30% of a core and
        the API server 88% while kwok made the last 4,500 nodes Ready, 750 a minute (2026-12-02)."""
        last = -1

        def enough() -> bool:
            nonlocal last
            n = len(self.ready(label_selector))
            if n < count and n != last:
                log.info("  %d/%d nodes Ready", n, count)
            last = n
            return n >= count

        poll_until(
            f"{count} nodes Ready",
            enough,
            timeout=timeout,
            interval=max(0.5, count / 1000),
            error=ClusterError,
            detail=lambda: f"only {max(last, 0)}/{count} Ready",
        )
        log.info("%d nodes Ready", last)

    def wait_real_node(self, timeout: float = 120.0) -> None:
        wait(
            f"node {NODE_NAME}",
            lambda: NODE_NAME in self.ready(f"kubernetes.io/hostname={NODE_NAME}"),
            timeout,
            lambda: tail(self.kubelet_log),
        )
