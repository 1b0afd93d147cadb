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
from patchbay_operator.devicereports import Report
from patchbay_operator.profiles import Registry

OLD, NEW = "patchbay-node-agent-abcde", "patchbay-node-agent-fghij"


async def test_the_reports_a_gone_agent_pod_wrote_are_deleted_and_no_other() -> None:
    kube = FakeKube()

    async def call(fn: Any, *args: Any) -> Any:
        return fn(*args)

    watch = AgentWatch(
        kube, call, Settings(namespace="patchbay-system"), registry=Registry(), mark=lambda _n: None
    )
    for pod in (OLD, NEW):
        watch.pods.fold("ADDED", AgentPod(pod, "", "n1", "2026-11-30T00:00:00Z"))
    stale = Report("serial.n1", "serial", "n1", agent=OLD, revision="a")
    fresh = Report("sensors.n1", "sensors", "n1", agent=NEW, revision="b")
    for report in (stale, fresh):
        watch.reports.fold("ADDED", report)
    try:
        watch.pods.fold("DELETED", AgentPod(OLD, "", "n1", "2026-11-30T00:00:00Z"))
        await until(lambda: kube.deleted)
        assert [ref.path.rpartition("/")[2] for ref in kube.deleted] == ["serial.n1"]
        assert set(watch.reports.items) == {"sensors.n1"}
    finally:
        await watch.close()
