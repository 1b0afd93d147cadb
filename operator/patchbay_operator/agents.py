"""DevicePlugin and DRA modes: the objects that make each applied profile's agents real.

A profile that leaves ``spec.agent`` alone is served by the shared node agent (ONE ConfigMap and
DaemonSet, ``patchbay-node-agent``, for every such profile); one with agent settings of its own
gets a ConfigMap and DaemonSet of its own (``patchbay-<name>``). A DRA profile also has its
DeviceClass (deviceclasses.py), and its agents leave out the nodes of the profile that serves the
same resource through node capacity (KEP-5004: never both ways on one node), so a change of that
twin re-applies it.

Applying is server-side apply of what render.py makes (field manager ``patchbay-operator``);
deleting goes by name (``render.object_name``), so a profile that was never applied, or whose
spec changed, deletes cleanly without rendering anything. What the agents then tell comes back
through agentwatch.py; the DaemonSet an apply answers with is folded into it at once.
"""

from __future__ import annotations

import contextlib
import logging
from collections.abc import Callable, Iterable, Sequence
from dataclasses import KW_ONLY, dataclass, field
from typing import Any

from patchbay_operator import render
from patchbay_operator.agentwatch import AgentWatch
from patchbay_operator.constants import SHARED_KEY, Mode, Reason
from patchbay_operator.deviceclasses import DeviceClasses
from patchbay_operator.kube import Ref, collection
from patchbay_operator.parts import Part
from patchbay_operator.peering import writes
from patchbay_operator.profiles import Profile, Selector
from patchbay_operator.status.conditions import Problem
from patchbay_operator.status.daemonset import AgentDaemonSet

log = logging.getLogger(__name__)
OWN_OBJECTS = (("apps/v1", "DaemonSet"), ("v1", "ConfigMap"))
"""The kinds of an agent's objects besides the DeviceClass, in the order they are deleted."""


