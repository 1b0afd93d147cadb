"""DRA mode on the REAL API server: the `patchbay-agent --dra-driver` process on the host, with
--kubeconfig (the session cluster's admin), a FAKE device tree, and this test in the kubelet's
place on the agent's two real Unix sockets.

Checked: the agent publishes its ResourceSlice (server-side apply, validated by the real
resource.k8s.io/v1 schema) owned by a real (kwok) Node, with one device per device file, the
driver, the node's pool and the attributes; a ResourceClaim the test creates and allocates (as
admin, through the status subresource) to two of those devices is prepared: the answer names the
CDI IDs and the claim's CDI spec file resolves them; after the claim is deleted, unprepare removes
the file; a device file removed from the tree gets its slice device the `patchbay.dev/vanished`
taint with a higher pool generation where the API server keeps device taints, and leaves the slice
where it drops them (before 1.36: DRADeviceTaints off).

Whether taints are kept is asked of the API server itself (a dry-run create, as the agent asks),
and must agree with the release's capability table; then the agent must find out the same: its
DeviceReport says `deviceTaints` Kept or Dropped, and where Dropped, a device the device plugin
still hands out (the PodResources server this test sets) and a removed device are left out of the
slice, marked `withheld` in the report, and come back when neither holds any more. The same test
checks the one behaviour on releases with the capability and the other on releases without.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import re
import time
from pathlib import Path
from typing import Any

from kubernetes import client
from kubernetes.client.rest import ApiException
from support.agentrun import HostAgent, agent_argv, write_agent_config
from support.clusters import AgentNode, create_resource_claim, or_none, wait_for
from support.draplugin import node_call, register
from support.fakehw import FakeHardware
from support.podresources_peer import PodResourcesPeer, ThreadedPeers
from support.releases import has

from patchbay_agent.api import dra_v1_pb2
from patchbay_agent.dra.slices import (
    device_name,
    partitions_kept,
    sharing_kept,
    taint_probe_document,
    taints_kept,
)

GROUP, VERSION = "resource.k8s.io", "v1"
RESOURCE = "example.com/serial"


def _call(coro: Any) -> Any:
    return asyncio.run(coro)


def _serial_host(workdir: Path, serials: int, plugin: dict[str, Any]) -> FakeHardware:
    """The test's host, `workdir/host`, with `serials` USB serial adapters; and the agent's
    config, `workdir/agent.yaml`: RESOURCE served with `plugin`."""
    hw = FakeHardware(workdir / "host")
    hw.add_serials(serials)
    write_agent_config(workdir / "agent.yaml", plugin, RESOURCE)
    return hw


def _driver(node: AgentNode, kind: str) -> str:
    """The test's DRA driver of `kind`: `<prefix><kind>.patchbay.dev`."""
    return f"{node.prefix}{kind}.patchbay.dev"


def _start_agent(node: AgentNode, hw: FakeHardware, driver: str, *extra: str) -> HostAgent:
    """The agent process in DRA mode for `driver` on the test's node, talking to the API server
    as its admin; its config `workdir/agent.yaml`, its kubelet root `workdir/k`, its CDI dir
    `workdir/cdi`, its log `workdir/agent.log`; `extra`: more flags."""
    argv = agent_argv(
        node.workdir / "agent.yaml",
        node.name,
        *extra,
        dra_driver=driver,
        kubelet_root_dir=node.workdir / "k",
        device_plugin_dir=node.workdir / "dp",
        host_root=hw.root,
        cdi_spec_dir=node.workdir / "cdi",
        http_address="off",
        kubeconfig=node.devcluster.kubeconfig,
        log_format="json",
    )
    return HostAgent(argv, node.workdir / "agent.log")


def _slice(custom: client.CustomObjectsApi, name: str) -> dict[str, Any] | None:
    """The ResourceSlice `name`; None when there is none."""
    obj: dict[str, Any] | None = or_none(
        lambda: custom.get_cluster_custom_object(GROUP, VERSION, "resourceslices", name)
    )
    return obj


