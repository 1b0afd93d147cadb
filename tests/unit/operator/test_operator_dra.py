"""DRA mode without a cluster: the agent DaemonSet as a DRA kubelet plugin, the DeviceClass, who
wins a resource name per way of serving, the KEP-5004 overlap check and the DRA status (pure:
what the API server kept of the DeviceClass and the slices' taints, too), and the controller
applying and removing the DeviceClass through ``fakekube.FakeKube`` (and reading back what it
stored). The real API servers of both kinds are in tests/integration/operator/test_operator_dra_mode.py."""

from __future__ import annotations

import copy
from pathlib import Path
from typing import Any

import pytest
import yaml
from fakekube import FakeKube, started
from support.agentrun import until
from support.clusters import kstatus

from patchbay_agent.kubelet.draplugin import service_dir
from patchbay_agent.options import node_agent_plugins_dir
from patchbay_operator import render
from patchbay_operator.capacity import NodeState
from patchbay_operator.config import Settings
from patchbay_operator.controller import Controller
from patchbay_operator.devicereports import Device, Report
from patchbay_operator.kube import collection, ref_of
from patchbay_operator.profiles import Profile, Registry, Selector
from patchbay_operator.status.daemonset import AgentDaemonSet
from patchbay_operator.status.dra import StoredDeviceClass, dra_status, served_twice

R = "example.com/serial"
KUBELET = "/tmp/node-1/kubelet"
SETTINGS = Settings(
    namespace="patchbay-test", agent_image="example.invalid/agent:1", kubelet_root_dir=KUBELET
)


def body(
    name: str = "serial", mode: str = "DRA", created: str = "2026-01-01T00:00:00Z", **selector: str
) -> dict[str, Any]:
    return {
        "metadata": {"name": name, "uid": f"uid-{name}", "generation": 1, "creationTimestamp": created},
        "spec": {
            "resourceName": R,
            "mode": mode,
            "nodeSelector": {"matchLabels": selector},
            "plugin": {"discovery": {"paths": {"globs": ["/dev/ttyUSB*"]}}},
        },
    }


def prof(name: str = "serial", mode: str = "DRA", **kw: Any) -> Profile:
    return Profile.from_body(body(name, mode, **kw))


def container(ds: dict[str, Any]) -> dict[str, Any]:
    (c,) = ds["spec"]["template"]["spec"]["containers"]
    return dict(c)


def flags(ds: dict[str, Any]) -> dict[str, str]:
    """The agent command's ``--flag value`` pairs."""
    cmd = container(ds)["command"]
    return {cmd[i]: cmd[i + 1] for i in range(1, len(cmd) - 1) if cmd[i].startswith("--")}


# --- rendering -------------------------------------------------------------------------------


