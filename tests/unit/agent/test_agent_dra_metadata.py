"""DRA device metadata files (dra/metadata.py) on a tmp tree: upstream's layout and stream, the
generation rule, and what unprepare may delete."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from patchbay_agent.config import ConfigError, parse
from patchbay_agent.dra.metadata import (
    ClaimInfo,
    DeviceMetadataFiles,
    base_request,
    container_path,
    decode_first,
    encode,
    metadata_objects,
)

DRIVER, POOL = "gpu.example.com", "node-a"
ATTRS: dict[str, dict[str, Any]] = {
    "dev-0": {"patchbay.dev/id": {"string": "card0"}, "patchbay.dev/healthy": {"bool": True}},
    "dev-1": {"patchbay.dev/id": {"string": "card1"}, "patchbay.dev/healthy": {"bool": True}},
}


def stream(path: Path) -> list[dict[str, Any]]:
    text, decoder, out = path.read_text(), json.JSONDecoder(), []
    rest = text.lstrip()
    while rest:
        obj, end = decoder.raw_decode(rest)
        out.append(obj)
        rest = rest[end:].lstrip()
    return out


def test_the_stream_holds_the_same_object_once_per_version_newest_first() -> None:
    claim = ClaimInfo("ns", "claim", "uid-1", "gpu")
    objs = metadata_objects(
        DRIVER, POOL, claim, request="req", devices=["dev-0"], attributes=ATTRS, generation=7
    )
    assert [o["apiVersion"] for o in objs] == [
        "metadata.resource.k8s.io/v1beta1",
        "metadata.resource.k8s.io/v1alpha1",
    ]
    # The field names of upstream's DeviceMetadata (api/metadata/types.go, v0.37).
    assert objs[0] == {
        "kind": "DeviceMetadata",
        "apiVersion": "metadata.resource.k8s.io/v1beta1",
        "metadata": {"name": "claim", "namespace": "ns", "uid": "uid-1", "generation": 7},
        "podClaimName": "gpu",
        "requests": [
            {
                "name": "req",
                "devices": [
                    {"driver": DRIVER, "pool": POOL, "name": "dev-0", "attributes": ATTRS["dev-0"]},
                ],
            }
        ],
    }
    text = encode(objs)
    assert text.count("\n{") == 1 and text.endswith("}\n")
    assert decode_first(text) == objs[0]
    # A reader skips objects of versions it does not know, and what is not JSON ends it.
    assert (
        decode_first('{"kind": "DeviceMetadata", "apiVersion": "metadata.resource.k8s.io/v9"}\n' + text)
        == (objs[0])
    )
    assert decode_first("not json") is None


def test_container_paths_for_a_named_claim_and_a_template_claim() -> None:
    named = ClaimInfo("ns", "shared-gpu", "u")
    made = ClaimInfo("ns", "pod-gpu-x7k2p", "u", pod_claim_name="gpu")
    root = "/var/run/kubernetes.io/dra-device-attributes"
    assert (
        container_path(DRIVER, named, "req") == f"{root}/resourceclaims/shared-gpu/req/{DRIVER}-metadata.json"
    )
    assert (
        container_path(DRIVER, made, "req") == f"{root}/resourceclaimtemplates/gpu/req/{DRIVER}-metadata.json"
    )
    assert ClaimInfo.of(
        {"metadata": {"annotations": {"resource.kubernetes.io/pod-claim-name": "gpu"}}}, "ns", "n", "u"
    ) == ClaimInfo("ns", "n", "u", "gpu")
    assert ClaimInfo.of({"metadata": "junk"}, "ns", "n", "u") == ClaimInfo("ns", "n", "u")


def test_a_pod_claim_name_that_could_leave_its_directory_is_refused() -> None:
    for bad in ("../../etc", "a/b", "x\x00", "Gpu"):
        claim = {"metadata": {"annotations": {"resource.kubernetes.io/pod-claim-name": bad}}}
        with pytest.raises(ValueError, match=r"annotation resource.kubernetes.io/pod-claim-name"):
            ClaimInfo.of(claim, "ns", "n", "u")


def test_a_subrequest_shares_its_request_file() -> None:
    assert base_request("gpu/high-memory") == "gpu"
    assert base_request("gpu") == "gpu"


def test_write_refresh_and_remove(tmp_path: Path) -> None:
    files = DeviceMetadataFiles(DRIVER, POOL, tmp_path / "dra-device-metadata")
    claim = ClaimInfo("ns", "c", "uid-1")
    mounts = files.write(claim, [("req/small", "dev-0"), ("req/large", "dev-1"), ("other", "dev-1")], ATTRS)
    assert sorted(mounts) == ["other", "req"]
    path = files.file(claim, "req")
    assert mounts["req"]["name"] == "uid-1_req"
    assert mounts["req"]["containerEdits"]["mounts"][0]["hostPath"] == str(path)
    (first, _) = stream(path)
    assert [d["name"] for d in first["requests"][0]["devices"]] == ["dev-0", "dev-1"]
    assert first["metadata"]["generation"] == 1
    inode = path.stat().st_ino

    # Nothing changed: nothing written; prepared again: the same generation.
    assert files.refresh(lambda: ATTRS) == 0
    files.write(claim, [("req/small", "dev-0"), ("req/large", "dev-1"), ("other", "dev-1")], ATTRS)
    assert stream(path)[0]["metadata"]["generation"] == 1

    # dev-1 turns unhealthy: both files that list it are rewritten, in place, generation 2.
    sick = {**ATTRS, "dev-1": {**ATTRS["dev-1"], "patchbay.dev/healthy": {"bool": False}}}
    assert files.refresh(lambda: sick) == 2
    beta, alpha = stream(path)
    assert beta["metadata"]["generation"] == alpha["metadata"]["generation"] == 2
    assert beta["requests"][0]["devices"][1]["attributes"]["patchbay.dev/healthy"] == {"bool": False}
    assert path.stat().st_ino == inode
    assert files.refresh(lambda: sick) == 0

    # A file someone else wrote is left as it is.
    stranger = tmp_path / "dra-device-metadata" / "ns_x" / "r" / "metadata.json"
    stranger.parent.mkdir(parents=True)
    stranger.write_text('{"kind": "DeviceMetadata", "apiVersion": "metadata.resource.k8s.io/v1beta1"}')
    assert files.refresh(lambda: ATTRS) == 2
    assert stranger.read_text().startswith('{"kind"')

    # Unprepare of an older claim of the same name leaves the newer claim's files.
    files.remove("ns", "c", "uid-0")
    assert path.exists()
    files.remove("ns", "c", "uid-1")
    assert not path.parent.parent.exists()
    files.remove("ns", "c", "uid-1")  # twice: fine


def test_the_profile_field_is_a_bool_and_on_by_default() -> None:
    base = {"resourceName": "example.com/gpu", "plugin": {"discovery": {"virtual": {"count": 1}}}}
    assert parse(base).allocation.device_metadata is True
    off = {**base, "plugin": {**base["plugin"], "allocation": {"deviceMetadata": False}}}
    assert parse(off).allocation.device_metadata is False
    bad = {**base, "plugin": {**base["plugin"], "allocation": {"deviceMetadata": "yes"}}}
    with pytest.raises(ConfigError, match=r"plugin\.allocation\.deviceMetadata"):
        parse(bad)
