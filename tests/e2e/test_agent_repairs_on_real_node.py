"""The agent puts back what it writes, on the real node with the chart's defaults: the shared node
agent pod serves a DevicePlugin profile and a DRA profile, and an administrator's mistakes are
undone by that pod, as its watch of its own objects sees them (docs/agent.md#what-the-agent-writes-again):

- `kubectl delete dr <profile>.<node>` for each profile: the report is back;
- `kubectl delete resourceslice` of the DRA profile's slice: back, with every device;
- `kubectl edit dr` (a device said Unhealthy, by the field manager kubectl-edit): the agent's own
  report is back;
- each repair is counted on the agent's /metrics (`patchbay_agent_repairs_total`) and logged in the
  Kubernetes style; and with nothing changing, the agent writes nothing (the objects' resource
  versions stay over a quiet interval).

The time from each deletion or edit to the object written again is printed (the goal is 2 s; the
waits are bounded at 30 s, and no time is asserted on this shared machine).
"""

from __future__ import annotations

import time
import urllib.request
from collections.abc import Callable
from typing import Any

from kubernetes import client
from support.dranode import RESOURCE_GROUP, RESOURCE_VERSION, dra_profile, slices_of
from support.promtext import parse
from support.realnode import DEVICES, SHARED_SELECTOR, OnNode, pod_ready, serial_profile, wait_for

REPORTS = ("patchbay.dev", "v1beta1", "devicereports")
#: The quiet interval: nothing changes on the node, so nothing may be written.
QUIET_SECONDS = 15.0


def _read(read: Callable[[], dict[str, Any]]) -> dict[str, Any] | None:
    try:
        return read()
    except client.ApiException as e:
        if e.status == 404:
            return None
        raise


def _timed(what: str, change: Callable[[], None], back: Callable[[], object]) -> float:
    """Make `change`, wait (at most 30 s) until `back()`, print and return the seconds it took."""
    started = time.monotonic()
    change()
    wait_for(what, back, 30, every=0.05)
    took = time.monotonic() - started
    print(f"{what}: {took:.2f}s")
    return took


