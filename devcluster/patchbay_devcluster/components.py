"""The control plane's processes, one type each: :class:`Etcd`, :class:`KubeApiServer`,
:class:`KubeControllerManager`, :class:`KubeScheduler` and :class:`Kwok`, and
:class:`ControlPlane`, which starts them in that order and starts one again.

What each component is (identity, command line, health endpoint) is in
:mod:`patchbay_devcluster.controlplane`; starting, recording, awaiting and stopping them in
:mod:`patchbay_devcluster.process`.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Sequence
from pathlib import Path

from kubernetes import client

from patchbay_devcluster import controlplane, kubeapi
from patchbay_devcluster.controlplane import COMPONENTS
from patchbay_devcluster.podnetwork import SERVICE_SUBNET
from patchbay_devcluster.process import ClusterError, Process, State, StateDir
from patchbay_devcluster.procs import Proc, free_port, http_ok, stop_pid

log = logging.getLogger(__name__)

PORTS = (
    "etcd",
    "etcd-peer",
    "apiserver",
    "controller-manager",
    "scheduler",
    "kwok",
    "kubelet",
    "kubelet-healthz",
)
"""The ports picked at ``up``, by name (the real node's kubelet takes the last two). The real
node adds ``relay``, a port of the bridge address, when it starts."""


class Component(Process):
    """A control-plane component on the cluster's ports, ready when its health endpoint answers
    200 (``controlplane.HEALTH``)."""

    def __init__(self, home: StateDir, bin_dir: Path, ports: dict[str, int], fleet: int = 0) -> None:
        super().__init__(home)
        self.bin_dir = bin_dir
        self.ports = ports
        self.fleet = fleet

    def argv(self) -> list[str]:
        # The "kubernetes" Service's address is the pod bridge's own (podnetwork.SERVICE_SUBNET).
        return controlplane.argv(
            self.name,
            self.bin_dir,
            self.home.path,
            self.home.pki,
            self.ports,
            service_range=str(SERVICE_SUBNET),
            fleet=self.fleet,
        )

    def ready(self) -> bool:
        port, path, tls = controlplane.HEALTH[self.name]
        return http_ok(self.ports[port], path, tls=tls)


class Etcd(Component):
    name = "etcd"


class KubeApiServer(Component):
    """Ready when its ``/readyz`` says so: that takes a client certificate, so it is asked with
    the admin's client (``api``)."""

    name = "kube-apiserver"

    def __init__(
        self,
        home: StateDir,
        bin_dir: Path,
        ports: dict[str, int],
        fleet: int,
        api: Callable[[], client.ApiClient],
    ) -> None:
        super().__init__(home, bin_dir, ports, fleet)
        self.api = api

    def ready(self) -> bool:
        return kubeapi.readyz(self.api(), timeout=5)


class KubeControllerManager(Component):
    name = "kube-controller-manager"


class KubeScheduler(Component):
    name = "kube-scheduler"


class Kwok(Component):
    """kwok, which keeps the Nodes annotated for it (``controlplane.kwok_node``) Ready."""

    name = "kwok"

    def argv(self) -> list[str]:
        # Past 5,000 nodes kwok reads a copy of its stages with a longer node status period.
        stages = controlplane.kwok_stages_path(self.home.path, self.fleet)
        if stages != controlplane.KWOK_STAGES:
            stages.write_text(controlplane.kwok_stages(self.fleet))
        return super().argv()


TYPES: dict[str, type[Component]] = {
    t.name: t for t in (Etcd, KubeApiServer, KubeControllerManager, KubeScheduler, Kwok)
}
assert tuple(TYPES) == COMPONENTS


class ControlPlane:
    """The five components of one cluster: started in order (each awaited before the next),
    stopped in reverse by ``DevCluster.down``; one started again on its ports."""

    def __init__(
        self, home: StateDir, bin_dir: Callable[[], Path], api: Callable[[], client.ApiClient]
    ) -> None:
        self.home = home
        self.bin_dir = bin_dir  # resolved only when a component starts: teardown needs no binaries
        self.api = api

    def component(self, name: str, st: State) -> Component:
        """Component ``name`` on ``st``'s ports, sized for its fleet."""
        if name == KubeApiServer.name:
            return KubeApiServer(self.home, self.bin_dir(), st.ports, st.fleet, self.api)
        return TYPES[name](self.home, self.bin_dir(), st.ports, st.fleet)

    def start(self, timeout: float, api_ips: Sequence[str] = (), fleet: int = 0) -> State:
        """A fresh state (``PORTS`` picked, credentials for an API server that also answers at
        ``api_ips``), then every component in order, each recorded as it starts and awaited
        before the next. On a failure, those already running are left to ``DevCluster.down``.
        ``fleet``: the kwok nodes it is sized for (``controlplane.kwok_stretch``)."""
        home = self.home
        for d in (home.path, home.pki, home.logs):
            d.mkdir(parents=True, exist_ok=True)
        home.path.chmod(0o700)
        st = State(ports={n: free_port() for n in PORTS}, fleet=fleet)
        st.save(home.state_file)
        controlplane.write_credentials(
            home.path, home.pki, home.kubeconfig, st.ports["apiserver"], api_ips=api_ips
        )
        log.info("Starting control plane in %s", home.path)
        for name in COMPONENTS:
            proc = self.component(name, st).launch(st, timeout)
            log.info("  %s ready (pid %d)", name, proc.pid)
        return st

    def restart(self, st: State, name: str, timeout: float, grace: float) -> Proc:
        """Stop component ``name`` by PID and start it again on the same ports. After the API
        server, any other component that exited while it was away is started again too."""
        if name not in COMPONENTS:
            raise ClusterError(f"unknown component {name!r}; one of {', '.join(COMPONENTS)}")
        old = next((p for p in st.procs if p.name == name), None)
        if old is None:
            raise ClusterError(f"{name} is not running in {self.home.path}")
        stop_pid(old, grace=grace)
        proc = self._respawn(st, st.procs.index(old), timeout)
        if name == KubeApiServer.name:
            self._revive_exited(st, timeout)
        return proc

    def _revive_exited(self, st: State, timeout: float) -> None:
        """Start again each control-plane component of ``st`` that no longer runs.

        The controller-manager's /healthz answers before it has built its controllers, and it
        exits (code 1) when the API server refuses a connection while it builds them: a restart of
        the API server in its first seconds lost it for good (CI, 2026-11-27: "failed to create
        Kubernetes client for resourcequota-controller ... connection refused"). On a real control
        plane the kubelet restarts that static pod; here this does, once, on the same ports.
        """
        for i, p in enumerate(st.procs):
            if p.name not in COMPONENTS or p.runs():
                continue
            log.warning("%s (pid %d) exited while the API server was away; starting it again", p.name, p.pid)
            self._respawn(st, i, timeout)

    def _respawn(self, st: State, index: int, timeout: float) -> Proc:
        """``st.procs[index]`` (stopped or exited) started again in its place, on the same ports."""
        proc = self.component(st.procs[index].name, st).launch(st, timeout, at=index)
        log.info("Restarted %s (pid %d)", proc.name, proc.pid)
        return proc
