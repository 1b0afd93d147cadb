"""`make release REGISTRY=...` (hack/release.py --registry): the release pushed as a user fetches
it, to a real OCI registry (distribution's, the binary the dev cluster runs, here on its own on
127.0.0.1 with TLS from a CA of the test's): the images' digests and the chart's are the ones the
registry then serves. No cluster, no real node."""

from __future__ import annotations

import json
import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest
from support.clusters import wait_for
from support.scripts import load

from patchbay_devcluster import pki
from patchbay_devcluster import registry as oci
from patchbay_devcluster.imagebuild import build_all
from patchbay_devcluster.install import package_chart
from patchbay_devcluster.procs import free_port

# No Kubernetes component runs here: `make test` runs it once, `make test-release` does not again.
pytestmark = pytest.mark.release_independent

REPO = Path(__file__).resolve().parents[2]


@pytest.fixture
def registry(tmp_path: Path) -> Iterator[oci.Registry]:
    ca = pki.CertificateAuthority(tmp_path / "pki")
    serving = ca.issue("registry", "registry", server=True)
    port = free_port()
    conf = tmp_path / "config.yml"
    conf.write_text(json.dumps(oci.config(tmp_path / "storage", port, serving.cert, serving.key)))
    with (tmp_path / "registry.log").open("wb") as log:
        proc = subprocess.Popen(
            [str(oci.binary()), "serve", str(conf)], stdout=log, stderr=log, env=oci.env()
        )
    reg = oci.Registry("release", port, ca.pair.cert, oci.write_cert_dir(ca.pair.cert, tmp_path / "certs.d"))
    try:
        wait_for("the registry answers", reg.answers, 30)
        yield reg
    finally:
        proc.terminate()
        proc.wait(timeout=30)


def test_release_pushed_to_a_registry_is_what_it_serves(
    registry: oci.Registry, tmp_path: Path, bin_dir: Path
) -> None:
    release = load("release")
    version = (REPO / "VERSION").read_text().strip()
    images = build_all(REPO)
    chart = package_chart(bin_dir / "helm", REPO / "charts" / "patchbay", tmp_path / "chart")
    where = f"{registry.host}/patchbay"
    pushed = release.push_release(where, version, images, chart, registry.ca)
    assert set(pushed) == {
        f"{where}/patchbay-operator:{version}",
        f"{where}/patchbay-agent:{version}",
        f"oci://{where}/charts/patchbay:{version}",
    }, pushed
    for ref, digest in pushed.items():
        repository, tag = ref.removeprefix("oci://").rsplit(":", 1)
        assert digest.startswith("sha256:"), (ref, digest)
        assert registry.manifest_digest(repository, tag) == digest, ref