def test_the_dra_agent_is_the_plugin_agent_with_the_kubelet_plugin_directories() -> None:
    cm, ds, dc = render.agent_objects(prof(), SETTINGS)
    plugin_cm, plugin_ds = render.agent_objects(prof(mode="DevicePlugin"), SETTINGS)
    (entry,) = yaml.safe_load(cm["data"]["node.yaml"])["profiles"]
    (plugin_entry,) = yaml.safe_load(plugin_cm["data"]["node.yaml"])["profiles"]
    assert (entry["mode"], entry["driver"]) == ("DRA", "serial.patchbay.dev")
    assert entry["plugin"] == plugin_entry["plugin"]  # the same agent config (another revision)
    args = flags(ds)
    assert "--dra-driver" not in args  # the entry names the driver
    assert args["--kubelet-root-dir"] == KUBELET
    # The driver's directory is its own under the kubelet's plugins directory (what the pod mounts).
    assert args["--node-plugins-dir"] == f"{KUBELET}/plugins"
    assert args["--cdi-spec-dir"] == render.CDI_SPEC_MOUNT  # always: DRA hands over through CDI
    assert "--device-plugin-dir" not in args
    for flag in (
        "--watch-config",
        "--report-namespace",
        "--pod-name",
        "--pod-resources-socket",
        "--node-config",
    ):
        assert args[flag] == flags(plugin_ds)[flag]
    pod = ds["spec"]["template"]["spec"]
    mounts = {m["name"]: m["mountPath"] for m in container(ds)["volumeMounts"]}
    host = {v["name"]: v.get("hostPath") for v in pod["volumes"]}
    # The kubelet dials the endpoint the agent announces: container path == node path. Of the
    # plugins directory, only its own driver's (least host access).
    for name, path in (
        ("plugins-registry", f"{KUBELET}/plugins_registry"),
        ("kubelet-plugins", f"{KUBELET}/plugins/serial.patchbay.dev"),
    ):
        assert mounts[name] == path
        assert host[name] == {"path": path, "type": "DirectoryOrCreate"}
    assert mounts["cdi-specs"] == "/var/run/cdi"
    assert host["cdi-specs"] == {"path": SETTINGS.cdi_spec_dir, "type": "DirectoryOrCreate"}
    assert host["pod-resources"]["path"] == f"{KUBELET}/pod-resources"
    assert "device-plugins" not in mounts and "device-plugins" not in host
    # Its own ServiceAccount (the only one bound to the DRA ClusterRole); everything else is the
    # DevicePlugin agent's: hardening, probe.
    plugin_pod = plugin_ds["spec"]["template"]["spec"]
    assert pod["serviceAccountName"] == SETTINGS.agent_dra_service_account == "patchbay-agent-dra"
    assert plugin_pod["serviceAccountName"] == SETTINGS.agent_service_account == "patchbay-agent"
    assert container(ds)["securityContext"] == container(plugin_ds)["securityContext"]
    assert container(ds)["readinessProbe"] == container(plugin_ds)["readinessProbe"]
    assert ds["metadata"]["labels"]["app.kubernetes.io/component"] == "dra-driver"
    assert ds["spec"]["selector"] == plugin_ds["spec"]["selector"]  # the informer still sees it
    assert dc["kind"] == "DeviceClass"


def test_a_device_plugin_agent_has_no_dra_flag_or_mount() -> None:
    objs = render.agent_objects(prof(mode="DevicePlugin"), SETTINGS)
    assert [o["kind"] for o in objs] == ["ConfigMap", "DaemonSet"]
    args = flags(objs[1])
    assert "--dra-driver" not in args and "--cdi-spec-dir" not in args
    names = {m["name"] for m in container(objs[1])["volumeMounts"]}
    assert "device-plugins" in names and not names & {"plugins-registry", "kubelet-plugins"}


def test_device_class_selects_the_driver_and_serves_the_extended_resource() -> None:
    dc = render.device_class(prof())
    assert dc["apiVersion"] == "resource.k8s.io/v1"
    assert dc["metadata"]["name"] == "serial.patchbay.dev"
    assert "namespace" not in dc["metadata"]  # cluster-scoped
    assert dc["spec"] == {
        "selectors": [{"cel": {"expression": 'device.driver == "serial.patchbay.dev"'}}],
        "extendedResourceName": R,
    }
    (owner,) = dc["metadata"]["ownerReferences"]
    assert (owner["kind"], owner["name"], owner["uid"], owner["controller"]) == (
        "DevicePluginProfile",
        "serial",
        "uid-serial",
        True,
    )
    assert ref_of(dc).path == "/apis/resource.k8s.io/v1/deviceclasses/serial.patchbay.dev"


def test_collections_know_which_kinds_are_cluster_scoped() -> None:
    assert collection("resource.k8s.io/v1", "DeviceClass") == "/apis/resource.k8s.io/v1/deviceclasses"
    with pytest.raises(ValueError, match="cluster-scoped"):
        collection("resource.k8s.io/v1", "DeviceClass", "ns")
    with pytest.raises(ValueError, match="namespace is required"):
        collection("apps/v1", "DaemonSet")


# --- who serves a resource name ---------------------------------------------------------------


