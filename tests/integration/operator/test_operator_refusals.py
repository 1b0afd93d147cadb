"""Refusals explained: agent pods the API server refuses to create turn the profile Stalled with
the cluster's own reason, and a fix shows within seconds (the real API server's Pod Security
admission and the real DaemonSet controller; kwok runs the pods once they exist).

The figures (time to Stalled, time to recover) are printed, not asserted (docs/benchmarks.md):
run with ``-s`` to see them.
"""

from __future__ import annotations

import time
from typing import Any

from kubernetes.client.rest import ApiException
from support.clusters import NAMESPACE, TEST_LABEL, Cluster, kstatus, wait_for
from support.operator import Operator

ENFORCE = "pod-security.kubernetes.io/enforce"
STALL_AFTER = "5"
"""The operator's ``--stall-after`` for this test: a refusal is Stalled 5 s after the DaemonSet
controller's first FailedCreate instead of the default 60 s, the same condition, reason and
message (unit tests cover the period itself: test_operator_refusal_decisions.py). The test waited
a minute for it on each release."""


def spec(tag: str) -> dict[str, Any]:
    """A profile whose agent runs privileged (and mounts hostPaths, as every agent does)."""
    return {
        "resourceName": "example.com/serial",
        "mode": "DevicePlugin",
        "nodeSelector": {"matchLabels": {TEST_LABEL: tag}},
        "plugin": {"discovery": {"paths": {"globs": ["/dev/ttyUSB*"]}}},
        "agent": {"privileged": True, "tolerations": [{"operator": "Exists"}]},
    }


def stalled(cluster: Cluster, name: str) -> dict[str, Any] | None:
    cond = cluster.condition(name, "Stalled")
    return cond if cond is not None and cond["status"] == "True" else None


def label_namespace(cluster: Cluster, level: str | None) -> None:
    cluster.core.patch_namespace(NAMESPACE, {"metadata": {"labels": {ENFORCE: level}}})


def pod_security_refuses(cluster: Cluster) -> bool:
    """Whether the API server refuses a privileged pod in the namespace now (a dry run: nothing is
    created). Pod Security admission reads the namespace's labels from the API server's own
    informer, so a label takes effect a moment after the patch: 7 of 100 dry runs right after
    it were still admitted on an idle machine (2026-11-28), and an agent pod created in that
    moment is admitted and never refused."""
    pod = {
        "metadata": {"generateName": "pod-security-probe-"},
        "spec": {"containers": [{"name": "c", "image": "probe", "securityContext": {"privileged": True}}]},
    }
    try:
        cluster.core.create_namespaced_pod(NAMESPACE, pod, dry_run="All")
    except ApiException as e:
        if e.status == 403 and "violates PodSecurity" in str(e.body):
            return True
        raise
    return False


def test_pods_refused_by_pod_security_stall_the_profile_and_a_fix_recovers_it(
    cluster: Cluster, operator: Operator
) -> None:
    operator.stop()
    operator.start("--stall-after", STALL_AFTER)
    try:
        _refused_then_fixed(cluster)
    finally:
        operator.stop()
        operator.start()


def _refused_then_fixed(cluster: Cluster) -> None:
    cluster.add_nodes(2)
    name = f"{cluster.prefix}serial"
    daemonset = f"patchbay-{name}"
    label_namespace(cluster, "baseline")
    try:
        wait_for("Pod Security to enforce baseline", lambda: pod_security_refuses(cluster), timeout=30)
        start = time.monotonic()
        cluster.create_profile(name, spec(cluster.tag))
        cond = wait_for("Stalled", lambda: stalled(cluster, name), timeout=120)
        to_stalled = time.monotonic() - start
        assert cond["reason"] == "FailedCreate", cond
        assert f"DaemonSet {daemonset} cannot create its agent pods" in cond["message"], cond
        assert 'violates PodSecurity "baseline:latest"' in cond["message"], cond
        assert "privileged" in cond["message"], cond
        profile = cluster.profile(name) or {}
        assert kstatus(profile) == "Failed", profile.get("status")
        problem = profile["status"]["problems"][0]
        assert (problem["node"], problem["reason"]) == ("", "FailedCreate"), problem
        # The same text as the DaemonSet controller's own event.
        events = cluster.core.list_namespaced_event(
            NAMESPACE, field_selector=f"involvedObject.name={daemonset},reason=FailedCreate"
        ).items
        assert events and "violates PodSecurity" in events[0].message
    finally:
        label_namespace(cluster, None)
    fixed = time.monotonic()
    wait_for("Current", lambda: kstatus(cluster.profile(name) or {}) == "Current", timeout=120)
    to_current = time.monotonic() - fixed
    st = (cluster.profile(name) or {})["status"]
    assert st["nodesReady"] == "2/2", st
    assert all(p["reason"] != "FailedCreate" for p in st["problems"]), st
    print(f"\nrefusal -> Stalled: {to_stalled:.1f} s; label removed -> Current: {to_current:.1f} s")
