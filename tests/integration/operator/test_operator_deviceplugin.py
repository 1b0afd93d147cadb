"""DevicePlugin mode: the agent ConfigMap and DaemonSet, server-side applied and owned by the profile."""

from __future__ import annotations

import signal
from typing import Any

import yaml
from kubernetes.client.rest import ApiException
from support.clusters import NAMESPACE, TEST_LABEL, Cluster, profile_spec, wait_for
from support.operator import Operator, agent_object, assert_applied_for
from support.reports import device_report

R = "example.com/serial"
AGENT_IMAGE = "example.invalid/patchbay-agent:it"


def spec(tag: str, replicas: int = 1, **agent: Any) -> dict[str, Any]:
    return profile_spec(
        R,
        "DevicePlugin",
        {TEST_LABEL: tag},
        plugin={"discovery": {"paths": {"globs": ["/dev/ttyUSB*"]}}, "sharing": {"replicas": replicas}},
        agent={"tolerations": [{"operator": "Exists"}], **agent},
    )


def daemonset(cluster: Cluster, profile: str) -> dict[str, Any] | None:
    return agent_object(cluster, "DaemonSet", profile)


def configmap(cluster: Cluster, profile: str) -> dict[str, Any] | None:
    return agent_object(cluster, "ConfigMap", profile)


def entry(cm: dict[str, Any] | None) -> dict[str, Any]:
    """The one entry of an agent of its own's node config (its ConfigMap's ``node.yaml``)."""
    assert cm is not None
    (only,) = yaml.safe_load(cm["data"]["node.yaml"])["profiles"]
    return dict(only)


def apply_report(cluster: Cluster, name: str, node: str, agent: str, devices: list[dict[str, Any]]) -> None:
    """What an agent pod does: its DeviceReport of `devices` for `node` (`Cluster.apply_report`)."""
    cluster.apply_report(name, node, agent, devices, R)


def test_agent_objects_are_applied_rolled_and_deleted(cluster: Cluster, operator: Operator) -> None:
    cluster.add_nodes(3)
    name = f"{cluster.prefix}serial"
    created = cluster.create_profile(name, spec(cluster.tag))
    uid = created["metadata"]["uid"]

    ds = wait_for("DaemonSet", lambda: daemonset(cluster, name))
    cm = configmap(cluster, name)
    assert cm is not None
    config = entry(cm)
    assert config["resourceName"] == R and config["profile"] == name
    assert config["plugin"]["discovery"] == {"paths": {"globs": ["/dev/ttyUSB*"]}}
    assert config["plugin"]["health"] == {"periodSeconds": 5, "failureThreshold": 3, "successThreshold": 1}
    for obj in (ds, cm):
        assert_applied_for(obj, name, uid)
    pod = ds["spec"]["template"]["spec"]
    assert pod["containers"][0]["image"] == AGENT_IMAGE  # the operator's --agent-image default
    assert pod["containers"][0]["securityContext"]["capabilities"] == {"drop": ["ALL"]}
    assert ds["spec"]["updateStrategy"]["rollingUpdate"]["maxSurge"] == 1

    # kwok runs the agent pods (tolerating its taint): the status reports the rollout done.
    # "3/3" comes from the DaemonSet's status and the per-node problems from the operator's own
    # watch of the pods, which can see the last pod Ready a moment later: a status written in
    # between says 3/3 and AgentStarting for that node, and the pod's event writes it again (CI
    # run at 96cd5c0). So the status is read once both have seen every pod Ready.
    def settled() -> dict[str, Any] | None:
        st = (cluster.profile(name) or {}).get("status") or {}
        reasons = {p["reason"] for p in st.get("problems") or []}
        return st if st.get("nodesReady") == "3/3" and "AgentStarting" not in reasons else None

    st = wait_for("status 3/3, every agent pod seen Ready", settled)
    conds = {c["type"]: c for c in st["conditions"]}
    assert conds["Ready"]["status"] == "True"
    assert conds["Reconciling"]["status"] == "False"
    assert conds["Stalled"]["status"] == "False"
    # No kubelet behind kwok nodes: nothing advertises devices, and status says so per node.
    assert st["devices"] == {"capacity": 0, "allocatable": 0}
    assert st["problemCount"] == 3 and {p["reason"] for p in st["problems"]} == {"NoDevices"}

    # A plugin change rewrites the config, which the agents follow live (the pod template stays:
    # no pod rolls).
    template = ds["spec"]["template"]
    cluster.patch_spec(name, {"plugin": {"sharing": {"replicas": 4}}})
    wait_for(
        "the new config", lambda: entry(configmap(cluster, name))["plugin"]["sharing"] == {"replicas": 4}
    )
    assert (daemonset(cluster, name) or {})["spec"]["template"] == template
    wait_for(
        "status of generation 2",
        lambda: ((cluster.profile(name) or {}).get("status") or {}).get("observedGeneration") == 2,
    )

    cluster.delete_profile(name)
    wait_for(
        "agent objects deleted", lambda: daemonset(cluster, name) is None and configmap(cluster, name) is None
    )
    wait_for("profile gone", lambda: cluster.profile(name) is None)


