"""The agent's DeviceReport on the REAL API server: the `patchbay-agent` process on the host, with
--kubeconfig (the session cluster's admin), the Python kubelet peer, a PodResources server this
test sets, and a FAKE device tree; the report lands through server-side apply, validated by the
real CRD schema, owned by a real (kwok) Node.

Checked: the report appears with the node's UID in its owner reference, every device Healthy and
the containers the PodResources server names; a removed device file turns that device Unhealthy
(reason Vanished, a since time) in exactly ONE write; a period with no change writes nothing
(waiting on the agent's own counters, not on sleep); deleting the node garbage-collects the
report (the session cluster's controller-manager runs the garbage collector).
"""

from __future__ import annotations

import re
import urllib.request
from pathlib import Path
from typing import Any

import pytest
from kubernetes import client
from kubernetes.client.rest import ApiException
from support.agentrun import HostAgent, agent_argv, write_agent_config
from support.clusters import REPO, AgentNode, apply_crd, or_none, served, wait_for
from support.fakehw import FakeHardware
from support.podresources_peer import PodResourcesPeer, ThreadedPeers
from support.promtext import parse, value
from support.pykubelet import PyKubelet
from support.reports import device_report, largest_report, node_owner

from patchbay_devcluster import DevCluster
from patchbay_devcluster.releases import matrix

CRD_FILE = REPO / "crds" / "patchbay.dev_devicereports.yaml"
GROUP, VERSION, PLURAL = "patchbay.dev", "v1beta1", "devicereports"
RESOURCE = "example.com/serial"
PROFILE = "p"


@pytest.fixture(scope="module")
def report_crd(api: client.ApiClient) -> None:
    """The DeviceReport CRD from crds/, created or replaced, Established and served."""
    apply_crd(api, CRD_FILE)
    custom = client.CustomObjectsApi(api)
    wait_for(
        "the DeviceReport API to be served",
        lambda: served(lambda: custom.list_namespaced_custom_object(GROUP, VERSION, "default", PLURAL)),
    )


def one_device(namespace: str, node: str) -> dict[str, Any]:
    """The report of profile `PROFILE` on `node` as the agent pod "agent-pod-1" writes it: one
    healthy device, ttyUSB0."""
    return device_report(
        namespace,
        node,
        PROFILE,
        RESOURCE,
        [{"id": "ttyUSB0", "health": "Healthy"}],
        {"total": 1, "healthy": 1, "unhealthy": 0, "allocated": 0},
        agent="agent-pod-1",
    )


class AgentProcess(HostAgent):
    """The real `patchbay-agent` process; its log in a file, its /metrics port read from there."""

    def __init__(self, argv: list[str], log: Path) -> None:
        super().__init__(argv, log)
        self.port = int(wait_for("the agent to serve /metrics", self._port, timeout=30))

    def _port(self) -> int | None:
        if self.proc.poll() is not None:
            raise AssertionError(f"the agent exited with {self.proc.returncode}:\n{self.text()[-3000:]}")
        m = re.search(r"Serving /metrics, /healthz, /readyz on http://127\.0\.0\.1:(\d+)", self.text())
        return int(m.group(1)) if m else None

    def metrics(self) -> dict[str, Any]:
        with urllib.request.urlopen(f"http://127.0.0.1:{self.port}/metrics", timeout=5) as r:
            return parse(r.read().decode())

    def counter(self, name: str, **labels: str) -> float:
        try:
            return value(self.metrics(), name, **labels)
        except KeyError:
            return 0.0