def _delete_slice(custom: client.CustomObjectsApi, name: str) -> None:
    with contextlib.suppress(ApiException):
        custom.delete_cluster_custom_object(GROUP, VERSION, "resourceslices", name)


def _report(custom: client.CustomObjectsApi, namespace: str, node_name: str) -> dict[str, Any] | None:
    """The DeviceReport of the profile `p` on `node_name`; None when there is none."""
    obj: dict[str, Any] | None = or_none(
        lambda: custom.get_namespaced_custom_object(
            "patchbay.dev", "v1beta1", namespace, "devicereports", f"p.{node_name}"
        )
    )
    return obj


async def _register(registry: Path) -> Any:
    return await register(registry)


async def _node_call(endpoint: str, method: str, claim: dra_v1_pb2.Claim) -> Any:
    return await node_call(endpoint, method, claim)


def _prepare(endpoint: str, claim: dra_v1_pb2.Claim) -> dra_v1_pb2.NodePrepareResourcesResponse:
    response: dra_v1_pb2.NodePrepareResourcesResponse = _call(
        _node_call(endpoint, "NodePrepareResources", claim)
    )
    return response


def _unprepare(endpoint: str, claim: dra_v1_pb2.Claim) -> dra_v1_pb2.NodeUnprepareResourcesResponse:
    response: dra_v1_pb2.NodeUnprepareResourcesResponse = _call(
        _node_call(endpoint, "NodeUnprepareResources", claim)
    )
    return response


def _allocate(
    custom: client.CustomObjectsApi, claim: dict[str, Any], node_name: str, results: list[dict[str, str]]
) -> None:
    """Allocate `claim` to `results` on `node_name` as the scheduler would (the status
    subresource, as admin)."""
    claim["status"] = {
        "allocation": {
            "devices": {"results": results},
            "nodeSelector": {
                "nodeSelectorTerms": [
                    {"matchFields": [{"key": "metadata.name", "operator": "In", "values": [node_name]}]}
                ]
            },
        }
    }
    meta = claim["metadata"]
    custom.replace_namespaced_custom_object_status(
        GROUP, VERSION, meta["namespace"], "resourceclaims", meta["name"], claim
    )