def test_a_device_plugin_and_a_dra_profile_may_share_a_resource_name_two_dra_profiles_may_not() -> None:
    plugin = prof("old-plugin", "DevicePlugin", created="2026-01-01T00:00:00Z")
    dra = prof("new-dra", "DRA", created="2026-02-01T00:00:00Z")
    later = prof("later-dra", "DRA", created="2026-03-01T00:00:00Z")
    reg = Registry([plugin, dra, later])
    assert reg.conflict(plugin) is None and reg.conflict(dra) is None
    assert reg.conflict(later) == dra
    assert reg.other_way(dra) == plugin and reg.other_way(plugin) == dra
    assert reg.static_winners() == {}


def nodestate(name: str, **labels: str) -> NodeState:
    return NodeState.from_node({"metadata": {"name": name, "labels": labels}})


def test_served_twice_names_the_nodes_both_profiles_select() -> None:
    nodes = [nodestate("a", plugin="yes"), nodestate("b", plugin="yes", dra="yes"), nodestate("c", dra="yes")]
    dra = prof("d", "DRA", dra="yes")
    plugin = prof("p", "DevicePlugin", plugin="yes")
    assert served_twice(dra, plugin, nodes) == ["b"]
    assert served_twice(dra, None, nodes) == []
    assert served_twice(dra, prof("d2", "DRA"), nodes) == []  # same way: a name conflict instead
    everywhere = prof("p", "DevicePlugin")
    assert served_twice(dra, everywhere, nodes) == ["b", "c"]
    going = Profile.from_body(
        {**body("p", "DevicePlugin"), "metadata": {"name": "p", "deletionTimestamp": "2026-01-02T00:00:00Z"}}
    )
    assert served_twice(dra, going, nodes) == []


# --- status -----------------------------------------------------------------------------------

DS_OK = AgentDaemonSet(
    "serial",
    generation=1,
    status={
        "observedGeneration": 1,
        "desiredNumberScheduled": 2,
        "numberAvailable": 2,
        "updatedNumberScheduled": 2,
    },
)


def report(node: str, *devices: Device) -> Report:
    return Report(f"serial.{node}", "serial", node, devices)


def cond(st: dict[str, Any], type_: str) -> dict[str, Any]:
    return next(c for c in st["conditions"] if c["type"] == type_)


def test_dra_devices_come_from_the_reports_and_nothing_waits_for_node_capacity() -> None:
    nodes = [nodestate("a"), nodestate("b")]  # DRA devices never appear in node capacity
    reports = [
        report("a", Device("ttyUSB0", True, holders=("ns/pod/c",)), Device("ttyUSB1", True)),
        report("b", Device("ttyUSB0", False, "Vanished", "gone")),
    ]
    st = dra_status(prof(), DS_OK, nodes, {}, "T", reports=reports)
    assert st["devices"] == {"capacity": 3, "allocatable": 2, "healthy": 2, "unhealthy": 1, "allocated": 1}
    assert st["devicesAllocatable"] == "2/3" and st["nodesReady"] == "2/2"
    assert cond(st, "Ready")["status"] == "True"
    assert cond(st, "Reconciling")["status"] == "False"  # no WaitingForKubelet in DRA mode
    assert cond(st, "Degraded")["reason"] == "DevicesUnhealthy"
    assert [(p["node"], p.get("device"), p["reason"]) for p in st["problems"]] == [
        ("b", "ttyUSB0", "Vanished")
    ]
    assert kstatus({"metadata": {"generation": 1}, "status": st}) == "Current"


def test_a_node_without_a_report_is_a_transient_no_devices_problem() -> None:
    st = dra_status(prof(), DS_OK, [nodestate("a")], {}, "T")
    assert st["devices"]["capacity"] == 0
    (p,) = st["problems"]
    assert (p["node"], p["reason"]) == ("a", "NoDevices") and "no DeviceReport" in p["message"]


def test_a_resource_served_twice_is_degraded_and_names_the_nodes() -> None:
    nodes = [nodestate("a"), nodestate("b")]
    reports = [report("a", Device("d0", True)), report("b", Device("d0", True))]
    st = dra_status(prof(), DS_OK, nodes, {}, "T", reports=reports, twin="serial-plugin", twice=["b"])
    degraded = cond(st, "Degraded")
    assert (degraded["status"], degraded["reason"]) == ("True", "ResourceServedTwice")
    assert "serial-plugin" in degraded["message"] and "b" in degraded["message"]
    assert [(p["node"], p["reason"]) for p in st["problems"]] == [("b", "ResourceServedTwice")]
    assert cond(st, "Ready")["status"] == "True"  # the agents work; the overlap is the user's to fix


