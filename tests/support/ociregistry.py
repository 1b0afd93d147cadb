"""A real OCI registry (distribution's, the binary the dev cluster runs) on its own on 127.0.0.1,
with TLS from a CA made for it: what the release tests push to."""

from __future__ import annotations

import contextlib
import json
import subprocess
from collections.abc import Iterator
from pathlib import Path

from support.clusters import wait_for

from patchbay_devcluster import pki
from patchbay_devcluster import registry as oci
from patchbay_devcluster.procs import free_port


@contextlib.contextmanager
def running_registry(directory: Path, name: str) -> Iterator[oci.Registry]:
    """A registry serving from ``directory`` (its storage, certificates, config and log), stopped
    at the end."""
    ca = pki.CertificateAuthority(directory / "pki")
    serving = ca.issue("registry", "registry", server=True)
    port = free_port()
    conf = directory / "config.yml"
    conf.write_text(json.dumps(oci.config(directory / "storage", port, serving.cert, serving.key)))
    with (directory / "registry.log").open("wb") as log:
        proc = subprocess.Popen(
            [str(oci.binary()), "serve", str(conf)], stdout=log, stderr=log, env=oci.env()
        )
    reg = oci.Registry(name, port, ca.pair.cert, oci.write_cert_dir(ca.pair.cert, directory / "certs.d"))
    try:
        wait_for("the registry answers", reg.answers, 30)
        yield reg
    finally:
        proc.terminate()
        proc.wait(timeout=30)