def test_operator_killed_during_a_spec_change_converges(cluster: Cluster, operator: Operator) -> None:
    cluster.add_nodes(2)
    name = f"{cluster.prefix}serial"
    cluster.create_profile(name, spec(cluster.tag))
    ds = wait_for("DaemonSet", lambda: daemonset(cluster, name))
    assert ds["spec"]["template"]["spec"].get("priorityClassName") is None
    operator.stop(signal.SIGKILL)
    cluster.patch_spec(
        name, {"plugin": {"sharing": {"replicas": 2}}, "agent": {"priorityClassName": "system-node-critical"}}
    )
    operator.start()
    ds = wait_for(
        "rolled DaemonSet",
        lambda: (
            (d := daemonset(cluster, name)) and d["spec"]["template"]["spec"].get("priorityClassName") and d
        ),
    )
    assert ds["spec"]["template"]["spec"]["priorityClassName"] == "system-node-critical"
    assert entry(configmap(cluster, name))["plugin"]["sharing"] == {"replicas": 2}


def test_mode_change_to_static_removes_the_agents(cluster: Cluster, operator: Operator) -> None:
    nodes = cluster.add_nodes(1)
    name = f"{cluster.prefix}serial"
    cluster.create_profile(name, spec(cluster.tag))
    wait_for("DaemonSet", lambda: daemonset(cluster, name))
    cluster.custom.patch_cluster_custom_object(
        "patchbay.dev",
        "v1beta1",
        "devicepluginprofiles",
        name,
        [
            {"op": "replace", "path": "/spec/mode", "value": "Static"},
            {"op": "remove", "path": "/spec/plugin"},
            {"op": "remove", "path": "/spec/agent"},
            {"op": "add", "path": "/spec/static", "value": {"capacity": 2}},
        ],
        _content_type="application/json-patch+json",
    )
    wait_for("agents removed", lambda: daemonset(cluster, name) is None and configmap(cluster, name) is None)
    wait_for("static value", lambda: cluster.values(nodes[0], R) == ("2", "2"))


def test_reports_of_profiles_that_do_not_exist_are_deleted(cluster: Cluster, operator: Operator) -> None:
    """A DeviceReport no profile owns (a misbehaving agent's, or one left from a profile deleted
    while the operator was down) is deleted within seconds; a known profile's report stays."""
    (node,) = cluster.add_nodes(1)
    name = f"{cluster.prefix}kept"
    cluster.create_profile(name, spec(cluster.tag))
    wait_for("DaemonSet", lambda: daemonset(cluster, name))

    def report(profile: str) -> dict[str, Any]:
        return device_report(
            NAMESPACE, node, profile, R, [], {"total": 0, "healthy": 0, "unhealthy": 0, "allocated": 0}
        )

    def exists(profile: str) -> bool:
        try:
            cluster.custom.get_namespaced_custom_object(
                "patchbay.dev", "v1beta1", NAMESPACE, "devicereports", f"{profile}.{node}"
            )
        except ApiException as e:
            if e.status == 404:
                return False
            raise
        return True

    ghost = f"{cluster.prefix}ghost"
    for profile in (name, ghost):
        cluster.custom.create_namespaced_custom_object(
            "patchbay.dev", "v1beta1", NAMESPACE, "devicereports", report(profile)
        )
    wait_for("the unknown profile's report deleted", lambda: not exists(ghost), 60)
    assert exists(name)
    assert "no such DevicePluginProfile" in operator.log()