STORED = StoredDeviceClass("serial.patchbay.dev", R)
DROPPED = StoredDeviceClass("serial.patchbay.dev", "")


def test_a_device_class_stored_without_its_extended_resource_name_is_degraded_not_silently_ready() -> None:
    reports = [report("a", Device("d0", True), Device("d1", True))]
    kept = dra_status(prof(), DS_OK, [nodestate("a")], {}, "T", reports=reports, device_class=STORED)
    assert cond(kept, "Degraded")["status"] == "False"
    assert kept["dra"] == {
        "deviceClassName": "serial.patchbay.dev",
        "extendedResourceName": R,
        "deviceTaints": None,
        "consumableCapacity": None,
        "partitionableDevices": None,
        "withheldDevices": None,
        "maintenance": None,
    }
    st = dra_status(prof(), DS_OK, [nodestate("a")], {}, "T", reports=reports, device_class=DROPPED)
    degraded = cond(st, "Degraded")
    assert (degraded["status"], degraded["reason"]) == ("True", "ExtendedResourceNotServed")
    assert (
        R in degraded["message"]
        and "ResourceClaims with deviceClassName serial.patchbay.dev" in degraded["message"]
    )
    ready = cond(st, "Ready")
    assert ready["status"] == "True" and f"pods that ask for {R}" in ready["message"]
    assert st["dra"]["extendedResourceName"] == ""
    assert kstatus({"metadata": {"generation": 1}, "status": st}) == "Current"  # claims work
    # Unhealthy devices as well: still ExtendedResourceNotServed, and the message says both.
    sick = [report("a", Device("d0", False, "Vanished", "gone"))]
    both = cond(
        dra_status(prof(), DS_OK, [nodestate("a")], {}, "T", reports=sick, device_class=DROPPED), "Degraded"
    )
    assert (
        both["reason"] == "ExtendedResourceNotServed"
        and "also unhealthy devices on 1 node" in both["message"]
    )
    # Served twice outranks it (a fix the user must make on the profiles).
    twice = dra_status(prof(), DS_OK, [nodestate("a")], {}, "T", device_class=DROPPED, twin="p", twice=["a"])
    assert cond(twice, "Degraded")["reason"] == "ResourceServedTwice"


def test_where_taints_are_dropped_withheld_devices_are_counted_out_and_said() -> None:
    nodes = [nodestate("a"), nodestate("b")]
    reports = [
        Report(
            "serial.a",
            "serial",
            "a",
            (
                Device("d0", True),
                Device("d1", False, "Vanished", "gone", withheld=True),
                Device("d2", True, withheld=True),  # still handed out by the device plugin
            ),
            device_taints="Dropped",
        ),
        Report("serial.b", "serial", "b", (Device("d0", True),), device_taints="Kept"),
    ]
    st = dra_status(prof(), DS_OK, nodes, {}, "T", reports=reports, device_class=STORED)
    assert st["devices"] == {"capacity": 4, "allocatable": 2, "healthy": 3, "unhealthy": 1, "allocated": 0}
    assert (st["dra"]["deviceTaints"], st["dra"]["withheldDevices"]) == ("Dropped", 2)
    (p,) = st["problems"]
    assert (p["node"], p["device"], p["reason"]) == ("a", "d1", "Vanished")
    assert p["message"].startswith("gone; left out of the node's ResourceSlice")
    kept = [Report("serial.b", "serial", "b", (Device("d0", True),), device_taints="Kept")]
    st = dra_status(prof(), DS_OK, [nodestate("b")], {}, "T", reports=kept)
    assert (st["dra"]["deviceTaints"], st["dra"]["withheldDevices"]) == ("Kept", 0)