def test_the_dra_agent_publishes_slices_and_prepares_claims(
    agent_node: AgentNode, namespace: str, kube_release: str
) -> None:
    custom, _, node_name, node_uid, workdir, _ = agent_node
    driver = _driver(agent_node, "serial")
    hw = _serial_host(
        workdir,
        3,
        {
            "discovery": {"paths": {"globs": ["/dev/ttyUSB*"]}},
            "allocation": {"devicesEnvName": "SERIALS", "envs": {"MODE": "raw"}},
        },
    )
    root = workdir / "k"
    cdi_dir = workdir / "cdi"
    slice_name = f"{node_name}-{driver}"

    def the_slice() -> dict[str, Any] | None:
        return _slice(custom, slice_name)

    agent = _start_agent(agent_node, hw, driver, "--instance", "it1")
    try:
        registry = root / "plugins_registry" / f"{driver}-it1.sock"
        wait_for("the registration socket", registry.exists, timeout=30)
        info = _call(_register(registry))
        assert (info.type, info.name, list(info.supported_versions)) == (
            "DRAPlugin",
            driver,
            ["v1.DRAPlugin", "v1beta1.DRAPlugin", "v1.DRAResourceHealth", "v1alpha1.DRAResourceHealth"],
        )
        assert info.endpoint == str(root / "plugins" / driver / "dra-it1.sock")
        assert not (workdir / "dp").exists() or list((workdir / "dp").iterdir()) == []

        first = wait_for("the ResourceSlice", the_slice, timeout=30)
        assert first["metadata"]["ownerReferences"] == [
            {
                "apiVersion": "v1",
                "kind": "Node",
                "name": node_name,
                "uid": node_uid,
                "blockOwnerDeletion": False,
                "controller": False,
            }
        ]
        assert {m["manager"] for m in first["metadata"]["managedFields"]} == {"patchbay-agent"}
        spec = first["spec"]
        assert (spec["driver"], spec["nodeName"]) == (driver, node_name)
        assert spec["pool"]["name"] == node_name and spec["pool"]["resourceSliceCount"] == 1
        names = [device_name(f"ttyUSB{i}") for i in range(3)]
        assert [d["name"] for d in spec["devices"]] == names
        assert spec["devices"][1]["attributes"] == {
            "patchbay.dev/id": {"string": "ttyUSB1"},
            "patchbay.dev/path": {"string": "/dev/ttyUSB1"},
        }

        # A claim, allocated by the test as the scheduler would (status subresource, as admin).
        two = {"name": "two", "exactly": {"deviceClassName": "serial", "count": 2}}
        claim = create_resource_claim(custom, namespace, "serials", [two])
        _allocate(
            custom,
            claim,
            node_name,
            [
                {"request": "two", "driver": driver, "pool": node_name, "device": names[0]},
                {"request": "two", "driver": driver, "pool": node_name, "device": names[2]},
            ],
        )
        uid = claim["metadata"]["uid"]
        ref = dra_v1_pb2.Claim(namespace=namespace, uid=uid, name="serials")
        endpoint = info.endpoint
        prepared = _prepare(endpoint, ref).claims[uid]
        assert prepared.error == ""
        assert [
            (list(d.request_names), d.pool_name, d.device_name, list(d.cdi_device_ids))
            for d in prepared.devices
        ] == [
            # The request's first device also mounts its device metadata file (KEP-5304).
            (
                ["two"],
                node_name,
                names[0],
                [f"{driver}/device={uid}-{names[0]}", f"{driver}/device={uid}_two"],
            ),
            (["two"], node_name, names[2], [f"{driver}/device={uid}-{names[2]}"]),
        ]
        spec_file = cdi_dir / f"patchbay_{driver}_{uid}.json"
        cdi = json.loads(spec_file.read_text())
        assert cdi["kind"] == f"{driver}/device"
        assert [d["name"] for d in cdi["devices"]] == [f"{uid}-{names[0]}", f"{uid}-{names[2]}", f"{uid}_two"]
        # A claim the pod names (no pod-claim-name annotation): the resourceclaims path; the file
        # lists the request's two devices of the real claim's allocation.
        (mount,) = cdi["devices"][2]["containerEdits"]["mounts"]
        assert mount["containerPath"] == (
            f"/var/run/kubernetes.io/dra-device-attributes/resourceclaims/serials/two/{driver}-metadata.json"
        )
        meta = json.JSONDecoder().raw_decode(Path(mount["hostPath"]).read_text())[0]
        assert meta["metadata"] == {"name": "serials", "namespace": namespace, "uid": uid, "generation": 1}
        assert [d["name"] for d in meta["requests"][0]["devices"]] == [names[0], names[2]]
        assert cdi["devices"][1]["containerEdits"]["deviceNodes"] == [
            {"path": "/dev/ttyUSB2", "hostPath": "/dev/ttyUSB2", "permissions": "rw"}
        ]
        assert cdi["containerEdits"] == {"env": ["MODE=raw", "SERIALS=ttyUSB0,ttyUSB2"]}
        assert _prepare(endpoint, ref).claims[uid] == prepared

        # The claim goes; unpreparing needs only the local file.
        custom.delete_namespaced_custom_object(GROUP, VERSION, namespace, "resourceclaims", "serials")
        wait_for(
            "the claim to be gone",
            lambda: _gone(custom, namespace, "serials"),
            timeout=30,
        )
        assert _unprepare(endpoint, ref).claims[uid].error == ""
        assert not spec_file.exists()
        assert not Path(mount["hostPath"]).exists()

        # A device file goes: where the API server keeps device taints its slice device gets one,
        # where it drops them the device leaves the slice; in a newer generation either way.
        hw.remove_dev("/dev/ttyUSB1")

        def tainted() -> dict[str, Any] | None:
            obj = the_slice()
            devs = {d["name"]: d for d in (obj or {}).get("spec", {}).get("devices", [])}
            return obj if names[1] in devs and devs[names[1]].get("taints") else None

        def left_out() -> dict[str, Any] | None:
            obj = the_slice()
            devs = [d["name"] for d in (obj or {}).get("spec", {}).get("devices", [])]
            return obj if devs == [names[0], names[2]] else None

        if has("dra-device-taints", kube_release):
            second = wait_for("the unhealthy device's taint", tainted, timeout=60)
            (taint,) = next(d for d in second["spec"]["devices"] if d["name"] == names[1])["taints"]
            assert (taint["key"], taint["value"], taint["effect"]) == (
                "patchbay.dev/vanished",
                "Vanished",
                "NoSchedule",
            )
        else:
            second = wait_for("the unhealthy device left out of the slice", left_out, timeout=60)
        assert second["spec"]["pool"]["generation"] > spec["pool"]["generation"]
        assert all("taints" not in d for d in second["spec"]["devices"] if d["name"] != names[1])

        assert agent.stop() == 0
        assert not registry.exists()
        assert not Path(endpoint).exists()
        text = agent.text()
        assert "Traceback" not in text
        assert '"level": "error"' not in text
        assert re.search(r"Wrote 1 ResourceSlice", text)
    finally:
        agent.stop()
        _delete_slice(custom, slice_name)