@dataclass(eq=False)
class Agents(Part):
    """Applies and deletes each profile's agent objects, as the registry decides."""

    _: KW_ONLY
    watch: AgentWatch
    classes: DeviceClasses
    mark: Callable[[Iterable[str]], None] = lambda _names: None
    #: shared profiles that do not fit in the node agent's ConfigMap -> why (their status says)
    refused: dict[str, str] = field(default_factory=dict)
    #: several profiles' `stage` asked in one go (staging.py's ``Staging.entries``; None: `stage`
    #: asked per profile)
    stages: Callable[[Sequence[Profile]], render.Stage] | None = None

    def _staged(self, profiles: Sequence[Profile]) -> render.Stage | None:
        """How `profiles` render mid-rollout, asked once for all of them."""
        if self.stages is not None:
            return self.stages(profiles)
        return render.once([(p, None) for p in profiles], self.stage)

    # --- a profile's agents, as the registry decides --------------------------------------------

    async def reconcile(self, profile: Profile) -> None:
        """``profile`` was created or changed: its agents if it runs agents and won its resource
        name (and CDI kind), none otherwise; a DRA twin's agents follow their new exclusion; the
        shared agent serves what the shared profiles say now (applied once, after both)."""
        twin = self.registry.applied_dra_twin(profile)
        follow = [twin] if twin is not None else []
        if profile.mode.runs_agents and self.registry.conflict(profile) is None:
            await self.apply(profile, *follow)
        else:
            await self.delete(profile)
            await self.apply(*follow)

    async def apply(self, *profiles: Profile) -> None:
        """Each profile's agents (the shared node agent's: its own objects go; or its own) and a
        DRA profile's DeviceClass, which no other mode keeps; then the shared node agent."""
        shared = [p for p in profiles if p.uses_shared_agent]
        for profile in shared:
            await self._delete_own(profile, f"DevicePluginProfile {profile.name} uses the shared agent")
        own = [p for p in profiles if p not in shared]
        # Rendered once, under the locks of every agent written (parts.Writing; taken in one
        # order, so two appliers never wait on each other): a wave written meanwhile is never
        # overwritten by an older stanza.
        async with contextlib.AsyncExitStack() as held:
            for key in sorted({SHARED_KEY, *(p.name for p in own)}):
                await held.enter_async_context(self.writing(key))
            stage = self._staged([*own, *self.registry.shared_agent_profiles()])
            for profile in own:
                await self._apply_own(profile, self.registry.exclusion(profile), stage)
            await self._apply_shared(stage)
        for profile in shared:  # the class after its agents, as an own agent's objects are applied
            if profile.mode is Mode.DRA:
                await self.classes.apply(profile)
            else:
                await self.classes.delete(profile)

    async def reapply_dra_twin(self, profile: Profile) -> None:
        """The node-capacity side of a resource changed (selector, mode, gone): the DRA profile
        of the same resource re-applies its agents with the new exclusion."""
        twin = self.registry.applied_dra_twin(profile)
        if twin is not None:
            await self.apply(twin)

    async def apply_shared(self, *, daemonset: bool = True) -> None:
        """The shared node agent becomes what the shared profiles say now (each with the nodes its
        agents leave out, see `render.shared_agent_objects`); with no profile left, it goes, unless
        `node_agent_always_on` keeps it (no profile in its config, no owner: it then only keeps
        the nodes' inventories; the uninstall hook deletes it). Without `daemonset` only its
        ConfigMap is written: a rollout's wave changes the config alone (the DaemonSet depends on
        the set of shared profiles and the settings, which a wave never changes).

        The profiles and their rollouts' stanzas are read under the shared agent's lock, when
        this call's turn to write comes (parts.Writing): of two calls, the later one's rendering
        is the one that stays."""
        async with self.writing(SHARED_KEY):
            profiles = self.registry.shared_agent_profiles()
            await self._apply_shared(self._staged(profiles), daemonset=daemonset)

    async def _apply_shared(self, stage: render.Stage | None, *, daemonset: bool = True) -> None:
        """`apply_shared` with the shared agent's lock held and `stage` asked under it."""
        profiles = [(p, self.registry.exclusion(p)) for p in self.registry.shared_agent_profiles()]
        refused = render.over_limit(profiles, stage)
        if refused or self.refused:
            self._refuse(refused)
        if refused:
            # Never half-written: the agents keep serving the config they have.
            return
        if not profiles and not self.settings.node_agent_always_on:
            await self._delete_objects(render.SHARED_AGENT, "no profile uses the shared agent")
            return
        for obj in render.shared_agent_objects(profiles, self.settings, stage):
            if daemonset or obj["kind"] != "DaemonSet":
                await self._apply_object(obj)

    async def apply_wave(self, name: str) -> None:
        """A rollout of `name` moved (a wave, a halt's put-back, the end): the agents' config says
        so. A profile with an agent of its own: its ConfigMap only (its DaemonSet does not depend
        on the rollout); the shared node agent's otherwise."""
        profile = self.registry.get(name)
        if profile is None or profile.deleting or profile.uses_shared_agent:
            await self.apply_shared(daemonset=False)
            return
        async with self.writing(name):
            profile = self.registry.get(name)  # as it is when this write's turn comes
            if profile is None or profile.deleting or profile.uses_shared_agent:
                return
            if profile.mode.runs_agents and self.registry.conflict(profile) is None:
                exclude, stage = self.registry.exclusion(profile), self._staged([profile])
                await self._apply_object(render.agent_objects(profile, self.settings, exclude, stage)[0])

    async def unused_shared(self, *, taking_over: bool = False) -> None:
        """At the operator's start (not while a peered replica stands by) or take-over (its gate
        opens after it) with no profile using the shared node agent (no profile handler will
        apply it): applied when `node_agent_always_on` keeps it for the inventories, deleted when
        it is left from a time the setting was on."""
        left = SHARED_KEY in self.watch.daemonsets.items
        if not (taking_over or writes(self.watch.gate)) or self.registry.shared_agent_profiles():
            return
        if not (self.settings.node_agent_always_on or left):
            return
        try:
            await self.apply_shared()
        except Exception:
            log.exception("Applying the shared node agent with no profile failed")

    def _refuse(self, names: list[str]) -> None:
        """`names` do not fit in the node agent's ConfigMap: each is refused (its status says so,
        `problems`) and the ConfigMap is left as it is; the ones refused before and no more are
        marked again."""
        why = (
            f"the shared node agent's ConfigMap {render.SHARED_AGENT} would hold more than "
            f"{render.CONFIGMAP_LIMIT} bytes with this profile's settings: it is not written (the agents "
            "keep serving what they have); make the profile smaller, or give it an agent section of its own"
        )
        before = set(self.refused)
        self.refused = dict.fromkeys(names, why)
        if names:
            log.error("Not writing ConfigMap %s: %s would not fit", render.SHARED_AGENT, ", ".join(names))
        self.mark(sorted(before | set(names)))

    def problems(self, name: str) -> list[Problem]:
        """The profile's problem while it does not fit in the shared ConfigMap (stalled: only a
        change of a profile makes it fit)."""
        why = self.refused.get(name)
        return [] if why is None else [Problem("", "", Reason.CONFIG_TOO_LARGE.value, why, stalled=True)]

    async def delete(self, profile: Profile) -> None:
        """Delete the agent objects if they exist (a Static or conflicting profile has none), the
        DeviceClass it controls, and the profile's reports."""
        await self._delete_own(profile)
        await self.classes.delete(profile)
        await self.watch.prune_reports(profile.name, keep=())
        self.classes.forget(profile.name)

    # --- objects ----------------------------------------------------------------------------------

    async def _apply_own(
        self, profile: Profile, exclude: Selector | None, stage: render.Stage | None
    ) -> None:
        """Apply the profile's own agent objects (`exclude`, `stage`: see `render.agent_objects`);
        a DevicePlugin profile that was DRA before loses its DeviceClass."""
        for obj in render.agent_objects(profile, self.settings, exclude, stage):
            if obj["kind"] == "DeviceClass":
                await self.classes.apply(profile, obj)
            else:
                await self._apply_object(obj)
        if profile.mode is not Mode.DRA:
            await self.classes.delete(profile)

    async def _apply_object(self, obj: dict[str, Any]) -> None:
        """Server-side apply one namespaced object; an agent DaemonSet's answer is folded into the
        watch at once (its rollout starts from the generation it was given)."""
        applied = await self.call(self.kube.apply, obj)
        meta = obj["metadata"]
        log.info("Applied %s %s/%s", obj["kind"], meta["namespace"], meta["name"])
        if obj["kind"] == "DaemonSet":
            self.watch.applied(AgentDaemonSet.from_object(applied))

    async def _delete_own(self, profile: Profile, why: str = "") -> None:
        """Delete the profile's own agent DaemonSet and ConfigMap if it had them; its reports and
        DeviceClass stay."""
        await self._delete_objects(render.object_name(profile.name), why)

    async def _delete_objects(self, name: str, why: str) -> None:
        ns = self.settings.namespace
        for api_version, kind in OWN_OBJECTS:
            if await self.call(self.kube.delete, Ref(collection(api_version, kind, ns), name)):
                log.info("Deleted %s %s/%s%s", kind, ns, name, f" ({why})" if why else "")
