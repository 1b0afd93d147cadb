"""hack/sbom.py: an image's SBOM from its OCI archive: the dpkg status file's installed packages and
every site-packages METADATA of the final root filesystem (layers in order, whiteouts honoured).
The real images' SBOMs are checked in tests/integration/test_release_push.py."""

from __future__ import annotations

import gzip
import hashlib
import io
import json
import tarfile
from pathlib import Path

import pytest
from support.scripts import load

STATUS = """Package: libc6
Status: install ok installed
Architecture: amd64
Source: glibc
Version: 2.36-9+deb12u14
Description: GNU C Library
 shared libraries

Package: removed-one
Status: deinstall ok config-files
Version: 1.0

Package: base-files
Status: install ok installed
Architecture: amd64
Version: 12.4+deb12u13
"""

SITE = "opt/patchbay/lib/python3.11/site-packages"


def layer(files: dict[str, bytes], gz: bool) -> bytes:
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w") as tar:
        for name, data in files.items():
            info = tarfile.TarInfo(name)
            info.size = len(data)
            tar.addfile(info, io.BytesIO(data))
    return gzip.compress(buf.getvalue()) if gz else buf.getvalue()


def archive(path: Path, layers: list[bytes], config: bytes = b"{}") -> Path:
    blobs: dict[str, bytes] = {}

    def add(data: bytes) -> dict[str, object]:
        digest = "sha256:" + hashlib.sha256(data).hexdigest()
        blobs[digest] = data
        return {"digest": digest, "size": len(data), "mediaType": "application/octet-stream"}

    manifest = add(
        json.dumps({"schemaVersion": 2, "config": add(config), "layers": [add(x) for x in layers]}).encode()
    )
    with tarfile.open(path, "w") as tar:
        for name, data in {"index.json": json.dumps({"manifests": [manifest]}).encode()}.items():
            info = tarfile.TarInfo(name)
            info.size = len(data)
            tar.addfile(info, io.BytesIO(data))
        for digest, data in blobs.items():
            info = tarfile.TarInfo("blobs/" + digest.replace(":", "/"))
            info.size = len(data)
            tar.addfile(info, io.BytesIO(data))
    return path


def metadata(name: str, version: str) -> bytes:
    head = f"Metadata-Version: 2.1\nName: {name}\nVersion: {version}\n"
    return (head + "License-Expression: Apache-2.0\n\nbody\n").encode()


def test_the_final_filesystem_packages_with_their_purls(tmp_path: Path) -> None:
    base = layer({"var/lib/dpkg/status": STATUS.encode()}, gz=True)
    app = layer(
        {
            f"{SITE}/grpcio-1.85.3.dist-info/METADATA": metadata("grpcio", "1.85.3"),
            f"{SITE}/typing_extensions-4.16.0.dist-info/METADATA": metadata("typing_extensions", "4.16.0"),
            f"{SITE}/gone-1.0.dist-info/METADATA": metadata("gone", "1.0"),
            f"{SITE}/not_metadata.txt": b"x",
        },
        gz=False,
    )
    # A later layer deletes one distribution (a whiteout of its directory).
    top = layer({f"{SITE}/.wh.gone-1.0.dist-info": b""}, gz=True)
    doc = load("sbom").sbom(archive(tmp_path / "img.oci.tar", [base, app, top]), "example/image:1.0", 0)

    assert doc["spdxVersion"] == "SPDX-2.3" and doc["creationInfo"]["created"] == "1970-01-01T00:00:00Z"
    by_name = {p["name"]: p for p in doc["packages"]}
    assert set(by_name) == {"example/image:1.0", "libc6", "base-files", "grpcio", "typing_extensions"}
    purls = {p["name"]: p["externalRefs"][0]["referenceLocator"] for p in doc["packages"][1:]}
    assert purls["libc6"] == "pkg:deb/debian/libc6@2.36-9%2Bdeb12u14?arch=amd64&upstream=glibc"
    assert purls["typing_extensions"] == "pkg:pypi/typing-extensions@4.16.0"
    assert by_name["grpcio"]["licenseDeclared"] == "Apache-2.0"
    contained = {r["relatedSpdxElement"] for r in doc["relationships"] if r["relationshipType"] == "CONTAINS"}
    assert contained == {p["SPDXID"] for p in doc["packages"][1:]}


def test_an_opaque_directory_hides_what_lower_layers_had(tmp_path: Path) -> None:
    base = layer(
        {"var/lib/dpkg/status": STATUS.encode(), f"{SITE}/old-1.dist-info/METADATA": metadata("old", "1")},
        gz=False,
    )
    top = layer(
        {f"{SITE}/.wh..wh..opq": b"", f"{SITE}/new-2.dist-info/METADATA": metadata("new", "2")}, gz=False
    )
    doc = load("sbom").sbom(archive(tmp_path / "img.oci.tar", [base, top]), "x", 0)
    names = {p["name"] for p in doc["packages"]}
    assert "new" in names and "old" not in names, names


def test_the_sbom_is_dated_by_the_image_so_the_same_image_gives_the_same_sbom(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.delenv("SOURCE_DATE_EPOCH", raising=False)
    base = layer({"var/lib/dpkg/status": STATUS.encode()}, gz=False)
    config = json.dumps({"created": "2026-11-29T08:31:28.123456789Z"}).encode()
    path = archive(tmp_path / "img.oci.tar", [base], config)
    first, again = (load("sbom").sbom(path, "x") for _ in range(2))
    assert first["creationInfo"]["created"] == "2026-11-29T08:31:28Z"
    assert first == again
