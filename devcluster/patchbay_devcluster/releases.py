"""The Kubernetes support matrix and what each release of it can do.

The matrix itself has ONE definition, ``hack/kube-releases`` (read by ``hack/kube-binaries.sh``,
the Makefile and this module). The capability table below says, for each behaviour Patchbay
relies on that depends on the release, the first release of the matrix that has it; the tests
skip a capability's checks on releases before that (naming the release and the reason), and
``hack/generate.py`` writes the same table into docs/compatibility.md, so the doc and the skips
cannot disagree.

Where a capability comes from (feature gates in each release's ``pkg/features/kube_features.go``,
the device manager in ``pkg/kubelet/cm/devicemanager``) is in docs/compatibility.md and
docs/facts.md#kubelet-endpoints.
"""

from __future__ import annotations

import re
import subprocess
from dataclasses import dataclass
from pathlib import Path

#: The repository checkout this (development-only, editable-installed) package lives in.
REPO = Path(__file__).resolve().parents[2]
RELEASES_FILE = REPO / "hack" / "kube-releases"


def matrix(path: Path = RELEASES_FILE) -> list[str]:
    """The supported releases, oldest first (the last one is the default)."""
    lines = (line.strip() for line in path.read_text().splitlines())
    return [line for line in lines if line and not line.startswith("#")]


def minor(release: str) -> tuple[int, int]:
    """``v1.34.4`` -> ``(1, 34)``; raises ValueError for anything else."""
    m = re.fullmatch(r"v?(\d+)\.(\d+)(?:\.\d+)?(?:[-+].*)?", release.strip())
    if m is None:
        raise ValueError(f"not a Kubernetes release: {release!r}")
    return int(m.group(1)), int(m.group(2))


def release_of(bin_dir: Path) -> str:
    """The release a bin dir holds, as its kube-apiserver reports it (``v1.34.4``)."""
    out = subprocess.run(
        [str(bin_dir / "kube-apiserver"), "--version"], capture_output=True, text=True, check=True, timeout=30
    ).stdout
    m = re.search(r"v\d+\.\d+\.\d+\S*", out)
    if m is None:
        raise ValueError(f"{bin_dir / 'kube-apiserver'} --version printed no release: {out!r}")
    return m.group(0)


@dataclass(frozen=True)
class Capability:
    """A release-dependent behaviour: what it is, from which minor on, what Patchbay does without."""

    name: str
    since: str
    what: str
    without: str

    def present(self, release: str) -> bool:
        return minor(release) >= minor(self.since)


CAPABILITIES: dict[str, Capability] = {
    c.name: c
    for c in (
        Capability(
            "device-plugin-endpoint-per-socket",
            "v1.37",
            "the kubelet keeps one device-plugin endpoint per socket path, so a second agent "
            "instance of a resource (a maxSurge rollout) never disturbs the first",
            "one client per resource: when the old agent's stream ends the kubelet would drop the "
            "new one; the new agent hands over first (a registration the kubelet fails to connect "
            "leaves it no client to close), so nothing dips",
        ),
        Capability(
            "dra-extended-resource",
            "v1.36",
            "DRAExtendedResource: a DeviceClass's extendedResourceName serves unchanged pods "
            "(limits: {example.com/x: 1}) through DRA",
            "the API server drops extendedResourceName; the profile says so (Degraded, "
            "ExtendedResourceNotServed) and only ResourceClaims reach the devices",
        ),
        Capability(
            "dra-device-taints",
            "v1.36",
            "DRADeviceTaints: ResourceSlice device taints keep unhealthy devices from new claims",
            "the API server drops taints; the agent leaves unhealthy devices out of its slices",
        ),
        Capability(
            "health-in-pod-status",
            "v1.36",
            "ResourceHealthStatus: the kubelet shows device health (device plugins and DRA) in a pod's "
            "status.containerStatuses[].allocatedResourcesStatus",
            "no health in pod status; DeviceReports and the profile's status still show it",
        ),
        Capability(
            "dra-consumable-capacity",
            "v1.36",
            "DRAConsumableCapacity: a DRA profile's sharing.replicas lets that many claims share a "
            "device (allowMultipleAllocations, patchbay.dev/shares)",
            "the API server drops those fields; the agent publishes the devices unshared and the "
            "profile is Degraded (SharingNotServed)",
        ),
        Capability(
            "dra-partitionable-devices",
            "v1.36",
            "DRAPartitionableDevices: a DRA profile's plugin.partitions offers each device in several "
            "sizes (sharedCounters, consumesCounters) and the scheduler never over-commits it",
            "the API server drops those fields; the agent publishes the devices whole and the "
            "profile is Degraded (PartitionsNotServed)",
        ),
        Capability(
            "device-taint-rules",
            "v1.37",
            "DeviceTaintRules (resource.k8s.io/v1): kubectl patchbay cordon, drain (--preview) and "
            "uncordon take a DRA profile's devices out of service and back; its status shows them",
            "no DeviceTaintRules: the plugin says so and changes nothing; take the node out of service "
            "instead (kubectl cordon / drain)",
        ),
    )
}


def has(capability: str, release: str) -> bool:
    """Whether ``release`` has ``capability`` (a KeyError names an unknown capability)."""
    return CAPABILITIES[capability].present(release)
