"""Explained health on the real node: the profile's status says WHY, kstatus says Failed when
nothing will change by itself, and it recovers by itself once the cause is fixed.

- An agent pod that cannot start (its image is not on the node and may not be pulled) makes the
  profile Stalled (kstatus Failed) within two minutes, naming the node and the kubelet's reason;
  fixing the image returns it to Current, with no operator restart.
- A device that vanishes shows in the status with its node, ID, reason and since when, within
  seconds, through the agent's DeviceReport (written with its pod-bound token, node-scoped by the
  chart's admission policy); the report names the pod that holds a device; the agent's /metrics
  (scraped over the pod network) carry per-device health and per-pod allocations; Events mark
  the transitions; a node the profile no longer selects loses its report.
"""

from __future__ import annotations

import json
import urllib.request
from pathlib import Path
from typing import Any

from kubernetes import client
from support.clusters import Cluster, kstatus
from support.promtext import parse
from support.realnode import (
    DEVICES,
    Installed,
    add_fake_device,
    busybox_pod,
    limits,
    serial_profile,
    wait_for,
)

GROUP, VERSION = "patchbay.dev", "v1beta1"


def conditions(cluster: Cluster, name: str) -> dict[str, dict[str, Any]]:
    st = (cluster.profile(name) or {}).get("status") or {}
    return {c["type"]: c for c in st.get("conditions") or []}


def report(cluster: Cluster, namespace: str, name: str) -> dict[str, Any] | None:
    try:
        obj: dict[str, Any] = cluster.custom.get_namespaced_custom_object(
            GROUP, VERSION, namespace, "devicereports", name
        )
    except client.ApiException as e:
        if e.status == 404:
            return None
        raise
    return obj


def events(cluster: Cluster, profile: str) -> list[tuple[str, str, str]]:
    items = cluster.core.list_namespaced_event(
        "default", field_selector=f"involvedObject.name={profile}"
    ).items
    return [(e.type, e.reason, e.message) for e in items]


def test_an_agent_pod_that_cannot_start_is_failed_and_recovers_when_fixed(
    patchbay: Installed, cluster: Cluster, real_node: str
) -> None:
    name = f"{cluster.prefix}broken"
    resource = f"e2e.patchbay.dev/{cluster.tag}-broken"
    cluster.set_labels(real_node, {"patchbay.dev/e2e-broken": cluster.tag})
    try:
        cluster.create_profile(
            name,
            {
                "resourceName": resource,
                "mode": "DevicePlugin",
                "nodeSelector": {"matchLabels": {"patchbay.dev/e2e-broken": cluster.tag}},
                "plugin": {"discovery": {"virtual": {"count": 2}}},
                # An image that is not on the node, and may not be pulled.
                "agent": {
                    "image": "ghcr.io/kube-patchbay/patchbay-agent:0.0.0-missing",
                    "imagePullPolicy": "Never",
                },
            },
        )

        def failed() -> dict[str, Any] | None:
            obj = cluster.profile(name) or {}
            return obj if kstatus(obj) == "Failed" else None

        obj = wait_for("kstatus Failed", failed, 120)
        stalled = conditions(cluster, name)["Stalled"]
        assert stalled["reason"] == "ErrImageNeverPull", stalled
        assert f"node {real_node}" in stalled["message"], stalled
        problems = obj["status"]["problems"]
        assert {"node": real_node, "reason": "ErrImageNeverPull"}.items() <= problems[0].items(), problems
        assert conditions(cluster, name)["Reconciling"]["status"] == "False"

        # The fix: the right image. The DaemonSet rolls, the agent registers, Current again.
        cluster.patch_spec(
            name,
            {
                "agent": {
                    "image": patchbay.release.values["agent"]["image"],
                    "imagePullPolicy": "IfNotPresent",
                }
            },
        )

        def current() -> bool:
            return kstatus(cluster.profile(name) or {}) == "Current"

        wait_for("kstatus Current after the fix", current, 180)

        # Current comes with the agent Ready; its registration and first report follow within
        # moments (until then the status lists a transient NoDevices, which posts no Event).
        def clean() -> dict[str, Any] | None:
            st: dict[str, Any] = (cluster.profile(name) or {}).get("status") or {}
            return st if st.get("problems") == [] and st.get("nodesReady") == "1/1" else None

        wait_for("no problem left after the fix", clean, 60)
        assert wait_for(
            "the devices on the node", lambda: cluster.values(real_node, resource) == ("2", "2"), 60
        )
    finally:
        cluster.delete_profile(name)
        cluster.set_labels(real_node, {"patchbay.dev/e2e-broken": None})


