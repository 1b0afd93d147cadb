"""Profiles as the operator understands them, and who wins a resource name (pure, no I/O).

A ``Profile`` is the parsed, immutable view of one DevicePluginProfile; the ``Registry`` holds
all of them and decides, per resource name, which one is applied: the oldest (creation time,
then name), so two profiles for the same resource never fight over nodes. Deleting profiles
never win, so the next in line is promoted as soon as the winner starts going away.

The contest is held per *way of serving*: node capacity (Static and DevicePlugin, both write the
node's capacity/allocatable) and DRA (ResourceSlices and a DeviceClass with
``extendedResourceName``). So one node-capacity profile and one DRA profile may share a resource
name: that is how a resource migrates from a device plugin to DRA node by node. Whether they
then select the same node (which KEP-5004 forbids) is reported, not decided, here
(``status.dra.served_twice``).
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

from patchbay_api.selectors import LabelSelector
from patchbay_operator.constants import DEFAULT_NODE_GROUP, SHARED_KEY, Mode
from patchbay_operator.pluginspec import PluginSpec, merge, plain

#: The profile's label selectors (``spec.nodeSelector``, a group's ``nodeSelector``): the API
#: package's one evaluator, under the name the operator's modules use.
Selector = LabelSelector


def _selector(raw: Mapping[str, Any] | None) -> Selector:
    """A profile's selector: absent selects every node, as the empty one does (docs/api.md)."""
    return Selector.parse(raw or {})


@dataclass(frozen=True)
class NodeGroup:
    """One of ``spec.nodeGroups``: the nodes its selector matches use ``plugin``, the profile's
    ``spec.plugin`` with the group's settings merged over it (``pluginspec.merge``)."""

    name: str
    selector: Selector
    #: the group's own partial ``plugin``, as written
    overrides: Mapping[str, Any] = field(compare=False, repr=False)
    #: ``spec.plugin`` with ``overrides`` merged in: what the group's nodes are served with
    plugin: PluginSpec = field(compare=False, repr=False)

    @classmethod
    def parse(cls, raw: Mapping[str, Any], base: Mapping[str, Any]) -> NodeGroup:
        overrides = plain(raw.get("plugin") or {})
        return cls(
            str(raw["name"]),
            _selector(raw.get("nodeSelector")),
            overrides,
            PluginSpec.parse(merge(base, overrides)),
        )


