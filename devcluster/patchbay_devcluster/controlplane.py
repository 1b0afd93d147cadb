"""What each control-plane component is: its identity, its command line and its health endpoint.

The control plane is set up like envtest/kubeadm: one CA, the Node and RBAC authorizers,
NodeRestriction, per-component client identities (each a kubeconfig in the state directory),
service-account token signing, and the controller manager using per-controller service-account
credentials. kwok runs as one more component and manages only the Nodes annotated for it
(:func:`kwok_node`). Everything listens on 127.0.0.1, on the ports the cluster picked; the API
server's certificate also names the addresses the cluster asks for (the relay's, for pods).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from patchbay_devcluster import pki

# Order matters: started in this order, stopped in reverse.
COMPONENTS = ("etcd", "kube-apiserver", "kube-controller-manager", "kube-scheduler", "kwok")
KWOK_NODE_ANNOTATION = "kwok.x-k8s.io/node"
KWOK_TAINT_KEY = "kwok.x-k8s.io/node"
KWOK_NODE_LABEL = "type"
KWOK_STAGES = Path(__file__).with_name("kwok-stages.yaml")
KWOK_FLEET_STEP = 5000
"""Up to this many kwok nodes, the settings every figure up to 5,000 nodes was measured with;
above it kwok's periodic writes are spread out in proportion (:func:`kwok_stretch`)."""
_HEARTBEAT_DELAY = "durationMilliseconds: 300000\n    jitterDurationMilliseconds: 310000"
"""The node status refresh's delay in ``KWOK_STAGES`` (5 to 5m10s), stretched by :func:`kwok_stages`."""

HEALTH: dict[str, tuple[str, str, bool]] = {
    "etcd": ("etcd", "/health", False),
    "kube-controller-manager": ("controller-manager", "/healthz", True),
    "kube-scheduler": ("scheduler", "/healthz", True),
    "kwok": ("kwok", "/healthz", False),
}
"""component: (its port's name, health path, TLS) for plain HTTP(S) probes. The API server is
not here: its ``/readyz`` takes a client certificate, so the cluster asks it with its client."""


def kwok_stretch(fleet: int) -> int:
    """How many times longer kwok's Lease and node-status periods, and the node lifecycle
    controller's grace, are for a cluster sized for ``fleet`` kwok nodes: 1 up to 5,000 nodes,
    then in proportion, so that kwok's writes stay near their rate at 5,000 nodes.

    Why: kwok renews every node's Lease each quarter of its duration. With the 240 s lease that
    held 5,000 nodes (83 renewals a second), 20,000 nodes make 333 a second, and on this 2-core
    machine the renewals fell behind the controller's grace: 11,354 of 20,000 nodes NotReady 36
    minutes into a run (docs/benchmarks.md, "where 20,000 stops"). A node's liveness is the
    cluster's load here, not what a benchmark measures.
    """
    return max(1, math.ceil(fleet / KWOK_FLEET_STEP))


def kwok_stages(fleet: int) -> str:
    """kwok's stages (``KWOK_STAGES``) for a cluster sized for ``fleet`` nodes: the node status
    refresh's delay multiplied by :func:`kwok_stretch`, the rest as written."""
    text = KWOK_STAGES.read_text()
    stretch = kwok_stretch(fleet)
    if stretch == 1:
        return text
    if text.count(_HEARTBEAT_DELAY) != 1:
        raise ValueError(f"{KWOK_STAGES.name}: the node heartbeat's delay is not {_HEARTBEAT_DELAY!r}")
    stretched = (
        f"durationMilliseconds: {300000 * stretch}\n    jitterDurationMilliseconds: {310000 * stretch}"
    )
    return text.replace(_HEARTBEAT_DELAY, stretched)


def kwok_stages_path(state_dir: Path, fleet: int) -> Path:
    """Where kwok reads its stages: the packaged file, or its stretched copy in the state
    directory (written by the kwok component before it starts)."""
    return KWOK_STAGES if kwok_stretch(fleet) == 1 else state_dir / KWOK_STAGES.name