def test_a_vanished_device_is_named_with_its_node_reason_and_holder(
    patchbay: Installed, cluster: Cluster, real_node: str, namespace: str, fake_dev: Path
) -> None:
    name, resource = serial_profile(cluster, fake_dev, real_node)
    report_name = f"{name}.{real_node}"
    try:
        (agent,) = wait_for("the agent pod Ready", lambda: patchbay.ready_agents(name), 120)
        rep = wait_for(
            "the agent's DeviceReport", lambda: report(cluster, patchbay.namespace, report_name), 60
        )
        node_uid = cluster.core.read_node(real_node).metadata.uid
        owner = rep["metadata"]["ownerReferences"][0]
        assert (owner["kind"], owner["name"], owner["uid"]) == ("Node", real_node, node_uid)
        assert rep["summary"] == {"total": DEVICES, "healthy": DEVICES, "unhealthy": 0, "allocated": 0}

        # A pod takes a device: the report names it (from the kubelet's PodResources API).
        pod = limits(busybox_pod("holder", real_node, "sleep 3600"), resource, 1)
        cluster.core.create_namespaced_pod(namespace, pod)

        def holder() -> list[Any] | None:
            r = report(cluster, patchbay.namespace, report_name) or {}
            held = [d for d in r.get("devices") or [] if d.get("pods")]
            return held or None

        (held,) = wait_for("the report to name the pod holding a device", holder, 120)
        assert held["pods"] == [{"namespace": namespace, "name": "holder", "container": "main"}]

        # A device vanishes: named in the profile's status with node, device, reason and time.
        victim = next(p for p in sorted(fake_dev.iterdir()) if not held["id"].endswith(p.name))
        victim.unlink()

        def named() -> dict[str, Any] | None:
            st = (cluster.profile(name) or {}).get("status") or {}
            hits = [p for p in st.get("problems") or [] if p.get("device", "").endswith(victim.name)]
            return hits[0] if hits else None

        problem = wait_for("the vanished device in the profile's status", named, 60)
        assert problem["node"] == real_node
        assert problem["reason"] == "Vanished", problem
        assert problem["since"].endswith("Z")
        st = (cluster.profile(name) or {})["status"]
        assert st["devices"]["unhealthy"] == 1 and st["devices"]["healthy"] == DEVICES - 1
        assert st["devices"]["allocated"] == 1
        degraded = conditions(cluster, name)["Degraded"]
        assert degraded["status"] == "True" and victim.name in degraded["message"], degraded
        assert kstatus(cluster.profile(name) or {}) == "Current"  # serving what it has: not failed
        wait_for(
            "a Warning event naming the device",
            lambda: [e for e in events(cluster, name) if e[0] == "Warning" and victim.name in e[2]],
            60,
        )

        # The agent's own /metrics, scraped over the pod network as a Prometheus would.
        url = f"http://{agent.status.pod_ip}:9464/metrics"

        def scraped() -> dict[str, Any] | None:
            with urllib.request.urlopen(url, timeout=5) as r:
                families = parse(r.read().decode())
            health = {s.labels["device"]: s.value for s in families["patchbay_agent_device_healthy"].samples}
            return families if any(v == 0 for v in health.values()) else None

        families = wait_for("per-device health in the agent's metrics", scraped, 60)
        # The total only: holders' names stay off the open port unless the chart asks for them
        # (agent.metricsHolderLabels); the DeviceReport names them for those who may read it.
        allocated = families["patchbay_agent_allocated_devices"].samples
        # (an agent of its own is a node agent now: its series carry the profile label, as the
        # shared agent's do)
        assert [(s.labels, s.value) for s in allocated] == [({"profile": name}, 1.0)]
        assert "holder" not in json.dumps([s.labels for f in families.values() for s in f.samples])

        add_fake_device(fake_dev, victim.name)
        wait_for("the device healthy again", lambda: named() is None, 60)
        wait_for(
            "a Recovered event",
            lambda: [e for e in events(cluster, name) if e[1] == "Recovered" and victim.name in e[2]],
            60,
        )

        # The node leaves the profile: its agent goes, and so does its report.
        cluster.set_labels(real_node, {"patchbay.dev/e2e-plugin": None})
        wait_for("the report deleted", lambda: report(cluster, patchbay.namespace, report_name) is None, 120)
    finally:
        cluster.delete_profile(name)
        cluster.set_labels(real_node, {"patchbay.dev/e2e-plugin": None})