def test_the_agent_publishes_its_device_report(
    agent_node: AgentNode, report_crd: None, namespace: str
) -> None:
    custom, devcluster, node_name, node_uid, workdir, _ = agent_node
    name = f"{PROFILE}.{node_name}"
    hw = FakeHardware(workdir / "host")
    hw.add_serials(4)
    plugin_dir = workdir / "dp"
    plugin = {
        "discovery": {"paths": {"globs": ["/dev/ttyUSB*"]}},
        # Rounds every second: the quiet period below waits on them.
        "health": {"periodSeconds": 1},
        "sharing": {"replicas": 2},
    }
    config = write_agent_config(workdir / "agent.yaml", plugin, RESOURCE)

    def report() -> dict[str, Any] | None:
        obj: dict[str, Any] | None = or_none(
            lambda: custom.get_namespaced_custom_object(GROUP, VERSION, namespace, PLURAL, name)
        )
        return obj

    agent: AgentProcess | None = None
    with ThreadedPeers() as peers:
        kubelet = PyKubelet(plugin_dir)
        pod_resources = PodResourcesPeer(workdir / "pr.sock")
        pod_resources.hold("ml", "trainer", "main", RESOURCE, ["ttyUSB0::0", "ttyUSB0::1"])
        pod_resources.hold("ml", "eval", "job", RESOURCE, ["ttyUSB3::1"])
        pod_resources.hold("ml", "eval", "job", "other.example.com/x", ["x0"])
        peers.call(kubelet.start())
        peers.call(pod_resources.start())
        try:
            argv = agent_argv(
                config,
                node_name,
                device_plugin_dir=plugin_dir,
                host_root=hw.root,
                http_address="127.0.0.1:0",
                kubeconfig=devcluster.kubeconfig,
                profile=PROFILE,
                report_namespace=namespace,
                pod_name="patchbay-agent-p-x1",
                pod_resources_socket=pod_resources.socket,
                pod_resources_period="1",
                log_format="json",
            )
            agent = AgentProcess(argv, workdir / "agent.log")
            first = wait_for("the DeviceReport", report, timeout=30)
            assert first["metadata"]["ownerReferences"] == [node_owner(node_name, node_uid)]
            assert first["metadata"]["labels"] == {
                "patchbay.dev/profile": PROFILE,
                "app.kubernetes.io/managed-by": "patchbay-agent",
            }
            assert {m["manager"]: m["operation"] for m in first["metadata"]["managedFields"]} == {
                "patchbay-agent": "Apply"
            }
            assert (first["profile"], first["nodeName"], first["resourceName"], first["agent"]) == (
                PROFILE,
                node_name,
                RESOURCE,
                "patchbay-agent-p-x1",
            )
            assert first["observedAt"].endswith("Z")
            assert first["summary"] == {"total": 4, "healthy": 4, "unhealthy": 0, "allocated": 2}
            devices = {d["id"]: d for d in first["devices"]}
            assert list(devices) == ["ttyUSB0", "ttyUSB1", "ttyUSB2", "ttyUSB3"]
            assert all(d["health"] == "Healthy" and d["since"].endswith("Z") for d in devices.values())
            assert devices["ttyUSB0"]["pods"] == [{"namespace": "ml", "name": "trainer", "container": "main"}]
            assert devices["ttyUSB3"]["pods"] == [{"namespace": "ml", "name": "eval", "container": "job"}]
            assert "pods" not in devices["ttyUSB1"]
            # Every write by the agent changes the object (observedAt at least), and a
            # CRD without a status subresource counts each in metadata.generation.
            writes = agent.counter("patchbay_agent_report_writes_total", result="ok")
            assert writes >= 1
            assert first["metadata"]["generation"] == writes

            # A device file goes: one write, Unhealthy, Vanished, since when.
            hw.remove_dev("/dev/ttyUSB1")

            def vanished() -> dict[str, Any] | None:
                obj = report()
                dev = next(d for d in (obj or {}).get("devices", []) if d["id"] == "ttyUSB1")
                return obj if dev["health"] == "Unhealthy" else None

            second = wait_for("ttyUSB1 to be reported Unhealthy", vanished, timeout=30)
            dev = next(d for d in second["devices"] if d["id"] == "ttyUSB1")
            assert dev["reason"] == "Vanished"
            assert "/dev/ttyUSB1" in dev["message"]
            assert dev["since"] >= devices["ttyUSB1"]["since"]
            assert second["summary"] == {"total": 4, "healthy": 3, "unhealthy": 1, "allocated": 2}
            assert agent.counter("patchbay_agent_report_writes_total", result="ok") == writes + 1
            assert second["metadata"]["generation"] == first["metadata"]["generation"] + 1

            # A quiet period: health rounds and PodResources reads go on and publish no new device
            # snapshot, so the reporter writes nothing (wait on the agent's own counters, then
            # compare).
            rounds = agent.counter("patchbay_agent_health_round_seconds_count")
            reads = agent.counter("patchbay_agent_pod_resources_reads_total", result="ok")
            wait_for(
                "two more health rounds and two PodResources reads",
                lambda: (
                    agent.counter("patchbay_agent_health_round_seconds_count") >= rounds + 2
                    and agent.counter("patchbay_agent_pod_resources_reads_total", result="ok") >= reads + 2
                ),
                timeout=30,
            )
            assert agent.counter("patchbay_agent_report_writes_total", result="ok") == writes + 1
            assert agent.counter("patchbay_agent_report_writes_total", result="error") == 0
            quiet = report()
            assert quiet is not None
            assert quiet["metadata"]["resourceVersion"] == second["metadata"]["resourceVersion"]

            assert agent.stop() == 0
            log = agent.text()
            assert "Traceback" not in log
            assert '"level": "error"' not in log
        finally:
            if agent is not None:
                agent.stop()
            peers.call(pod_resources.stop())
            peers.call(kubelet.stop())

    # The node goes: the garbage collector takes its report (a new CRD's dependents are seen once
    # the collector's discovery of resources has run, up to about 30 s).
    client.CoreV1Api(custom.api_client).delete_node(node_name)
    wait_for(
        "the garbage collector to delete the report with its node", lambda: report() is None, timeout=120
    )


