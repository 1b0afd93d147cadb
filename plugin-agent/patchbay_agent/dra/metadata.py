"""DRA device metadata in the container (KEP-5304): which device a container got, read from a file.

At prepare, a DRA driver may write, per request of a claim, a file that names the devices it
prepared for that request with their attributes, and have the runtime bind-mount it read-only
into every container that uses the claim (a CDI device the driver adds to its answer). A
workload then knows its device, its NUMA node or PCI address without calling the API server.
The layout and format are upstream's (`k8s.io/dynamic-resource-allocation`, `api/metadata` and
`kubeletplugin/metadata.go`, v0.37; docs/dra.md#device-metadata has them as facts), and this
module writes exactly them:

* on the host: `<driver's service dir>/dra-device-metadata/<namespace>_<claim>/<request>/metadata.json`
  (the kubelet's plugins directory: on the node's disk, so a reboot keeps it);
* in the container, under `/var/run/kubernetes.io/dra-device-attributes`:
  `resourceclaims/<claim>/<request>/<driver>-metadata.json` for a claim the pod names,
  `resourceclaimtemplates/<pod's claim name>/<request>/...` for a claim made from a template
  (its name is generated; the pod's own name for it comes from the claim's
  `resource.kubernetes.io/pod-claim-name` annotation);
* the file: a stream of JSON objects, the same `DeviceMetadata` once per API version, newest
  first (`metadata.resource.k8s.io/v1beta1`, then `v1alpha1`), so a reader takes the first
  version it knows; `metadata.generation` starts at 1 and counts up on every rewrite.

Patchbay's differences from the upstream library, both deliberate: the mount is one more CDI
device in the claim's own spec file (named `<claim uid>_<request>` like upstream's), so the spec
copies that survive a reboot (cdi.py) cover it too; and the file is rewritten, its generation
counted up, whenever a prepared device's attributes or health change (`patchbay.dev/healthy`, a
bool this module adds), where the library leaves that to the driver.

Pure except `DeviceMetadataFiles`, which owns the files (one lock: prepare, unprepare and a
health change's refresh never interleave on one file).
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import re
import shutil
import threading
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from patchbay_agent.kubelet.draplugin import base_request

log = logging.getLogger(__name__)

#: The API group of the file's objects, and its versions, newest first (what the stream holds).
GROUP = "metadata.resource.k8s.io"
VERSIONS = (f"{GROUP}/v1beta1", f"{GROUP}/v1alpha1")
KIND = "DeviceMetadata"
#: Where the files are in the container, and its two kinds of claims' subdirectories.
CONTAINER_DIR = "/var/run/kubernetes.io/dra-device-attributes"
CLAIMS_SUBDIR = "resourceclaims"
TEMPLATES_SUBDIR = "resourceclaimtemplates"
#: The host directory under the driver's service directory.
HOST_SUBDIR = "dra-device-metadata"
FILE_NAME = "metadata.json"
#: The claim annotation with the pod's own name for a claim made from a template.
POD_CLAIM_ANNOTATION = "resource.kubernetes.io/pod-claim-name"
_POD_CLAIM_NAME = re.compile(r"[a-z0-9]([-a-z0-9]{0,61}[a-z0-9])?")
#: The attribute this module adds to every device: whether it is healthy now.
HEALTHY_ATTRIBUTE = "patchbay.dev/healthy"

#: Attributes by slice device name (what `DeviceMetadataFiles` asks for at prepare and refresh).
Attributes = Mapping[str, Mapping[str, Any]]


@dataclass(frozen=True)
class ClaimInfo:
    """What the file says of its claim, from the ResourceClaim object."""

    namespace: str
    name: str
    uid: str
    #: the pod's own name for a claim made from a template; None for a claim the pod names
    pod_claim_name: str | None = None

    @classmethod
    def of(cls, claim: Mapping[str, Any], namespace: str, name: str, uid: str) -> ClaimInfo:
        meta = claim.get("metadata")
        annotations = meta.get("annotations") if isinstance(meta, Mapping) else None
        pod_name = annotations.get(POD_CLAIM_ANNOTATION) if isinstance(annotations, Mapping) else None
        if pod_name and not _POD_CLAIM_NAME.fullmatch(str(pod_name)):
            # It names a directory in the container (container_path): never a `..` or a `/`.
            raise ValueError(
                f"annotation {POD_CLAIM_ANNOTATION} {str(pod_name)[:80]!r} is not a pod's claim name"
                " (a DNS-1123 label)"
            )
        return cls(namespace, name, uid, str(pod_name) if pod_name else None)


def container_path(driver: str, claim: ClaimInfo, request: str) -> str:
    """Where the container reads the request's file (the module doc)."""
    if claim.pod_claim_name:
        return f"{CONTAINER_DIR}/{TEMPLATES_SUBDIR}/{claim.pod_claim_name}/{request}/{driver}-metadata.json"
    return f"{CONTAINER_DIR}/{CLAIMS_SUBDIR}/{claim.name}/{request}/{driver}-metadata.json"


