"""A profile's reconcile and delete: the registry decides, then the nodes and the agents follow.

One way down: kopf's handler (handlers.py) hands the profile to the controller, which hands it
here; the registry (profiles.py, pure) records it and decides who wins each resource name and CDI
kind; the node workers are queued (nodes.py: Static capacity, planned from the registry when they
run), the statuses concerned are marked (statuswriter.py), the profile's revision is written
(revisions.py), and the agents' objects are applied or deleted (agents.py, which also applies a
DRA profile's DeviceClass and its twin). Nothing on the way calls back up: what changes is
marked, and computed later by the status loop.

Deleting waits until no node carries the profile's resource (ownership comes from the node
annotations, so this works after a restart too), then hands the resource name, and the CDI kind,
to the next profile in line.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import Iterable, Mapping
from dataclasses import replace
from typing import Any

from patchbay_operator.agents import Agents
from patchbay_operator.events import EventRecorder
from patchbay_operator.nodes import NodeSync
from patchbay_operator.profiles import Profile, Registry
from patchbay_operator.revisions import Revisions
from patchbay_operator.statuswriter import StatusWriter

log = logging.getLogger(__name__)


class CleanupPendingError(RuntimeError):
    """Some nodes still carry a deleting profile's resource; the delete handler retries."""


class Reconciler:
    """Every profile's way from kopf to the nodes and the agents (see the module doc)."""

    def __init__(
        self,
        registry: Registry,
        nodes: NodeSync,
        agents: Agents,
        status: StatusWriter,
        events: EventRecorder,
        *,
        revisions: Revisions | None = None,
    ) -> None:
        self._registry, self._nodes, self._agents = registry, nodes, agents
        self._status, self._events, self._revisions = status, events, revisions
        self.reconciles = 0

    async def reconcile(self, body: Mapping[str, Any]) -> None:
        """A profile was created, changed or seen on resume (level-based, idempotent): re-plan the
        nodes, and apply or remove its agents depending on its mode and on conflicts."""
        profile = Profile.from_body(body)
        self.reconciles += 1
        self._registry.upsert(profile)
        self._status.seed(profile.name, body.get("status"), replace=False)
        self._nodes.enqueue_all()
        self._status.mark(self._registry.names_of(profile.resource))
        if self._revisions is not None:
            await self._revisions.reconcile(profile)
        winner = self._registry.conflict(profile)
        if winner is not None:
            log.warning(
                "DevicePluginProfile %s not applied: %s is provided by %s",
                profile.name,
                profile.resource,
                winner.name,
            )
        await self._agents.reconcile(profile)

    async def delete(self, body: Mapping[str, Any], patience: float = 60.0) -> None:
        """A profile is being deleted: remove its agents and every node value it set, then hand
        its resource name to the next profile in line. Raises ``CleanupPendingError`` while some
        node still carries the resource after ``patience`` seconds (kopf retries)."""
        profile = replace(Profile.from_body(body), deleting=True)
        # Deleting before its objects go: never a winner, so every node plans its removal, and
        # nothing repairs (recreates) what is deleted now (repairs.py renders from the registry).
        self._registry.upsert(profile)
        await self._agents.delete(profile)
        await self._agents.apply_shared()
        self._nodes.enqueue_all()
        deadline = time.monotonic() + patience
        while left := self._nodes.carrying(profile.name):
            if time.monotonic() > deadline:
                raise CleanupPendingError(f"{len(left)} nodes still carry {profile.resource}, e.g. {left[0]}")
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._nodes.queue.wait_idle(), max(0.1, deadline - time.monotonic()))
            await asyncio.sleep(0.2)
        self._registry.remove(profile.name)
        self._status.forget(profile.name)
        self._events.forget(profile.name)
        log.info("Removed %s from every node for DevicePluginProfile %s", profile.resource, profile.name)
        self._status.mark(self._registry.names_of(profile.resource))
        promoted = self._registry.winner(profile.resource, dra=profile.dra)
        if promoted is not None:
            log.info("DevicePluginProfile %s now provides %s", promoted.name, promoted.resource)
            if promoted.mode.runs_agents:
                await self._agents.apply(promoted)
        await self._promote_cdi_kind(profile)
        await self._agents.reapply_dra_twin(profile)

    async def _promote_cdi_kind(self, gone: Profile) -> None:
        """The profiles that waited for one of ``gone``'s CDI kinds: the next in line is applied now."""
        if not gone.cdi_kinds:
            return
        waiting = sorted(
            (p for p in self._registry if p.cdi_kinds & gone.cdi_kinds and not p.deleting),
            key=lambda p: p.sort_key,
        )
        self._status.mark([p.name for p in waiting])
        for p in waiting:
            if self._registry.conflict(p) is None and p.mode.runs_agents:
                log.info("DevicePluginProfile %s now has CDI kind %s", p.name, ", ".join(sorted(p.cdi_kinds)))
                await self._agents.apply(p)

    def replace_all(self, bodies: Iterable[Mapping[str, Any]]) -> None:
        """The registry becomes the profiles as listed (with their status): at start, and when a
        peered replica takes over from a registry kopf stopped updating."""
        bodies = list(bodies)
        for gone in self._registry.replace_all(Profile.from_body(b) for b in bodies):
            self._status.forget(gone)
        for body in bodies:
            self._status.seed(str(body["metadata"]["name"]), body.get("status"))