def test_the_dra_agent_writes_its_slice_again_when_someone_else_deletes_or_edits_it(
    agent_node: AgentNode,
) -> None:
    """The agent follows its node's slices of its driver with a watch (field selectors
    spec.nodeName and spec.driver): `kubectl delete resourceslice` and an edit by another field
    manager (`kubectl edit` dropping a device) are each undone at once by the agent process, which
    logs it in the Kubernetes style; while nothing changes the slice's resourceVersion stays."""
    custom, _, _, _, workdir, _ = agent_node
    driver = _driver(agent_node, "fix")
    hw = _serial_host(workdir, 2, {"discovery": {"paths": {"globs": ["/dev/ttyUSB*"]}}})
    slice_name = f"{agent_node.name}-{driver}"

    def whole() -> dict[str, Any] | None:
        """The slice with both devices, written by the agent alone."""
        obj = _slice(custom, slice_name)
        if obj is None or len(obj["spec"]["devices"]) != 2:
            return None
        return obj if {m["manager"] for m in obj["metadata"]["managedFields"]} == {"patchbay-agent"} else None

    agent = _start_agent(agent_node, hw, driver, "--instance", "it1")
    try:
        registry = workdir / "k" / "plugins_registry" / f"{driver}-it1.sock"
        wait_for("the registration socket", registry.exists, timeout=30)
        _call(_register(registry))
        first = wait_for("the ResourceSlice", whole, timeout=30)

        started = time.monotonic()
        custom.delete_cluster_custom_object(GROUP, VERSION, "resourceslices", slice_name)
        again = wait_for("the deleted slice written again", whole, timeout=30)
        print(f"deleted -> written again: {time.monotonic() - started:.2f}s")
        assert again["metadata"]["uid"] != first["metadata"]["uid"]

        started = time.monotonic()
        edited = {"spec": {"devices": again["spec"]["devices"][:1]}}
        custom.patch_cluster_custom_object(
            GROUP, VERSION, "resourceslices", slice_name, edited, field_manager="kubectl-edit"
        )
        back = wait_for(
            "the edited slice written again",
            lambda: (
                (o := whole()) is not None
                and o["metadata"]["resourceVersion"] != again["metadata"]["resourceVersion"]
                and o
            ),
            timeout=30,
        )
        print(f"edited -> written again: {time.monotonic() - started:.2f}s")

        quiet = back["metadata"]["resourceVersion"]
        time.sleep(2.0)  # a quiet interval: nothing changes, so nothing may be written
        assert (_slice(custom, slice_name) or {})["metadata"]["resourceVersion"] == quiet

        text = agent.text()
        assert f"ResourceSlice {slice_name} was deleted; written again" in text
        assert f"ResourceSlice {slice_name} was edited by kubectl-edit; written again" in text
        assert "Traceback" not in text
    finally:
        agent.stop()
        _delete_slice(custom, slice_name)


