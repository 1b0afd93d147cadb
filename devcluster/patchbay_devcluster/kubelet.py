"""The real node's kubelet: the pinned kubelet as node ``localhost`` on the node's containerd,
its root directory the machine's ``/var/lib/kubelet``. It serves on 127.0.0.1 only; the node is
named ``localhost`` and the API server prefers the Hostname address, so ``kubectl logs/exec``
reach it over loopback. Its node IP is the pod bridge's address.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from patchbay_devcluster import cgroups, hostdirs, pki
from patchbay_devcluster.hostdirs import NodeError, NodePaths
from patchbay_devcluster.podnetwork import NODE_IP
from patchbay_devcluster.process import ClusterError, Process, State, StateDir
from patchbay_devcluster.procs import Proc, http_ok

NODE_NAME = "localhost"
READY_TIMEOUT = 120.0
"""Seconds the kubelet's /healthz has to answer after a start."""


def kubelet_config(
    paths: NodePaths, pki_dir: Path, port: int, healthz_port: int, cgroup_root: str, *, cgroup_version: int
) -> dict[str, Any]:
    return {
        "apiVersion": "kubelet.config.k8s.io/v1beta1",
        "kind": "KubeletConfiguration",
        "address": "127.0.0.1",
        "port": port,
        "readOnlyPort": 0,
        "healthzBindAddress": "127.0.0.1",
        "healthzPort": healthz_port,
        "authentication": {
            "anonymous": {"enabled": False},
            "webhook": {"enabled": False},
            "x509": {"clientCAFile": str(pki_dir / "ca.crt")},
        },
        # Only clients with a certificate of the cluster's CA reach it, on loopback.
        "authorization": {"mode": "AlwaysAllow"},
        "tlsCertFile": str(pki_dir / "kubelet-serving.crt"),
        "tlsPrivateKeyFile": str(pki_dir / "kubelet-serving.key"),
        "containerRuntimeEndpoint": f"unix://{paths.containerd_sock}",
        "podLogsDir": str(paths.pod_logs),
        # cgroup v1 or v2 (cgroups.kubelet_settings), no systemd, kernel defaults we may not change.
        **cgroups.kubelet_settings(cgroup_version, cgroup_root),
        "failSwapOn": False,
        "protectKernelDefaults": False,
        # Images are imported, never pulled: never garbage-collect them, never evict for disk.
        "imageGCHighThresholdPercent": 100,
        "imageGCLowThresholdPercent": 99,
        "evictionHard": {"memory.available": "100Mi", "nodefs.available": "1%", "imagefs.available": "1%"},
        "resolvConf": "",
        "serializeImagePulls": False,
        "maxPods": 50,
        "syncFrequency": "10s",
    }


class Kubelet(Process):
    """The kubelet of the node: its certificates, kubeconfig and configuration, its command line,
    healthy when its /healthz answers."""

    name = "kubelet"

    def __init__(self, home: StateDir, paths: NodePaths, pki_dir: Path, bin_dir: Path | None) -> None:
        super().__init__(home)
        self.paths = paths
        self.pki_dir = pki_dir
        self.bin_dir = bin_dir
        self.healthz_port = 0

    @property
    def kubeconfig(self) -> Path:
        return self.paths.root / "kubelet.kubeconfig"

    def configure(
        self, api_port: int, port: int, healthz_port: int, cgroup_root: str, *, cgroup_version: int
    ) -> None:
        """Its client and serving certificates, its kubeconfig and its configuration file."""
        ca = pki.CertificateAuthority(self.pki_dir)
        client = ca.issue("kubelet-client", f"system:node:{NODE_NAME}", orgs=("system:nodes",), client=True)
        ca.issue("kubelet-serving", NODE_NAME, server=True)
        pki.write_kubeconfig(self.kubeconfig, f"https://127.0.0.1:{api_port}", ca.pair.cert, client)
        conf = kubelet_config(
            self.paths, self.pki_dir, port, healthz_port, cgroup_root, cgroup_version=cgroup_version
        )
        self.paths.kubelet_config.write_text(json.dumps(conf, indent=2))

    def argv(self) -> list[str]:
        if self.bin_dir is None:
            raise NodeError("no Kubernetes binaries to run the kubelet from")
        return [
            str(self.bin_dir / "kubelet"),
            f"--config={self.paths.kubelet_config}",
            f"--kubeconfig={self.kubeconfig}",
            f"--root-dir={self.paths.kubelet_root}",
            f"--cert-dir={self.paths.root / 'kubelet-pki'}",
            f"--hostname-override={NODE_NAME}",
            # The bridge's address: hostNetwork pods get it as their IP, so probes of those pods
            # stay on the pod network too (never the machine's own interface).
            f"--node-ip={NODE_IP}",
            "--v=1",
            # The device manager's plugin handler and client at V(2): every registration,
            # connection, ListAndWatch update and disconnection of a device plugin is logged
            # (klog matches file base names, so other handler.go/client.go files log a little too).
            "--vmodule=handler=2,client=2",
        ]

    def ready(self) -> bool:
        return http_ok(self.healthz_port, "/healthz", tls=False)

    def start(self, st: State) -> Proc:
        """Start it (or start it again, after a stop) on the ports of ``st``; waits until healthy.
        The node's claim on the machine's directories then names it (``hostdirs.record_kubelet``)."""
        st.procs = [p for p in st.procs if p.name != self.name or p.runs()]
        if self.recorded(st):
            raise ClusterError("the kubelet is already running")
        self.healthz_port = st.ports["kubelet-healthz"]
        proc = self.launch(st, READY_TIMEOUT)
        hostdirs.record_kubelet(self.home.path, proc)
        return proc
