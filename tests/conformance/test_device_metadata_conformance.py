"""The agent's DRA device metadata files, read by upstream's own reader (KEP-5304).

The peer, tests/conformance/metadatareader, is `k8s.io/dynamic-resource-allocation/devicemetadata`
of a release compiled into a small command (hack/go-peer.sh; cached outside the repository), so what is
checked is what a workload built against that library understands of a file the agent wrote
(dra/metadata.py), not the test's reading of the format:

Run against every release of the matrix that has the API (from 1.36):

* v0.37 (Kubernetes 1.37): it takes the `v1beta1` object and its validation passes;
* v0.36 (1.36, the first with the API): it knows only `v1alpha1`, skips the `v1beta1` object and
  reads the same content from the second one;
* and the peer can say no: an attribute name upstream's validation refuses is reported.

A build failure is an error, never a skip.
"""

from __future__ import annotations

import json
import subprocess
from pathlib import Path
from typing import Any

import pytest
from support import gopeer

from patchbay_agent.dra.metadata import ClaimInfo, DeviceMetadataFiles, encode, metadata_objects
from patchbay_devcluster.releases import matrix

pytestmark = pytest.mark.peer

DRIVER, POOL = "serial.patchbay.dev", "node-1"
ATTRS: dict[str, dict[str, Any]] = {
    "ttyusb0-1a2b3c4d": {
        "patchbay.dev/id": {"string": "ttyUSB0"},
        "patchbay.dev/path": {"string": "/dev/ttyUSB0"},
        "patchbay.dev/healthy": {"bool": True},
        "resource.kubernetes.io/pciBusID": {"string": "0000:3b:00.0"},
        "dra.net/numaNode": {"int": 1},
    },
    "ttyusb1-5e6f7a8b": {"patchbay.dev/id": {"string": "ttyUSB1"}, "patchbay.dev/healthy": {"bool": False}},
}


def minor(release: str) -> int:
    return int(release.lstrip("v").split(".")[1])


#: The matrix's releases (hack/kube-releases, its one definition) whose library has the device
#: metadata API: from 1.36; from 1.37 its reader also validates and says which version it took.
WITH_API = [r for r in matrix() if minor(r) >= 36]


def reader(release: str) -> Path:
    return gopeer.build("metadatareader", release)


def read(binary: Path, path: Path) -> dict[str, Any]:
    out = subprocess.run([str(binary), str(path)], capture_output=True, text=True, timeout=30, check=False)
    assert out.returncode == 0, out.stderr
    got: dict[str, Any] = json.loads(out.stdout)
    return got


@pytest.mark.parametrize("release", WITH_API)
def test_upstreams_reader_reads_what_the_agent_wrote(tmp_path: Path, release: str) -> None:
    validates = minor(release) >= 37
    decoded = "metadata.resource.k8s.io/v1beta1" if validates else ""
    validation = "valid" if validates else ""
    binary = reader(release)
    files = DeviceMetadataFiles(DRIVER, POOL, tmp_path / "dra-device-metadata")
    claim = ClaimInfo("lab", "my-pod-serial-x7k2p", "0f7c9a52-9d1e-4c55-8b3e-2f7d1c0a9e11", "serial")
    files.write(claim, [("serial", "ttyusb0-1a2b3c4d"), ("serial/second", "ttyusb1-5e6f7a8b")], ATTRS)
    got = read(binary, files.file(claim, "serial"))
    assert (got["decoded"], got["validation"]) == (decoded, validation)
    assert (got["namespace"], got["name"], got["uid"], got["generation"], got["podClaimName"]) == (
        "lab",
        "my-pod-serial-x7k2p",
        "0f7c9a52-9d1e-4c55-8b3e-2f7d1c0a9e11",
        1,
        "serial",
    )
    ((request,),) = [got["requests"]]
    assert request["name"] == "serial"
    assert [(d["driver"], d["pool"], d["name"], d["attributes"]) for d in request["devices"]] == [
        (DRIVER, POOL, name, attrs) for name, attrs in ATTRS.items()
    ]

    # A rewrite (a health change) is read as generation 2 by the same reader.
    well = {
        **ATTRS,
        "ttyusb1-5e6f7a8b": {**ATTRS["ttyusb1-5e6f7a8b"], "patchbay.dev/healthy": {"bool": True}},
    }
    assert files.refresh(lambda: well) == 1
    assert read(binary, files.file(claim, "serial"))["generation"] == 2


def test_the_reader_refuses_what_upstream_refuses(tmp_path: Path) -> None:
    """The peer is no yes-man: a device name that is no DNS label (slice device names are) fails
    upstream's validation."""
    newest = matrix()[-1]
    assert minor(newest) >= 37, f"the matrix's newest release {newest} has no validating reader"
    binary = reader(newest)
    claim = ClaimInfo("lab", "c", "uid-1")
    bad = {"Dev_0": {"patchbay.dev/id": {"string": "x"}}}
    path = tmp_path / "metadata.json"
    path.write_text(
        encode(
            metadata_objects(
                DRIVER, POOL, claim, request="r", devices=["Dev_0"], attributes=bad, generation=1
            )
        )
    )
    got = read(binary, path)
    assert got["validation"] != "valid" and "requests[0].devices[0].name" in got["validation"], got
