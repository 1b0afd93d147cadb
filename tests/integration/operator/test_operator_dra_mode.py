"""DRA mode against the real API server: the agent DaemonSet as a DRA kubelet plugin and the
profile's DeviceClass (resource.k8s.io/v1, extendedResourceName), server-side applied and owned
by the profile; the KEP-5004 overlap with a DevicePlugin profile reported in status; the
DeviceClass removed when the profile leaves DRA mode or goes.

Where the API server drops the DeviceClass's extendedResourceName (DRAExtendedResource off, before
1.36), the profile's status says so (Degraded, ExtendedResourceNotServed; status.dra) instead of a
silent Ready; where it keeps it, it says nothing of the kind. The same test checks whichever the
session's release does, and that the release's capability table agrees with its API server."""

from __future__ import annotations

from typing import Any

from support.clusters import TEST_LABEL, Cluster, wait_for
from support.operator import Operator, agent_object, assert_applied_for
from support.releases import has


def spec(cluster: Cluster, mode: str = "DRA") -> dict[str, Any]:
    return cluster.agent_spec("serial", mode)


def daemonset(cluster: Cluster, profile: str) -> dict[str, Any] | None:
    return agent_object(cluster, "DaemonSet", profile)


def status(cluster: Cluster, name: str) -> dict[str, Any]:
    return dict((cluster.profile(name) or {}).get("status") or {})


def condition(cluster: Cluster, name: str, type_: str) -> dict[str, Any]:
    return cluster.condition(name, type_) or {}


