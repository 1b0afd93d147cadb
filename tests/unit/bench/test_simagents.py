"""The bench's simulated node agents (bench/patchbay_bench/simagents.py) and the rollout_scale
scenario's arithmetic: which revision each simulated node serves is the real agent's decision
(``Rollout.served``), its devices, the report it writes, the waves' time beyond their gates."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
import yaml

from patchbay_api.revisions import EVERYONE, NOBODY, Rollout, threshold_for
from patchbay_bench.apicost import served
from patchbay_bench.kube import Metrics
from patchbay_bench.scenarios.rollout_scale import less, per_node, wave_overheads
from patchbay_bench.simagents import SimAgents, device_report, resource_slices, served_devices

UID = "0b7a4c1e-uid"
NODES = [f"kwok-node-{i}" for i in range(40)]
LABELS = {"type": "kwok"}


def config_map(rollout: Rollout, rv: str, old_plugin: dict[str, Any] | None = None) -> dict[str, Any]:
    """The node agent's ConfigMap with one profile whose update revision ``new`` serves 2 virtual
    devices and whose current one ``old`` serves ``old_plugin``."""
    entry = {
        "profile": "p",
        "mode": "DevicePlugin",
        "resourceName": "bench.patchbay.dev/r",
        "plugin": {"discovery": {"virtual": {"count": 2}}},
        "nodeSelectorTerms": [{"matchExpressions": [{"key": "type", "operator": "In", "values": ["kwok"]}]}],
        "revision": "new",
        "uid": UID,
        "rollout": rollout.as_dict(),
        "revisions": {
            "old": {
                "resourceName": "bench.patchbay.dev/r",
                "plugin": old_plugin or {"discovery": {"virtual": {"count": 3}}},
            }
        },
    }
    return {"metadata": {"resourceVersion": rv}, "data": {"node.yaml": yaml.safe_dump({"profiles": [entry]})}}


class Recording(SimAgents):
    """SimAgents whose writes are kept instead of sent."""

    def __init__(self, tmp: Path) -> None:
        super().__init__("https://127.0.0.1:1", ("", "", ""), "ns", {n: f"agent-{n}" for n in NODES})
        self.sent: list[tuple[str, str, int]] = []

    def _write(self, entry: Any, node: str, decided: float) -> None:  # type: ignore[override]
        body = device_report(self.namespace, entry, node, self.agents[node])
        with self._lock:
            self.sent.append((node, body.get("revision", ""), body["summary"]["healthy"]))


@pytest.fixture
def sims(tmp_path: Path) -> Recording:
    return Recording(tmp_path)


def follow(sims: SimAgents, cm: dict[str, Any], nodes: list[str] = NODES) -> None:
    for n in nodes:
        sims.on_config(n, cm)
    sims.pool.shutdown(wait=True)


def test_each_node_serves_what_rollout_served_says(sims: Recording) -> None:
    threshold = threshold_for(UID, NODES, 7)
    rollout = Rollout("old", "new", None, threshold)
    for n in NODES:
        sims.on_node(n, {"metadata": {"labels": LABELS}})
    follow(sims, config_map(rollout, "1"))
    got = {node: rev for node, rev, _ in sims.sent}
    assert got == {n: rollout.served(UID, n, LABELS) for n in NODES}
    assert sum(rev == "new" for rev in got.values()) == 7
    assert {(rev, healthy) for _, rev, healthy in sims.sent} == {("new", 2), ("old", 3)}
    assert sims.ever[("p", "new")] == {n for n in NODES if got[n] == "new"}


def test_a_report_is_written_only_when_what_a_node_serves_changes(sims: Recording) -> None:
    for n in NODES:
        sims.on_node(n, {"metadata": {"labels": LABELS}})
    sims.pool.shutdown(wait=True)
    sims.pool = type(sims.pool)(4)
    follow(sims, config_map(Rollout("old", "new", None, NOBODY), "1"))
    assert len(sims.sent) == len(NODES)
    sims.sent.clear()
    sims.pool = type(sims.pool)(4)
    # The same stanza again (another write of the ConfigMap): nothing changes, nothing is written.
    follow(sims, config_map(Rollout("old", "new", None, NOBODY), "2"))
    assert sims.sent == []
    sims.pool = type(sims.pool)(4)
    follow(sims, config_map(Rollout("old", "new", None, EVERYONE), "3"))
    assert sorted(n for n, _, _ in sims.sent) == sorted(NODES)
    assert {rev for _, rev, _ in sims.sent} == {"new"}


def test_a_node_decides_only_once_it_knows_its_labels(sims: Recording) -> None:
    sims.on_config(NODES[0], config_map(Rollout("old", "new", None, EVERYONE), "1"))
    assert sims.ever == {}
    sims.on_node(NODES[0], {"metadata": {"labels": LABELS}})
    sims.on_node(NODES[1], {"metadata": {"labels": {"type": "other"}}})
    sims.on_config(NODES[1], config_map(Rollout("old", "new", None, EVERYONE), "1"))
    sims.pool.shutdown(wait=True)
    assert sims.sent == [(NODES[0], "new", 2)]


def test_a_glob_finds_no_device_on_a_simulated_node(sims: Recording) -> None:
    bad = {"discovery": {"paths": {"globs": ["/dev/nothing*"]}}}
    for n in NODES[:3]:
        sims.on_node(n, {"metadata": {"labels": LABELS}})
    follow(sims, config_map(Rollout("old", "new", None, NOBODY), "1", old_plugin=bad), NODES[:3])
    assert {(rev, healthy) for _, rev, healthy in sims.sent} == {("old", 0)}


def test_the_report_names_the_revision_and_counts_its_devices(sims: Recording) -> None:
    (entry,) = sims.configs[sims._entries(config_map(Rollout.settled("new"), "9"))][1]
    assert served_devices(entry) == 2
    body = device_report("ns", entry, "n1", "agent-x")
    assert body["metadata"] == {"name": "p.n1", "namespace": "ns"}
    assert (body["revision"], body["agent"], body["resourceName"]) == (
        "new",
        "agent-x",
        "bench.patchbay.dev/r",
    )
    assert body["summary"] == {"total": 2, "healthy": 2, "unhealthy": 0, "allocated": 0}
    assert [d["health"] for d in body["devices"]] == ["Healthy", "Healthy"]


def test_a_dra_entry_publishes_the_slice_the_real_agent_would(sims: Recording) -> None:
    """The same driver, pool (the node), node, device names and owner as the agent's publisher
    writes (its own functions), the devices the report counts healthy, none tainted."""
    cm = config_map(Rollout.settled("new"), "7")
    text = yaml.safe_load(cm["data"]["node.yaml"])
    text["profiles"][0] |= {"mode": "DRA", "driver": "p.patchbay.dev"}
    cm["data"]["node.yaml"] = yaml.safe_dump(text)
    (entry,) = sims.configs[sims._entries(cm)][1]
    (doc,) = resource_slices(entry, "kwok-node-3", "uid-3", 1234)
    assert doc["metadata"]["name"] == "kwok-node-3-p.patchbay.dev"
    assert doc["metadata"]["ownerReferences"][0]["uid"] == "uid-3"
    spec = doc["spec"]
    assert (spec["driver"], spec["nodeName"], spec["pool"]) == (
        "p.patchbay.dev",
        "kwok-node-3",
        {"name": "kwok-node-3", "generation": 1234, "resourceSliceCount": 1},
    )
    report = device_report("ns", entry, "kwok-node-3", "agent-x")
    ids = [d["attributes"]["patchbay.dev/id"]["string"] for d in spec["devices"]]
    assert ids == [d["id"] for d in report["devices"]] == ["virtual-0", "virtual-1"]
    assert [d["name"] for d in spec["devices"]] == ids and not any(d.get("taints") for d in spec["devices"])
    # A glob finds nothing on a kwok node: one slice with no device ("this node has none").
    text["profiles"][0]["plugin"] = {"discovery": {"paths": {"globs": ["/dev/nothing*"]}}}
    cm = {"metadata": {"resourceVersion": "8"}, "data": {"node.yaml": yaml.safe_dump(text)}}
    (entry,) = sims.configs[sims._entries(cm)][1]
    (empty,) = resource_slices(entry, "kwok-node-3", "", 1)
    assert empty["spec"]["devices"] == [] and "ownerReferences" not in empty["metadata"]


def test_wave_overheads_take_each_gates_wait_out() -> None:
    assert wave_overheads([10.0, 13.5, 16.0], 20.0, 2.0) == [1.5, 0.5, 2.0]
    assert wave_overheads([], 5.0, 2.0) == []


def test_per_node_takes_the_idle_rate_out() -> None:
    counts = {
        "requests": {"PATCH/devicereports": 100.0, "GET/configmaps": 20.0},
        "events": {"configmaps": 60.0},
    }
    idle = {"requests": {"GET/configmaps": 10.0}, "events": {"configmaps": 5.0}}
    # 20 s of rollout against a 10 s idle window: 20 background requests, 10 events; 50 nodes.
    assert per_node(counts, idle, 20.0, 10.0, 50) == (2.0, 2.0, 1.0)


def test_served_counts_only_what_a_change_can_touch() -> None:
    def metrics(reports: float, leases: float) -> Metrics:
        return Metrics.parse(
            "\n".join(
                [
                    f'apiserver_request_total{{verb="PATCH",resource="devicereports"}} {reports}',
                    f'apiserver_request_total{{verb="PUT",resource="leases"}} {leases}',
                    f'apiserver_watch_events_total{{resource="configmaps"}} {reports / 10}',
                ]
            )
        )

    got = served(metrics(10, 5), metrics(30, 500))
    assert json.loads(json.dumps(got)) == {
        "requests": {"PATCH/devicereports": 20.0},
        "events": {"configmaps": 2.0},
    }


def test_less_takes_the_benchs_own_requests_out() -> None:
    counts = {
        "requests": {"GET/devicepluginprofiles": 90.0, "APPLY/devicereports": 20.0},
        "events": {"pods": 1.0},
    }
    got = less(counts, {"GET/devicepluginprofiles": 100.0}, {"GET/devicepluginprofiles": 12.0})
    assert got == {
        "requests": {"GET/devicepluginprofiles": 2.0, "APPLY/devicereports": 20.0},
        "events": {"pods": 1.0},
    }
