"""The real node's pod network: a private network inside the machine.

Ordinary pods get an address on the bridge ``patchbay0`` (CNI ``bridge`` + ``host-local``,
Debian's containernetworking-plugins) in ``POD_SUBNET``; the bridge itself holds the first address,
which is also the node's InternalIP, so the kubelet's HTTP probes and a scraper on the node reach
pods exactly as in a cluster. Pods have no default route, the bridge does not forward
(``net.ipv4.conf.patchbay0.forwarding=0``, and the CNI plugin is told not to be a gateway, which
would turn forwarding on machine-wide) and nothing masquerades: a pod can talk to the node and to
other pods, and nothing it sends can leave the machine. The API server listens on 127.0.0.1,
which pods cannot reach; its Service range (``SERVICE_SUBNET``) starts at the bridge's address, so
the ``kubernetes`` Service that every pod finds in its environment IS the bridge's address, where
the cluster runs a relay on the Service's port (:mod:`patchbay_devcluster.podrelay`): pods reach
the API server as in any cluster, through no virtual IP.
"""

from __future__ import annotations

import ipaddress
import json
import subprocess
from pathlib import Path
from typing import Any

from patchbay_devcluster.hostdirs import NodeError, NodePaths

BRIDGE = "patchbay0"
"""The pod network's Linux bridge (one real node per machine, so one fixed name)."""

POD_SUBNET = ipaddress.IPv4Network("10.244.0.0/24")
"""Pod addresses; the bridge (and the node's InternalIP) is the first host address."""

NODE_IP = str(next(POD_SUBNET.hosts()))

SERVICE_SUBNET = ipaddress.IPv4Network("10.244.0.0/25")
"""The API server's Service range (``--service-cluster-ip-range``). Its first address, which the
API server gives the ``kubernetes`` Service, is NODE_IP, the bridge's own address: pods reach the
API server at the Service's address and port as in any cluster, and the cluster tool's relay
answers there (no virtual IP, no kube-proxy, nothing forwarded). The other Services' addresses
answer nothing, as without kube-proxy anywhere. Pods take addresses above this range."""
KUBERNETES_SERVICE_PORT = 443
"""The ``kubernetes`` Service's port (the API server's fixed choice): where the relay listens."""
POD_RANGE_START = SERVICE_SUBNET.broadcast_address + 1
"""The first pod address: above the Service range (126 pod addresses at once)."""
assert str(next(SERVICE_SUBNET.hosts())) == NODE_IP
BRIDGE_MAC = "02:70:62:00:00:01"
"""Locally administered (the 02 prefix), fixed: see ``create_bridge``."""
CNI_PLUGINS = ("bridge", "host-local", "loopback")


def cni_conflist(paths: NodePaths) -> dict[str, Any]:
    """The pod network: a bridge the cluster tool made, addresses from ``POD_SUBNET``, no routes.

    ``isGateway`` stays false: the plugin would then give the bridge an address itself AND switch
    on forwarding for the whole machine. ``routes`` is empty, so pods know only their subnet (the
    node and the other pods); there is no default route to leave by.
    """
    return {
        "cniVersion": "1.0.0",
        "name": "patchbay-pods",
        "plugins": [
            {
                "type": "bridge",
                "bridge": BRIDGE,
                "isGateway": False,
                "isDefaultGateway": False,
                "ipMasq": False,
                "hairpinMode": True,
                "ipam": {
                    "type": "host-local",
                    "ranges": [[{"subnet": str(POD_SUBNET), "rangeStart": str(POD_RANGE_START)}]],
                    "routes": [],
                    "dataDir": str(paths.cni_state),
                },
            }
        ],
    }


def _ip(*args: str, check: bool = True) -> subprocess.CompletedProcess[str]:
    res = subprocess.run(["ip", *args], capture_output=True, text=True, timeout=30)
    if check and res.returncode != 0:
        raise NodeError(f"ip {' '.join(args)}: {res.stderr.strip()}")
    return res


def create_bridge() -> None:
    """``patchbay0`` with the node's address and a fixed MAC, up, forwarding off (idempotent).

    The MAC is set explicitly: a Linux bridge otherwise takes the lowest MAC of its ports, so it
    changes as pods come and go, and a pod's ARP entry for the node's address would then point at
    another pod's port (its frames bridged there instead of reaching the node).
    """
    if _ip("link", "show", BRIDGE, check=False).returncode != 0:
        _ip("link", "add", BRIDGE, "type", "bridge")
    _ip("link", "set", "dev", BRIDGE, "address", BRIDGE_MAC)
    sysctl = Path("/proc/sys/net/ipv4/conf") / BRIDGE / "forwarding"
    sysctl.write_text("0\n")
    v6 = Path("/proc/sys/net/ipv6/conf") / BRIDGE / "disable_ipv6"
    if v6.exists():
        v6.write_text("1\n")
    address = f"{NODE_IP}/{POD_SUBNET.prefixlen}"
    if address not in _ip("-4", "addr", "show", "dev", BRIDGE).stdout:
        _ip("addr", "add", address, "dev", BRIDGE)
    _ip("link", "set", BRIDGE, "up")


def delete_bridge() -> None:
    """Remove the bridge (its veth ports went with the pods' network namespaces)."""
    _ip("link", "del", BRIDGE, check=False)


class PodNetwork:
    """The bridge and the CNI configuration of one node (the leases go with its directory)."""

    def __init__(self, paths: NodePaths) -> None:
        self.paths = paths

    def create(self) -> None:
        """The CNI configuration containerd reads, and the bridge (idempotent)."""
        conf = self.paths.cni_conf
        conf.mkdir(parents=True, exist_ok=True)
        (conf / "10-loopback.conflist").unlink(missing_ok=True)
        (conf / "10-patchbay-pods.conflist").write_text(json.dumps(cni_conflist(self.paths), indent=2))
        create_bridge()

    def remove(self) -> None:
        """After the pods are gone: the bridge (its veth ports went with the pods' network
        namespaces)."""
        delete_bridge()
