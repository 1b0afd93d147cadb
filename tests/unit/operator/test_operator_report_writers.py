"""A DeviceReport whose writer is gone is deleted, so the agent now on the node writes it afresh.

During a rollout of an agent DaemonSet both pods run on a node for a while, and each leaves the
other's writes alone (the agent's reporter, ``same_daemonset``): the old pod may write the report
after its successor did. Once the old pod is gone nobody corrects that report, and the operator
believes no report whose writer is not a pod it knows (the node counted as not reported: seen as
``rollout status`` waiting on 0 of 1 nodes updated after ``rollout undo`` in CI's make test). The
API is FAKE (fakekube.py) so the order is forced; the real agent writes a deleted report again at
once (tests/integration/agent)."""

from __future__ import annotations

from typing import Any

from fakekube import FakeKube
from support.converge import until

from patchbay_operator.agentpods import AgentPod
from patchbay_operator.agentwatch import AgentWatch
from patchbay_operator.config import Settings
from patchbay_operator.constants import API_GROUP, API_VERSION
from patchbay_operator.devicereports import Report
from patchbay_operator.kube import Ref, collection
from patchbay_operator.profiles import Registry

OLD, NEW = "patchbay-node-agent-abcde", "patchbay-node-agent-fghij"
NAMESPACE = "patchbay-system"


def report_object(name: str, agent: str) -> dict[str, Any]:
    profile, _, node = name.partition(".")
    return {
        "apiVersion": f"{API_GROUP}/{API_VERSION}",
        "kind": "DeviceReport",
        "metadata": {"name": name, "namespace": NAMESPACE},
        "profile": profile,
        "nodeName": node,
        "agent": agent,
    }


def agent_watch(kube: FakeKube) -> AgentWatch:
    async def call(fn: Any, *args: Any) -> Any:
        return fn(*args)

    watch = AgentWatch(kube, call, Settings(namespace=NAMESPACE), registry=Registry(), mark=lambda _n: None)
    for pod in (OLD, NEW):
        watch.pods.fold("ADDED", AgentPod(pod, "", "n1", "2026-11-30T00:00:00Z"))
    return watch


async def test_the_reports_a_gone_agent_pod_wrote_are_deleted_and_no_other() -> None:
    kube = FakeKube()
    watch = agent_watch(kube)
    for name, agent in (("serial.n1", OLD), ("sensors.n1", NEW)):
        watch.reports.fold("ADDED", Report.from_object(kube.apply(report_object(name, agent))))
    try:
        watch.pods.fold("DELETED", AgentPod(OLD, "", "n1", "2026-11-30T00:00:00Z"))
        await until(lambda: kube.deleted)
        assert [ref.path.rpartition("/")[2] for ref in kube.deleted] == ["serial.n1"]
        assert set(watch.reports.items) == {"sensors.n1"}
    finally:
        await watch.close()


async def test_a_report_its_successor_wrote_before_the_informer_saw_it_is_left() -> None:
    """The race of a shared agent's rollout: the new pod has written the report naming itself,
    the informer still holds the old pod's version when the old pod's DELETED comes. The API
    server's copy decides: nothing is deleted."""
    kube = FakeKube()
    watch = agent_watch(kube)
    watch.reports.fold("ADDED", Report.from_object(kube.apply(report_object("serial.n1", OLD))))
    kube.apply(report_object("serial.n1", NEW))  # the successor's write, not yet seen
    try:
        watch.pods.fold("DELETED", AgentPod(OLD, "", "n1", "2026-11-30T00:00:00Z"))
        await until(lambda: "get" in kube.calls)
        await watch.close()  # the deletion's task ran to its end
        assert kube.deleted == []
        assert kube.get(Ref(collection(f"{API_GROUP}/{API_VERSION}", "DeviceReport", NAMESPACE), "serial.n1"))
    finally:
        await watch.close()