def test_a_shared_profile_whose_sharing_is_dropped_is_degraded_and_says_so() -> None:
    """sharing.replicas > 1 in DRA mode is consumable capacity; where the agents found the API
    server drops it (before 1.36) the devices go unshared: Degraded, SharingNotServed."""
    b = body()
    b["spec"]["plugin"]["sharing"] = {"replicas": 3}
    shared = Profile.from_body(b)
    assert (shared.shares, prof().shares) == (3, 1)

    def rep(node: str, sharing: str) -> Report:
        return Report(f"serial.{node}", "serial", node, (Device("d0", True),), consumable_capacity=sharing)

    kept = dra_status(
        shared, DS_OK, [nodestate("a")], {}, "T", reports=[rep("a", "Kept")], device_class=STORED
    )
    assert kept["dra"]["consumableCapacity"] == "Kept"
    assert cond(kept, "Degraded")["status"] == "False"
    nodes = [nodestate("a"), nodestate("b")]
    reports = [rep("a", "Kept"), rep("b", "Dropped")]
    st = dra_status(shared, DS_OK, nodes, {}, "T", reports=reports, device_class=STORED)
    assert st["dra"]["consumableCapacity"] == "Dropped"
    degraded = cond(st, "Degraded")
    assert (degraded["status"], degraded["reason"]) == ("True", "SharingNotServed")
    assert "not 3" in degraded["message"] and "DRAConsumableCapacity" in degraded["message"]
    # An unshared profile never says anything about sharing, whatever a report claims.
    st = dra_status(prof(), DS_OK, nodes, {}, "T", reports=reports, device_class=STORED)
    assert st["dra"]["consumableCapacity"] is None
    assert cond(st, "Degraded")["status"] == "False"
    assert (
        Report.from_object(
            {
                "metadata": {"name": "serial.a"},
                "profile": "serial",
                "nodeName": "a",
                "consumableCapacity": "Dropped",
            }
        ).consumable_capacity
        == "Dropped"
    )


def test_a_report_says_taints_and_withheld_devices() -> None:
    obj = {
        "metadata": {"name": "serial.a"},
        "profile": "serial",
        "nodeName": "a",
        "deviceTaints": "Dropped",
        "devices": [{"id": "d0", "health": "Healthy"}, {"id": "d1", "health": "Unhealthy", "withheld": True}],
    }
    rep = Report.from_object(obj)
    # Kept: the unhealthy device (the status names it); counted: both.
    assert (rep.device_taints, rep.withheld, [(d.id, d.withheld) for d in rep.devices]) == (
        "Dropped",
        1,
        [("d1", True)],
    )
    assert (rep.total, rep.healthy, rep.unhealthy, rep.unlisted_unhealthy) == (2, 1, 1, 0)
    assert Report.from_object({**obj, "deviceTaints": None}).device_taints == ""


# --- the controller ---------------------------------------------------------------------------


@pytest.fixture
async def ctl() -> Any:
    kube = FakeKube()
    kube.add_node("n0", {"pool": "a"})
    async with started(Controller(SETTINGS, kube)) as c:  # type: ignore[arg-type]
        yield c, kube


DC_PATH = "/apis/resource.k8s.io/v1/deviceclasses/serial.patchbay.dev"


async def test_a_dra_profile_gets_its_device_class_and_loses_it_leaving_dra(ctl: Any) -> None:
    c, kube = ctl
    await c.reconcile(body())
    assert [o["kind"] for o in kube.applied] == [
        "ControllerRevision",
        "ConfigMap",
        "DaemonSet",
        "DeviceClass",
    ]
    assert DC_PATH in kube.objects
    plugin = copy.deepcopy(body(mode="DevicePlugin"))
    await c.reconcile(plugin)
    assert DC_PATH not in kube.objects
    # A profile without agent settings of its own is served by the shared node agent.
    assert "/apis/apps/v1/namespaces/patchbay-test/daemonsets/patchbay-node-agent" in kube.objects


async def test_a_device_class_the_profile_does_not_control_is_left_alone(ctl: Any) -> None:
    c, kube = ctl
    theirs = {
        "apiVersion": "resource.k8s.io/v1",
        "kind": "DeviceClass",
        "metadata": {"name": "serial.patchbay.dev"},
        "spec": {},
    }
    kube.apply(theirs)
    await c.reconcile(body(mode="DevicePlugin"))
    await c.delete(body(mode="DevicePlugin"))
    assert DC_PATH in kube.objects