def test_the_dra_agent_publishes_partitions_where_the_api_server_keeps_counters(
    agent_node: AgentNode, crd: dict[str, Any], namespace: str, kube_release: str
) -> None:
    """`plugin.partitions` on the real API server: where it keeps counters (1.36 on) the pool is a
    slice of counter sets and a slice of partitions that consume them, both accepted by the
    release's own validation, and a claim allocated to a partition is prepared with its place in
    the env; where it drops them (before 1.36) the devices are published whole and the
    DeviceReport says so."""
    custom, _, node_name, _, workdir, _ = agent_node
    driver = _driver(agent_node, "parts")
    kept = has("dra-partitionable-devices", kube_release)
    hw = _serial_host(
        workdir,
        2,
        {"discovery": {"paths": {"globs": ["/dev/ttyUSB*"]}}, "partitions": {"slots": 4, "sizes": [1, 2, 4]}},
    )
    names = [device_name(f"ttyUSB{i}") for i in range(2)]

    def slices() -> list[dict[str, Any]]:
        items: list[dict[str, Any]] = custom.list_cluster_custom_object(
            GROUP, VERSION, "resourceslices", field_selector=f"spec.driver={driver}"
        )["items"]
        return sorted(items, key=lambda o: o["metadata"]["name"])

    def report() -> dict[str, Any] | None:
        return _report(custom, namespace, node_name)

    expected = "Kept" if kept else "Dropped"
    agent = _start_agent(
        agent_node, hw, driver, "--instance", "pt1", "--profile", "p", "--report-namespace", namespace
    )
    try:
        wait_for(
            f"the DeviceReport saying partitionableDevices {expected}",
            lambda: (r := report()) is not None and r.get("partitionableDevices") == expected,
            timeout=60,
            detail=lambda: f"report: {report()}\nagent log:\n" + agent.text()[-4000:],
        )
        if not kept:
            (only,) = wait_for(
                "the whole devices' slice", lambda: (got := slices()) and len(got) == 1 and got
            )
            assert [d["name"] for d in only["spec"]["devices"]] == names
            assert all("consumesCounters" not in d for d in only["spec"]["devices"])
            return
        counters, devices = wait_for(
            "the counter and partition slices", lambda: (got := slices()) and len(got) == 2 and got
        )
        assert {c["spec"]["pool"]["resourceSliceCount"] for c in (counters, devices)} == {2}
        assert counters["spec"]["pool"]["generation"] == devices["spec"]["pool"]["generation"]
        assert [c["name"] for c in counters["spec"]["sharedCounters"]] == names
        assert "devices" not in counters["spec"] or not counters["spec"]["devices"]
        by_name = {d["name"]: d for d in devices["spec"]["devices"]}
        assert len(by_name) == 2 * 7
        half = by_name[f"{names[1]}-s2-3"]
        assert half["consumesCounters"] == [
            {"counterSet": names[1], "counters": {"s2": {"value": "1"}, "s3": {"value": "1"}}}
        ]
        assert half["attributes"]["patchbay.dev/slots"] == {"int": 2}

        # A claim allocated (by the test, as the scheduler would) to the half partition.
        registry = workdir / "k" / "plugins_registry" / f"{driver}-pt1.sock"
        wait_for("the registration socket", registry.exists, timeout=30)
        info = _call(_register(registry))
        claim = create_resource_claim(
            custom, namespace, "half", [{"name": "h", "exactly": {"deviceClassName": "serial"}}]
        )
        _allocate(
            custom,
            claim,
            node_name,
            [{"request": "h", "driver": driver, "pool": node_name, "device": f"{names[1]}-s2-3"}],
        )
        uid = claim["metadata"]["uid"]
        prepared = _prepare(
            info.endpoint, dra_v1_pb2.Claim(namespace=namespace, uid=uid, name="half")
        ).claims[uid]
        assert prepared.error == ""
        assert [d.device_name for d in prepared.devices] == [f"{names[1]}-s2-3"]
        cdi = json.loads((workdir / "cdi" / f"patchbay_{driver}_{uid}.json").read_text())
        assert "PATCHBAY_PARTITIONS=ttyUSB1:2-3/4" in cdi["containerEdits"]["env"]
        assert cdi["devices"][0]["containerEdits"]["deviceNodes"][0]["path"] == "/dev/ttyUSB1"
    finally:
        agent.stop()
        text = agent.text()
        for obj in slices():
            _delete_slice(custom, obj["metadata"]["name"])
    assert "Traceback" not in text