def write_credentials(
    state_dir: Path, pki_dir: Path, admin_kubeconfig: Path, api_port: int, api_ips: Sequence[str] = ()
) -> None:
    """Certificates for the API server (naming ``api_ips`` too) and every client identity, and
    their kubeconfigs (idempotent: existing certificates are kept, kubeconfigs name ``api_port``)."""
    ca = pki.CertificateAuthority(pki_dir)
    api_server_certificate(pki_dir, api_ips)
    ca.issue(
        "apiserver-kubelet-client", "kube-apiserver-kubelet-client", orgs=("system:masters",), client=True
    )
    pki.service_account_keys(pki_dir)
    # A separate CA for the aggregation layer's front proxy (as kubeadm does): requests carrying
    # X-Remote-User headers are trusted only from a client certificate of THIS CA.
    front = pki.CertificateAuthority(pki_dir / "front-proxy")
    front.issue("front-proxy-client", "front-proxy-client", client=True)
    identities = {
        "admin": ("patchbay-admin", ("system:masters",)),
        "controller-manager": ("system:kube-controller-manager", ()),
        "scheduler": ("system:kube-scheduler", ()),
        "kwok": ("kwok-controller", ("system:masters",)),
    }
    for stem, (cn, orgs) in identities.items():
        pair = ca.issue(stem, cn, orgs=orgs, client=True)
        target = admin_kubeconfig if stem == "admin" else state_dir / f"{stem}.kubeconfig"
        pki.write_kubeconfig(target, f"https://127.0.0.1:{api_port}", ca.pair.cert, pair)


def api_server_certificate(pki_dir: Path, ips: Sequence[str] = ()) -> pki.CertPair:
    """The API server's serving certificate: localhost, 127.0.0.1 and ``ips``. One that lacks any
    of them is issued again with its key; a running API server reloads the file by itself."""
    return pki.CertificateAuthority(pki_dir).issue("apiserver", "kube-apiserver", server=True, ips=ips)