def cdi_device_name(claim_uid: str, request: str) -> str:
    """`<claim uid>_<request>`: never one of the claim's device names (`<uid>-<device>`)."""
    return f"{claim_uid}_{request}"


def metadata_objects(
    driver: str,
    pool: str,
    claim: ClaimInfo,
    *,
    request: str,
    devices: Sequence[str],
    attributes: Attributes,
    generation: int,
) -> list[dict[str, Any]]:
    """The file's objects, one per version of `VERSIONS` (the same content in each)."""
    body: dict[str, Any] = {
        "metadata": {
            "name": claim.name,
            "namespace": claim.namespace,
            "uid": claim.uid,
            "generation": generation,
        },
    }
    if claim.pod_claim_name:
        body["podClaimName"] = claim.pod_claim_name
    listed = []
    for name in devices:
        entry: dict[str, Any] = {"driver": driver, "pool": pool, "name": name}
        attrs = attributes.get(name)
        if attrs:
            entry["attributes"] = {k: dict(v) for k, v in sorted(attrs.items())}
        listed.append(entry)
    body["requests"] = [{"name": request, "devices": listed}]
    return [{"kind": KIND, "apiVersion": version, **body} for version in VERSIONS]


def encode(objects: Sequence[Mapping[str, Any]]) -> str:
    """A JSON stream: each object indented, one after the other, each ending in a newline."""
    return "".join(json.dumps(obj, indent=2) + "\n" for obj in objects)


def decode_first(text: str) -> dict[str, Any] | None:
    """The stream's first object of a version this module writes, or None (what a reader does)."""
    decoder, at = json.JSONDecoder(), 0
    while True:
        while at < len(text) and text[at].isspace():
            at += 1
        if at >= len(text):
            return None
        try:
            obj, at = decoder.raw_decode(text, at)
        except ValueError:
            return None
        if isinstance(obj, dict) and obj.get("kind") == KIND and obj.get("apiVersion") in VERSIONS:
            return obj


