"""The operator's own informer against the real API server (in-process, no operator): nodes,
and the DeviceReports read with their own decoder.

What the controller relies on: a LIST snapshot and a WATCH from its resourceVersion miss
nothing; an API server restart is survived without losing events; an expired resourceVersion
(410 Gone) turns into a fresh LIST delivered as a resync; ``stop()`` ends a watch that is
blocked waiting for the next event.
"""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

import pytest
from kubernetes import client, config
from support.clusters import Cluster, running_devcluster, wait_for
from support.reports import device_report, largest_report

from patchbay_devcluster import DevCluster
from patchbay_operator import agentwatch
from patchbay_operator.capacity import NodeState
from patchbay_operator.devicereports import Report
from patchbay_operator.informer import Event, Informer, Snapshot, list_all
from patchbay_operator.kube import NODES_PATH, Kube, KubeError, Selectors, load_configuration
from patchbay_operator.nodes import SOURCE


@dataclass
class Seen:
    """What the informer delivered, recorded on its event loop."""

    events: list[Event[NodeState]] = field(default_factory=list)
    resyncs: list[Snapshot[NodeState]] = field(default_factory=list)
    threads: set[str] = field(default_factory=set)

    def on_events(self, batch: list[Event[NodeState]]) -> None:
        self.threads.add(threading.current_thread().name)
        self.events.extend(batch)

    def on_resync(self, snapshot: Snapshot[NodeState]) -> None:
        self.threads.add(threading.current_thread().name)
        self.resyncs.append(snapshot)

    def of(self, node: str) -> list[Event[NodeState]]:
        return [e for e in list(self.events) if e.obj.name == node]


@pytest.fixture
def loop() -> Iterator[asyncio.AbstractEventLoop]:
    """An event loop running in a thread named 'loop', as the operator's would."""
    lp = asyncio.new_event_loop()
    t = threading.Thread(target=lp.run_forever, name="loop", daemon=True)
    t.start()
    try:
        yield lp
    finally:
        lp.call_soon_threadsafe(lp.stop)
        t.join(5)
        lp.close()


def start(kube: Kube, loop: asyncio.AbstractEventLoop, rv: str) -> tuple[Informer[NodeState], Seen]:
    seen = Seen()
    informer = Informer(kube, SOURCE, loop, seen.on_events, seen.on_resync)
    informer.start(rv)
    return informer, seen


def test_list_then_watch_misses_nothing(
    cluster: Cluster, kube: Kube, loop: asyncio.AbstractEventLoop
) -> None:
    first = cluster.add_nodes(2)
    snapshot = list_all(kube, SOURCE)
    names = {s.name for s in snapshot.items}
    assert set(first) <= names
    assert snapshot.resource_version.isdigit()

    # Changes made after the snapshot but BEFORE the watch opens must still arrive.
    cluster.set_labels(first[0], {"color": "blue"})
    informer, seen = start(kube, loop, snapshot.resource_version)
    try:
        wait_for(
            "the label change made before the watch opened",
            lambda: any(
                e.type == "MODIFIED" and e.obj.labels.get("color") == "blue" for e in seen.of(first[0])
            ),
            timeout=30,
        )
        late = cluster.add_nodes(1, start=5)[0]
        wait_for("the new node", lambda: any(e.type == "ADDED" for e in seen.of(late)), timeout=30)
        cluster.set_status_value(first[1], "example.com/widget", "3")
        wait_for(
            "the extended resource in capacity and allocatable",
            lambda: any(
                e.obj.capacity.get("example.com/widget") == "3"
                and e.obj.allocatable.get("example.com/widget") == "3"
                for e in seen.of(first[1])
            ),
            timeout=30,
        )
        cluster.core.delete_node(late)
        wait_for("the deletion", lambda: any(e.type == "DELETED" for e in seen.of(late)), timeout=30)
        assert seen.resyncs == []
        assert seen.threads == {"loop"}, "callbacks must run on the event loop, not the informer's thread"
    finally:
        informer.stop()


@pytest.fixture(scope="module")
def own_cluster(tmp_path_factory: pytest.TempPathFactory, bin_dir: Path) -> Iterator[DevCluster]:
    """A control plane of this module's own: its API server is restarted, which the session's
    other tests must not see."""
    with running_devcluster(tmp_path_factory.mktemp("informer-cluster"), bin_dir) as c:
        yield c