@dataclass(frozen=True)
class Profile:
    """One DevicePluginProfile, parsed once when kopf hands it over."""

    name: str
    uid: str
    generation: int
    created: str  # RFC 3339; sorts chronologically as a string
    resource: str
    mode: Mode
    selector: Selector
    spec: Mapping[str, Any] = field(compare=False, repr=False)
    #: ``spec.plugin``, the agent's configuration, as the operator reads it (pluginspec.py)
    plugin: PluginSpec = field(default_factory=PluginSpec, compare=False, repr=False)
    static_capacity: int = 0
    capacity_label: str | None = None
    deleting: bool = False
    #: ``spec.nodeGroups``, in list order (the first that matches a node is the node's)
    node_groups: tuple[NodeGroup, ...] = field(default=(), compare=False, repr=False)

    @classmethod
    def from_body(cls, body: Mapping[str, Any]) -> Profile:
        meta = body.get("metadata") or {}
        spec = body.get("spec") or {}
        static = spec.get("static") or {}
        plugin = plain(spec.get("plugin")) or {}
        return cls(
            name=str(meta["name"]),
            uid=str(meta.get("uid", "")),
            generation=int(meta.get("generation") or 0),
            created=str(meta.get("creationTimestamp") or ""),
            resource=str(spec["resourceName"]),
            mode=Mode(spec["mode"]),
            selector=_selector(spec.get("nodeSelector")),
            spec=plain(spec),
            plugin=PluginSpec.parse(plugin),
            static_capacity=int(static.get("capacity") or 0),
            capacity_label=static.get("capacityFromLabel") or None,
            deleting=bool(meta.get("deletionTimestamp")),
            node_groups=tuple(NodeGroup.parse(g, plugin) for g in spec.get("nodeGroups") or ()),
        )

    def groups_matching(self, labels: Mapping[str, str]) -> list[NodeGroup]:
        """Every node group whose selector matches these labels, in list order."""
        return [g for g in self.node_groups if g.selector.matches(labels)]

    def group_of(self, labels: Mapping[str, str]) -> str:
        """The node group a node with these labels uses: the FIRST that matches in list order
        (docs/api.md#node-groups), or ``default`` (``spec.plugin`` alone). The node agent makes
        the same choice (``patchbay_agent.nodeconfig``); this one is for the status."""
        matching = self.groups_matching(labels)
        return matching[0].name if matching else DEFAULT_NODE_GROUP

    def plugin_for(self, labels: Mapping[str, str]) -> PluginSpec:
        """The plugin settings a node with these labels is served with (its group's)."""
        matching = self.groups_matching(labels)
        return matching[0].plugin if matching else self.plugin

    @property
    def sort_key(self) -> tuple[str, str]:
        return (self.created, self.name)

    @property
    def shares(self) -> int:
        """`plugin.sharing.replicas`: how many pods (DevicePlugin) or claims (DRA) may hold a
        device at once; with node groups, the most any group allows (a node's own number is
        ``plugin_for(labels).replicas``)."""
        return max([self.plugin.replicas, *(g.plugin.replicas for g in self.node_groups)])

    @property
    def partitioned(self) -> bool:
        """`plugin.partitions` on the profile or any of its node groups (DRA: devices offered in
        several sizes through counters)."""
        return any(p.partition_slots for p in (self.plugin, *(g.plugin for g in self.node_groups)))

    @property
    def uses_shared_agent(self) -> bool:
        """A profile that leaves `spec.agent` alone is served by the shared node agent; one with an
        `agent` section (image, privileges, resources, tolerations, ...; even an empty one, which
        the API server fills with defaults) gets its own DaemonSet."""
        return "agent" not in self.spec

    @property
    def agent_key(self) -> str:
        """Whose agents serve it: `SHARED_KEY` for the shared node agent, else its own name."""
        return SHARED_KEY if self.uses_shared_agent else self.name

    @property
    def dra(self) -> bool:
        """Served through DRA (ResourceSlices + a DeviceClass), not through node capacity."""
        return self.mode is Mode.DRA

    @property
    def cdi_kind(self) -> str | None:
        """``spec.plugin.allocation.cdi.kind`` (a DevicePlugin profile's CDI names), or None: the
        agent then writes a CDI spec and needs the runtime's spec directory mounted (only then:
        least privilege), and no other profile may have the same kind."""
        return self.plugin.cdi_kind

    @property
    def cdi_kinds(self) -> frozenset[str]:
        """Every CDI kind the profile's agents may name devices with: ``cdi_kind`` and its node
        groups' (a group may set a kind of its own); no other profile may use any of them."""
        kinds = [self.plugin.cdi_kind, *(g.plugin.cdi_kind for g in self.node_groups)]
        return frozenset(k for k in kinds if k)


