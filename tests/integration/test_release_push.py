"""`make release REGISTRY=...` (hack/release.py --registry): the release pushed as a user fetches
it, to a real OCI registry (distribution's, the binary the dev cluster runs, here on its own on
127.0.0.1 with TLS from a CA of the test's): the images' digests and the chart's are the ones the
registry then serves, and each is signed by digest with the release key (the real cosign binary,
hack/cosign-binary.sh; a key pair made for the test), as a user verifies it (docs/install.md): the
images and the chart pass `cosign verify`, each image's SBOM attestation verifies and lists its
Debian and Python packages, and an image moved under a released tag fails. No cluster, no real
node."""

from __future__ import annotations

import base64
import http.client
import json
import os
import subprocess
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from types import ModuleType
from typing import Any

import pytest
from support.ociregistry import running_registry
from support.scripts import load

from patchbay_devcluster import registry as oci
from patchbay_devcluster.imagebuild import BuiltImage, build_all
from patchbay_devcluster.install import package_chart

# No Kubernetes component runs here: `make test` runs it once, `make test-release` does not again.
pytestmark = pytest.mark.release_independent

REPO = Path(__file__).resolve().parents[2]
PASSWORD = "test-release-key"


@pytest.fixture(scope="module")
def registry(tmp_path_factory: pytest.TempPathFactory) -> Iterator[oci.Registry]:
    with running_registry(tmp_path_factory.mktemp("registry"), "release") as reg:
        yield reg


def key_pair(directory: Path, release: ModuleType) -> tuple[Path, Path]:
    """A throw-away cosign key pair (``cosign generate-key-pair``), the private key encrypted with
    ``$COSIGN_PASSWORD``: never the project's own, whose private half is in no repository."""
    directory.mkdir(parents=True, exist_ok=True)
    subprocess.run(
        [
            str(release.cosign_binary()),
            "generate-key-pair",
            "--output-key-prefix",
            str(directory / "release"),
        ],
        cwd=directory,
        env={**os.environ, "COSIGN_PASSWORD": PASSWORD},
        check=True,
        capture_output=True,
        text=True,
    )
    return directory / "release.key", directory / "release.pub"


@dataclass(frozen=True)
class Pushed:
    release: ModuleType
    where: str  # HOST:PORT/PATH
    version: str
    images: dict[str, BuiltImage]
    digests: dict[str, str]  # reference -> digest
    public_key: Path
    ca: Path

    def image(self, program: str) -> str:
        return f"{self.where}/patchbay-{program}"

    def verify(self, reference: str, key: Path | None = None) -> subprocess.CompletedProcess[str]:
        """`cosign verify` as docs/install.md has a user run it (and the registry's CA)."""
        key = key or self.public_key
        return self.release.cosign(
            ["verify", "--key", str(key), "--insecure-ignore-tlog=true", reference], self.ca, check=False
        )


@pytest.fixture(scope="module")
def pushed(registry: oci.Registry, tmp_path_factory: pytest.TempPathFactory, bin_dir: Path) -> Pushed:
    tmp_path = tmp_path_factory.mktemp("release")
    release = load("release")
    version = (REPO / "VERSION").read_text().strip()
    images = build_all(REPO)
    chart = package_chart(bin_dir / "helm", REPO / "charts" / "patchbay", tmp_path / "chart")
    private, public = key_pair(tmp_path / "keys", release)
    sboms = release.write_sboms(images, version, tmp_path)
    where = f"{registry.host}/patchbay"
    with pytest.MonkeyPatch.context() as env:
        env.setenv("COSIGN_PASSWORD", PASSWORD)
        signing = release.Signing(str(private), sboms)
        digests = release.push_release(where, version, images, chart, registry.ca, signing=signing)
    return Pushed(release, where, version, images, digests, public, registry.ca)


def test_release_pushed_to_a_registry_is_what_it_serves(registry: oci.Registry, pushed: Pushed) -> None:
    where, version = pushed.where, pushed.version
    assert set(pushed.digests) == {
        f"{where}/patchbay-operator:{version}",
        f"{where}/patchbay-agent:{version}",
        f"oci://{where}/charts/patchbay:{version}",
    }, pushed.digests
    for ref, digest in pushed.digests.items():
        repository, tag = ref.removeprefix("oci://").rsplit(":", 1)
        assert digest.startswith("sha256:"), (ref, digest)
        assert registry.manifest_digest(repository, tag) == digest, ref


def verified_digests(result: subprocess.CompletedProcess[str]) -> set[str]:
    """The manifest digests that `cosign verify` says its verified signatures sign."""
    assert result.returncode == 0, result.stderr
    return {doc["critical"]["image"]["docker-manifest-digest"] for doc in json.loads(result.stdout)}


def test_images_and_chart_verify_with_the_release_key(pushed: Pushed) -> None:
    for ref, digest in pushed.digests.items():
        reference = ref.removeprefix("oci://")  # by tag: what a user has before verifying
        assert verified_digests(pushed.verify(reference)) == {digest}, ref
        repository = reference.rsplit(":", 1)[0]
        assert verified_digests(pushed.verify(f"{repository}@{digest}")) == {digest}, ref