def test_api_server_restart_then_an_expired_resource_version(
    own_cluster: DevCluster, loop: asyncio.AbstractEventLoop
) -> None:
    kube = Kube(load_configuration(str(own_cluster.kubeconfig), 4))
    core = client.CoreV1Api(config.new_client_from_config(config_file=str(own_cluster.kubeconfig)))
    nodes = own_cluster.add_kwok_nodes(2, prefix="inf-")
    before = list_all(kube, SOURCE)
    informer, seen = start(kube, loop, before.resource_version)
    try:
        wait_for("the watch to be open", lambda: informer._watch is not None, timeout=30)
        # One write the informer does not watch moves etcd's (global) revision past `before`. The
        # 410 below depends on it: with no write in this window (this control plane has no
        # controllers; a kwok lease may or may not renew), the restarted watch cache would start
        # exactly at `before` and a watch from it would be valid (seen once on v1.34.4).
        core.create_namespaced_config_map(
            "default", client.V1ConfigMap(metadata=client.V1ObjectMeta(name="informer-revision-mover"))
        )
        # The API server goes away and comes back: the watch fails and is retried with backoff.
        # The new API server's watch cache starts at the current revision, past our last node
        # event: then the informer gets 410 and relists (or, had a bookmark carried it forward,
        # it watches on). Either way it must go on delivering.
        own_cluster.restart_component("kube-apiserver")
        core.patch_node(nodes[0], {"metadata": {"labels": {"after": "restart"}}})
        wait_for(
            "an event after the API server restart",
            lambda: any(e.obj.labels.get("after") == "restart" for e in seen.of(nodes[0])),
            timeout=60,
        )
        assert informer.restarts >= 1
        if seen.resyncs:
            assert {s.name for s in seen.resyncs[-1].items} == set(nodes)
    finally:
        informer.stop()

    # The restarted API server's watch cache begins at the revision it started at: the
    # resourceVersion of the first LIST is now too old (410 Gone)...
    with pytest.raises(KubeError) as gone:
        for _ in kube.watch(NODES_PATH, before.resource_version, timeout_seconds=5):
            pass
    assert gone.value.status == 410

    # ...so an informer starting from it LISTs again and delivers that as a resync, in which a
    # node deleted meanwhile is missing, and then watches on from the fresh list.
    core.delete_node(nodes[1])
    informer, seen = start(kube, loop, before.resource_version)
    try:
        snap = wait_for("a resync after 410 Gone", lambda: seen.resyncs and seen.resyncs[0], timeout=30)
        assert nodes[0] in {s.name for s in snap.items}
        assert nodes[1] not in {s.name for s in snap.items}
        assert informer.restarts >= 1
        core.patch_node(nodes[0], {"metadata": {"labels": {"after": "resync"}}})
        wait_for(
            "an event after the resync",
            lambda: any(e.obj.labels.get("after") == "resync" for e in seen.of(nodes[0])),
            timeout=30,
        )
    finally:
        informer.stop()
        kube.close()


def test_stop_ends_a_watch_blocked_on_read(kube: Kube, loop: asyncio.AbstractEventLoop) -> None:
    snapshot = list_all(kube, SOURCE)
    informer, _ = start(kube, loop, snapshot.resource_version)
    wait_for("the watch to be open", lambda: informer._watch is not None, timeout=30)
    informer.stop(timeout=10)
    assert informer._thread is not None
    # The server would hold the stream open for 300 s: stop() must interrupt the blocked read.
    assert not informer._thread.is_alive()