def argv(
    name: str,
    bin_dir: Path,
    state_dir: Path,
    pki_dir: Path,
    ports: dict[str, int],
    *,
    service_range: str = "10.0.0.0/24",
    fleet: int = 0,
) -> list[str]:
    """The command line of component ``name`` (one of ``COMPONENTS``). ``service_range``: the
    API server's Service range (the cluster passes one whose first address its pods can reach).
    ``fleet``: the kwok nodes the cluster is sized for (:func:`kwok_stretch`)."""
    stretch = kwok_stretch(fleet)
    b = str(bin_dir / name)
    p = pki_dir
    if name == "etcd":
        client = f"http://127.0.0.1:{ports['etcd']}"
        peer = f"http://127.0.0.1:{ports['etcd-peer']}"
        return [
            b,
            "--name=devcluster",
            f"--data-dir={state_dir / 'etcd'}",
            f"--listen-client-urls={client}",
            f"--advertise-client-urls={client}",
            f"--listen-peer-urls={peer}",
            f"--initial-advertise-peer-urls={peer}",
            f"--initial-cluster=devcluster={peer}",
            "--unsafe-no-fsync",  # test data: durability is not worth the fsync latency
            "--quota-backend-bytes=8589934592",
            "--log-level=warn",
        ]
    if name == "kube-apiserver":
        return [
            b,
            f"--etcd-servers=http://127.0.0.1:{ports['etcd']}",
            f"--secure-port={ports['apiserver']}",
            "--bind-address=127.0.0.1",
            "--advertise-address=127.0.0.1",
            # Endpoints may not hold loopback addresses, so the "kubernetes" Service gets none:
            # nothing here may connect to a ClusterIP anyway.
            "--endpoint-reconciler-type=none",
            f"--cert-dir={p}",
            f"--tls-cert-file={p / 'apiserver.crt'}",
            f"--tls-private-key-file={p / 'apiserver.key'}",
            f"--client-ca-file={p / 'ca.crt'}",
            f"--kubelet-client-certificate={p / 'apiserver-kubelet-client.crt'}",
            f"--kubelet-client-key={p / 'apiserver-kubelet-client.key'}",
            f"--kubelet-certificate-authority={p / 'ca.crt'}",
            # The real node is "localhost" (Hostname address); kwok nodes have only an
            # InternalIP of 127.0.0.1. Either way logs/exec stay on loopback.
            "--kubelet-preferred-address-types=Hostname,InternalIP",
            f"--service-cluster-ip-range={service_range}",
            "--allow-privileged=true",
            "--authorization-mode=Node,RBAC",
            "--enable-admission-plugins=NodeRestriction",
            "--service-account-issuer=https://kubernetes.default.svc.cluster.local",
            f"--service-account-key-file={p / 'sa.pub'}",
            f"--service-account-signing-key-file={p / 'sa.key'}",
            f"--requestheader-client-ca-file={p / 'front-proxy' / 'ca.crt'}",
            "--requestheader-allowed-names=front-proxy-client",
            "--requestheader-username-headers=X-Remote-User",
            "--requestheader-group-headers=X-Remote-Group",
            "--requestheader-extra-headers-prefix=X-Remote-Extra-",
            f"--proxy-client-cert-file={p / 'front-proxy' / 'front-proxy-client.crt'}",
            f"--proxy-client-key-file={p / 'front-proxy' / 'front-proxy-client.key'}",
            "--profiling=false",
            # Defaults of 400/200 throttle thousands of kwok nodes' heartbeats plus a benchmark.
            "--max-requests-inflight=3000",
            "--max-mutating-requests-inflight=1000",
            "--v=1",
        ]
    if name in ("kube-controller-manager", "kube-scheduler"):
        stem = "controller-manager" if name == "kube-controller-manager" else "scheduler"
        kc = str(state_dir / f"{stem}.kubeconfig")
        out = [
            b,
            f"--kubeconfig={kc}",
            f"--authentication-kubeconfig={kc}",
            f"--authorization-kubeconfig={kc}",
            "--leader-elect=false",
            "--bind-address=127.0.0.1",
            f"--secure-port={ports[stem]}",
            f"--cert-dir={state_dir / stem}",
            # A client that patches thousands of nodes must not be throttled by our own defaults.
            "--kube-api-qps=500",
            "--kube-api-burst=1000",
            "--v=1",
        ]
        if name == "kube-controller-manager":
            out += [
                "--use-service-account-credentials=true",
                f"--service-account-private-key-file={p / 'sa.key'}",
                f"--root-ca-file={p / 'ca.crt'}",
                f"--cluster-signing-cert-file={p / 'ca.crt'}",
                f"--cluster-signing-key-file={p / 'ca.key'}",
                "--cluster-name=patchbay-dev",
                "--concurrent-daemonset-syncs=5",
                # Thousands of kwok nodes on two cores: under a burst of pod creations kwok's
                # lease renewals lag past the default 50 s, the node lifecycle controller marks
                # nodes NotReady and their pods Ready=False, and kwok never sets them back.
                # Our machine's load is not a node failure; nothing here tests that detection.
                # Five of kwok's renewal periods, however long kwok_stretch makes them.
                f"--node-monitor-grace-period={300 * stretch}s",
            ]
        return out
    if name == "kwok":
        return [
            b,
            f"--kubeconfig={state_dir / 'kwok.kubeconfig'}",
            "--manage-all-nodes=false",
            f"--manage-nodes-with-annotation-selector={KWOK_NODE_ANNOTATION}=fake",
            f"--server-address=127.0.0.1:{ports['kwok']}",
            "--node-ip=127.0.0.1",
            "--cidr=10.0.1.0/24",
            # kwok renews each node's Lease every quarter of this: 60 s, where a kubelet renews
            # every 10 s. At 5,000 kwok nodes 10 s is 500 Lease writes a second, which took this
            # 2-core machine's API server (2026-11-29: 1,747 of 5,000 nodes NotReady 16 min into
            # a rollout_scale run, kube-apiserver 86% and kwok 38% of a core, load 7); 60 s is
            # 83. The node lifecycle controller's grace above (5 min) still outlasts a renewal.
            # What the benchmarks count is the operator's and the agents' traffic, not this.
            # Past 5,000 nodes, longer in proportion (kwok_stretch).
            f"--node-lease-duration-seconds={240 * stretch}",
            f"--config={kwok_stages_path(state_dir, fleet)}",
            # Past 5,000 nodes its log line per object written (218,000 lines in 28 minutes at
            # 20,000 nodes) is a share of a core this machine does not have: warnings only.
            *(["--v=WARN"] if stretch > 1 else []),
        ]
    raise ValueError(name)


def kwok_node(name: str, labels: dict[str, str]) -> dict[str, Any]:
    """A Node object that kwok will manage: heartbeats keep it Ready; no kubelet behind it."""
    return {
        "apiVersion": "v1",
        "kind": "Node",
        "metadata": {
            "name": name,
            "annotations": {KWOK_NODE_ANNOTATION: "fake", "node.alpha.kubernetes.io/ttl": "0"},
            "labels": {
                "kubernetes.io/hostname": name,
                "kubernetes.io/os": "linux",
                "kubernetes.io/arch": "amd64",
                "node-role.kubernetes.io/agent": "",
                KWOK_NODE_LABEL: "kwok",
                **labels,
            },
        },
        "spec": {"taints": [{"key": KWOK_TAINT_KEY, "value": "fake", "effect": "NoSchedule"}]},
        "status": {
            "allocatable": {"cpu": "32", "memory": "256Gi", "pods": "110"},
            "capacity": {"cpu": "32", "memory": "256Gi", "pods": "110"},
        },
    }
