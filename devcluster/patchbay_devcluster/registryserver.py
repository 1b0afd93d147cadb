"""The OCI registry's process: how the cluster runs distribution's registry
(:mod:`patchbay_devcluster.registry`) as one of its processes, under a name of its own
(``registry``, and ``registry-auth`` for the tests of pull secrets), with its configuration,
certificate and storage in ``<state>/registry/<name>/``.
"""

from __future__ import annotations

import json
import logging
from collections.abc import Mapping
from pathlib import Path

from patchbay_devcluster import pki
from patchbay_devcluster import registry as oci
from patchbay_devcluster.process import ClusterError, Process, State, StateDir
from patchbay_devcluster.procs import free_port

log = logging.getLogger(__name__)


class RegistryServer(Process):
    """The registry called ``name``; ready when its API's base endpoint answers."""

    grace = 5.0

    def __init__(self, home: StateDir, name: str = "registry") -> None:
        super().__init__(home)
        self.name = name
        self.dir = home.path / "registry" / name
        self.serving: oci.Registry | None = None  # set by ``start``

    @property
    def record(self) -> Path:
        return self.dir / "registry.json"

    @property
    def what(self) -> str:
        return f"the registry on {self.serving.host}" if self.serving is not None else self.name

    def running(self, st: State) -> oci.Registry | None:
        """The registry as it was started, if it runs now."""
        return oci.load_record(self.record) if self.runs(st) else None

    def argv(self) -> list[str]:
        try:
            return [str(oci.binary()), "serve", str(self.dir / "config.yml")]
        except oci.RegistryError as e:
            raise ClusterError(str(e)) from None

    def env(self) -> Mapping[str, str]:
        return oci.env()

    def ready(self) -> bool:
        return self.serving is not None and self.serving.answers()

    def start(
        self, st: State, credentials: oci.Credentials | None, containerd_config: Path, timeout: float
    ) -> oci.Registry:
        """On 127.0.0.1 (its port kept in ``st`` from an earlier start), TLS with the cluster's CA,
        storage under the state directory, htpasswd auth with ``credentials``; containerd told of it
        by a hosts file in its registry ``containerd_config`` directory."""
        self.dir.mkdir(parents=True, exist_ok=True)
        port = st.ports.get(self.name) or free_port()
        st.ports[self.name] = port
        ca = pki.CertificateAuthority(self.home.pki)
        serving = ca.issue("registry-serving", "patchbay-registry", server=True)
        htpasswd = None
        if credentials is not None:
            htpasswd = self.dir / "htpasswd"
            htpasswd.write_text(oci.htpasswd_line(credentials))
        conf = oci.config(self.dir / "storage", port, serving.cert, serving.key, htpasswd)
        (self.dir / "config.yml").write_text(json.dumps(conf, indent=2))
        reg = oci.Registry(
            self.name, port, ca.pair.cert, oci.write_cert_dir(ca.pair.cert, self.dir / "certs.d"), credentials
        )
        hosts = containerd_config / reg.host / "hosts.toml"
        hosts.parent.mkdir(parents=True, exist_ok=True)
        hosts.write_text(oci.hosts_toml(reg))
        self.serving = reg
        proc = self.launch(st, timeout)
        oci.save_record(self.record, reg)
        log.info("  registry %s on https://%s (pid %d)", self.name, reg.host, proc.pid)
        return reg