def test_a_list_of_large_objects_keeps_its_pages_near_the_byte_budget(cluster: Cluster, kube: Kube) -> None:
    """Pages follow the bytes, not only the count: DeviceReports at the CRD's bounds are 0.75 MB
    each, and 500 of them in one page held 375 MB of body at once. The first page asks for
    `first`; later ones for what the budget holds at the size seen, at most `chunk`; nothing is
    listed twice or left out (the continue token does not depend on the limit)."""
    ns = f"{cluster.prefix}pages"
    cluster.core.create_namespace(client.V1Namespace(metadata=client.V1ObjectMeta(name=ns)))
    try:
        for i in range(30):
            cluster.core.create_namespaced_config_map(
                ns,
                client.V1ConfigMap(
                    metadata=client.V1ObjectMeta(name=f"big-{i:02}", labels={"patchbay-test": "pages"}),
                    data={"blob": "x" * 40_000},
                ),
            )
        # Only ours: the namespace also gets the cluster's kube-root-ca.crt.
        path, ours = f"/api/v1/namespaces/{ns}/configmaps", Selectors(label="patchbay-test=pages")
        pages = list(kube.list_pages(path, 500, ours, first=20, page_bytes=200_000))
        assert [p.limit for p in pages][:1] == [20]
        # 20 objects of ~40 KB: about 5 fit 200,000 bytes.
        assert all(1 <= p.limit <= 6 for p in pages[1:]), [p.limit for p in pages]
        assert len(pages) >= 3
        names = [i["metadata"]["name"] for p in pages for i in p.items]
        assert sorted(names) == [f"big-{i:02}" for i in range(30)]
        assert len({p.resource_version for p in pages}) == 1

        # Small objects (about 0.5 KB with their metadata): the second page grows back, to
        # hundreds (at most the chunk).
        for i in range(30):
            cluster.core.patch_namespaced_config_map(f"big-{i:02}", ns, {"data": {"blob": "x"}})
        pages = list(kube.list_pages(path, 500, ours, first=20, page_bytes=200_000))
        assert [len(p.items) for p in pages] == [20, 10]
        assert 200 <= pages[1].limit <= 500, pages[1].limit
        assert [p.limit for p in kube.list_pages(path, 25, ours, first=20, page_bytes=200_000)] == [20, 25]
    finally:
        cluster.core.delete_namespace(ns)


def test_device_reports_are_read_straight_into_what_the_operator_keeps(
    cluster: Cluster, kube: Kube, loop: asyncio.AbstractEventLoop
) -> None:
    """The DeviceReports' source reads its LIST pages and WATCH lines with its own decoder
    (devicereports.decode_page and decode_event, msgspec): from the real API server's bytes, a
    report at the CRD's bounds and a small one arrive as ``Report``s equal to the dict reading of
    the same objects, in the LIST and in every watch event type (ADDED, MODIFIED, DELETED)."""
    ns = f"{cluster.prefix}wire"
    cluster.core.create_namespace(client.V1Namespace(metadata=client.V1ObjectMeta(name=ns)))
    reports = agentwatch.sources(ns)[3]
    informer: Informer[Report] | None = None
    try:
        big = largest_report(ns, "node-big", "wire")
        cluster.custom.create_namespaced_custom_object("patchbay.dev", "v1beta1", ns, "devicereports", big)
        snapshot = list_all(kube, reports)
        (listed,) = snapshot.items
        assert isinstance(listed, Report)
        assert listed == Report.from_object(big)
        assert (listed.total, listed.unhealthy, listed.allocated) == (2048, 2048, 8)

        got: list[Event[Report]] = []
        informer = Informer(kube, reports, loop, got.extend, lambda _s: None)
        informer.start(snapshot.resource_version)
        wait_for("the watch to be open", lambda: informer is not None and informer._watch is not None, 30)
        small = device_report(
            ns,
            "node-small",
            "wire",
            "example.com/serial",
            [
                {"id": "a", "health": "Healthy", "pods": [{"namespace": "n", "name": "p", "container": "c"}]},
                {"id": "b", "health": "Unhealthy", "reason": "Gone", "pods": []},
            ],
            {"total": 2, "healthy": 1, "unhealthy": 1, "allocated": 1},
        )
        created = cluster.custom.create_namespaced_custom_object(
            "patchbay.dev", "v1beta1", ns, "devicereports", small
        )
        name = created["metadata"]["name"]
        cluster.custom.patch_namespaced_custom_object(
            "patchbay.dev",
            "v1beta1",
            ns,
            "devicereports",
            name,
            {"devices": [{"id": "a", "health": "Unhealthy", "reason": "Unplugged"}]},
        )
        cluster.custom.delete_namespaced_custom_object("patchbay.dev", "v1beta1", ns, "devicereports", name)
        wait_for("three events", lambda: len(got) >= 3, 30)
        assert [e.type for e in got] == ["ADDED", "MODIFIED", "DELETED"]
        added, modified, deleted = (e.obj for e in got)
        assert added == Report.from_object(created)
        assert (added.total, added.healthy, added.allocated) == (2, 1, 1)
        assert [d.id for d in added.devices] == ["b"] and added.devices[0].reason == "Gone"
        assert (modified.total, modified.healthy, modified.allocated) == (1, 0, 0)
        assert modified.devices[0].reason == "Unplugged"
        assert deleted.name == name and deleted.node == "node-small"
        assert int(informer.resource_version) >= int(snapshot.resource_version)
    finally:
        if informer is not None:
            informer.stop(timeout=10)
        cluster.core.delete_namespace(ns)