def attested_sbom(pushed: Pushed, reference: str) -> dict[str, Any]:
    res = pushed.release.cosign(
        [
            "verify-attestation",
            "--key",
            str(pushed.public_key),
            "--type",
            "spdxjson",
            "--insecure-ignore-tlog=true",
            reference,
        ],
        pushed.ca,
        check=False,
    )
    assert res.returncode == 0, res.stderr
    (line,) = [ln for ln in res.stdout.splitlines() if ln.strip()]
    statement = json.loads(base64.b64decode(json.loads(line)["payload"]))
    assert statement["predicateType"] == "https://spdx.dev/Document", statement["predicateType"]
    return statement["predicate"]


def test_each_image_has_its_sbom_attested(pushed: Pushed) -> None:
    # A Python package each program runs on: the agent's gRPC (the kubelet's device plugin API),
    # the operator's kopf.
    for program, runs_on in (("operator", "kopf"), ("agent", "grpcio")):
        digest = pushed.digests[f"{pushed.image(program)}:{pushed.version}"]
        sbom = attested_sbom(pushed, f"{pushed.image(program)}@{digest}")
        assert sbom["spdxVersion"] == "SPDX-2.3"
        versions = {p["name"]: p.get("versionInfo") for p in sbom["packages"]}
        purls = {r["referenceLocator"] for p in sbom["packages"] for r in p.get("externalRefs", [])}
        assert versions.get(runs_on), (program, sorted(versions))
        assert versions.get(f"patchbay-{program}") == pushed.version, sorted(versions)
        for deb in ("libc6", "python3", "base-files"):  # the Debian base's
            assert versions.get(deb), (deb, sorted(versions))
        assert any(p.startswith("pkg:deb/debian/libc6@") for p in purls), purls
        assert f"pkg:pypi/{runs_on}@{versions[runs_on]}" in purls, purls


def copy_tag(registry: oci.Registry, repository: str, source: str, target: str) -> None:
    """What an attacker with push rights can do: the manifest of ``repository:source`` put under
    the tag ``target`` as it is (the registry API, GET then PUT)."""
    path = f"/v2/{repository.removeprefix(registry.host + '/')}/manifests"
    accept = "application/vnd.oci.image.index.v1+json, application/vnd.oci.image.manifest.v1+json"
    conn = http.client.HTTPSConnection(oci.HOST, registry.port, context=registry.context(), timeout=10)
    try:
        conn.request("GET", f"{path}/{source}", headers={"Accept": accept})
        res = conn.getresponse()
        body, media_type = res.read(), res.getheader("Content-Type", "")
        assert res.status == 200, (res.status, body)
        conn.request("PUT", f"{path}/{target}", body=body, headers={"Content-Type": media_type})
        res = conn.getresponse()
        assert res.status == 201, (res.status, res.read())
    finally:
        conn.close()


def test_a_tampered_image_fails_verification(pushed: Pushed, registry: oci.Registry, tmp_path: Path) -> None:
    repository = pushed.image("operator")
    operator = f"{repository}:{pushed.version}"
    genuine = pushed.digests[operator]
    # Another key's signature is no release signature, even on the genuine image: a key made
    # here, and the project's own (committed, keys/patchbay-release.pub), which signed no test.
    _, other = key_pair(tmp_path / "other", pushed.release)
    for key in (other, REPO / "keys" / "patchbay-release.pub"):
        res = pushed.verify(operator, key)
        assert res.returncode != 0, res.stdout
        assert "signatures do not match" in res.stderr, (key, res.stderr)
    # The agent's image (signed, but in its own repository) pushed under the operator's tag.
    push = ["podman", "push", "--quiet", "--cert-dir", str(registry.cert_dir)]
    subprocess.run(
        [*push, pushed.images["agent"].ref, f"docker://{operator}"], check=True, capture_output=True
    )
    try:
        tampered = registry.manifest_digest(repository, pushed.version)
        assert tampered not in (None, genuine), tampered
        res = pushed.verify(operator)
        assert res.returncode != 0, res.stdout
        assert "no signatures found" in res.stderr, res.stderr
        # ...and the genuine image's signatures copied to the tampered digest: they sign another.
        copy_tag(registry, repository, genuine.replace(":", "-"), str(tampered).replace(":", "-"))
        res = pushed.verify(operator)
        assert res.returncode != 0, res.stdout
        assert "digest does not match" in res.stderr, res.stderr
    finally:
        operator_image = pushed.images["operator"].ref
        subprocess.run([*push, operator_image, f"docker://{operator}"], check=True, capture_output=True)
    # The genuine image, under its tag again, verifies again.
    assert registry.manifest_digest(repository, pushed.version) == genuine
    assert verified_digests(pushed.verify(operator)) == {genuine}