def _node_matches(terms: list[dict[str, Any]], labels: dict[str, str]) -> bool:
    """How the scheduler reads nodeSelectorTerms: any term whose expressions all hold."""
    from patchbay_api.selectors import Requirement

    return any(
        all(
            Requirement(e["key"], e["operator"], frozenset(e.get("values") or ())).matches(labels)
            for e in t["matchExpressions"]
        )
        for t in terms
    )


@pytest.mark.parametrize(
    ("dp_selector", "labels", "runs"),
    [
        ({"matchLabels": {"serial": "plugin"}}, {"serial-dra": "true"}, True),
        ({"matchLabels": {"serial": "plugin"}}, {"serial-dra": "true", "serial": "plugin"}, False),
        ({"matchLabels": {"serial": "plugin"}}, {"serial-dra": "true", "serial": "other"}, True),
        (
            {"matchExpressions": [{"key": "gpu", "operator": "Exists"}]},
            {"serial-dra": "true", "gpu": ""},
            False,
        ),
        (
            {
                "matchLabels": {"a": "1"},
                "matchExpressions": [{"key": "b", "operator": "NotIn", "values": ["x"]}],
            },
            {"serial-dra": "true", "a": "1", "b": "x"},
            True,  # the DevicePlugin profile does not select it (b is x)
        ),
        ({}, {"serial-dra": "true"}, False),  # the other profile selects every node
        ({"matchLabels": {"serial": "plugin"}}, {}, False),  # not the DRA profile's node at all
    ],
)
def test_a_dra_agent_never_runs_where_the_resource_is_served_through_node_capacity(
    dp_selector: dict[str, Any], labels: dict[str, str], runs: bool
) -> None:
    """KEP-5004: the DRA DaemonSet's node affinity is "the DRA selector AND NOT the device plugin
    profile's selector", so a node matching both runs only the device plugin's agent."""
    dra = Profile.from_body(body(**{"serial-dra": "true"}))
    _, ds, _ = render.agent_objects(dra, SETTINGS, Selector.parse(dp_selector))
    affinity = ds["spec"]["template"]["spec"]["affinity"]["nodeAffinity"]
    terms = affinity["requiredDuringSchedulingIgnoredDuringExecution"]["nodeSelectorTerms"]
    assert _node_matches(terms, labels) is runs


async def test_the_dra_daemonset_follows_the_device_plugin_profiles_selector(ctl: Any) -> None:
    """The DRA agents' exclusion is re-applied when the other side appears, and lifted when it
    goes."""
    c, kube = ctl
    cm_path = "/api/v1/namespaces/patchbay-test/configmaps/patchbay-node-agent"

    def terms() -> list[dict[str, Any]]:
        """The DRA profile's terms in the shared node agent's config (what its agents select)."""
        config = yaml.safe_load(kube.objects[cm_path]["data"]["node.yaml"])
        (entry,) = [e for e in config["profiles"] if e["profile"] == "serial-dra"]
        return [{"matchExpressions": t} for t in entry["nodeSelectorTerms"]]

    dra = body("serial-dra", "DRA", "2026-01-02T00:00:00Z", **{"serial-dra": "true"})
    plugin = body("serial-dp", "DevicePlugin", "2026-01-01T00:00:00Z", serial="plugin")
    await c.reconcile(dra)
    assert terms() == [{"matchExpressions": [{"key": "serial-dra", "operator": "In", "values": ["true"]}]}]
    await c.reconcile(plugin)
    assert terms() == [
        {
            "matchExpressions": [
                {"key": "serial-dra", "operator": "In", "values": ["true"]},
                {"key": "serial", "operator": "NotIn", "values": ["plugin"]},
            ]
        }
    ]
    await c.delete(plugin)
    assert terms() == [{"matchExpressions": [{"key": "serial-dra", "operator": "In", "values": ["true"]}]}]


