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
from patchbay_devcluster.imagebuild import BuiltImage
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


def relabelled(image: BuiltImage, label: str, work: Path) -> BuiltImage:
    """``image`` with one label more (``podman build --network=none``, no new layer): a new config,
    so a new image ID and digest. For the e2e tests that push the session's images to the cluster's
    registry: the kubelet (1.35 on: KubeletEnsureSecretPulledImages) records each image it pulls by
    image ID with the repositories it pulled it from, and from then on lets a pod use that image
    only under those names; the session's own images pulled from the registry would take their
    imported names away from the rest of the session, whose pods use them with pull policy Never
    (seen: ErrImageNeverPull, docs/install.md#a-node-that-pulls-and-imports-the-same-image)."""
    ref = f"{image.repository}:{image.tag}-{label}"
    work.mkdir(parents=True, exist_ok=True)
    (work / "Containerfile").write_text(f"FROM {image.ref}\nLABEL dev.patchbay.e2e={label}\n")
    argv = ["podman", "build", "--network=none", "--pull=never", "--tag", ref, str(work)]
    subprocess.run(argv, check=True, capture_output=True, timeout=300)
    return BuiltImage(image.program, ref, image.archive, built=True, seconds=0.0)