def _largest_report(namespace: str, node_name: str) -> dict[str, Any]:
    return largest_report(namespace, node_name, PROFILE)


def test_the_largest_report_the_crd_admits_is_stored_and_one_more_of_anything_is_refused(
    api: client.ApiClient, report_crd: None, namespace: str, node: tuple[str, str]
) -> None:
    """Written the agent's way (server-side apply, its field manager, so managedFields lists every
    device too): the report at every bound of the schema is stored, not refused by etcd's request
    size limit after admission; one device, one holder or one character of message more is
    refused at admission with the field named."""
    import json

    node_name, _uid = node
    custom = client.CustomObjectsApi(api)
    largest = _largest_report(namespace, node_name)
    size = len(json.dumps(largest))

    def apply(body: dict[str, Any]) -> None:
        custom.patch_namespaced_custom_object(
            GROUP,
            VERSION,
            namespace,
            PLURAL,
            body["metadata"]["name"],
            body,
            field_manager="patchbay-agent",
            force=True,
            _content_type="application/apply-patch+yaml",
        )

    apply(largest)
    got = custom.get_namespaced_custom_object(GROUP, VERSION, namespace, PLURAL, largest["metadata"]["name"])
    assert len(got["devices"]) == 2048, size
    assert sum(len(d.get("pods", ())) for d in got["devices"]) == 512
    print(f"largest admitted report: {size:,} bytes of JSON as sent, {len(json.dumps(got)):,} as stored")

    too_many = _largest_report(namespace, node_name)
    too_many["devices"].append({**too_many["devices"][-1], "id": "x" * 63})
    holder = _largest_report(namespace, node_name)
    holder["devices"][8]["pods"] = [{"namespace": "n", "name": "one-more", "container": "c"}]
    text = _largest_report(namespace, node_name)
    text["devices"][128]["message"] = "m"
    for body, field, words in (
        (too_many, "devices", "must have at most 2048 items"),
        (holder, "devices", "at most 512 holders"),
        (text, "devices", "at most 65536 characters of message"),
    ):
        with pytest.raises(ApiException) as refused:
            apply(body)
        assert refused.value.status == 422, refused.value.body[:500]
        said = str(refused.value.body)
        assert field in said and words in said, said[:800]


def test_the_agent_reads_its_kubelets_version_from_the_node(
    devcluster: DevCluster, api: client.ApiClient, node: tuple[str, str]
) -> None:
    """What decides whether a rollout hands over (docs/facts.md#kubelet-endpoints): the Node's
    status.nodeInfo.kubeletVersion, read with the agent's own client, as kwok reports it and as a
    kubelet of the matrix's oldest release would."""
    from patchbay_agent.kubeclient import KubeClient

    name, _uid = node
    agent_client = KubeClient(devcluster.kubeconfig)
    core = client.CoreV1Api(api)
    wait_for(
        "kwok to report the node's kubelet", lambda: core.read_node(name).status.node_info.kubelet_version
    )
    assert agent_client.kubelet_version(name) == core.read_node(name).status.node_info.kubelet_version
    info = core.read_node(name).status.node_info
    oldest = matrix()[0]
    info.kubelet_version = oldest
    core.patch_node_status(
        name, {"status": {"nodeInfo": client.ApiClient().sanitize_for_serialization(info)}}
    )
    wait_for("the version as set", lambda: agent_client.kubelet_version(name) == oldest, 10)


