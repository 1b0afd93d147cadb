"""The relay's process: how the cluster runs :mod:`patchbay_devcluster.relay` on the pod bridge's
address, so that the real node's pods reach the API server (``DevCluster.pod_api_server``).

It listens on the ``kubernetes`` Service's address and port (the bridge's own,
``podnetwork.SERVICE_SUBNET``) and is ready once a TLS handshake through it verifies the API
server's certificate for that address.
"""

from __future__ import annotations

import logging

from patchbay_devcluster import controlplane
from patchbay_devcluster.podnetwork import KUBERNETES_SERVICE_PORT, NODE_IP
from patchbay_devcluster.process import ClusterError, Process, State, StateDir
from patchbay_devcluster.procs import free_port, tls_ok

log = logging.getLogger(__name__)

RELAY = "relay"
"""The relay's name as a process and as a port of ``state.json``."""
RELAY_PORT = KUBERNETES_SERVICE_PORT
"""The relay's port on the bridge address: the ``kubernetes`` Service's, whose address is the
bridge's (``podnetwork.SERVICE_SUBNET``), so pods reach the API server as in any cluster. Something
else on the machine that holds it (a listener on the wildcard address) is an error that says so."""
API_SERVER_IPS = (NODE_IP,)
"""Addresses the API server's certificate names besides localhost and 127.0.0.1: the relay's,
so that pods verify the API server they reach through it."""


class PodRelay(Process):
    """The relay from ``NODE_IP:port`` to the API server on 127.0.0.1."""

    name = RELAY

    def __init__(self, home: StateDir, api_port: int, port: int = RELAY_PORT) -> None:
        super().__init__(home)
        self.api_port = api_port
        self.port = port

    @property
    def marker(self) -> str:
        # The relay module is imported when used, not with this module: the package imports this
        # module, and a module run with ``python -m`` must not be imported before it runs (runpy
        # warns, and it would be loaded twice).
        from patchbay_devcluster import relay

        return relay.MODULE

    @property
    def what(self) -> str:
        return f"the relay on {NODE_IP}:{self.port}"

    def argv(self) -> list[str]:
        from patchbay_devcluster import relay  # when used: see ``marker``

        return relay.argv((NODE_IP, self.port), ("127.0.0.1", self.api_port))

    def ready(self) -> bool:
        return tls_ok(NODE_IP, self.port, self.home.pki / "ca.crt")

    @classmethod
    def ensure(cls, home: StateDir, st: State, timeout: float) -> None:
        """The relay on the bridge address (which the real node's network made), recorded in
        ``st``. Kept if it already runs (a second start of the real node after a failed one)."""
        if cls(home, st.ports["apiserver"]).runs(st):
            return
        # A state directory of an earlier version: its certificate may not name the address yet.
        # Issued again now, the running API server reloads it; the wait sees it served.
        controlplane.api_server_certificate(home.pki, API_SERVER_IPS)
        port = free_port(NODE_IP, preferred=RELAY_PORT)
        if port != RELAY_PORT:
            raise ClusterError(
                f"port {RELAY_PORT} of {NODE_IP} is taken (a listener on the wildcard address?): pods "
                f"reach the API server through the kubernetes Service at {NODE_IP}:{RELAY_PORT}; free it"
            )
        st.ports[RELAY] = port
        proc = cls(home, st.ports["apiserver"], port).launch(st, timeout)
        log.info("  relay for pods on %s:%d (pid %d)", NODE_IP, port, proc.pid)