class Registry:
    """Every known profile, by name; decides the winner for each resource name.

    The Static winners are asked for on every node event, so they are computed once per change
    of the registry, not once per event.
    """

    def __init__(self, profiles: Iterable[Profile] = ()) -> None:
        self._by_name: dict[str, Profile] = {p.name: p for p in profiles}
        self._static_winners: dict[str, Profile] | None = None

    def __contains__(self, name: object) -> bool:
        return name in self._by_name

    def __iter__(self) -> Any:
        return iter(list(self._by_name.values()))

    def get(self, name: str) -> Profile | None:
        return self._by_name.get(name)

    def __len__(self) -> int:
        return len(self._by_name)

    def names(self) -> list[str]:
        return list(self._by_name)

    def names_of(self, resource: str) -> list[str]:
        """The profiles of ``resource`` (each way of serving it): a change of one can change the
        others' status (who wins, what is served twice)."""
        return [p.name for p in self._by_name.values() if p.resource == resource]

    def upsert(self, profile: Profile) -> None:
        self._by_name[profile.name] = profile
        self._static_winners = None

    def remove(self, name: str) -> Profile | None:
        self._static_winners = None
        return self._by_name.pop(name, None)

    def replace_all(self, profiles: Iterable[Profile]) -> list[str]:
        """Become exactly ``profiles``; returns the names that were dropped."""
        fresh = {p.name: p for p in profiles}
        gone = [n for n in self._by_name if n not in fresh]
        self._by_name = fresh
        self._static_winners = None
        return gone

    def winner(self, resource: str, *, dra: bool = False) -> Profile | None:
        """The profile applied for ``resource`` through node capacity (``dra=False``: Static or
        DevicePlugin) or through DRA: the oldest one of that kind not being deleted."""
        live = [
            p for p in self._by_name.values() if p.resource == resource and p.dra == dra and not p.deleting
        ]
        return min(live, key=lambda p: p.sort_key) if live else None

    def is_winner(self, profile: Profile) -> bool:
        w = self.winner(profile.resource, dra=profile.dra)
        return w is not None and w.name == profile.name

    def conflict(self, profile: Profile) -> Profile | None:
        """The profile that holds ``profile``'s resource name (the same way of serving) or its
        CDI kind instead of it, if any: two agents writing one CDI kind's spec would hand out each
        other's devices under the same CDI names."""
        w = self.winner(profile.resource, dra=profile.dra)
        if w is not None and w.name != profile.name:
            return w
        return self.cdi_kind_holder(profile)

    def cdi_kind_holder(self, profile: Profile) -> Profile | None:
        """The oldest other live profile with one of ``profile``'s CDI kinds, when it is older."""
        kinds = profile.cdi_kinds
        if not kinds:
            return None
        older = [
            p
            for p in self._by_name.values()
            if p.name != profile.name
            and not p.deleting
            and p.cdi_kinds & kinds
            and p.sort_key < profile.sort_key
        ]
        return min(older, key=lambda p: p.sort_key) if older else None

    def other_way(self, profile: Profile) -> Profile | None:
        """The applied profile that serves ``profile``'s resource name the other way (a DRA
        profile's node-capacity twin, or the reverse), if any: their nodes must not overlap."""
        return self.winner(profile.resource, dra=not profile.dra)

    def exclusion(self, profile: Profile) -> Selector | None:
        """The nodes a DRA profile's agents leave out: those of the profile that serves the same
        resource through node capacity (KEP-5004: never both ways on one node); None for others."""
        twin = self.other_way(profile) if profile.mode is Mode.DRA else None
        return twin.selector if twin is not None else None

    def shared_agent_profiles(self) -> list[Profile]:
        """The profiles the shared node agent serves now: agent modes, not being deleted, without
        agent settings of their own, and applied (no conflict)."""
        return [
            p
            for p in self._by_name.values()
            if p.mode.runs_agents and not p.deleting and p.uses_shared_agent and self.conflict(p) is None
        ]

    def applied_dra_twin(self, profile: Profile) -> Profile | None:
        """The DRA profile that serves ``profile``'s resource the other way and is applied (not
        being deleted, no conflict): its agents' exclusion follows ``profile``'s selector."""
        twin = self.other_way(profile)
        if twin is not None and twin.mode is Mode.DRA and not twin.deleting and self.conflict(twin) is None:
            return twin
        return None

    def static_winners(self) -> dict[str, Profile]:
        """resource name -> the Static profile applied for it (DevicePlugin winners excluded);
        cached until the registry changes."""
        if self._static_winners is None:
            out: dict[str, Profile] = {}
            for resource in {p.resource for p in self._by_name.values()}:
                w = self.winner(resource)
                if w is not None and w.mode is Mode.STATIC:
                    out[resource] = w
            self._static_winners = out
        return self._static_winners
