"""DRA mode end to end on the REAL node, on the user's path: a `spec.mode: DRA` profile makes the
operator pod render the agent DaemonSet (the agent registers with the real kubelet as a DRA
kubelet plugin) and a DeviceClass; the agent pod publishes the node's devices as a ResourceSlice;
the real scheduler allocates claims against it and the real kubelet has the agent prepare them
(CDI spec files resolved by the node's containerd 2.4).

- a pod with a ResourceClaimTemplate that picks ONE device by attribute (CEL) gets exactly that
  device's node and the env naming it, and reads which device it got from its device metadata
  file (KEP-5304, upstream's path and format);
- an unchanged pod that asks `limits: {<resourceName>: 1}` is served by DRA through the
  DeviceClass's extendedResourceName; where the API server drops that field (before 1.36) the
  pod stays Pending and the profile says why (Degraded, ExtendedResourceNotServed);
- a pod's claim is unprepared when the pod goes: its CDI spec file is removed;
- a prepared claim outlives a new agent pod and a kubelet crash;
- a vanished device is tainted in the ResourceSlice, so a claim for it waits until it is back;
  where the API server drops device taints (before 1.36) the agent leaves it out of the slice
  instead, and the profile's status says so.

Where a release lacks a capability (docs/compatibility.md), a test checks what Patchbay does
instead rather than skipping (``support.releases.has``).
"""

from __future__ import annotations

import contextlib
import json
import os
from pathlib import Path
from typing import Any

from kubernetes import client
from support.clusters import Cluster
from support.dranode import (
    RESOURCE_GROUP,
    RESOURCE_VERSION,
    claim_pod,
    claim_template,
    dra_profile,
    dra_status,
    profile_status,
    report_health,
    slice_devices,
)
from support.realnode import (
    DEVICES,
    OWN_AGENT,
    SHARED_SELECTOR,
    Installed,
    OnNode,
    add_fake_device,
    busybox_pod,
    limits,
    pod_log,
    unschedulable,
    wait_for,
)
from support.releases import has


def device_lines(logs: str) -> list[str]:
    return sorted(line for line in logs.splitlines() if line.startswith("ttyDRA"))


