"""Partitions in DRA mode on the REAL node: `partitions: {slots: 4, sizes: [1, 2, 4]}` on a
`mode: DRA` profile over ONE fake device (mknod 1:3), served by the shared node agent (the chart's
default path; docs/dra.md#partitions).

Where the API server keeps counters (DRAPartitionableDevices, 1.36 on): the pool is a counter set
of 4 slots and 7 partitions (4 of one slot, 2 of two, 1 of four) that consume them. Four pods
whose claims ask for one slot each run at once, on four different slots; a pod asking for two
slots waits; with two slots free that are not an aligned pair (0 and 2) it still waits; once two
adjacent ones are (0 and 1) it runs, and its container's PATCHBAY_PARTITIONS names the device and
the slots 0-1.

Where the API server drops them (before 1.36): the profile is Degraded (PartitionsNotServed,
`status.dra.partitionableDevices: Dropped`), the device is published whole, the first pod gets it
(no partition env) and the second waits until it goes.
"""

from __future__ import annotations

import contextlib
import re
import time
from typing import Any

from kubernetes import client
from support.clusters import Cluster
from support.dranode import dra_status, report_holders, slice_devices
from support.realnode import OnNode, add_fake_device, busybox_pod, pod_log, unschedulable, wait_for
from support.releases import has

RG, RV = "resource.k8s.io", "v1"
LABEL = "patchbay.dev/e2e-parts"


def template(custom: client.CustomObjectsApi, ns: str, name: str, driver: str, slots: int | None) -> None:
    """A ResourceClaimTemplate for one device of the driver's class; with `slots`, a partition of
    that many slots (a CEL selector on `patchbay.dev/slots`)."""
    exactly: dict[str, Any] = {"deviceClassName": driver}
    if slots is not None:
        exactly["selectors"] = [
            {"cel": {"expression": f'device.attributes["patchbay.dev"].slots == {slots}'}}
        ]
    custom.create_namespaced_custom_object(
        RG,
        RV,
        ns,
        "resourceclaimtemplates",
        {
            "apiVersion": f"{RG}/{RV}",
            "kind": "ResourceClaimTemplate",
            "metadata": {"name": name},
            "spec": {"spec": {"devices": {"requests": [{"name": "part", "exactly": exactly}]}}},
        },
    )


def pod(name: str, node: str, tmpl: str) -> dict[str, Any]:
    """A busybox pod with a claim from `tmpl`; its log names its devices and partitions."""
    p = busybox_pod(name, node, "echo SERIALS=$SERIALS; echo PARTS=$PATCHBAY_PARTITIONS; sleep 3600")
    p["spec"]["resourceClaims"] = [{"name": "part", "resourceClaimTemplateName": tmpl}]
    p["spec"]["containers"][0]["resources"] = {"claims": [{"name": "part"}]}
    return p


def allocated(cluster: Cluster, ns: str, name: str) -> str:
    """The device the pod's claim was allocated."""
    (st,) = cluster.core.read_namespaced_pod(name, ns).status.resource_claim_statuses
    claim = cluster.custom.get_namespaced_custom_object(RG, RV, ns, "resourceclaims", st.resource_claim_name)
    (result,) = claim["status"]["allocation"]["devices"]["results"]
    return str(result["device"])


def gone(core: client.CoreV1Api, ns: str, name: str) -> bool:
    try:
        core.read_namespaced_pod(name, ns)
    except client.ApiException as e:
        return e.status == 404
    return False