class DeviceMetadataFiles:
    """The metadata files of one driver's prepared claims (the module doc)."""

    def __init__(self, driver: str, pool: str, root: Path) -> None:
        """`root`: `<the driver's service dir>/dra-device-metadata`."""
        self.driver = driver
        self.pool = pool
        self.root = root
        self._lock = threading.Lock()

    def file(self, claim: ClaimInfo, request: str) -> Path:
        return self.root / f"{claim.namespace}_{claim.name}" / request / FILE_NAME

    def write(
        self, claim: ClaimInfo, devices: Sequence[tuple[str, str]], attributes: Attributes
    ) -> dict[str, dict[str, Any]]:
        """Write the file of every request of `devices` ((request, slice device name) pairs) at
        generation 1; returns the CDI devices that mount them by request (for the claim's spec).
        Raises OSError. A file already there for this claim UID (prepare again) keeps its
        generation when nothing changed, and counts it up when something did."""
        # A request's file, by its base name (`gpu` of `gpu/fast`); the content names the
        # request as the allocation does, subrequest included (upstream's rule).
        by_request: dict[str, tuple[str, list[str]]] = {}
        for request, name in devices:
            _, names = by_request.setdefault(base_request(request), (request, []))
            if name not in names:
                names.append(name)
        out: dict[str, dict[str, Any]] = {}
        with self._lock:
            for request, (full_name, names) in by_request.items():
                path = self.file(claim, request)
                self._write(path, claim, full_name, names, attributes, first=True)
                out[request] = {
                    "name": cdi_device_name(claim.uid, request),
                    "containerEdits": {
                        "mounts": [
                            {
                                "hostPath": str(path),
                                "containerPath": container_path(self.driver, claim, request),
                                "type": "bind",
                                "options": ["ro", "bind"],
                            }
                        ]
                    },
                }
        return out

    def _write(
        self,
        path: Path,
        claim: ClaimInfo,
        request: str,
        names: Sequence[str],
        attributes: Attributes,
        *,
        first: bool,
    ) -> bool:
        """Write the file if its content changed (generation + 1, or 1 for a new claim); True
        when it wrote."""
        old = _read(path)
        generation = 1
        if old is not None and (old.get("metadata") or {}).get("uid") == claim.uid:
            previous = int((old.get("metadata") or {}).get("generation") or 1)
            if self._objects(claim, request, names, attributes, previous)[0] == old:
                return False
            generation = previous + 1
        elif not first:
            return False
        _write_in_place(path, encode(self._objects(claim, request, names, attributes, generation)))
        return True

    def _objects(
        self, claim: ClaimInfo, request: str, names: Sequence[str], attributes: Attributes, generation: int
    ) -> list[dict[str, Any]]:
        return metadata_objects(
            self.driver,
            self.pool,
            claim,
            request=request,
            devices=names,
            attributes=attributes,
            generation=generation,
        )

    def remove(self, namespace: str, name: str, uid: str) -> None:
        """Delete the claim's files, unless they are another claim's of the same name (recreated
        under it and prepared since). Raises OSError."""
        directory = self.root / f"{namespace}_{name}"
        with self._lock:
            for path in directory.glob(f"*/{FILE_NAME}"):
                old = _read(path)
                if old is not None and (old.get("metadata") or {}).get("uid") not in (uid, None):
                    return
            if directory.exists():
                shutil.rmtree(directory)

    def refresh(self, attributes: Callable[[], Attributes]) -> int:
        """Rewrite every file whose devices' attributes or health changed (its generation counted
        up); returns how many it rewrote. A file it cannot read or write is logged and left."""
        written = 0
        with self._lock:
            attrs: Attributes | None = None
            for path in sorted(self.root.glob(f"*/*/{FILE_NAME}")):
                old = _read(path)
                if old is None:
                    continue
                try:
                    claim, request, names = _parsed(old)
                except (KeyError, TypeError, ValueError):
                    log.warning("Device metadata %s is not ours to update: left as it is", path)
                    continue
                if attrs is None:
                    attrs = attributes()
                try:
                    written += self._write(path, claim, request, names, attrs, first=False)
                except OSError as e:
                    log.error("Cannot update the device metadata %s: %s", path, e)
        return written


def _parsed(obj: Mapping[str, Any]) -> tuple[ClaimInfo, str, list[str]]:
    meta = obj["metadata"]
    (req,) = obj["requests"]
    claim = ClaimInfo(str(meta["namespace"]), str(meta["name"]), str(meta["uid"]), obj.get("podClaimName"))
    return claim, str(req["name"]), [str(d["name"]) for d in req["devices"]]


def _read(path: Path) -> dict[str, Any] | None:
    with contextlib.suppress(OSError, UnicodeDecodeError):
        return decode_first(path.read_text())
    return None


def _write_in_place(path: Path, text: str) -> None:
    """Write the file over itself, never a new file renamed over it: a container's bind mount
    holds the file's inode, so a renamed-over file would leave the container reading the old
    one for its life (upstream's writer writes in place too). The file is a few hundred bytes,
    written in one call."""
    path.parent.mkdir(parents=True, exist_ok=True)
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_CLOEXEC, 0o644)
    with os.fdopen(fd, "w") as f:
        f.write(text)