def test_dra_profile_serves_claims_and_unchanged_pods_on_the_real_node(
    on_node: OnNode, kube_release: str
) -> None:
    patchbay, cluster, e2e_cluster, real_node, namespace, fake_dev = on_node
    name, resource, driver = dra_profile(cluster, fake_dev, real_node)
    core, custom = cluster.core, cluster.custom
    cdi_dir = e2e_cluster.real_node().paths.cdi_spec_dir
    pods = ("dra-claim", "dra-unchanged")
    try:
        wait_for("the DRA agent pod Ready (registered)", lambda: patchbay.ready_agents(name), 120)
        devices = wait_for(
            "the node's devices in a ResourceSlice",
            lambda: (d := slice_devices(cluster, driver, real_node)) and len(d) == DEVICES and d,
            60,
        )
        ids = {d["attributes"]["patchbay.dev/id"]["string"]: n for n, d in devices.items()}
        chosen_id = sorted(ids)[2]
        device_class = custom.get_cluster_custom_object(
            RESOURCE_GROUP, RESOURCE_VERSION, "deviceclasses", driver
        )
        served = has("dra-extended-resource", kube_release)
        assert device_class["spec"].get("extendedResourceName") == (resource if served else None)

        # 1. A claim template that picks exactly one device by attribute.
        claim_template(custom, namespace, "one-serial", driver, device_id=chosen_id)
        # The claim's device metadata (KEP-5304), where upstream puts it for a template's claim:
        # under the pod's own name for the claim ("serial") and the request's ("serial").
        meta = "/var/run/kubernetes.io/dra-device-attributes/resourceclaimtemplates"
        meta += f"/serial/serial/{driver}-metadata.json"
        pod = busybox_pod(
            "dra-claim",
            real_node,
            f"echo SERIALS=$SERIALS; echo E2E=$E2E; ls {fake_dev}; "
            f"echo META-BEGIN; cat {meta}; echo; echo META-END; sleep 3600",
        )
        pod["spec"]["resourceClaims"] = [{"name": "serial", "resourceClaimTemplateName": "one-serial"}]
        pod["spec"]["containers"][0]["resources"] = {"claims": [{"name": "serial"}]}
        core.create_namespaced_pod(namespace, pod)
        logs = wait_for(
            "the claim's pod running", lambda: pod_log(core, namespace, "dra-claim", "META-END"), 120
        )
        lines = logs.splitlines()
        assert lines[0] == f"SERIALS={chosen_id}", logs
        assert lines[1] == "E2E=dra", logs
        assert device_lines(logs) == [chosen_id.rsplit("_", 1)[-1]], logs
        # The container read its device from the metadata file: the v1beta1 object first.
        text = logs.split("META-BEGIN\n", 1)[1].split("META-END", 1)[0]
        first, _ = json.JSONDecoder().raw_decode(text.lstrip())
        assert first["apiVersion"] == "metadata.resource.k8s.io/v1beta1", text
        assert first["podClaimName"] == "serial" and first["metadata"]["generation"] == 1, text
        ((request,),) = [first["requests"]]
        ((device,),) = [request["devices"]]
        assert (request["name"], device["driver"], device["name"]) == ("serial", driver, ids[chosen_id]), text
        assert device["attributes"]["patchbay.dev/id"] == {"string": chosen_id}, text
        assert device["attributes"]["patchbay.dev/healthy"] == {"bool": True}, text
        claim_specs = sorted(p.name for p in cdi_dir.glob(f"patchbay_{driver}_*.json"))
        assert len(claim_specs) == 1, claim_specs

        # 2. An unchanged pod asking for the extended resource: served by DRA via the DeviceClass,
        # where the API server kept its extendedResourceName.
        core.create_namespaced_pod(
            namespace,
            limits(
                busybox_pod("dra-unchanged", real_node, f"echo SERIALS=$SERIALS; ls {fake_dev}; sleep 3600"),
                resource,
                1,
            ),
        )
        if served:
            logs = wait_for(
                "the unchanged pod running",
                lambda: pod_log(core, namespace, "dra-unchanged", "SERIALS="),
                120,
            )
            (other,) = logs.splitlines()[0].removeprefix("SERIALS=").split(",")
            assert other in ids and other != chosen_id, logs
            assert device_lines(logs) == [other.rsplit("_", 1)[-1]], logs
            assert len(list(cdi_dir.glob(f"patchbay_{driver}_*.json"))) == 2
        else:
            # Not served by DRA on this cluster, and the profile says so rather than a bare Ready.
            message = wait_for(
                "the unchanged pod unschedulable", lambda: unschedulable(core, namespace, "dra-unchanged"), 60
            )
            assert f"Insufficient {resource}" in message, message
            degraded = cluster.condition(name, "Degraded") or {}
            assert (degraded.get("status"), degraded.get("reason")) == ("True", "ExtendedResourceNotServed")
            assert resource in degraded["message"] and driver in degraded["message"], degraded
            assert dra_status(cluster, name).get("extendedResourceName") == ""

        # The agent's report names the pods that hold the devices (from the kubelet's PodResources,
        # the claims' devices of its driver), and the profile counts them.
        held_count = 2 if served else 1

        def allocated() -> bool:
            st = (cluster.profile(name) or {}).get("status") or {}
            return (st.get("devices") or {}).get("allocated") == held_count

        wait_for(f"the profile counting {held_count} device(s) allocated through claims", allocated, 60)

        # 3. Pods gone -> claims unprepared -> their CDI specs removed.
        for p in pods:
            core.delete_namespaced_pod(p, namespace, grace_period_seconds=0)
        wait_for(
            "the claims' CDI specs removed", lambda: not list(cdi_dir.glob(f"patchbay_{driver}_*.json")), 90
        )
    finally:
        for p in pods:
            with contextlib.suppress(client.ApiException):
                core.delete_namespaced_pod(p, namespace, grace_period_seconds=0)
        with contextlib.suppress(client.ApiException):
            custom.delete_namespaced_custom_object(
                RESOURCE_GROUP, RESOURCE_VERSION, namespace, "resourceclaimtemplates", "one-serial"
            )
        cluster.delete_profile(name)
        cluster.set_labels(real_node, {"patchbay.dev/e2e-dra": None})


