"""Device maintenance on the REAL node, as an administrator does it: `kubectl patchbay drain
--preview`, `drain`, `uncordon` (DeviceTaintRules, Kubernetes 1.37 on) on a DRA profile's devices
that the operator's agent pod publishes, with claims the real scheduler allocated and the real
kubelet had the agent prepare; the API server's device-taint-eviction controller (in the real
kube-controller-manager) previews and evicts; the profile's status shows the rule.

Where the release has no DeviceTaintRules (before 1.37), the plugin refuses with the reason and
changes nothing, and the profile's status shows no maintenance.
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import subprocess
import time
from pathlib import Path
from typing import Any

from kubernetes import client
from support.clusters import Cluster
from support.dranode import claim_pod, claim_template, dra_profile, profile_status, slice_devices
from support.realnode import DEVICES, Installed, OnNode, wait_for
from support.releases import has

from patchbay_devcluster import DevCluster

RESOURCE_GROUP, RESOURCE_VERSION = "resource.k8s.io", "v1"
REPO = Path(__file__).resolve().parents[2]
PLUGIN = Path(os.environ.get("VIRTUAL_ENV") or REPO / ".venv") / "bin" / "kubectl-patchbay"
TAINT_KEY = "patchbay.dev/maintenance"


def plugin(e2e_cluster: DevCluster, patchbay: Installed, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [str(PLUGIN), *args, "--kubeconfig", str(e2e_cluster.kubeconfig), "-n", patchbay.namespace],
        capture_output=True,
        text=True,
        timeout=120,
    )


def maintenance(cluster: Cluster, profile: str) -> list[dict[str, Any]]:
    return list((profile_status(cluster, profile).get("dra") or {}).get("maintenance") or [])


def pod_phase(core: client.CoreV1Api, ns: str, name: str) -> str | None:
    """The pod's phase; None once it is gone."""
    try:
        pod = core.read_namespaced_pod(name, ns)
    except client.ApiException as e:
        if e.status == 404:
            return None
        raise
    return str(pod.status.phase)


