"""DRA mode's claims: from a ResourceClaim's allocation to a CDI spec file and the kubelet's answer.
Pure: no I/O (`dra/preparer.py` reads the claim and writes the file).

NodePrepareResources hands the kubelet CDI device IDs, which the container runtime resolves in the
spec files of its CDI directories (docs/cdi.md). A claim's devices are fixed for the claim's
life, so each prepared claim gets its OWN spec file, `patchbay_<driver>_<claim uid>.json`, with
kind `<driver>/device` and one CDI device per allocated device named `<claim uid>-<device name>`:

* the file is the agent's only state: NodeUnprepareResources deletes it by name, which works after
  the claim object is gone and after an agent restart (docs/dra.md#prepare);
* names that include the claim UID never collide between claims, so two claims' files never make
  the runtime refuse a name as defined twice;
* the spec-level container edits carry what the device plugin's Allocate gives every container:
  the config's envs and mounts and `<devicesEnvName>=<physical IDs, comma-joined>`.
"""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from patchbay_agent.cdi import CDI_VERSION, device_nodes
from patchbay_agent.config import Allocation
from patchbay_agent.core.inventory import DeviceSpec
from patchbay_agent.dra.slices import Place

#: The env var that names a claim's partitions and their places (docs/dra.md#partitions).
PARTITIONS_ENV = "PATCHBAY_PARTITIONS"


class ClaimError(Exception):
    """A claim the agent cannot prepare; the message goes into the claim's `error` field."""


@dataclass(frozen=True)
class AllocatedDevice:
    """One allocation result of our driver and pool, mapped to the physical device."""

    request: str
    device_name: str
    physical_id: str
    #: which share of a device that allows multiple allocations (consumable capacity); "" else
    share_id: str = ""
    #: a partition's place on its device; None for a whole device
    place: Place | None = None


#: What a claim UID may look like: Kubernetes UIDs are RFC 4122 strings; this admits any
#: letters, digits, dots, dashes and underscores, never a path separator or a NUL, since the UID
#: names a file in the runtime's CDI directory (found by tests/fuzz/test_fuzz_dra.py).
_CLAIM_UID = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]{0,127}")


def check_claim_uid(uid: str) -> str | None:
    """Why `uid` cannot be a claim's UID, or None when it can."""
    if _CLAIM_UID.fullmatch(uid) and ".." not in uid:
        return None
    return f"claim UID {uid[:80]!r} is not a Kubernetes UID (letters, digits, '.', '-', '_'; at most 128)"


_DNS_LABEL = r"[a-z0-9]([-a-z0-9]{0,61}[a-z0-9])?"
#: A namespace is a DNS-1123 label; a ResourceClaim's name a DNS-1123 subdomain (at most 253).
_NAMESPACE = re.compile(_DNS_LABEL)
_CLAIM_NAME = re.compile(rf"{_DNS_LABEL}(\.{_DNS_LABEL})*")
#: A request of an allocation result: a DNS label, or `request/subrequest` (both labels).
_REQUEST = re.compile(rf"{_DNS_LABEL}(/{_DNS_LABEL})?")


def check_claim_name(namespace: str, name: str) -> str | None:
    """Why `namespace`/`name` cannot name a ResourceClaim, or None when they can. Both name
    directories of the claim's device metadata files, so a NUL, a `/` or a `..` must never get
    that far (a NUL in a name was found by tests/fuzz/test_fuzz_dra.py)."""
    if not _NAMESPACE.fullmatch(namespace):
        return f"claim namespace {namespace[:80]!r} is not a DNS-1123 label (a-z, 0-9, '-'; at most 63)"
    if len(name) > 253 or not _CLAIM_NAME.fullmatch(name):
        return f"claim name {name[:80]!r} is not a DNS-1123 subdomain (a-z, 0-9, '-', '.'; at most 253)"
    return None


def is_request_name(request: str) -> bool:
    """True for a request name as the API server admits it: `gpu` or `gpu/fast`."""
    return _REQUEST.fullmatch(request) is not None


def spec_file_name(driver: str, claim_uid: str) -> str:
    """`patchbay_<driver>_<claim uid>.json`: one file per prepared claim."""
    return f"patchbay_{driver}_{claim_uid}.json"


def cdi_kind(driver: str) -> str:
    return f"{driver}/device"


def cdi_device_name(claim_uid: str, device_name: str) -> str:
    return f"{claim_uid}-{device_name}"


def cdi_device_id(driver: str, claim_uid: str, device_name: str) -> str:
    """The fully qualified CDI name the kubelet passes to the runtime."""
    return f"{cdi_kind(driver)}={cdi_device_name(claim_uid, device_name)}"


