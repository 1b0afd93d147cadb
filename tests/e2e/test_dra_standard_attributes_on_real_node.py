"""The standard DRA attributes on the REAL node, matched by the real scheduler across two profiles.

Two `mode: DRA` profiles with `pci` discovery publish this machine's own PCI functions (read from
the host's real /sys through the agent pods' host mounts: no fake tree, and no device file is
passed to a pod without `vfio`, so preparing them is harmless). Each device carries
`resource.kubernetes.io/pciBusID` and `resource.kubernetes.io/pcieRoot` (docs/dra.md#resourceslices).

- a claim with one request per profile, constrained by `matchAttribute:
  resource.kubernetes.io/pcieRoot`, is allocated and its pod runs: both devices under one root;
- the same claim constrained by `matchAttribute: resource.kubernetes.io/pciBusID` (two different
  functions never share an address) is never allocated: the pod stays Unschedulable. This is the
  control that shows the scheduler really compares the values the agents publish, where the first
  case alone could pass on a machine with a single root complex (this VM has one, pci0000:00);
  trees with several roots are covered by the discovery tests on fake sysfs trees
  (tests/unit/agent/test_agent_discovery.py).

The functions are picked from what the machine has: two with different vendor:device pairs.
"""

from __future__ import annotations

import contextlib
import os
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from kubernetes import client
from support.clusters import Cluster
from support.dranode import labelled_dra_profile, slice_devices
from support.realnode import OWN_AGENT, Installed, busybox_pod, unschedulable, wait_for

RG, RV = "resource.k8s.io", "v1"
SYSFS_PCI = Path("/sys/bus/pci/devices")
PCIE_ROOT, PCI_BUS_ID = "resource.kubernetes.io/pcieRoot", "resource.kubernetes.io/pciBusID"


def _read(path: Path) -> str:
    return path.read_text().strip().lower().removeprefix("0x")


def pci_functions() -> dict[tuple[str, str], list[tuple[str, str]]]:
    """(vendor, device) -> [(address, pcie root)] of this machine's PCI functions."""
    out: dict[tuple[str, str], list[tuple[str, str]]] = {}
    for link in sorted(SYSFS_PCI.iterdir()) if SYSFS_PCI.is_dir() else []:
        real = os.path.realpath(link)
        root = real.removeprefix("/sys/devices/").split("/", 1)[0]
        out.setdefault((_read(link / "vendor"), _read(link / "device")), []).append((link.name, root))
    return out


@pytest.fixture
def two_kinds() -> tuple[tuple[str, str], tuple[str, str]]:
    """Two vendor:device pairs of this machine, the functions of each under one root."""
    kinds = [k for k, fns in pci_functions().items() if len({root for _, root in fns}) == 1]
    if len(kinds) < 2:
        pytest.skip(f"this machine has {len(kinds)} PCI vendor:device pair(s) in {SYSFS_PCI}; 2 needed")
    return kinds[0], kinds[1]


def pci_profile(cluster: Cluster, label: str, suffix: str, kind: tuple[str, str]) -> tuple[str, str]:
    """A DRA profile over the functions of one vendor:device pair: (name, driver)."""
    plugin = {
        "discovery": {"pci": {"vendor": kind[0], "device": kind[1]}},
        "allocation": {"devicesEnvName": f"PCI_{suffix.upper()}"},
    }
    return labelled_dra_profile(cluster, label, suffix, plugin, agent=OWN_AGENT)


def attribute(device: dict[str, Any], name: str) -> str | None:
    value = (device.get("attributes") or {}).get(name) or {}
    return value.get("string")


def two_request_template(name: str, drivers: tuple[str, str], match: str) -> dict[str, Any]:
    return {
        "apiVersion": f"{RG}/{RV}",
        "kind": "ResourceClaimTemplate",
        "metadata": {"name": name},
        "spec": {
            "spec": {
                "devices": {
                    "requests": [
                        {"name": "a", "exactly": {"deviceClassName": drivers[0]}},
                        {"name": "b", "exactly": {"deviceClassName": drivers[1]}},
                    ],
                    "constraints": [{"requests": ["a", "b"], "matchAttribute": match}],
                }
            }
        },
    }


def claim_pod(name: str, node: str, template: str) -> dict[str, Any]:
    pod = busybox_pod(name, node, "echo PCI_A=$PCI_A; echo PCI_B=$PCI_B; sleep 3600")
    pod["spec"]["resourceClaims"] = [{"name": "pair", "resourceClaimTemplateName": template}]
    pod["spec"]["containers"][0]["resources"] = {"claims": [{"name": "pair"}]}
    return pod