def _gone(custom: client.CustomObjectsApi, namespace: str, name: str) -> bool:
    read = lambda: custom.get_namespaced_custom_object(GROUP, VERSION, namespace, "resourceclaims", name)  # noqa: E731
    return or_none(read) is None


def test_the_dra_agent_finds_out_whether_the_api_server_keeps_device_taints(
    agent_node: AgentNode, crd: dict[str, Any], namespace: str, kube_release: str
) -> None:
    custom, _, node_name, _, workdir, _ = agent_node
    driver = _driver(agent_node, "taints")
    keeps = has("dra-device-taints", kube_release)

    # The API server itself, asked as the agent asks it (nothing is stored): the capability
    # table and the API server agree.
    answer = custom.create_cluster_custom_object(
        GROUP, VERSION, "resourceslices", taint_probe_document(driver, node_name), dry_run="All"
    )
    assert taints_kept(answer) is keeps, (kube_release, answer["spec"])
    shares_kept = has("dra-consumable-capacity", kube_release)
    assert sharing_kept(answer) is shares_kept, (kube_release, answer["spec"])
    assert partitions_kept(answer) is has("dra-partitionable-devices", kube_release), (kube_release, answer)
    assert (
        custom.list_cluster_custom_object(
            GROUP, VERSION, "resourceslices", field_selector=f"spec.driver={driver}"
        )["items"]
        == []
    )

    hw = _serial_host(
        workdir,
        3,
        {
            "discovery": {"paths": {"globs": ["/dev/ttyUSB*"]}},
            "health": {"periodSeconds": 1},
            # Shared by two claims each where consumable capacity is kept, else unshared.
            "sharing": {"replicas": 2},
        },
    )
    names = {f"ttyUSB{i}": device_name(f"ttyUSB{i}") for i in range(3)}
    slice_name = f"{node_name}-{driver}"

    def slice_devices() -> dict[str, dict[str, Any]] | None:
        obj = _slice(custom, slice_name)
        if obj is None:
            return None
        return {d["attributes"]["patchbay.dev/id"]["string"]: d for d in obj["spec"].get("devices", [])}

    def report() -> dict[str, Any] | None:
        return _report(custom, namespace, node_name)

    def withheld() -> set[str]:
        return {d["id"] for d in (report() or {}).get("devices", []) if d.get("withheld")}

    def taint_keys(devices: dict[str, dict[str, Any]], physical: str) -> set[str]:
        return {t["key"] for t in devices[physical].get("taints") or []}

    expected = "Kept" if keeps else "Dropped"
    with ThreadedPeers() as peers:
        # A pod still holds ttyUSB2 through the DEVICE PLUGIN of the resource (a node moving to DRA).
        pod_resources = PodResourcesPeer(workdir / "pr.sock")
        pod_resources.hold("ml", "old", "main", RESOURCE, ["ttyUSB2"])
        peers.call(pod_resources.start())
        agent = _start_agent(
            agent_node,
            hw,
            driver,
            "--profile",
            "p",
            "--report-namespace",
            namespace,
            "--pod-resources-socket",
            str(pod_resources.socket),
            "--pod-resources-period",
            "1",
        )
        try:
            first = wait_for(
                f"the DeviceReport saying deviceTaints {expected}",
                lambda: (r := report()) and r.get("deviceTaints") == expected and r,
                timeout=60,
            )
            sharing = "Kept" if shares_kept else "Dropped"
            assert wait_for(
                f"the DeviceReport saying consumableCapacity {sharing}",
                lambda: (r := report()) and r.get("consumableCapacity") == sharing,
                timeout=30,
            )
            shared = wait_for("the slice", slice_devices, 60)
            for dev in shared.values():
                if shares_kept:
                    assert dev["allowMultipleAllocations"] is True, dev
                    assert dev["capacity"]["patchbay.dev/shares"]["value"] == "2", dev
                else:
                    assert "allowMultipleAllocations" not in dev and "capacity" not in dev, dev
            if keeps:
                # Tainted, not left out: the scheduler sees it and does not allocate it.
                devices = wait_for(
                    "the held device tainted",
                    lambda: (d := slice_devices()) and len(d) == 3 and taint_keys(d, "ttyUSB2") and d,
                    timeout=60,
                )
                assert taint_keys(devices, "ttyUSB2") == {"patchbay.dev/held-by-device-plugin"}
                assert first["summary"]["withheld"] == 0
            else:
                devices = wait_for(
                    "the held device left out of the slice",
                    lambda: (d := slice_devices()) is not None and sorted(d) == ["ttyUSB0", "ttyUSB1"] and d,
                    timeout=60,
                )
                assert wait_for("the report marking it withheld", lambda: withheld() == {"ttyUSB2"}, 30)
                assert report()["summary"]["withheld"] == 1  # type: ignore[index]
            assert all("taints" not in devices[p] for p in ("ttyUSB0", "ttyUSB1"))

            # A device vanishes: tainted where taints are kept, left out where they are dropped.
            hw.remove_dev("/dev/ttyUSB1")
            if keeps:
                devices = wait_for(
                    "the vanished device tainted",
                    lambda: (d := slice_devices()) and taint_keys(d, "ttyUSB1") and d,
                    timeout=60,
                )
                assert taint_keys(devices, "ttyUSB1") == {"patchbay.dev/vanished"}
                assert withheld() == set()
            else:
                wait_for(
                    "the vanished device left out of the slice",
                    lambda: (d := slice_devices()) is not None and sorted(d) == ["ttyUSB0"],
                    timeout=60,
                )
                assert wait_for("both marked withheld", lambda: withheld() == {"ttyUSB1", "ttyUSB2"}, 30)
                dev = next(d for d in report()["devices"] if d["id"] == "ttyUSB1")  # type: ignore[index]
                assert (dev["health"], dev["reason"]) == ("Unhealthy", "Vanished")

            # Back, and the pod gone: every device in the slice, none tainted, none withheld.
            hw.add_dev("/dev/ttyUSB1")
            pod_resources.remove_pod("ml", "old")
            wait_for(
                "all three devices in the slice untainted",
                lambda: (
                    (d := slice_devices()) is not None
                    and sorted(d) == ["ttyUSB0", "ttyUSB1", "ttyUSB2"]
                    and not any(x.get("taints") for x in d.values())
                ),
                timeout=60,
            )
            assert wait_for("none withheld", lambda: (r := report()) and r["summary"]["withheld"] == 0, 30)
            assert {d["name"] for d in (slice_devices() or {}).values()} == set(names.values())

            assert agent.stop() == 0
            text = agent.text()
            assert "Traceback" not in text
            assert ("drops ResourceSlice device taints" in text) is not keeps
            assert ("drops a shared device's fields" in text) is not shares_kept
        finally:
            agent.stop()
            _delete_slice(custom, slice_name)