class DroppingKube(FakeKube):
    """Stores DeviceClasses as an API server with DRAExtendedResource off does: without
    ``spec.extendedResourceName`` (until ``keeps`` is set: a control plane upgraded)."""

    keeps = False

    def apply(self, obj: dict[str, Any], force: bool = True) -> dict[str, Any]:
        if obj["kind"] == "DeviceClass" and not self.keeps:
            obj = {**obj, "spec": {k: v for k, v in obj["spec"].items() if k != "extendedResourceName"}}
        return super().apply(obj, force)


async def test_the_controller_reads_back_the_device_class_and_applies_it_again_while_dropped() -> None:
    kube = DroppingKube()
    kube.add_node("n0", {"pool": "a"})
    c = Controller(Settings(namespace="patchbay-test", status_debounce=0.01), kube)  # type: ignore[arg-type]
    c.classes.recheck = 0.05
    await c.start()
    try:
        await c.reconcile(body())
        assert c.classes.stored["serial"] == DROPPED
        st = c.statuses.compute("serial")
        assert st is not None and cond(st, "Degraded")["reason"] == "ExtendedResourceNotServed"
        applies = len(kube.applied)
        await until(lambda: len(kube.applied) > applies)  # applied again while dropped
        kube.keeps = True
        await until(lambda: c.classes.stored["serial"] == STORED)
        st = c.statuses.compute("serial")
        assert st is not None and cond(st, "Degraded")["reason"] != "ExtendedResourceNotServed"
        assert not c.classes.checking("serial")  # kept: nothing more is scheduled
        # Leaving DRA mode: the class goes, and a status write removes status.dra (None in the
        # merge patch) after one that had it.
        await until(lambda: any((w.get("dra") or {}).get("deviceClassName") for _, w in kube.status_writes))
        before = len(kube.status_writes)
        await c.reconcile(body(mode="DevicePlugin"))
        assert "serial" not in c.classes.stored
        await until(lambda: any("dra" in w and w["dra"] is None for _, w in kube.status_writes[before:]))
    finally:
        await c.stop()


# --- least host access: only the driver's own directory of the kubelet's plugins ---------------


@pytest.mark.parametrize("root", ["/var/lib/kubelet", "/var/lib/" + "k" * 40, "/x"])
@pytest.mark.parametrize(
    "driver", ["dra.patchbay.dev", "a-rather-long-profile-name-of-fifty-characters-xx.patchbay.dev"]
)
def test_the_operator_mounts_the_directory_the_agent_uses(root: str, driver: str) -> None:
    """The operator and the agent compute the driver's directory each on its own side (short and
    long driver names, short and long kubelet roots): they must agree."""
    assert render.dra_service_dir(root, driver) == str(service_dir(Path(root), driver))


def host_paths(ds: dict[str, Any]) -> dict[str, str]:
    """Volume name -> the node's path, for every hostPath volume of the DaemonSet."""
    volumes = ds["spec"]["template"]["spec"]["volumes"]
    return {v["name"]: v["hostPath"]["path"] for v in volumes if "hostPath" in v}


def test_an_own_dra_agent_mounts_its_driver_directory_and_the_shared_one_its_own_directory() -> None:
    own_body = body()
    own_body["spec"]["agent"] = {"resources": {"limits": {"memory": "64Mi"}}}
    own = render.agent_objects(Profile.from_body(own_body), SETTINGS)[1]
    shared = render.shared_agent_objects([(prof(), None)], SETTINGS)[1]
    assert host_paths(own)["kubelet-plugins"] == f"{KUBELET}/plugins/serial.patchbay.dev"
    assert host_paths(shared)["kubelet-plugins"] == f"{KUBELET}/plugins/patchbay_node-agent"