def test_the_agent_writes_its_reports_and_slice_again_when_someone_deletes_or_edits_them(
    on_node: OnNode,
) -> None:
    patchbay, cluster, _e2e_cluster, real_node, _namespace, fake_dev = on_node
    custom, ns = cluster.custom, patchbay.namespace
    label = "patchbay.dev/e2e-fix"
    serial, _serial_res = serial_profile(cluster, fake_dev, real_node, suffix="fix", agent=None, label=label)
    dra, _dra_res, driver = dra_profile(cluster, fake_dev, real_node, own_agent=False)
    reports = {p: f"{p}.{real_node}" for p in (serial, dra)}

    def report(profile: str) -> dict[str, Any] | None:
        return _read(
            lambda: custom.get_namespaced_custom_object(*REPORTS[:2], ns, REPORTS[2], reports[profile])
        )

    def agents_only(obj: dict[str, Any]) -> bool:
        return {m["manager"] for m in obj["metadata"].get("managedFields") or []} == {"patchbay-agent"}

    def whole_report(profile: str, uid: str | None = None) -> dict[str, Any] | None:
        """The profile's report with every device Healthy, written by the agent alone (and, with
        `uid`, another object than that one: written again after a deletion)."""
        obj = report(profile)
        if obj is None or (uid is not None and obj["metadata"]["uid"] == uid):
            return None
        healthy = [d for d in obj.get("devices") or [] if d.get("health") == "Healthy"]
        return obj if len(healthy) == DEVICES and agents_only(obj) else None

    def the_slice(uid: str | None = None) -> dict[str, Any] | None:
        slices = slices_of(cluster, driver, real_node)
        if len(slices) != 1 or (uid is not None and slices[0]["metadata"]["uid"] == uid):
            return None
        (obj,) = slices
        return obj if len(obj["spec"].get("devices") or []) == DEVICES and agents_only(obj) else None

    def agent_pod() -> client.V1Pod | None:
        pods = cluster.core.list_namespaced_pod(ns, label_selector=SHARED_SELECTOR).items
        live = [p for p in pods if p.spec.node_name == real_node and not p.metadata.deletion_timestamp]
        return live[0] if len(live) == 1 and pod_ready(live[0]) else None

    def delete_report(profile: str) -> None:
        custom.delete_namespaced_custom_object(*REPORTS[:2], ns, REPORTS[2], reports[profile])

    try:
        for profile in (serial, dra):
            wait_for(
                f"{profile}'s DeviceReport, every device Healthy", lambda p=profile: whole_report(p), 180
            )
        first_slice = wait_for("the DRA profile's ResourceSlice", the_slice, 120)
        pod = wait_for("the shared node agent's pod Ready", agent_pod, 60)
        restarts = sum(c.restart_count for c in pod.status.container_statuses or [])

        took: dict[str, float] = {}
        for profile, mode in ((serial, "DevicePlugin"), (dra, "DRA")):
            uid = (report(profile) or {})["metadata"]["uid"]
            took[f"dr {mode} deleted"] = _timed(
                f"the {mode} profile's deleted DeviceReport written again",
                lambda p=profile: delete_report(p),
                lambda p=profile, u=uid: whole_report(p, u),
            )
        took["resourceslice deleted"] = _timed(
            "the deleted ResourceSlice written again",
            lambda: custom.delete_cluster_custom_object(
                RESOURCE_GROUP, RESOURCE_VERSION, "resourceslices", first_slice["metadata"]["name"]
            ),
            lambda: the_slice(first_slice["metadata"]["uid"]),
        )
        before = report(serial) or {}
        sick = [{**d, "health": "Unhealthy", "reason": "Edited"} for d in before["devices"]]
        took["dr edited"] = _timed(
            "the edited DeviceReport written again",
            lambda: custom.patch_namespaced_custom_object(
                *REPORTS[:2], ns, REPORTS[2], reports[serial], {"devices": sick}, field_manager="kubectl-edit"
            ),
            lambda: (
                (o := whole_report(serial)) is not None
                and o["metadata"]["resourceVersion"] != before["metadata"]["resourceVersion"]
            ),
        )
        print("deletion/edit -> written again:", ", ".join(f"{k} {v:.2f}s" for k, v in took.items()))

        # Counted on the agent's own /metrics and logged, by the one agent pod, never restarted.
        after = agent_pod()
        assert after is not None and after.metadata.uid == pod.metadata.uid
        assert sum(c.restart_count for c in after.status.container_statuses or []) == restarts

        def repairs() -> dict[tuple[str, str, str], float]:
            with urllib.request.urlopen(f"http://{after.status.pod_ip}:9464/metrics", timeout=5) as r:
                families = parse(r.read().decode())
            (rss,) = families["process_resident_memory_bytes"].samples
            print(f"node agent RSS: {rss.value / 2**20:.1f} MiB")
            samples = families["patchbay_agent_repairs"].samples
            return {(s.labels["profile"], s.labels["kind"], s.labels["cause"]): s.value for s in samples}

        counted = repairs()
        assert counted[(serial, "DeviceReport", "deleted")] == 1, counted
        assert counted[(serial, "DeviceReport", "edited")] == 1, counted
        assert counted[(dra, "DeviceReport", "deleted")] == 1, counted
        assert counted[(dra, "ResourceSlice", "deleted")] == 1, counted
        log = cluster.core.read_namespaced_pod_log(after.metadata.name, ns)
        for profile in (serial, dra):
            assert f"DeviceReport {reports[profile]} was deleted; written again" in log
        assert f"DeviceReport {reports[serial]} was edited by kubectl-edit (deleted it); written again" in log
        assert f"ResourceSlice {first_slice['metadata']['name']} was deleted; written again" in log

        # Quiet: nothing changes, so nothing is written (no periodic rewrite).
        def versions() -> tuple[str, ...]:
            objs = [report(serial), report(dra), the_slice()]
            return tuple(str((o or {}).get("metadata", {}).get("resourceVersion")) for o in objs)

        quiet = versions()
        time.sleep(QUIET_SECONDS)  # the interval itself is what is checked: no write in it
        assert versions() == quiet
        assert repairs() == counted
    finally:
        for name in (serial, dra):
            cluster.delete_profile(name)
        cluster.set_labels(real_node, {label: None, "patchbay.dev/e2e-dra": None})
