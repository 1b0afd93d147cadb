"""Static mode: what each node should advertise, and the one JSON patch that gets it there (pure).

The operator keeps a ``NodeState`` per node in its own memory (never kopf's:
docs/facts.md#kopf-on-nodes says why) holding only what this module needs: labels,
extended-resource values in capacity and allocatable, and the ownership annotations. ``plan``
compares that state with the winning Static profiles and returns the JSON-patch operations for
``nodes/<name>/status``: capacity, allocatable and the ownership annotation change together, in
ONE request, with no read-modify-write.

Ownership: a node annotation ``static.patchbay.dev/<slot>`` whose value names the resource and the
profile. It is written in the same patch as the value, so after a restart the operator still
knows which resources it set, and it never removes a resource that lacks it.
"""

from __future__ import annotations

import hashlib
import json
import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from patchbay_api.quantity import QuantityError, quantity_value
from patchbay_operator.constants import OWNER_ANNOTATION_PREFIX, Reason
from patchbay_operator.inventorylabels import NodeLabels
from patchbay_operator.profiles import Profile

JsonPatch = list[dict[str, Any]]

_INT = re.compile(r"^[0-9]+$")


def escape_pointer(token: str) -> str:
    """RFC 6901: ``~`` -> ``~0`` and ``/`` -> ``~1`` (``example.com/dongle`` -> ``example.com~1dongle``)."""
    return token.replace("~", "~0").replace("/", "~1")


def owner_annotation_key(resource: str) -> str:
    """The annotation slot for ``resource``: readable when it fits, else a stable hash.

    ``/`` becomes ``_``; that is injective because a DNS domain never contains ``_``. Annotation
    names are at most 63 characters, resource names can be much longer.
    """
    name = resource.replace("/", "_")
    if len(name) > 63:
        digest = hashlib.sha256(resource.encode()).hexdigest()[:16]
        name = f"{name[:46].rstrip('-_.')}-{digest}"
    return OWNER_ANNOTATION_PREFIX + name


def owner_annotation_value(resource: str, profile: str) -> str:
    return json.dumps({"resource": resource, "profile": profile}, separators=(",", ":"), sort_keys=True)


@dataclass(frozen=True)
class Owner:
    """What an ownership annotation says: the resource and the profile that set it."""

    resource: str
    profile: str
    key: str


def parse_owner(key: str, value: str) -> Owner | None:
    """None for annotations under our prefix that are not ours to trust (malformed)."""
    try:
        data = json.loads(value)
    except ValueError:
        return None
    if not isinstance(data, dict):
        return None
    resource, profile = data.get("resource"), data.get("profile")
    if not isinstance(resource, str) or not isinstance(profile, str):
        return None
    return Owner(resource, profile, key)


def quantity_to_int(value: str | None) -> int:
    """A node's extended-resource quantity as the count the scheduler uses (0 when absent).

    Any Kubernetes quantity is understood (``4``, ``2k``, ``1Ki``, ``1Ti``, ``2P``, ``1e3``,
    ``1000m``), through the API package's parser (the API server's grammar). Extended resources are integers
    (docs/facts.md#extended-resources); a fraction, which only a hand-made patch can put on a
    node, is rounded UP, as ``Quantity.Value()`` does where the scheduler counts. A value that is
    not a quantity at all raises ValueError (the API server never stores one).
    """
    if value is None:
        return 0
    try:
        return quantity_value(value)
    except QuantityError as e:
        raise ValueError(f"{value!r} is not a Kubernetes quantity ({e})") from None


