"""A DeviceReport whose writer is gone is deleted only if the API server's copy still names it.

The operator's informer may hold a report seconds old: in a rollout of the shared node agent the
new pod writes the node's reports naming itself as the old pod goes, and the old pod's DELETED can
reach the operator before the reports' MODIFIED. Deleting on the informer's copy deleted live
reports (CI on v1.34.4: the agent wrote them again half a second later, the node unreported
meanwhile). Here the operator's own AgentWatch runs in-process against the real API server and
etcd, its informer's copy made stale on purpose: the report the successor rewrote stays, the one
still naming the gone pod goes, and a delete with a stale resourceVersion is refused by the API
server itself (409), which is what makes the read-then-delete safe.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Iterator
from typing import Any

import pytest
from kubernetes import client
from support.clusters import Cluster
from support.converge import until
from support.reports import device_report

from patchbay_operator import agentwatch
from patchbay_operator.agentpods import AgentPod
from patchbay_operator.agentwatch import AgentWatch
from patchbay_operator.config import Settings
from patchbay_operator.devicereports import Report
from patchbay_operator.informer import list_all
from patchbay_operator.kube import Kube, KubeError, Ref
from patchbay_operator.profiles import Registry

OLD, NEW = "patchbay-node-agent-old00", "patchbay-node-agent-new00"
CREATED = "2026-12-01T00:00:00Z"


@pytest.fixture
def namespace(cluster: Cluster) -> Iterator[str]:
    ns = f"{cluster.prefix}writers"
    cluster.core.create_namespace(client.V1Namespace(metadata=client.V1ObjectMeta(name=ns)))
    try:
        yield ns
    finally:
        cluster.core.delete_namespace(ns)


def report(namespace: str, profile: str, agent: str) -> dict[str, Any]:
    devices = [{"id": "a", "health": "Healthy"}]
    summary = {"total": 1, "healthy": 1, "unhealthy": 0, "allocated": 0}
    return device_report(namespace, "n1", profile, "example.com/serial", devices, summary, agent=agent)


def in_thread(fn: Callable[..., Any], *args: Any) -> Any:
    """The operator's ``call``: a blocking API call off the event loop."""
    return asyncio.to_thread(fn, *args)


async def test_a_report_rewritten_by_the_successor_stays_and_the_stale_one_goes(
    cluster: Cluster, kube: Kube, namespace: str
) -> None:
    custom = ("patchbay.dev", "v1beta1", namespace, "devicereports")
    for profile in ("serial", "sensors"):
        cluster.custom.create_namespaced_custom_object(*custom, report(namespace, profile, OLD))
    source = agentwatch.sources(namespace)[3]
    snapshot = list_all(kube, source)
    watch = AgentWatch(
        kube, in_thread, Settings(namespace=namespace), registry=Registry(), mark=lambda _n: None
    )
    try:
        for pod in (OLD, NEW):
            watch.pods.fold("ADDED", AgentPod(pod, "", "n1", CREATED))
        watch.reports.resync(snapshot)
        # The deletions go in this order, one after the other: when "serial" is gone from the
        # informer, "sensors" has been decided.
        assert list(watch.reports.items) == ["sensors.n1", "serial.n1"]

        # The successor takes "sensors" over; this informer never hears of it.
        cluster.custom.patch_namespaced_custom_object(*custom, "sensors.n1", {"agent": NEW})
        assert {r.agent for r in watch.reports.items.values()} == {OLD}

        watch.pods.fold("DELETED", AgentPod(OLD, "", "n1", CREATED))
        await until(lambda: "serial.n1" not in watch.reports.items)

        left = {
            o["metadata"]["name"]: o["agent"]
            for o in cluster.custom.list_namespaced_custom_object(*custom)["items"]
        }
        assert left == {"sensors.n1": NEW}
    finally:
        await watch.close()


def test_the_api_server_refuses_a_delete_of_a_version_written_since(
    cluster: Cluster, kube: Kube, namespace: str
) -> None:
    """The precondition the deletion relies on, on a DeviceReport (a custom resource)."""
    custom = ("patchbay.dev", "v1beta1", namespace, "devicereports")
    created = cluster.custom.create_namespaced_custom_object(*custom, report(namespace, "serial", OLD))
    first = created["metadata"]["resourceVersion"]
    cluster.custom.patch_namespaced_custom_object(*custom, "serial.n1", {"agent": NEW})
    ref = Ref(agentwatch.reports_collection(namespace), "serial.n1")
    with pytest.raises(KubeError) as refused:
        kube.delete(ref, resource_version=first)
    assert refused.value.status == 409
    assert Report.from_object(kube.get(ref) or {}).agent == NEW
    current = (kube.get(ref) or {})["metadata"]["resourceVersion"]
    assert kube.delete(ref, resource_version=current) is True
    assert kube.get(ref) is None