def test_a_report_deleted_or_written_by_someone_else_is_written_again(
    devcluster: DevCluster, api: client.ApiClient, report_crd: None, namespace: str, node: tuple[str, str]
) -> None:
    """The reporter follows its report with a watch (a metadata.name field selector, as in the
    agent): when it is deleted, the agent writes it again at once although no device changed; when
    someone else edited it (`kubectl edit`: another field manager, the `agent` field untouched) or
    wrote it (another agent on the node naming itself, a forged device), the agent deletes that one
    and writes its own afresh, so nothing of the other writer's stays (server-side apply over it
    would keep the fields another manager set); a successor's write is left alone; while nothing
    changes, the report's resourceVersion stays (no write, no read)."""
    import asyncio
    import time

    from support.converge import until

    from patchbay_agent.kubeclient import KubeClient
    from patchbay_agent.metrics import Metrics
    from patchbay_agent.report.devicereport import ReportTarget
    from patchbay_agent.report.reporter import Reporter, report_watch

    name, uid = node
    target = ReportTarget(PROFILE, name, namespace, RESOURCE, "agent-pod-1")  # DaemonSet "agent"
    custom = client.CustomObjectsApi(api)

    def build(node_uid: str | None) -> dict[str, Any]:
        return one_device(namespace, name)

    def stored() -> dict[str, Any] | None:
        obj: dict[str, Any] | None = or_none(
            lambda: custom.get_namespaced_custom_object(GROUP, VERSION, namespace, PLURAL, target.name)
        )
        return obj

    def write(body: dict[str, Any], manager: str) -> None:
        """Another writer's server-side apply of the report."""
        custom.patch_namespaced_custom_object(
            GROUP,
            VERSION,
            namespace,
            PLURAL,
            target.name,
            body,
            field_manager=manager,
            force=True,
            _content_type="application/apply-patch+yaml",
        )

    def edit(patch: dict[str, Any]) -> None:
        """`kubectl edit` of the report: a merge patch by the field manager kubectl-edit."""
        custom.patch_namespaced_custom_object(
            GROUP, VERSION, namespace, PLURAL, target.name, patch, field_manager="kubectl-edit"
        )

    async def scenario() -> None:
        kube = KubeClient(devcluster.kubeconfig)
        metrics = Metrics(RESOURCE, name)
        reporter = Reporter(target, kube, build, metrics, coalesce=0.05, watch=report_watch(kube, target))
        stop = asyncio.Event()
        task = asyncio.create_task(reporter.run(stop))
        try:
            await until(lambda: reporter.writes == 1, 10)
            first = await asyncio.to_thread(stored) or {}
            assert first.get("agent") == "agent-pod-1"

            # Deleted: written again, at once (the watch says so).
            deleted = time.monotonic()
            await asyncio.to_thread(
                custom.delete_namespaced_custom_object, GROUP, VERSION, namespace, PLURAL, target.name
            )
            await until(lambda: reporter.writes == 2, 10)
            print(f"deleted -> written again: {time.monotonic() - deleted:.3f}s")
            assert reporter.restored == 1
            assert (await asyncio.to_thread(stored) or {}).get("agent") == "agent-pod-1"

            # Edited with kubectl (another field manager; the agent field untouched): replaced.
            await asyncio.to_thread(
                edit, {"devices": [{"id": "ttyUSB0", "health": "Unhealthy", "reason": "Edited"}]}
            )
            await until(lambda: reporter.writes == 3, 10)
            restored = await asyncio.to_thread(stored) or {}
            assert restored["devices"] == [{"id": "ttyUSB0", "health": "Healthy"}]
            assert {m["manager"] for m in restored["metadata"]["managedFields"]} == {"patchbay-agent"}

            # Written by someone else (another agent pod names itself, claims the device sick).
            forged = {**build(uid), "agent": "agent-of-another-profile"}
            forged["devices"] = [
                {"id": "ttyUSB0", "health": "Unhealthy", "reason": "Forged"},
                {"id": "ttyFAKE", "health": "Healthy"},
            ]
            await asyncio.to_thread(write, forged, "someone-else")
            await until(lambda: reporter.writes == 4, 10)
            restored = await asyncio.to_thread(stored) or {}
            assert restored.get("agent") == "agent-pod-1"
            assert restored["devices"] == [{"id": "ttyUSB0", "health": "Healthy"}]
            assert reporter.restored == 3
            repairs = [metrics.repairs.labels("DeviceReport", c).value for c in ("deleted", "edited")]
            assert repairs == [1, 2]

            # A newer pod of the agent's own DaemonSet (a rollout: the name differs only in the
            # random suffix) writes it: this agent, going away, leaves that report alone.
            verifies = reporter.verifies
            successor = {**build(uid), "agent": "agent-pod-2"}
            await asyncio.to_thread(write, successor, "patchbay-agent")
            await until(lambda: reporter.verifies > verifies, 10)
            # Quiet: nothing changes, nothing is written (the version stays, as the watch says).
            quiet = (await asyncio.to_thread(stored) or {})["metadata"]["resourceVersion"]
            await asyncio.sleep(2.0)
            after = await asyncio.to_thread(stored) or {}
            assert (after.get("agent"), after["metadata"]["resourceVersion"]) == ("agent-pod-2", quiet)
            assert (reporter.writes, reporter.restored) == (4, 3)
        finally:
            stop.set()
            await asyncio.wait_for(task, 10)

    asyncio.run(scenario())