def test_the_shared_node_agent_serves_a_dra_profile(on_node: OnNode) -> None:
    """A DRA profile without agent settings: the shared node agent (the same pod that serves
    device-plugin profiles, as the demo shows) publishes its ResourceSlice, prepares a claim and
    writes the claim's status, all with the account the chart gives it (the ServiceAccount with
    the DRA rights; a profile's own device-plugin agent has none). Its driver's service socket
    and claim record are in the node agent's own directory under the kubelet's plugins directory
    (the only part of it the pod mounts), and the kubelet dials it there."""
    patchbay, cluster, e2e_cluster, real_node, namespace, fake_dev = on_node
    name, _resource, driver = dra_profile(cluster, fake_dev, real_node, own_agent=False)
    core, custom = cluster.core, cluster.custom
    try:
        wait_for(
            "the node's devices in a ResourceSlice",
            lambda: len(slice_devices(cluster, driver, real_node)) == DEVICES,
            120,
        )
        claim_template(custom, namespace, "shared-serial", driver)
        core.create_namespaced_pod(namespace, claim_pod("dra-shared", real_node, "shared-serial", fake_dev))
        logs = wait_for("the pod running", lambda: pod_log(core, namespace, "dra-shared", "SERIALS="), 120)
        (held,) = logs.splitlines()[0].removeprefix("SERIALS=").split(",")
        pod_raw = cluster.api.sanitize_for_serialization(core.read_namespaced_pod("dra-shared", namespace))
        (claim_name,) = [c["resourceClaimName"] for c in pod_raw["status"]["resourceClaimStatuses"]]

        def entry() -> dict[str, Any] | None:
            claim = custom.get_namespaced_custom_object(
                RESOURCE_GROUP, RESOURCE_VERSION, namespace, "resourceclaims", claim_name
            )
            mine = [e for e in claim.get("status", {}).get("devices") or [] if e["driver"] == driver]
            return mine[0] if mine else None

        got = wait_for("the claim's status written by the node agent", entry, 60)
        assert got["data"]["id"] == held, got
        # Where the kubelet reached it: the node agent's own directory, never plugins/<driver>.
        plugins = e2e_cluster.real_node().paths.kubelet_root / "plugins"
        claim_uid = custom.get_namespaced_custom_object(
            RESOURCE_GROUP, RESOURCE_VERSION, namespace, "resourceclaims", claim_name
        )["metadata"]["uid"]
        (record,) = (plugins / "patchbay_node-agent").glob(f"*/claim-{claim_uid}.json")
        assert list(record.parent.glob("dra-*.sock")) and (record.parent / "calls.lock").exists()
        assert not (plugins / driver / record.name).exists()
        # The pod serving it is the shared node agent's, running as the account with DRA rights.
        agents = core.list_namespaced_pod(patchbay.namespace, label_selector=SHARED_SELECTOR).items
        accounts = {p.spec.service_account_name for p in agents if p.spec.node_name == real_node}
        assert accounts == {"patchbay-agent-dra"}, accounts
    finally:
        with contextlib.suppress(client.ApiException):
            core.delete_namespaced_pod("dra-shared", namespace, grace_period_seconds=0)
        with contextlib.suppress(client.ApiException):
            custom.delete_namespaced_custom_object(
                RESOURCE_GROUP, RESOURCE_VERSION, namespace, "resourceclaimtemplates", "shared-serial"
            )
        cluster.delete_profile(name)
        cluster.set_labels(real_node, {"patchbay.dev/e2e-dra": None})