def running_log(core: client.CoreV1Api, ns: str, name: str) -> str | None:
    pod = core.read_namespaced_pod(name, ns)
    assert pod.status.phase not in ("Failed", "Succeeded"), pod.status
    if pod.status.phase != "Running":
        return None
    text = str(core.read_namespaced_pod_log(name, ns))
    return text if "PCI_B=" in text else None


@contextlib.contextmanager
def cleanup(cluster: Cluster, namespace: str, label: str, node: str) -> Iterator[list[str]]:
    """Deletes what the test made (pods, templates, the profiles) and the node's label."""
    made: list[str] = []
    try:
        yield made
    finally:
        for kind, name in (m.split("/", 1) for m in made):
            with contextlib.suppress(client.ApiException):
                if kind == "pod":
                    cluster.core.delete_namespaced_pod(name, namespace, grace_period_seconds=0)
                elif kind == "template":
                    cluster.custom.delete_namespaced_custom_object(
                        RG, RV, namespace, "resourceclaimtemplates", name
                    )
                else:
                    cluster.delete_profile(name)
        cluster.set_labels(node, {label: None})


def test_a_claim_across_two_profiles_matches_on_the_standard_pci_attributes(
    patchbay: Installed,
    cluster: Cluster,
    real_node: str,
    namespace: str,
    two_kinds: tuple[tuple[str, str], tuple[str, str]],
) -> None:
    label = "patchbay.dev/e2e-pci"
    expected = {kind: dict(fns) for kind, fns in pci_functions().items() if kind in two_kinds}
    core, custom = cluster.core, cluster.custom
    with cleanup(cluster, namespace, label, real_node) as made:
        cluster.set_labels(real_node, {label: cluster.tag})
        profiles = [pci_profile(cluster, label, s, k) for s, k in zip(("a", "b"), two_kinds, strict=True)]
        made += [f"profile/{name}" for name, _ in profiles]
        drivers = (profiles[0][1], profiles[1][1])

        # Each agent publishes every function of its pair, with the standard attributes read
        # from the host's sysfs.
        for (name, driver), kind in zip(profiles, two_kinds, strict=True):
            wait_for(f"{name}'s DRA agent pod Ready", lambda n=name: patchbay.ready_agents(n), 120)
            devices = wait_for(
                f"{driver}'s devices in a ResourceSlice",
                lambda d=driver, k=kind: (
                    (s := slice_devices(cluster, d, real_node)) and len(s) == len(expected[k]) and s
                ),
                60,
            )
            published = {attribute(d, PCI_BUS_ID): attribute(d, PCIE_ROOT) for d in devices.values()}
            assert published == expected[kind], devices

        # 1. One device of each profile under the same PCIe root: allocated, the pod runs, and
        # the claim's two devices share the root.
        made.append("template/same-root")
        custom.create_namespaced_custom_object(
            RG, RV, namespace, "resourceclaimtemplates", two_request_template("same-root", drivers, PCIE_ROOT)
        )
        made.append("pod/pci-same-root")
        core.create_namespaced_pod(namespace, claim_pod("pci-same-root", real_node, "same-root"))
        logs = wait_for(
            "the same-root pod running", lambda: running_log(core, namespace, "pci-same-root"), 120
        )
        envs = dict(line.split("=", 1) for line in logs.splitlines() if line.startswith("PCI_"))
        assert envs["PCI_A"] and envs["PCI_B"], logs
        (status,) = core.read_namespaced_pod("pci-same-root", namespace).status.resource_claim_statuses
        claim = custom.get_namespaced_custom_object(
            RG, RV, namespace, "resourceclaims", status.resource_claim_name
        )
        results = claim["status"]["allocation"]["devices"]["results"]
        roots = {
            r["request"]: attribute(slice_devices(cluster, r["driver"], real_node)[r["device"]], PCIE_ROOT)
            for r in results
        }
        assert set(roots) == {"a", "b"} and roots["a"] == roots["b"] and roots["a"], results
        print(f"standard attributes: claim allocated across {drivers} under {roots['a']}")

        # 2. The control: the same two requests must share a pciBusID, which two functions
        # never do; the scheduler finds no allocation and the pod waits, saying so.
        made.append("template/same-address")
        custom.create_namespaced_custom_object(
            RG,
            RV,
            namespace,
            "resourceclaimtemplates",
            two_request_template("same-address", drivers, PCI_BUS_ID),
        )
        made.append("pod/pci-same-address")
        core.create_namespaced_pod(namespace, claim_pod("pci-same-address", real_node, "same-address"))
        message = wait_for(
            "the same-address pod unschedulable",
            lambda: unschedulable(core, namespace, "pci-same-address"),
            60,
        )
        assert "cannot allocate all claims" in message, message
        assert core.read_namespaced_pod("pci-same-address", namespace).spec.node_name is None