def test_a_repair_the_ordinary_write_made_first_is_counted_with_the_real_servers_events(
    devcluster: DevCluster, api: client.ApiClient, report_crd: None, namespace: str, node: tuple[str, str]
) -> None:
    """The order CI once caught on the real node (a report deleted, put back 0.03 s later by a
    change's ordinary write, the repair never counted), forced step by step with the real API
    server's own watch events: the agent's write, someone's `kubectl delete` (or `kubectl edit`),
    the agent's next ordinary write, and only then the watch event looked at, as the change-writer
    loop does between writes. The DELETED event carries the deletion's resourceVersion, not the
    one the agent's write returned (docs/agent.md#what-the-agent-writes-again): checked here on
    each release the suite runs on. Either way the repair is due from the event and counted by
    the write that came first; the agent's own delete (of an edited report) is no repair."""
    import asyncio

    from support.converge import until

    from patchbay_agent.kubeclient import KubeClient
    from patchbay_agent.metrics import Metrics
    from patchbay_agent.ownwatch import Repairs
    from patchbay_agent.report.devicereport import ReportTarget
    from patchbay_agent.report.reporter import report_watch

    name, _uid = node
    target = ReportTarget(PROFILE, name, namespace, RESOURCE, "agent-pod-1")
    custom = client.CustomObjectsApi(api)
    report = one_device(namespace, name)

    async def scenario() -> None:
        kube = KubeClient(devcluster.kubeconfig)
        metrics = Metrics(RESOURCE, name)
        repairs = Repairs("DeviceReport", metrics, keep=8)
        events: list[tuple[str, dict[str, Any]]] = []
        watch = report_watch(kube, target)
        assert watch is not None
        watch.start(lambda kind, obj: events.append((kind, obj)))

        def seen(kind: str) -> tuple[str, dict[str, Any]] | None:
            return next(((k, o) for k, o in events if k == kind), None)

        async def write() -> str:
            version = await asyncio.to_thread(kube.apply, report)
            repairs.wrote(version)
            return version

        def counted(cause: str) -> float:
            return metrics.repairs.labels("DeviceReport", cause).value

        try:
            await until(lambda: seen("LISTED"), 10)
            written = await write()
            await until(lambda: seen("ADDED"), 10)
            events.clear()

            # Deleted, then the ordinary write before the event is looked at.
            await asyncio.to_thread(
                custom.delete_namespaced_custom_object, GROUP, VERSION, namespace, PLURAL, target.name
            )
            again = await write()
            _, deleted = await until(lambda: seen("DELETED"), 10)
            assert deleted["metadata"]["resourceVersion"] not in (written, again)
            assert not repairs.own(deleted)
            assert repairs.suspect("DELETED", deleted, {target.name})
            repairs.written([target.name])  # the write that came first counts it
            assert (counted("deleted"), counted("edited")) == (1, 0)
            await until(lambda: seen("ADDED"), 10)
            events.clear()

            # Edited with kubectl, then the agent's forced ordinary write before the event.
            await asyncio.to_thread(
                custom.patch_namespaced_custom_object,
                GROUP, VERSION, namespace, PLURAL, target.name,
                {"devices": [{"id": "ttyUSB0", "health": "Unhealthy", "reason": "Edited"}]},
                field_manager="kubectl-edit",
            )  # fmt: skip
            await write()
            # Both MODIFIED events (kubectl's, then the agent's write), looked at in their order.
            await until(lambda: len([k for k, _ in events if k == "MODIFIED"]) >= 2, 10)
            edits = [obj for kind, obj in events if kind == "MODIFIED"]
            assert "kubectl-edit" in {m["manager"] for m in edits[0]["metadata"]["managedFields"]}
            assert repairs.suspect("MODIFIED", edits[0], {target.name})
            assert repairs.own(edits[1])
            repairs.written([target.name])
            assert (counted("deleted"), counted("edited")) == (1, 1)
            events.clear()

            # The agent's own delete (as after an edit) and its write: no repair.
            stored = await asyncio.to_thread(kube.read_report, namespace, target.name)
            assert stored is not None
            with repairs.deleting(target.name):
                await asyncio.to_thread(
                    kube.delete_report, namespace, target.name, stored["metadata"]["resourceVersion"]
                )
            await write()
            _, own = await until(lambda: seen("DELETED"), 10)
            repairs.suspect("DELETED", own, {target.name})
            repairs.written([target.name])
            assert (counted("deleted"), counted("edited")) == (1, 1)
        finally:
            watch.stop()
            watch.join(10)

    asyncio.run(scenario())