@pytest.mark.parametrize(
    "profiles", [[], ["serial"], ["serial", "a-rather-long-profile-name-of-fifty-characters-xx"]]
)
def test_the_shared_node_agent_mounts_only_its_own_directory_of_the_kubelets_plugins(
    profiles: list[str],
) -> None:
    """Least host access: of the kubelet's plugins directory (every CSI and DRA driver's sockets)
    the shared node agent's pod mounts one directory of its own, whichever DRA profiles it serves,
    at the same path in the container (the kubelet dials the path the agent announces), created
    when missing."""
    ds = render.shared_agent_objects([(prof(n), None) for n in profiles], SETTINGS)[1]
    pod = ds["spec"]["template"]["spec"]
    own = f"{KUBELET}/plugins/patchbay_node-agent"
    under_plugins = {
        name: path
        for name, path in host_paths(ds).items()
        if path == f"{KUBELET}/plugins" or path.startswith(f"{KUBELET}/plugins/")
    }
    assert under_plugins == {"kubelet-plugins": own}
    (volume,) = [v for v in pod["volumes"] if v["name"] == "kubelet-plugins"]
    assert volume["hostPath"] == {"path": own, "type": "DirectoryOrCreate"}
    mounts = {m["name"]: m["mountPath"] for m in container(ds)["volumeMounts"]}
    assert mounts["kubelet-plugins"] == own
    assert not any(p == f"{KUBELET}/plugins" for p in mounts.values())
    # The pod template still depends on no profile.
    assert pod == render.shared_agent_objects([], SETTINGS)[1]["spec"]["template"]["spec"]


@pytest.mark.parametrize(
    "root", ["/var/lib/kubelet", "/var/lib/kubelet/", "/tmp/patchbay-node-0123456789/kubelet", "/x"]
)
def test_the_operator_mounts_the_directory_the_node_agent_keeps_its_drivers_in(root: str) -> None:
    """The node agent's directory: the operator's rule (what the pod mounts) and the agent's
    (where its units put their drivers' directories) agree, and every driver's directory, short
    or hashed, lies inside it, one level down."""
    assert render.node_agent_plugins_dir(root) == str(node_agent_plugins_dir(Path(root)))
    base = Path(render.node_agent_plugins_dir(root))
    assert base.name == "patchbay_node-agent"
    for driver in ("dra.patchbay.dev", "a-rather-long-profile-name-of-fifty-characters-xx.patchbay.dev"):
        assert service_dir(Path(root), driver, node_agent_plugins_dir(Path(root))).parent == base


@pytest.mark.parametrize("root", ["/var/lib/kubelet", "/var/lib/" + "k" * 40])
@pytest.mark.parametrize("name", ["serial", "a-rather-long-profile-name-of-fifty-characters-xx"])
@pytest.mark.parametrize("own", [True, False])
def test_the_node_agent_makes_its_driver_directory_in_what_its_pod_mounts(
    root: str, name: str, own: bool
) -> None:
    """Both shapes of agent run `--node-config`: the driver's directory their DRA unit makes, from
    the flags the operator renders (parsed as the agent's command line does), lies in what the
    pod mounts: an agent of its own, its driver's own directory itself; the shared one, one level
    inside its own directory."""
    from patchbay_agent.nodeagent import NodeAgent, NodeOptions
    from patchbay_agent.nodeconfig import parse_node_config
    from patchbay_agent.options import AgentOptions, Values, build_parser

    settings = Settings(
        namespace="patchbay-test", agent_image="example.invalid/agent:1", kubelet_root_dir=root
    )
    b = body(name)
    if own:
        b["spec"]["agent"] = {}
        cm, ds = render.agent_objects(Profile.from_body(b), settings)[:2]
    else:
        cm, ds = render.shared_agent_objects([(Profile.from_body(b), None)], settings)
    env = {"$(NODE_NAME)": "node-a", "$(POD_NAMESPACE)": "patchbay-test", "$(POD_NAME)": "agent-a"}
    args = build_parser().parse_args([env.get(a, a) for a in container(ds)["command"][1:]])
    values = Values(args, {"POD_NAMESPACE": "patchbay-test"})
    options = NodeOptions(
        AgentOptions(**values.section("agent")), report_namespace="patchbay-test", **values.section("node")
    )
    (entry,) = parse_node_config(yaml.safe_load(cm["data"]["node.yaml"]))
    dra = NodeAgent([entry], options, client=None, labels={}).unit_options(entry).dra  # type: ignore[arg-type]
    assert dra is not None
    made = service_dir(dra.kubelet_root_dir, dra.driver, dra.plugins_dir)
    mounted = Path(host_paths(ds)["kubelet-plugins"])
    assert made == mounted if own else made.parent == mounted