def test_a_dra_profile_gets_its_agents_and_device_class_and_deleting_it_removes_them(
    cluster: Cluster, operator: Operator, kube_release: str
) -> None:
    nodes = cluster.add_nodes(2)
    name = f"{cluster.prefix}dra"
    driver = f"{name}.patchbay.dev"
    created = cluster.create_profile(name, spec(cluster))
    uid = created["metadata"]["uid"]

    ds = wait_for("the agent DaemonSet", lambda: daemonset(cluster, name))
    (agent,) = ds["spec"]["template"]["spec"]["containers"]
    cmd = agent["command"]
    # An agent of its own is a node agent serving this one profile (its ConfigMap's node.yaml: the
    # mode, so the driver, is the entry's), its DRA driver's directory below --node-plugins-dir.
    assert "--node-config" in cmd and "--dra-driver" not in cmd
    assert cmd[cmd.index("--cdi-spec-dir") + 1] == "/var/run/cdi"
    assert "--device-plugin-dir" not in cmd
    root = cmd[cmd.index("--kubelet-root-dir") + 1]
    assert cmd[cmd.index("--node-plugins-dir") + 1] == f"{root}/plugins"
    mounts = {m["name"]: m["mountPath"] for m in agent["volumeMounts"]}
    assert mounts["plugins-registry"] == f"{root}/plugins_registry"
    # Its own driver's directory only, the one the agent makes its socket in.
    assert mounts["kubelet-plugins"] == f"{root}/plugins/{driver}"

    dc = wait_for("the DeviceClass", lambda: cluster.device_class(driver))
    assert dc["spec"]["selectors"] == [{"cel": {"expression": f'device.driver == "{driver}"'}}]
    resource = f"example.com/{cluster.prefix}serial"
    served = has("dra-extended-resource", kube_release)
    # Kept by the API server where DRAExtendedResource is on (1.36 on), dropped where it is off.
    assert dc["spec"].get("extendedResourceName") == (resource if served else None), (
        kube_release,
        dc["spec"],
    )
    assert_applied_for(dc, name, uid)

    # kwok "runs" the agent pods: the rollout completes; no report yet, so no device counted.
    st = wait_for("status 2/2", lambda: (s := status(cluster, name)).get("nodesReady") == "2/2" and s)
    # Who wrote the status, as `--show-managed-fields` and audit logs name it.
    fields = (cluster.profile(name) or {})["metadata"]["managedFields"]
    assert {m["manager"] for m in fields if m.get("subresource") == "status"} == {"patchbay-operator"}
    assert st["devices"] == {"capacity": 0, "allocatable": 0, "healthy": 0, "unhealthy": 0, "allocated": 0}
    conds = {c["type"]: c for c in st["conditions"]}
    assert conds["Ready"]["status"] == "True"
    assert conds["Degraded"]["reason"] != "ResourceServedTwice"
    assert {p["node"] for p in st["problems"]} == set(nodes)
    assert st["dra"]["deviceClassName"] == driver
    if served:
        assert st["dra"]["extendedResourceName"] == resource
        assert conds["Degraded"]["reason"] != "ExtendedResourceNotServed"
    else:
        # Not a silent Ready: the profile says unchanged pods are not served, claims are.
        assert st["dra"]["extendedResourceName"] == ""
        degraded = conds["Degraded"]
        assert (degraded["status"], degraded["reason"]) == ("True", "ExtendedResourceNotServed")
        assert resource in degraded["message"] and f"deviceClassName {driver}" in degraded["message"]
        assert "not served by DRA on this cluster" in conds["Ready"]["message"]

    # KEP-5004: a DevicePlugin profile for the same resource on the same nodes is not refused
    # (that is how a node migrates), but the DRA profile says which nodes are served twice.
    plugin = f"{cluster.prefix}plugin"
    cluster.create_profile(plugin, spec(cluster, "DevicePlugin"))
    wait_for("the DevicePlugin agents too", lambda: daemonset(cluster, plugin))
    degraded = wait_for(
        "Degraded=ResourceServedTwice",
        lambda: (c := condition(cluster, name, "Degraded")).get("reason") == "ResourceServedTwice" and c,
    )
    assert degraded["status"] == "True"
    assert plugin in degraded["message"] and all(n in degraded["message"] for n in nodes)
    assert condition(cluster, plugin, "Stalled").get("reason") != "ResourceNameConflict"

    # ... and never runs its DRA agents there: the DaemonSet's affinity leaves those nodes out.
    def scheduled() -> int | None:
        ds = daemonset(cluster, name) or {}
        return (ds.get("status") or {}).get("desiredNumberScheduled")

    wait_for("no DRA agent where the device plugin serves", lambda: scheduled() == 0)
    # Moving the nodes off the DevicePlugin profile's selector ends it.
    cluster.patch_spec(plugin, {"nodeSelector": {"matchLabels": {TEST_LABEL: "elsewhere"}}})
    wait_for(
        "no longer served twice",
        lambda: condition(cluster, name, "Degraded").get("reason") not in (None, "ResourceServedTwice"),
    )
    wait_for("the DRA agents back on both nodes", lambda: scheduled() == 2)

    cluster.delete_profile(name)
    wait_for("the DeviceClass gone", lambda: cluster.device_class(driver) is None)
    wait_for("the agents gone", lambda: daemonset(cluster, name) is None)
    wait_for("the profile gone", lambda: cluster.profile(name) is None)


def test_leaving_dra_mode_removes_the_device_class(cluster: Cluster, operator: Operator) -> None:
    cluster.add_nodes(1)
    name = f"{cluster.prefix}dra"
    driver = f"{name}.patchbay.dev"
    cluster.create_profile(name, spec(cluster))
    wait_for("the DeviceClass", lambda: cluster.device_class(driver))
    cluster.patch_spec(name, {"mode": "DevicePlugin"})
    wait_for("the DeviceClass gone", lambda: cluster.device_class(driver) is None)
    ds = wait_for(
        "the DevicePlugin agents",
        lambda: (
            (d := daemonset(cluster, name))
            and "--device-plugin-dir" in d["spec"]["template"]["spec"]["containers"][0]["command"]
            and d
        ),
    )
    assert "--dra-driver" not in ds["spec"]["template"]["spec"]["containers"][0]["command"]