def test_a_device_is_previewed_drained_and_returned(on_node: OnNode, kube_release: str) -> None:
    """Preview (effect None: the rule's status says how many pods a drain would evict), drain
    (NoExecute: the pod using the device is evicted; one that tolerates the taint for 300 s stays;
    no new claim gets the node's devices), return (the rule goes, a waiting claim is allocated)."""
    patchbay, cluster, e2e_cluster, real_node, namespace, fake_dev = on_node
    name, _resource, driver = dra_profile(cluster, fake_dev, real_node)
    core, custom = cluster.core, cluster.custom
    pods = ("maint-a", "maint-b", "maint-c")
    try:
        devices = wait_for(
            "the node's devices in a ResourceSlice",
            lambda: d if len(d := slice_devices(cluster, driver, real_node)) == DEVICES else None,
            120,
        )
        # Physical ID (a path ending in the device file's name) -> its name in the slice.
        ids = {d["attributes"]["patchbay.dev/id"]["string"]: n for n, d in devices.items()}
        (first,) = [i for i in ids if i.endswith("ttyDRA0")]
        (second,) = [i for i in ids if i.endswith("ttyDRA1")]
        if not has("device-taint-rules", kube_release):
            res = plugin(e2e_cluster, patchbay, "drain", name, "--node", real_node, "--preview")
            assert res.returncode == 1, res
            assert "serves no DeviceTaintRules" in res.stderr, res.stderr
            assert "maintenance" not in (profile_status(cluster, name).get("dra") or {})
            return

        # Two pods on the node's first two devices; b's claim tolerates the maintenance taint 300 s.
        claim_template(custom, namespace, "maint-0", driver, first)
        # A device taint is tolerated in the claim's request (not the pod): 300 s.
        tolerate = {"key": TAINT_KEY, "operator": "Exists", "effect": "NoExecute", "tolerationSeconds": 300}
        claim_template(custom, namespace, "maint-1", driver, second, tolerations=[tolerate])
        core.create_namespaced_pod(namespace, claim_pod("maint-a", real_node, "maint-0", fake_dev))
        core.create_namespaced_pod(namespace, claim_pod("maint-b", real_node, "maint-1", fake_dev))
        for pod in ("maint-a", "maint-b"):
            wait_for(f"{pod} running", lambda pod=pod: pod_phase(core, namespace, pod) == "Running", 120)

        # Bad input: named, nothing written.
        bad = plugin(e2e_cluster, patchbay, "drain", name, "--node", real_node, "--device", "nosuch")
        assert bad.returncode == 1 and "--device nosuch: no such device" in bad.stderr, bad.stderr
        assert first in bad.stderr, bad.stderr  # the IDs, as `kubectl patchbay devices` shows them

        # 1. Preview: nothing changes; the cluster says what a drain would do.
        res = plugin(e2e_cluster, patchbay, "drain", name, "--node", real_node, "--preview")
        assert res.returncode == 0, res.stderr
        assert f"every device of {name} on node {real_node}: None (a preview" in res.stdout, res.stdout
        preview = re.search(r"preview: .*?(\d+) pods? would be evicted", res.stdout)
        assert preview is not None and int(preview.group(1)) == 2, res.stdout
        shown = wait_for(
            "the preview in the profile's status",
            lambda: [m for m in maintenance(cluster, name) if m["effect"] == "None" and m.get("message")],
            60,
        )
        assert shown[0]["node"] == real_node and shown[0]["device"] == "", shown
        assert "would be evicted" in shown[0]["message"], shown
        assert {pod_phase(core, namespace, p) for p in ("maint-a", "maint-b")} == {"Running"}

        # One device, named by the ID `kubectl patchbay devices` shows: cordoned, then returned.
        res = plugin(
            e2e_cluster, patchbay, "cordon", name, "--node", real_node, "--device", first, "--wait", "0"
        )
        assert res.returncode == 0 and f"devicetaintrule/{name}.{real_node}.{ids[first]}:" in res.stdout, res
        listed = plugin(
            e2e_cluster, patchbay, "devices", "--profile", name, "--node", real_node, "-o", "json"
        )
        health = {d["device"]: (d["health"], d["reason"]) for d in json.loads(listed.stdout)["items"]}
        assert health[first] == ("Maintenance", "NoSchedule") and health[second][0] == "Healthy", health
        res = plugin(e2e_cluster, patchbay, "uncordon", name, "--node", real_node, "--device", first)
        assert res.returncode == 0 and "in service again" in res.stdout, res

        # 2. Drain: a is evicted, b (300 s toleration) stays, a new claim waits.
        started = time.monotonic()
        res = plugin(e2e_cluster, patchbay, "drain", name, "--node", real_node)
        assert res.returncode == 0, res.stderr
        assert "NoExecute (no new claims get it, and the pods using it are evicted)" in res.stdout, res.stdout
        wait_for("maint-a evicted", lambda: pod_phase(core, namespace, "maint-a") in (None, "Failed"), 120)
        evicted_after = time.monotonic() - started
        assert pod_phase(core, namespace, "maint-b") == "Running"
        wait_for(
            "the drain in the profile's status",
            lambda: [m for m in maintenance(cluster, name) if m["effect"] == "NoExecute"],
            60,
        )
        # `kubectl patchbay devices` says which devices are out of service, and why.
        listed = plugin(
            e2e_cluster, patchbay, "devices", "--profile", name, "--node", real_node, "-o", "json"
        )
        assert listed.returncode == 0, listed.stderr
        health = {d["device"]: (d["health"], d["reason"]) for d in json.loads(listed.stdout)["items"]}
        assert health[first] == health[second] == ("Maintenance", "NoExecute"), health
        claim_template(custom, namespace, "maint-any", driver)
        core.create_namespaced_pod(namespace, claim_pod("maint-c", real_node, "maint-any", fake_dev))
        time.sleep(5)  # a scheduling attempt or two: the only devices are tainted
        assert pod_phase(core, namespace, "maint-c") == "Pending"

        # 3. Return: the rule goes, the waiting pod gets a device, the status forgets the rule.
        started = time.monotonic()
        res = plugin(e2e_cluster, patchbay, "uncordon", name, "--node", real_node)
        assert res.returncode == 0 and "in service again" in res.stdout, res
        wait_for("maint-c running", lambda: pod_phase(core, namespace, "maint-c") == "Running", 120)
        returned_after = time.monotonic() - started
        wait_for("the status without maintenance", lambda: maintenance(cluster, name) == [], 60)
        assert pod_phase(core, namespace, "maint-b") == "Running"
        print(
            f"maintenance: drain -> evicted {evicted_after:.1f}s; uncordon -> running {returned_after:.1f}s"
        )
    finally:
        with contextlib.suppress(client.ApiException):
            custom.delete_cluster_custom_object(
                RESOURCE_GROUP, RESOURCE_VERSION, "devicetaintrules", f"{name}.{real_node}"
            )
        for pod in pods:
            with contextlib.suppress(client.ApiException):
                core.delete_namespaced_pod(pod, namespace, grace_period_seconds=0)
        for template in ("maint-0", "maint-1", "maint-any"):
            with contextlib.suppress(client.ApiException):
                custom.delete_namespaced_custom_object(
                    RESOURCE_GROUP, RESOURCE_VERSION, namespace, "resourceclaimtemplates", template
                )
        cluster.delete_profile(name)
        cluster.set_labels(real_node, {"patchbay.dev/e2e-dra": None})
