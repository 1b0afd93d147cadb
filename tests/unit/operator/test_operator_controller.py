"""The controller's node cache: how informer events and resyncs fold in (no API calls made)."""

from __future__ import annotations

from kubernetes import client

from patchbay_operator.capacity import NodeState
from patchbay_operator.config import Settings
from patchbay_operator.controller import Controller
from patchbay_operator.informer import NodeEvent, Snapshot
from patchbay_operator.kube import Kube


def state(name: str, rv: str, **labels: str) -> NodeState:
    return NodeState.from_node({"metadata": {"name": name, "resourceVersion": rv, "labels": labels}})


def controller() -> Controller:
    # A client configuration pointing nowhere: these tests must never reach an API server.
    return Controller(Settings(), Kube(client.Configuration(host="http://127.0.0.1:9")))


def test_resync_drops_nodes_deleted_while_not_watching_and_keeps_fresher_state() -> None:
    ctl = controller()
    ctl.observe_events([NodeEvent("ADDED", state("a", "10")), NodeEvent("ADDED", state("b", "20", x="new"))])
    assert set(ctl.nodes) == {"a", "b"}
    # The relist no longer has "a"; its copy of "b" is OLDER than what a patch response gave us.
    ctl.resync_nodes(Snapshot([state("b", "15", x="old"), state("c", "16")], "16"))
    assert set(ctl.nodes) == {"b", "c"}
    assert ctl.nodes["b"].labels == {"x": "new"}


def test_events_apply_in_order_and_stale_ones_are_ignored() -> None:
    ctl = controller()
    ctl.observe_events(
        [
            NodeEvent("ADDED", state("a", "5", v="1")),
            NodeEvent("MODIFIED", state("a", "7", v="2")),
            NodeEvent("MODIFIED", state("a", "6", v="stale")),
        ]
    )
    assert ctl.nodes["a"].labels == {"v": "2"}
    ctl.observe_events([NodeEvent("DELETED", state("a", "8"))])
    assert ctl.nodes == {}
    assert ctl.counters.node_events == 4