def test_partitions_fill_a_device_and_a_two_slot_claim_waits_for_adjacent_slots(
    on_node: OnNode, kube_release: str
) -> None:
    patchbay, cluster, _e2e_cluster, real_node, ns, fake_dev = on_node
    name = f"{cluster.prefix}parts"
    driver = f"{name}.patchbay.dev"
    core, custom = cluster.core, cluster.custom
    kept = has("dra-partitionable-devices", kube_release)
    add_fake_device(fake_dev, "ttyPT0")
    cluster.set_labels(real_node, {LABEL: cluster.tag})
    pods: list[str] = []
    templates = ["one-slot", "two-slots", "any-part"]
    try:
        cluster.create_profile(
            name,
            {
                "resourceName": f"e2e.patchbay.dev/{cluster.tag}-parts",
                "mode": "DRA",
                "nodeSelector": {"matchLabels": {LABEL: cluster.tag}},
                "plugin": {
                    "discovery": {"paths": {"globs": [f"{fake_dev}/ttyPT*"]}},
                    "partitions": {"slots": 4, "sizes": [1, 2, 4]},
                    "allocation": {"permissions": "rw", "devicesEnvName": "SERIALS"},
                },
            },
        )
        expected = "Kept" if kept else "Dropped"
        wait_for(
            f"the profile saying partitionableDevices {expected}",
            lambda: dra_status(cluster, name).get("partitionableDevices") == expected,
            180,
        )
        if not kept:
            (device,) = wait_for(
                "the whole device in a ResourceSlice",
                lambda: list(slice_devices(cluster, driver, real_node).values()),
                60,
            )
            assert "consumesCounters" not in device, device
            degraded = cluster.condition(name, "Degraded") or {}
            assert (degraded.get("status"), degraded.get("reason")) == ("True", "PartitionsNotServed"), (
                degraded
            )
            template(custom, ns, "any-part", driver, None)
            # One after the other: created together, either could get the device first.
            pods.append("whole-1")
            core.create_namespaced_pod(ns, pod("whole-1", real_node, "any-part"))
            first = wait_for(
                "a pod running on the whole device", lambda: pod_log(core, ns, "whole-1", "PARTS="), 120
            )
            assert re.search(r"^SERIALS=\S*ttyPT0$", first, re.M) and re.search(r"^PARTS=$", first, re.M), (
                first
            )
            pods.append("whole-2")
            core.create_namespaced_pod(ns, pod("whole-2", real_node, "any-part"))
            message = wait_for("the second pod unschedulable", lambda: unschedulable(core, ns, "whole-2"), 60)
            assert "cannot allocate all claims" in message, message
            core.delete_namespaced_pod("whole-1", ns, grace_period_seconds=0)
            wait_for(
                "the second pod running once the device is free",
                lambda: pod_log(core, ns, "whole-2", "PARTS="),
                120,
            )
            print(f"partitions: Dropped on {kube_release}, published whole")
            return

        devices = wait_for(
            "7 partitions in the ResourceSlices",
            lambda: (got := slice_devices(cluster, driver, real_node)) and len(got) == 7 and got,
            60,
        )
        assert all(d.get("consumesCounters") for d in devices.values()), devices
        template(custom, ns, "one-slot", driver, 1)
        template(custom, ns, "two-slots", driver, 2)
        ones = [f"slot-{n}" for n in range(4)]
        for p in ones:
            pods.append(p)
            core.create_namespaced_pod(ns, pod(p, real_node, "one-slot"))
        logs = {p: wait_for(f"{p} running", lambda p=p: pod_log(core, ns, p, "PARTS="), 180) for p in ones}
        slot_of: dict[int, str] = {}
        for p in ones:
            device = allocated(cluster, ns, p)
            first = int(devices[device]["attributes"]["patchbay.dev/firstSlot"]["int"])
            assert devices[device]["attributes"]["patchbay.dev/slots"] == {"int": 1}, device
            assert re.search(rf"^PARTS=\S*ttyPT0:{first}-{first}/4$", logs[p], re.M), logs[p]
            slot_of[first] = p
        assert sorted(slot_of) == [0, 1, 2, 3], slot_of  # four claims filled the device
        # The DeviceReport counts a partition's pod as its device's holder (kubectl patchbay
        # devices and the drain read it): four pods on the one device.
        holders = wait_for(
            "the report naming the four pods as the device's holders",
            lambda: (
                (got := report_holders(cluster, patchbay, name, real_node))
                and any(len(h) == 4 for h in got.values())
                and got
            ),
            60,
        )
        ((device_id, held),) = [(d, h) for d, h in holders.items() if h]
        assert device_id.endswith("ttyPT0") and held == sorted(f"{ns}/{p}" for p in ones), holders

        pods.append("pair")
        core.create_namespaced_pod(ns, pod("pair", real_node, "two-slots"))
        message = wait_for("the two-slot pod unschedulable", lambda: unschedulable(core, ns, "pair"), 60)
        assert "cannot allocate all claims" in message, message

        # Slots 0 and 2 free: two slots, but no aligned pair. The scheduler tries again on every
        # deletion; the pod must still wait.
        for first in (0, 2):
            core.delete_namespaced_pod(slot_of[first], ns, grace_period_seconds=0)
        for first in (0, 2):
            wait_for(f"{slot_of[first]} gone", lambda p=slot_of[first]: gone(core, ns, p), 60)
        deadline = time.monotonic() + 15
        while time.monotonic() < deadline:
            assert core.read_namespaced_pod("pair", ns).status.phase == "Pending", "ran on fragmented slots"
            time.sleep(1)

        # Slot 1 too: slots 0-1 are an aligned pair.
        core.delete_namespaced_pod(slot_of[1], ns, grace_period_seconds=0)
        text = wait_for(
            "the two-slot pod running on slots 0-1", lambda: pod_log(core, ns, "pair", "PARTS="), 120
        )
        assert re.search(r"^PARTS=\S*ttyPT0:0-1/4$", text, re.M), text
        assert allocated(cluster, ns, "pair").endswith("-s0-1")
        print(f"partitions: Kept on {kube_release}; fragmented slots kept the 2-slot pod waiting")
    finally:
        for p in pods:
            with contextlib.suppress(client.ApiException):
                core.delete_namespaced_pod(p, ns, grace_period_seconds=0)
        for t in templates:
            with contextlib.suppress(client.ApiException):
                custom.delete_namespaced_custom_object(RG, RV, ns, "resourceclaimtemplates", t)
        cluster.delete_profile(name)
        cluster.set_labels(real_node, {LABEL: None})
        (fake_dev / "ttyPT0").unlink(missing_ok=True)