def test_dra_claims_survive_agent_and_kubelet_restarts_and_vanished_devices_are_tainted(
    on_node: OnNode, kube_release: str
) -> None:
    """A prepared claim outlives a new agent pod and a kubelet crash (the claim's CDI file is the
    agent's only state): its pod keeps running, the slices are published again (the kubelet wipes
    them when it starts), and the NEW agent unprepares the claim when the pod goes. The held
    device's health reaches the agent's DeviceReport on every release and, where the kubelet
    shows device health in pod status (1.36 on: over v1alpha1.DRAResourceHealth before 1.37, v1
    from 1.37), the pod's allocatedResourcesStatus too. A device that vanishes is tainted in the
    ResourceSlice, or, where the API server drops device taints (before 1.36), left out of it
    (the profile says so); either way a claim for it stays unschedulable until it is back. The
    claim's own status.devices names the prepared device and follows its health (KEP-4817)."""
    patchbay, cluster, e2e_cluster, real_node, namespace, fake_dev = on_node
    name, _resource, driver = dra_profile(cluster, fake_dev, real_node)
    core, custom = cluster.core, cluster.custom
    cdi_dir = e2e_cluster.real_node().paths.cdi_spec_dir
    pods = ("dra-held", "dra-wants-gone")
    taints_kept = has("dra-device-taints", kube_release)
    health_in_pod_status = has("health-in-pod-status", kube_release)
    try:
        (agent,) = wait_for("the DRA agent pod Ready (registered)", lambda: patchbay.ready_agents(name), 120)
        devices = wait_for(
            "the node's devices in a ResourceSlice",
            lambda: (d := slice_devices(cluster, driver, real_node)) and len(d) == DEVICES and d,
            60,
        )
        ids = {d["attributes"]["patchbay.dev/id"]["string"]: n for n, d in devices.items()}
        # What the agent found out about device taints, as the profile's status says it.
        wait_for(
            "the profile saying whether device taints are kept",
            lambda: dra_status(cluster, name).get("deviceTaints") == ("Kept" if taints_kept else "Dropped"),
            60,
        )
        # Held through a claim of its own: the kubelet reports device health in pod status only
        # for containers' resources.claims (not for extended resources served by DRA).
        claim_template(custom, namespace, "any-serial", driver)
        core.create_namespaced_pod(namespace, claim_pod("dra-held", real_node, "any-serial", fake_dev))
        logs = wait_for("the pod running", lambda: pod_log(core, namespace, "dra-held", "SERIALS="), 120)
        (held,) = logs.splitlines()[0].removeprefix("SERIALS=").split(",")
        assert held in ids, logs
        assert len(list(cdi_dir.glob(f"patchbay_{driver}_*.json"))) == 1

        def still_running() -> None:
            pod = core.read_namespaced_pod("dra-held", namespace)
            assert pod.status.phase == "Running"
            assert pod.status.container_statuses[0].restart_count == 0

        # 1. A new agent pod (the old one deleted, as a rollout or an eviction would).
        core.delete_namespaced_pod(agent.metadata.name, agent.metadata.namespace, grace_period_seconds=5)
        wait_for(
            "a new agent pod Ready",
            lambda: [p for p in patchbay.ready_agents(name) if p.metadata.uid != agent.metadata.uid],
            120,
        )
        still_running()

        # 2. The kubelet crashes and comes back: it wipes the node's slices; the agent registers
        # again and publishes them again; the pod is untouched.
        e2e_cluster.stop_kubelet()
        e2e_cluster.start_kubelet()
        e2e_cluster.wait_real_node_ready(120)
        wait_for("the slices back", lambda: len(slice_devices(cluster, driver, real_node)) == DEVICES, 120)
        wait_for("the agent Ready again", lambda: patchbay.ready_agents(name), 120)
        still_running()

        # The held device vanishes: the agent's report says so and, where the kubelet shows device
        # health in pod status, the kubelet learns it from the agent's health stream
        # (DRAResourceHealth) and the pod's status says so; back, Healthy again.
        held_name = ids[held]

        def pod_health() -> set[str]:
            pod = core.read_namespaced_pod("dra-held", namespace)
            raw = cluster.api.sanitize_for_serialization(pod)
            return {
                r.get("health", "")
                for cs in raw["status"].get("containerStatuses") or []
                for s in cs.get("allocatedResourcesStatus") or []
                for r in s.get("resources") or []
                if str(r.get("resourceID", "")).endswith(held_name)
            }

        def health_is(health: str) -> bool:
            reported = report_health(cluster, patchbay, name, real_node).get(held) == health
            return reported and (not health_in_pod_status or pod_health() == {health})

        wait_for("the held device Healthy", lambda: health_is("Healthy"), 60)
        # The claim's own status says what the pod got (KEP-4817; every release of the matrix).
        pod_raw = cluster.api.sanitize_for_serialization(core.read_namespaced_pod("dra-held", namespace))
        (claim_name,) = [c["resourceClaimName"] for c in pod_raw["status"]["resourceClaimStatuses"]]

        def claim_device() -> dict[str, Any]:
            claim = custom.get_namespaced_custom_object(
                RESOURCE_GROUP, RESOURCE_VERSION, namespace, "resourceclaims", claim_name
            )
            entries = [e for e in claim.get("status", {}).get("devices") or [] if e["driver"] == driver]
            return entries[0] if len(entries) == 1 else {}

        def claim_health() -> tuple[str, str] | None:
            conditions = {c["type"]: c for c in claim_device().get("conditions") or []}
            if "Healthy" not in conditions:
                return None
            return conditions["Healthy"]["status"], conditions["Healthy"]["reason"]

        entry = wait_for("the claim's status naming its device", claim_device, 60)
        assert (entry["pool"], entry["device"]) == (real_node, held_name), entry
        assert {c["type"]: c["status"] for c in entry["conditions"]} == {"Ready": "True", "Healthy": "True"}
        assert entry["data"]["id"] == held, entry
        assert entry["data"]["cdiDevice"].startswith(f"{driver}/device="), entry
        held_file = fake_dev / held.rsplit("_", 1)[-1]
        rdev = held_file.stat().st_rdev
        held_file.unlink()
        wait_for("the held device Unhealthy", lambda: health_is("Unhealthy"), 60)
        wait_for("the claim's status saying so", lambda: claim_health() == ("False", "Vanished"), 60)
        if not taints_kept:
            # Its taint would be dropped: left out of the slice while it is gone (the running pod
            # keeps its claim), and the profile says why.
            wait_for(
                "it left out of the slice",
                lambda: held_name not in slice_devices(cluster, driver, real_node),
                60,
            )
            wait_for(
                "the profile counting it withheld",
                lambda: dra_status(cluster, name).get("withheldDevices") == 1,
                60,
            )
        os.mknod(held_file, 0o666 | 0o020000, rdev)
        wait_for("Healthy again", lambda: health_is("Healthy"), 60)
        wait_for("the claim's status Healthy again", lambda: claim_health() == ("True", "Healthy"), 60)
        if not health_in_pod_status:
            # This kubelet shows no device health in pod status (ResourceHealthStatus off before
            # 1.36): the report and the profile are where it is seen.
            assert pod_health() == set()
        wait_for(
            "all devices in the slice", lambda: len(slice_devices(cluster, driver, real_node)) == DEVICES, 60
        )
        still_running()

        # 3. The pod goes: the agent of now unprepares the claim an earlier one prepared.
        core.delete_namespaced_pod("dra-held", namespace, grace_period_seconds=0)
        wait_for(
            "the claim's CDI spec removed", lambda: not list(cdi_dir.glob(f"patchbay_{driver}_*.json")), 90
        )

        # 4. A device vanishes: tainted (or, where taints are dropped, left out of the slice), so a
        # claim for it cannot be allocated; back: it can.
        (gone_id,) = [i for i in ids if i.endswith("ttyDRA1")]
        (fake_dev / "ttyDRA1").unlink()

        def tainted() -> list[dict[str, Any]] | None:
            dev = slice_devices(cluster, driver, real_node).get(ids[gone_id]) or {}
            return [t for t in dev.get("taints") or [] if t["key"] == "patchbay.dev/vanished"] or None

        def left_out() -> bool:
            devs = slice_devices(cluster, driver, real_node)
            return len(devs) == DEVICES - 1 and ids[gone_id] not in devs

        if taints_kept:
            (taint,) = wait_for("the vanished device tainted", tainted, 60)
            assert taint["effect"] == "NoSchedule"
        else:
            wait_for("the vanished device left out of the slice", left_out, 60)
            # The device's problem says where it went (once the report marks it withheld).
            wait_for(
                "the profile saying it is left out of the slice",
                lambda: [
                    p
                    for p in profile_status(cluster, name).get("problems") or []
                    if p.get("device") == gone_id and "left out of the node's ResourceSlice" in p["message"]
                ],
                60,
            )
        claim_template(custom, namespace, "the-gone-one", driver, gone_id)
        core.create_namespaced_pod(
            namespace, claim_pod("dra-wants-gone", real_node, "the-gone-one", fake_dev)
        )
        wait_for(
            "the claim for it unschedulable", lambda: unschedulable(core, namespace, "dra-wants-gone"), 60
        )
        add_fake_device(fake_dev, "ttyDRA1")
        if taints_kept:
            wait_for("the taint gone", lambda: tainted() is None, 60)
        else:
            wait_for(
                "it back in the slice", lambda: ids[gone_id] in slice_devices(cluster, driver, real_node), 60
            )
        logs = wait_for(
            "the claim allocated now", lambda: pod_log(core, namespace, "dra-wants-gone", "SERIALS="), 120
        )
        assert logs.splitlines()[0] == f"SERIALS={gone_id}", logs
    finally:
        for p in pods:
            with contextlib.suppress(client.ApiException):
                core.delete_namespaced_pod(p, namespace, grace_period_seconds=0)
        with contextlib.suppress(client.ApiException):
            for template in ("the-gone-one", "any-serial"):
                custom.delete_namespaced_custom_object(
                    RESOURCE_GROUP, RESOURCE_VERSION, namespace, "resourceclaimtemplates", template
                )
        cluster.delete_profile(name)
        cluster.set_labels(real_node, {"patchbay.dev/e2e-dra": None})