@dataclass
class NodeState:
    """The slice of a Node the operator remembers (memory stays small at thousands of nodes)."""

    name: str
    resource_version: str = ""
    labels: dict[str, str] = field(default_factory=dict)
    capacity: dict[str, str] = field(default_factory=dict)  # extended resources only
    allocatable: dict[str, str] = field(default_factory=dict)
    owners: dict[str, Owner] = field(default_factory=dict)  # resource -> ownership record
    has_annotations: bool = True
    has_capacity: bool = True
    has_allocatable: bool = True
    #: its inventory labels and which of them the operator's inventory-label manager owns
    inventory: NodeLabels = field(default_factory=NodeLabels)

    @classmethod
    def from_node(cls, node: Mapping[str, Any]) -> NodeState:
        meta = node.get("metadata") or {}
        status = node.get("status") or {}
        annotations = meta.get("annotations")
        capacity = status.get("capacity")
        allocatable = status.get("allocatable")
        owners: dict[str, Owner] = {}
        for k, v in (annotations or {}).items():
            if k.startswith(OWNER_ANNOTATION_PREFIX):
                owner = parse_owner(k, str(v))
                if owner is not None and owner_annotation_key(owner.resource) == k:
                    owners[owner.resource] = owner
        return cls(
            name=str(meta.get("name")),
            resource_version=str(meta.get("resourceVersion") or ""),
            labels={str(k): str(v) for k, v in (meta.get("labels") or {}).items()},
            capacity={str(k): str(v) for k, v in (capacity or {}).items() if "/" in k},
            allocatable={str(k): str(v) for k, v in (allocatable or {}).items() if "/" in k},
            owners=owners,
            has_annotations=annotations is not None,
            has_capacity=capacity is not None,
            has_allocatable=allocatable is not None,
            inventory=NodeLabels.from_node(node),
        )


def newer(candidate: str, current: str) -> bool:
    """Whether resourceVersion ``candidate`` is not older than ``current``.

    resourceVersions are opaque by contract; etcd makes them integers, and comparing them keeps a
    late watch event from undoing the fresher state a PATCH response already gave us. When either
    is not an integer, trust the candidate.
    """
    if candidate.isdigit() and current.isdigit():
        return int(candidate) >= int(current)
    return True


@dataclass(frozen=True)
class Desired:
    """What a Static profile wants on one node: a count, nothing (not selected), or an error."""

    value: int | None
    problem: str | None = None  # a message when the node's capacity label is unusable


def desired(profile: Profile, node: NodeState) -> Desired:
    if not profile.selector.matches(node.labels):
        return Desired(None)
    if profile.capacity_label and profile.capacity_label in node.labels:
        raw = node.labels[profile.capacity_label]
        if not _INT.match(raw):
            return Desired(
                None,
                f"label {profile.capacity_label}={raw!r} is not a non-negative integer",
            )
        return Desired(int(raw))
    return Desired(profile.static_capacity)


def _set_ops(node: NodeState, resource: str, value: int, profile: str, maps: dict[str, bool]) -> JsonPatch:
    """Ops that set ``resource`` to ``value`` with its ownership record.

    ``maps`` says which parent maps exist; a missing one is created by the first op that needs
    it (and marked present, so a second resource in the same patch does not replace it).
    """
    r = escape_pointer(resource)
    key = owner_annotation_key(resource)
    owner_value = owner_annotation_value(resource, profile)
    ops: JsonPatch = []
    if maps["annotations"]:
        ops.append(
            {"op": "add", "path": f"/metadata/annotations/{escape_pointer(key)}", "value": owner_value}
        )
    else:
        ops.append({"op": "add", "path": "/metadata/annotations", "value": {key: owner_value}})
        maps["annotations"] = True
    for section in ("capacity", "allocatable"):
        if maps[section]:
            ops.append({"op": "add", "path": f"/status/{section}/{r}", "value": str(value)})
        else:
            ops.append({"op": "add", "path": f"/status/{section}", "value": {resource: str(value)}})
            maps[section] = True
    return ops


def _remove_ops(node: NodeState, owner: Owner) -> JsonPatch:
    """Remove the resource and its ownership record; only paths that exist (a JSON patch
    ``remove`` of a missing path fails the whole patch)."""
    r = escape_pointer(owner.resource)
    ops: JsonPatch = []
    if owner.resource in node.capacity:
        ops.append({"op": "remove", "path": f"/status/capacity/{r}"})
    if owner.resource in node.allocatable:
        ops.append({"op": "remove", "path": f"/status/allocatable/{r}"})
    ops.append({"op": "remove", "path": f"/metadata/annotations/{escape_pointer(owner.key)}"})
    return ops


