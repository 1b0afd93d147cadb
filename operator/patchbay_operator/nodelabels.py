"""The opt-in inventory labels kept on the nodes (``--inventory-node-labels``; inventorylabels.py
decides, this module watches and writes).

On: an informer on NodeInventories (one per node, cluster-scoped) gives each node's desired
labels; the node cache the operator already keeps (nodes.py) gives what each node carries and
which labels the inventory-label manager owns (``NodeState.inventory``). A node is queued when
the two disagree, and a worker applies its whole set (server-side apply, not forced: one request,
no read) and folds the answer back, so the watch event of its own write is "nothing to do". One
write per node per inventory change; none while nothing changes.

Off: no NodeInventory is read; a node still carrying labels this manager owns (from when it was
on) has them removed, once; no write otherwise.

Failures are handled as the static capacity's (``nodes.NodeWriter``): 404, forgotten; 409 (a
label another manager took meanwhile: the cache was behind), the node read once and planned again;
anything else, tried again after a per-node backoff. The queue is paused while this replica must
not write (peering).
"""

from __future__ import annotations

import logging

from patchbay_operator.capacity import NodeState
from patchbay_operator.informer import Event, Snapshot, Source, Store
from patchbay_operator.inventorylabels import Inventory, plan
from patchbay_operator.kube import INVENTORIES_PATH, KubeAPI
from patchbay_operator.nodes import Call, NodeSync, NodeWriter

log = logging.getLogger(__name__)

SOURCE: Source[Inventory] = Source("NodeInventories", INVENTORIES_PATH, Inventory.from_object, first_page=100)


class InventoryLabels(NodeWriter):
    """Each node's inventory labels, kept; ``enabled`` False only removes what it owns. The nodes
    are ``NodeSync``'s cache (it folds every node event first, and this part's writes too)."""

    what = "Applying the inventory labels of node"

    def __init__(self, kube: KubeAPI, call: Call, nodes: NodeSync, *, enabled: bool) -> None:
        super().__init__(kube, call)
        self.node_sync, self.enabled = nodes, enabled
        self.inventories: Store[Inventory] = Store(lambda i: i.node, self._inventory_changed)
        self.writes = 0
        #: what the node informer (after NodeSync) and the NodeInventories' hand over
        self.node_feed = (self.observe, self.resync)
        self.inventory_feed = (self.inventories.observe, self.inventories.resync)

    def _wanted(self, name: str) -> dict[str, str]:
        inv = self.inventories.items.get(name) if self.enabled else None
        return dict(inv.labels) if inv is not None else {}

    def _check(self, name: str) -> None:
        node = self.node_sync.states.get(name)
        if node is not None and plan(self._wanted(name), node.inventory) is not None:
            self.queue.add(name)

    def _inventory_changed(self, old: Inventory | None, new: Inventory | None) -> None:
        """An inventory whose labels did not change (a device file came, a profile started
        serving something) stops here."""
        inv = new or old
        if inv is not None and (old is None or new is None or old.labels != new.labels):
            self._check(inv.node)

    def observe(self, events: list[Event[NodeState]]) -> None:
        for ev in events:
            self._check(ev.obj.name)

    def resync(self, snapshot: Snapshot[NodeState]) -> None:
        for state in snapshot.items:
            self._check(state.name)

    def fold(self, event_type: str, state: NodeState) -> None:
        self.node_sync.fold(event_type, state)
        self._check(state.name)

    def forget(self, name: str) -> None:
        self.node_sync.forget(name)

    def resume(self) -> None:
        """Write again (a peered replica taking over): every node checked."""
        self.queue.resume()
        for name in self.node_sync.states:
            self._check(name)

    def stats(self) -> dict[str, int]:
        return {"inventoryLabelWrites": self.writes, "inventoryLabelFailures": self.patch_failures}

    async def sync(self, name: str) -> None:
        node = self.node_sync.states.get(name)
        if node is None or self.queue.paused:
            return
        labels = plan(self._wanted(name), node.inventory)
        if labels is None:
            return
        result = await self.write(name, self._kube.apply_node_labels, labels)
        if result is None:
            return
        self.writes += 1
        log.info("Node %s: inventory labels %s", name, ", ".join(sorted(labels)) or "none")
        self.fold("APPLIED", NodeState.from_node(result))
