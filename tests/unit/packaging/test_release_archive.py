"""`make release`'s image archives (hack/release.py): the image `make images` built, under the name
the chart's defaults use. Checked on a small OCI archive made the way the node's images are."""

from __future__ import annotations

import hashlib
import io
import json
import tarfile
from pathlib import Path

import pytest
from support.scripts import load

from patchbay_devcluster.images import File, oci_archive

REPO = Path(__file__).resolve().parents[3]


def members(source: Path | bytes) -> dict[str, bytes]:
    """The files of a tar archive (a file, or its bytes): ``{name: data}``."""
    out: dict[str, bytes] = {}
    with tarfile.open(
        fileobj=io.BytesIO(source if isinstance(source, bytes) else source.read_bytes())
    ) as tar:
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


def archive_for(arch: str, path: Path, payload: bytes) -> Path:
    """A small OCI archive of one image whose config says ``arch`` (made as the node's images are,
    then its config and manifest rewritten)."""
    built = members(oci_archive("example.com/x:1", [File("bin/x", payload)], ["/bin/x"]))
    index = json.loads(built["index.json"])
    manifest_name = "blobs/" + index["manifests"][0]["digest"].replace(":", "/")
    manifest = json.loads(built.pop(manifest_name))
    config = json.loads(built.pop("blobs/" + manifest["config"]["digest"].replace(":", "/")))
    config["architecture"] = arch

    def put(data: bytes) -> dict[str, object]:
        digest = hashlib.sha256(data).hexdigest()
        built[f"blobs/sha256/{digest}"] = data
        return {"digest": f"sha256:{digest}", "size": len(data)}

    manifest["config"].update(put(json.dumps(config).encode()))
    index["manifests"][0].update(put(json.dumps(manifest).encode()))
    built["index.json"] = json.dumps(index).encode()
    with tarfile.open(path, "w") as tar:
        for name, data in built.items():
            info = tarfile.TarInfo(name)
            info.size = len(data)
            tar.addfile(info, io.BytesIO(data))
    return path


def test_the_platforms_of_an_image_are_one_index_in_the_release_archive(tmp_path: Path) -> None:
    amd64 = archive_for("amd64", tmp_path / "amd64.oci.tar", b"x86")
    arm64 = archive_for("arm64", tmp_path / "arm64.oci.tar", b"arm")
    target = tmp_path / "patchbay-agent-0.2.0.oci.tar"
    ref = "ghcr.io/kube-patchbay/patchbay-agent:0.2.0"
    release = load("release")
    digest = release.index_archive({"amd64": amd64, "arm64": arm64}, target, ref)

    after = members(target)
    (entry,) = json.loads(after["index.json"])["manifests"]
    assert entry["digest"] == digest
    assert entry["mediaType"] == "application/vnd.oci.image.index.v1+json"
    assert entry["annotations"] == {
        "io.containerd.image.name": ref,
        "org.opencontainers.image.ref.name": "0.2.0",
    }
    index = json.loads(after["blobs/" + digest.replace(":", "/")])
    listed = {m["platform"]["architecture"]: m["digest"] for m in index["manifests"]}
    for arch, source in (("amd64", amd64), ("arm64", arm64)):
        (own,) = json.loads(members(source)["index.json"])["manifests"]
        assert listed[arch] == own["digest"], arch  # each platform's image as it was built
    # Every blob of both images is there, each where its digest says.
    assert set(members(amd64)) - {"index.json"} <= set(after)
    assert set(members(arm64)) - {"index.json"} <= set(after)
    for name, data in after.items():
        if name.startswith("blobs/sha256/"):
            assert hashlib.sha256(data).hexdigest() == name.rsplit("/", 1)[1]
    # An image given as another architecture than its config says is refused.
    with pytest.raises(SystemExit, match="its image is amd64, given as the arm64 image"):
        release.index_archive({"amd64": amd64, "arm64": amd64}, tmp_path / "wrong.oci.tar", ref)