def allocated_devices(
    claim: Mapping[str, Any],
    uid: str,
    driver: str,
    pool: str,
    names: Mapping[str, str],
    *,
    places: Mapping[str, Place] | None = None,
) -> list[AllocatedDevice]:
    """Our devices in `claim`'s allocation, each mapped to its physical device through `names`
    (slice device name -> physical ID) and, for a partition, its place through `places`. Raises
    ClaimError when the claim is not the one the kubelet means (another UID: deleted and
    recreated under the same name), is not allocated, or names a device this node does not
    have."""
    if not isinstance(claim, Mapping):
        raise ClaimError(f"the API server answered {type(claim).__name__}, not a ResourceClaim")
    got = _field(claim, "metadata").get("uid")
    if got != uid:
        raise ClaimError(f"claim UID is {got!r}, not {uid!r} (the claim was replaced)")
    allocation = _field(_field(claim, "status"), "allocation")
    if not allocation:
        raise ClaimError("claim is not allocated")
    results = _field(allocation, "devices").get("results") or []
    if not isinstance(results, list):
        raise ClaimError(f"status.allocation.devices.results is {type(results).__name__}, not a list")
    out = []
    for i, result in enumerate(results):
        if not isinstance(result, Mapping):
            raise ClaimError(
                f"status.allocation.devices.results[{i}] is {type(result).__name__}, not an object"
            )
        if result.get("driver") != driver or result.get("pool") != pool:
            continue
        name = str(result.get("device", ""))
        physical = names.get(name)
        if physical is None:
            raise ClaimError(f"device {name!r} of pool {pool} is not a device of this node")
        request = str(result.get("request", ""))
        if not is_request_name(request):
            raise ClaimError(
                f"status.allocation.devices.results[{i}].request {request[:80]!r} is not a request"
                " name (a DNS-1123 label, or request/subrequest)"
            )
        share = result.get("shareID")
        out.append(
            AllocatedDevice(
                request,
                name,
                physical,
                str(share) if share else "",
                (places or {}).get(name),
            )
        )
    return out


def _field(obj: Mapping[str, Any], key: str) -> Mapping[str, Any]:
    """`obj[key]` when it is an object, else empty: a claim is read defensively, since the
    kubelet's request names it and the API server's answer is only as good as its schema."""
    value = obj.get(key)
    return value if isinstance(value, Mapping) else {}


def device_env_name(device_name: str) -> str:
    """`PATCHBAY_DEVICE_<NAME>`: the env var a device without device files is given."""
    return "PATCHBAY_DEVICE_" + re.sub(r"[^A-Z0-9]", "_", device_name.upper())


def claim_spec_document(
    driver: str,
    claim_uid: str,
    devices: Sequence[AllocatedDevice],
    specs: Mapping[str, Sequence[DeviceSpec]],
    allocation: Allocation,
) -> dict[str, Any]:
    """The claim's CDI spec: one device per allocated device (its device nodes), and the config's
    envs and mounts plus the devices env for the whole claim."""
    physical = list(dict.fromkeys(d.physical_id for d in devices))
    env = {**allocation.envs, allocation.devices_env_name: ",".join(physical)}
    cut = [f"{d.physical_id}:{d.place.first}-{d.place.last}/{d.place.slots}" for d in devices if d.place]
    if cut:
        env[PARTITIONS_ENV] = ",".join(dict.fromkeys(cut))
    edits: dict[str, Any] = {"env": [f"{k}={v}" for k, v in env.items()]}
    if allocation.mounts:
        edits["mounts"] = [
            {
                "hostPath": m.host_path,
                "containerPath": m.container_path,
                "type": "bind",
                "options": ["rbind", "ro" if m.read_only else "rw"],
            }
            for m in allocation.mounts
        ]
    cdi_devices = []
    for d in dict((d.device_name, d) for d in devices).values():
        nodes = device_nodes(specs.get(d.physical_id, ()))
        # CDI refuses a device with empty edits; a device without files (a virtual token) gets
        # one env var that names it instead.
        device_edits: dict[str, Any] = (
            {"deviceNodes": nodes}
            if nodes
            else {"env": [f"{device_env_name(d.device_name)}={d.physical_id}"]}
        )
        cdi_devices.append(
            {"name": cdi_device_name(claim_uid, d.device_name), "containerEdits": device_edits}
        )
    return {
        "cdiVersion": CDI_VERSION,
        "kind": cdi_kind(driver),
        "devices": cdi_devices,
        "containerEdits": edits,
    }
