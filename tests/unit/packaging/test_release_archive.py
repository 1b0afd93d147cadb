"""`make release`'s image archives (hack/release.py): the image `make images` built, under the name
the chart's defaults use. Checked on a small OCI archive made the way the node's images are."""

from __future__ import annotations

import hashlib
import json
import tarfile
from pathlib import Path

from support.scripts import load

from patchbay_devcluster.images import File, oci_archive

REPO = Path(__file__).resolve().parents[3]


def members(path: Path) -> dict[str, bytes]:
    out: dict[str, bytes] = {}
    with tarfile.open(path) as tar:
        for m in tar:
            if m.isfile():
                f = tar.extractfile(m)
                assert f is not None
                out[m.name] = f.read()
    return out


def test_the_release_archive_names_the_image_by_version_and_keeps_every_blob(tmp_path: Path) -> None:
    built = tmp_path / "built.oci.tar"
    repository = "ghcr.io/kube-patchbay/patchbay-agent"
    built.write_bytes(oci_archive(f"{repository}:0.2.0-0123456789ab", [File("bin/x", b"x")], ["/bin/x"]))
    target = tmp_path / "patchbay-agent-0.2.0.oci.tar"
    load("release").renamed_archive(built, target, f"{repository}:0.2.0")

    before, after = members(built), members(target)
    assert {k: v for k, v in after.items() if k != "index.json"} == {
        k: v for k, v in before.items() if k != "index.json"
    }
    (entry,) = json.loads(after["index.json"])["manifests"]
    (old,) = json.loads(before["index.json"])["manifests"]
    assert entry["digest"] == old["digest"]  # the same image
    assert entry["annotations"] == {
        "io.containerd.image.name": f"{repository}:0.2.0",
        "org.opencontainers.image.ref.name": "0.2.0",
    }
    # Every blob is where its digest says.
    for name, data in after.items():
        if name.startswith("blobs/sha256/"):
            assert hashlib.sha256(data).hexdigest() == name.rsplit("/", 1)[1]