def test_a_node_moves_from_device_plugin_to_dra_and_running_pods_keep_their_devices(
    patchbay: Installed,
    cluster: Cluster,
    real_node: str,
    namespace: str,
    fake_dev: Path,
    kube_release: str,
) -> None:
    """Migration node by node (docs/dra.md): one resource, a DevicePlugin profile and a DRA
    profile, the node's label moved from one selector to the other in one call. The device plugin
    agent leaves, the DRA agent comes; the pod that holds two devices through the device plugin
    keeps running, and DRA does not hand those two out again (tainted in the slice while held;
    where the API server drops taints, left out of it): new pods get the other two, a third waits,
    and gets one when the old pod is gone. The new pods are unchanged ones where the DeviceClass's
    extendedResourceName is kept, and pods with a claim where it is dropped (before 1.36: DRA
    serves only claims there)."""
    resource = f"e2e.patchbay.dev/{cluster.tag}-mig"
    dp_label, dra_label = "patchbay.dev/e2e-mig-dp", "patchbay.dev/e2e-mig-dra"
    dp_name, dra_name = f"{cluster.prefix}mig-dp", f"{cluster.prefix}mig-dra"
    driver = f"{dra_name}.patchbay.dev"
    for i in range(DEVICES):
        add_fake_device(fake_dev, f"ttyMIG{i}")
    plugin = {
        "discovery": {"paths": {"globs": [f"{fake_dev}/ttyMIG*"]}},
        "health": {"periodSeconds": 1, "failureThreshold": 1, "successThreshold": 1},
        "allocation": {"permissions": "rw", "devicesEnvName": "SERIALS"},
    }
    core = cluster.core
    pods = ("mig-old", "mig-new-1", "mig-new-2", "mig-new-3")

    def serials(pod: str) -> list[str]:
        logs = wait_for(f"{pod} running", lambda: pod_log(core, namespace, pod, "SERIALS="), 120)
        return logs.splitlines()[0].removeprefix("SERIALS=").split(",")

    def unchanged_pod(name: str, count: int) -> None:
        body = limits(busybox_pod(name, real_node, "echo SERIALS=$SERIALS; sleep 3600"), resource, count)
        core.create_namespaced_pod(namespace, body)

    served = has("dra-extended-resource", kube_release)
    taints_kept = has("dra-device-taints", kube_release)

    def new_pod(name: str) -> None:
        """One device through DRA: an unchanged pod where that is served, else a claim's pod."""
        if served:
            unchanged_pod(name, 1)
        else:
            core.create_namespaced_pod(namespace, claim_pod(name, real_node, "mig-any", fake_dev))

    try:
        cluster.set_labels(real_node, {dp_label: cluster.tag})
        for name, mode, label in ((dp_name, "DevicePlugin", dp_label), (dra_name, "DRA", dra_label)):
            cluster.create_profile(
                name,
                {
                    "resourceName": resource,
                    "mode": mode,
                    "nodeSelector": {"matchLabels": {label: cluster.tag}},
                    "plugin": plugin,
                    "agent": OWN_AGENT,
                },
            )
        wait_for(
            "the device plugin's devices on the node",
            lambda: cluster.values(real_node, resource)[1] == "4",
            120,
        )
        unchanged_pod("mig-old", 2)
        held = serials("mig-old")
        assert len(held) == 2

        # The move: one `kubectl label` in effect.
        cluster.set_labels(real_node, {dp_label: None, dra_label: cluster.tag})
        wait_for("the DRA agent Ready", lambda: patchbay.ready_agents(dra_name), 120)
        wait_for("the device plugin agent gone", lambda: not patchbay.agent_pods(dp_name), 120)

        def held_tainted() -> bool:
            devs = slice_devices(cluster, driver, real_node)
            tainted = {
                d["attributes"]["patchbay.dev/id"]["string"]
                for d in devs.values()
                if any(t["key"] == "patchbay.dev/held-by-device-plugin" for t in d.get("taints") or [])
            }
            return len(devs) == DEVICES and tainted == set(held)

        def held_left_out() -> bool:
            devs = slice_devices(cluster, driver, real_node)
            shown = {d["attributes"]["patchbay.dev/id"]["string"] for d in devs.values()}
            return len(devs) == DEVICES - len(held) and not shown & set(held)

        if taints_kept:
            wait_for("the devices the old pod holds tainted in the slice", held_tainted, 60)
        else:
            wait_for("the devices the old pod holds left out of the slice", held_left_out, 60)
            wait_for(
                "the profile counting them withheld",
                lambda: dra_status(cluster, dra_name).get("withheldDevices") == len(held),
                60,
            )
        # The documented step before sending new pods to a moved node: the scheduler takes the
        # device plugin's path while the Node still shows it allocatable, which lasts until the
        # kubelet's next node status sync (docs/dra.md#migration).
        wait_for(
            "the node's allocatable for the resource at 0",
            lambda: cluster.values(real_node, resource)[1] == "0",
            60,
        )
        old = core.read_namespaced_pod("mig-old", namespace)
        assert old.status.phase == "Running" and old.status.container_statuses[0].restart_count == 0

        if not served:
            claim_template(cluster.custom, namespace, "mig-any", driver)
        new_pod("mig-new-1")
        new_pod("mig-new-2")
        new = serials("mig-new-1") + serials("mig-new-2")
        assert sorted(new + held) == sorted({*new, *held}) and len(set(new + held)) == DEVICES, (held, new)
        new_pod("mig-new-3")
        wait_for(
            "a third new pod waiting (no free device)",
            lambda: unschedulable(core, namespace, "mig-new-3"),
            60,
        )
        degraded = cluster.condition(dra_name, "Degraded") or {}
        assert degraded.get("reason") != "ResourceServedTwice", degraded

        core.delete_namespaced_pod("mig-old", namespace, grace_period_seconds=0)
        (third,) = serials("mig-new-3")
        assert third in held
    finally:
        for p in pods:
            with contextlib.suppress(client.ApiException):
                core.delete_namespaced_pod(p, namespace, grace_period_seconds=0)
        with contextlib.suppress(client.ApiException):
            cluster.custom.delete_namespaced_custom_object(
                RESOURCE_GROUP, RESOURCE_VERSION, namespace, "resourceclaimtemplates", "mig-any"
            )
        for name in (dp_name, dra_name):
            cluster.delete_profile(name)
        cluster.set_labels(real_node, {dp_label: None, dra_label: None})