def test_only_reports_of_the_profiles_own_agent_pod_count(cluster: Cluster, operator: Operator) -> None:
    """Every report names the pod that wrote it (the chart's admission policy binds that to the
    writer's token): the operator believes it only when that pod is an agent of the report's
    profile on the report's node. Another profile's agent on the same node (compromised, say)
    that writes this profile's report, here one unhealthy device, changes nothing in the status;
    the same report from the profile's own agent pod (kwok runs it) is counted."""
    (node,) = cluster.add_nodes(1)
    name, other = f"{cluster.prefix}trusted", f"{cluster.prefix}other"
    cluster.create_profile(name, spec(cluster.tag))
    cluster.create_profile(other, {**spec(cluster.tag), "resourceName": "example.com/other"})

    def agent_pod(profile: str) -> str:
        pods = cluster.core.list_namespaced_pod(
            NAMESPACE,
            label_selector=f"patchbay.dev/profile={profile}",
            field_selector=f"spec.nodeName={node}",
        ).items
        return pods[0].metadata.name if len(pods) == 1 else ""

    own, foreign = wait_for(
        "the agent pods", lambda: (p, q) if (p := agent_pod(name)) and (q := agent_pod(other)) else None
    )

    def write(agent: str) -> None:
        apply_report(
            cluster, name, node, agent, [{"id": "ttyUSB0", "health": "Unhealthy", "reason": "Vanished"}]
        )

    def devices() -> dict[str, Any]:
        return dict(((cluster.profile(name) or {}).get("status") or {}).get("devices") or {})

    write(foreign)
    wait_for(
        "the operator to see the report", lambda: f"Ignoring DeviceReport {name}.{node}" in operator.log(), 30
    )
    assert f"its writer pod {foreign} is not an agent pod of DevicePluginProfile {name}" in operator.log()
    assert "unhealthy" not in devices(), devices()
    write(own)
    wait_for("the own agent's report counted", lambda: devices().get("unhealthy") == 1, 30)


def test_a_node_whose_kubelet_lost_the_agents_devices_is_degraded(
    cluster: Cluster, operator: Operator
) -> None:
    """The agent reports 4 healthy devices, the node's allocatable stays at 0 (what a v1.34
    kubelet did after a leaving agent registered again: docs/facts.md#kubelet-endpoints): past the
    grace (3 s for the tests' operator, 30 s by default), the node is a DevicesNotAllocatable
    problem, the profile Degraded and not Ready, and an Event says so; once the kubelet counts
    them again, all of that goes."""
    (node,) = cluster.add_nodes(1)
    name = f"{cluster.prefix}lost"
    cluster.create_profile(name, spec(cluster.tag))
    pods = wait_for(
        "the agent pod",
        lambda: (
            cluster.core.list_namespaced_pod(
                NAMESPACE,
                label_selector=f"patchbay.dev/profile={name}",
                field_selector=f"spec.nodeName={node}",
            ).items
        ),
    )
    healthy = [{"id": f"ttyUSB{i}", "health": "Healthy"} for i in range(4)]
    apply_report(cluster, name, node, pods[0].metadata.name, healthy)
    esc = R.replace("/", "~1")
    ops = [
        {"op": "add", "path": f"/status/capacity/{esc}", "value": "4"},
        {"op": "add", "path": f"/status/allocatable/{esc}", "value": "0"},
    ]
    cluster.core.patch_node_status(node, ops, _content_type="application/json-patch+json")

    def status() -> dict[str, Any]:
        return dict((cluster.profile(name) or {}).get("status") or {})

    def conditions() -> dict[str, tuple[str, str]]:
        return {c["type"]: (c["status"], c["reason"]) for c in status().get("conditions") or []}

    lost = wait_for(
        "the node a DevicesNotAllocatable problem",
        lambda: [p for p in status().get("problems") or [] if p["reason"] == "DevicesNotAllocatable"],
        60,
        detail=lambda: str(status()),
    )
    assert lost[0]["node"] == node and "counts 0 of the 4" in lost[0]["message"], lost
    assert conditions()["Degraded"] == ("True", "DevicesNotAllocatable"), status()
    assert conditions()["Ready"][0] == "False", status()
    wait_for(
        "a Warning Event",
        lambda: [
            e
            for e in cluster.core.list_event_for_all_namespaces(
                field_selector=f"involvedObject.name={name}"
            ).items
            if e.reason == "DevicesNotAllocatable"
        ],
        30,
    )
    ops[1]["value"] = "4"
    cluster.core.patch_node_status(node, ops, _content_type="application/json-patch+json")
    wait_for(
        "the problem gone",
        lambda: (
            not [p for p in status().get("problems") or [] if p["reason"] == "DevicesNotAllocatable"]
            and conditions().get("Degraded", ("", ""))[1] != "DevicesNotAllocatable"
        ),
        60,
        detail=lambda: str(status()),
    )