def test_the_api_server_keeps_a_gpus_standard_attributes_and_memory_capacity(
    api: client.ApiClient, node: tuple[str, str], name_prefix: str
) -> None:
    """What the agent publishes for an NVML GPU (its discovery is unit-tested with a fake NVML:
    no GPU here) is a slice the real API server accepts and stores as written: the standard
    `pciBusID`/`pcieRoot`/`numaNode` attributes and memory as the device's capacity."""
    from patchbay_agent.core.health import CheckResult, DeviceHealthTracker
    from patchbay_agent.core.inventory import Inventory
    from patchbay_agent.discovery import PhysicalDevice
    from patchbay_agent.dra.slices import slice_devices, slice_documents

    node_name, _uid = node
    driver = f"{name_prefix}gpu.patchbay.dev"
    gpu = PhysicalDevice(
        "GPU-8d0a1c2e-1111-2222-3333-444455556666",
        ("/dev/nvidia0",),
        numa_nodes=(1,),
        attributes=(
            ("uuid", "GPU-8d0a1c2e-1111-2222-3333-444455556666"),
            ("productName", "NVIDIA H100 80GB HBM3"),
            ("pciAddress", "0000:3b:00.0"),
            ("pcieRoot", "pci0000:3a"),
        ),
        capacity=(("memory", 85_520_809_984),),
    )
    inventory = Inventory(1, "rw")
    tracker = DeviceHealthTracker(1, 1)
    tracker.observe({gpu.id: CheckResult(True)})
    inventory.update([gpu], tracker)
    (doc,) = slice_documents(driver, node_name, slice_devices(inventory.current))
    custom = client.CustomObjectsApi(api)
    stored = custom.create_cluster_custom_object(GROUP, VERSION, "resourceslices", doc, dry_run="All")
    (device,) = stored["spec"]["devices"]
    attributes = device["attributes"]
    assert attributes["resource.kubernetes.io/pciBusID"] == {"string": "0000:3b:00.0"}
    assert attributes["resource.kubernetes.io/pcieRoot"] == {"string": "pci0000:3a"}
    assert attributes["resource.kubernetes.io/numaNode"] == {"int": 1}
    assert device["capacity"] == {"patchbay.dev/memory": {"value": "85520809984"}}


def test_the_api_server_stores_the_slice_written_on_a_real_h100(
    api: client.ApiClient, node: tuple[str, str], name_prefix: str
) -> None:
    """The ResourceSlice the agent's code wrote on a machine with a real H100 (hack/nvml_check.py,
    recorded in tests/data/nvml/) is accepted by the real API server and stored as written, its
    device unchanged: attributes, the standard PCI names and memory capacity."""
    record = json.loads((Path(__file__).parents[2] / "data" / "nvml" / "h100-vm-2026-11-27.json").read_text())
    (doc,) = record["slices"]
    node_name, _uid = node
    doc["metadata"]["name"] = f"{name_prefix}{node_name}-h100"
    doc["spec"]["driver"] = f"{name_prefix}gpu.patchbay.dev"
    doc["spec"]["nodeName"] = node_name
    doc["spec"]["pool"]["name"] = node_name
    custom = client.CustomObjectsApi(api)
    stored = custom.create_cluster_custom_object(GROUP, VERSION, "resourceslices", doc, dry_run="All")
    assert stored["spec"]["devices"] == doc["spec"]["devices"]