def plan(node: NodeState, winners: Mapping[str, Profile]) -> JsonPatch:
    """The JSON patch that brings ``node`` to what the winning Static profiles want ([] if none).

    - selected and valid count: set capacity, allocatable and the ownership record together;
      a resource already on the node WITHOUT our record is left alone (someone else set it);
    - a resource we own that no Static winner wants here any more (node unselected, profile
      deleting or gone, mode changed, label invalid): remove it;
    - a resource we own for another profile that is now the winner's: taken over in place.

    A resource the cache says is free is taken only if the node is still the version the cache
    holds: the patch starts with a JSON-patch ``test`` of ``metadata.resourceVersion``. Without
    it, a cache a watch event behind (another writer set the resource a moment ago) would make the
    ``add`` overwrite that writer's value and record it as ours. A stale cache makes the server
    refuse the whole patch; the worker reads the node again and plans anew (nodes.py).
    """
    ops: JsonPatch = []
    takes_free = False
    maps = {
        "annotations": node.has_annotations,
        "capacity": node.has_capacity,
        "allocatable": node.has_allocatable,
    }
    for resource, profile in winners.items():
        want = desired(profile, node)
        owner = node.owners.get(resource)
        if want.value is None:
            continue  # removal, if we own it, is handled below
        if owner is None and (resource in node.capacity or resource in node.allocatable):
            continue  # not ours: never touch it
        if (
            owner is not None
            and owner.profile == profile.name
            and node.capacity.get(resource) == str(want.value)
            and node.allocatable.get(resource) == str(want.value)
        ):
            continue
        takes_free = takes_free or owner is None
        ops.extend(_set_ops(node, resource, want.value, profile.name, maps))
    for resource, owner in node.owners.items():
        wanted_by = winners.get(resource)
        if wanted_by is not None and desired(wanted_by, node).value is not None:
            continue
        ops.extend(_remove_ops(node, owner))
    if takes_free and node.resource_version:
        ops.insert(0, {"op": "test", "path": "/metadata/resourceVersion", "value": node.resource_version})
    return ops


@dataclass(frozen=True)
class NodeReport:
    """How one selected node looks for a Static profile, for status (see status/static.py)."""

    name: str
    desired: int | None
    capacity: int
    allocatable: int
    ready: bool
    problem: tuple[Reason, str] | None


def report(profile: Profile, node: NodeState, failure: str | None = None) -> NodeReport | None:
    """None when the node is not selected; otherwise whether it advertises what it should."""
    want = desired(profile, node)
    if want.value is None and want.problem is None:
        return None
    r = profile.resource
    cap, alloc = node.capacity.get(r), node.allocatable.get(r)
    owner = node.owners.get(r)
    problem: tuple[Reason, str] | None = None
    if want.problem is not None:
        problem = (Reason.INVALID_CAPACITY_LABEL, want.problem)
    elif owner is None and (cap is not None or alloc is not None):
        problem = (Reason.OWNED_BY_OTHER, f"{r} is already set on the node by something else; left alone")
    elif failure is not None:
        problem = (Reason.PATCH_FAILED, failure)
    elif cap is None or alloc is None:
        problem = (Reason.NOT_ADVERTISED, f"{r} not advertised yet")
    elif cap != str(want.value) or alloc != str(want.value):
        problem = (Reason.VALUE_MISMATCH, f"capacity {cap}, allocatable {alloc}, want {want.value}")
    ready = problem is None and owner is not None and owner.profile == profile.name
    if problem is None and not ready:
        problem = (Reason.NOT_ADVERTISED, f"{r} not yet recorded as set by this profile")
    return NodeReport(
        name=node.name,
        desired=want.value,
        capacity=quantity_to_int(cap),
        allocatable=quantity_to_int(alloc),
        ready=ready,
        problem=problem,
    )


def shows(profile: Profile, node: NodeState) -> bool:
    """Whether ``node``'s status shows what ``profile`` (one revision of it) wants there: the count
    in capacity AND allocatable, recorded as this profile's; or, on a node it does not select,
    nothing of its resource recorded as this profile's (a staged rollout's gate, Static mode)."""
    want = desired(profile, node)
    r = profile.resource
    owner = node.owners.get(r)
    if want.problem is not None:
        return False
    if want.value is None:
        return owner is None or owner.profile != profile.name
    return (
        owner is not None
        and owner.profile == profile.name
        and node.capacity.get(r) == str(want.value)
        and node.allocatable.get(r) == str(want.value)
    )
