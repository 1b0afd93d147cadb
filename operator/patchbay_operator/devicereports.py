"""The agents' DeviceReports as the operator keeps them (pure).

Each agent writes one ``DeviceReport`` per profile and node (crds/patchbay.dev_devicereports.yaml):
every device's health, why, since when and which pods hold it; in DRA mode also whether the API
server keeps ResourceSlice device taints and which devices the agent left out of its slices
because it drops them. The operator keeps a small ``Report`` per object and sums them into the
profile's status.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any

import msgspec

MAX_KEPT_DEVICES = 16
"""Unhealthy devices kept per report: the status lists 10 problems in all, and a node with more
sick devices than this gets one problem saying how many more (status/daemonset.py)."""


@dataclass(frozen=True)
class Device:
    id: str
    healthy: bool
    reason: str = ""
    message: str = ""
    since: str = ""
    holders: tuple[str, ...] = ()  # "namespace/pod/container" (not kept from reports: counted)
    #: DRA: left out of the node's ResourceSlices (the taint it needs would be dropped)
    withheld: bool = False


@dataclass(frozen=True)
class AgentError:
    """The node agent cannot serve the profile on the node (`agentError`): why, since when."""

    reason: str
    message: str
    since: str = ""

    @property
    def needs_change(self) -> bool:
        """A refused config does not go away by waiting (the profile must change)."""
        return self.reason == "ConfigInvalid"


@dataclass(frozen=True)
class Counts:
    """A report's device counts, over every device it lists (kept or not)."""

    total: int = 0
    healthy: int = 0
    allocated: int = 0
    withheld: int = 0
    withheld_healthy: int = 0

    def plus(self, healthy: bool, held: bool, withheld: bool) -> Counts:
        return Counts(
            self.total + 1,
            self.healthy + healthy,
            self.allocated + held,
            self.withheld + withheld,
            self.withheld_healthy + (withheld and healthy),
        )

    @classmethod
    def of(cls, devices: Iterable[Device]) -> Counts:
        c = cls()
        for d in devices:
            c = c.plus(d.healthy, bool(d.holders), d.withheld)
        return c


@dataclass(frozen=True)
class Report:
    """One report as the operator keeps it: counts over every device, and the unhealthy devices
    (the ones the status names), at most ``MAX_KEPT_DEVICES`` of them. A report may list 2,048
    devices with long messages (about 1 MiB decoded); kept whole, 5,000 such reports would hold
    gigabytes in the operator, kept like this 80 MiB (docs/benchmarks.md, "Operator memory at the
    report bounds"). ``devices`` are the kept ones; ``counts`` (counted from ``devices`` when not
    given) are every device's."""

    name: str
    profile: str
    node: str
    devices: tuple[Device, ...] = ()
    #: the agent pod that wrote it (the admission policy binds it to the writer's token)
    agent: str = ""
    #: DRA: Kept, Dropped or Unknown; "" when the report does not say (DevicePlugin mode)
    device_taints: str = ""
    error: AgentError | None = None
    counts: Counts | None = None
    #: DRA, shared devices: Kept, Dropped or Unknown (consumable capacity); "" when not said
    consumable_capacity: str = ""
    #: DRA, partitioned devices: Kept, Dropped or Unknown (counters); "" when not said
    partitionable_devices: str = ""
    #: the profile's node group the agent serves the node with; "" for a profile without groups
    #: (or an agent older than node groups)
    node_group: str = ""
    #: the hash of the profile's revision the agent serves; "" from an agent older than revisions
    revision: str = ""
    #: `allocationFailures`: the kubelet's calls the agent answered with an error since
    #: `failures_since` (its start; "" and 0 while none failed), the last one's message
    failures: int = 0
    failures_since: str = ""
    last_failure: str = ""

    @property
    def all(self) -> Counts:
        return self.counts if self.counts is not None else Counts.of(self.devices)

    @property
    def total(self) -> int:
        return self.all.total

    @property
    def healthy(self) -> int:
        return self.all.healthy

    @property
    def unhealthy(self) -> int:
        c = self.all
        return c.total - c.healthy

    @property
    def allocated(self) -> int:
        return self.all.allocated

    @property
    def withheld(self) -> int:
        return self.all.withheld

    @property
    def withheld_healthy(self) -> int:
        return self.all.withheld_healthy

    @property
    def unlisted_unhealthy(self) -> int:
        """Unhealthy devices the operator did not keep (past ``MAX_KEPT_DEVICES``)."""
        return self.unhealthy - sum(not d.healthy for d in self.devices)

    @classmethod
    def from_object(cls, obj: Mapping[str, Any]) -> Report:
        """A report from its decoded object (a watch event's): the same reading as a LIST page's
        (``decode_page``), through the same wire structs."""
        return cls.from_wire(msgspec.convert(obj, WireReport))

    @classmethod
    def from_wire(cls, w: WireReport) -> Report:
        """What the operator keeps of one report as it came off the wire. Every field is read the
        way the old dict reading did (a value of an unexpected type counts as absent), so a
        report the CRD let through is never refused here."""
        devices: list[Device] = []
        total = healthy_n = held_n = withheld_n = withheld_healthy = 0
        # This loop runs for every device of every report (10 million at 5,000 nodes at the
        # bounds): no call per device, whatever it costs in looks.
        for d in w.devices:
            healthy, withheld, pods = d.health == "Healthy", d.withheld is True, d.pods
            # Holders are counted, not kept: the status says how many devices are held, not by whom
            # (kubectl patchbay devices reads them from the report itself).
            total += 1
            healthy_n += healthy
            withheld_n += withheld
            withheld_healthy += withheld and healthy
            if pods:
                held_n += _held(pods) if pods.__class__ is msgspec.Raw else 1
            if healthy or len(devices) >= MAX_KEPT_DEVICES:
                continue
            devices.append(
                Device(
                    id=_text(d.id),
                    healthy=False,
                    reason=_text(d.reason),
                    message=_text(d.message),
                    since=_text(d.since),
                    withheld=withheld,
                )
            )
        error = None
        if isinstance(w.agentError, Mapping):
            error = AgentError(
                _text(w.agentError.get("reason")) or "AgentFailed",
                _text(w.agentError.get("message")),
                _text(w.agentError.get("since")),
            )
        failures = w.allocationFailures if isinstance(w.allocationFailures, Mapping) else {}
        last = failures.get("last")
        return cls(
            name=_text(w.metadata.get("name")),
            profile=_text(w.profile),
            node=_text(w.nodeName),
            devices=tuple(devices),
            counts=Counts(total, healthy_n, held_n, withheld_n, withheld_healthy),
            agent=_text(w.agent),
            device_taints=_text(w.deviceTaints),
            error=error,
            consumable_capacity=_text(w.consumableCapacity),
            partitionable_devices=_text(w.partitionableDevices),
            node_group=_text(w.nodeGroup),
            revision=_text(w.revision),
            failures=int(failures.get("count") or 0),
            failures_since=_text(failures.get("since")),
            last_failure=_text(last.get("message")) if isinstance(last, Mapping) else "",
        )


def _held(pods: msgspec.Raw) -> bool:
    """Whether a device's ``pods`` from a LIST page (its JSON text, ``msgspec.Raw``) names any
    holder: a list with a holder is longer than any empty value's text (``[]``, ``null``,
    ``""``), and a short text is decoded to be sure."""
    return len(pods) > 8 or bool(msgspec.json.decode(pods))


def _text(value: Any) -> str:
    """A string field as the operator keeps it: absent, null or empty -> ""."""
    return str(value) if value else ""


# --- the wire: a LIST page decoded straight into what the operator reads ----------------------
#
# Why not json.loads: a report at the CRD's bounds is 0.73 MB of JSON, 2,048 devices with their
# messages and holders. json.loads builds a dict per device and per holder, and the operator keeps
# counts and at most 16 devices of it; at 5,000 such reports the decode was most of the operator's
# start (docs/benchmarks.md, "The decode of a report at the bounds"). msgspec decodes into these
# structs instead: unknown fields are skipped without building them, and the holders' objects are
# kept as raw bytes (``pods``: only whether a device has any is read). Every leaf is ``Any`` on
# purpose: the reading above stays as lenient as a dict's, and a type the CRD allows never fails a
# whole page.


class WireDevice(msgspec.Struct):
    id: Any = None
    health: Any = None
    reason: Any = None
    message: Any = None
    since: Any = None
    withheld: Any = None
    pods: Any = None


class WireReport(msgspec.Struct):
    metadata: dict[str, Any] = msgspec.field(default_factory=dict)
    profile: Any = None
    nodeName: Any = None  # noqa: N815 (the API's field name)
    devices: list[WireDevice] = msgspec.field(default_factory=list)
    agent: Any = None
    deviceTaints: Any = None  # noqa: N815
    agentError: Any = None  # noqa: N815
    consumableCapacity: Any = None  # noqa: N815
    partitionableDevices: Any = None  # noqa: N815
    nodeGroup: Any = None  # noqa: N815
    revision: Any = None
    allocationFailures: Any = None  # noqa: N815


class _RawDevice(WireDevice):
    """A device as a LIST page carries it: its holders left undecoded."""

    pods: msgspec.Raw = msgspec.field(default_factory=msgspec.Raw)


class _RawReport(WireReport):
    devices: list[_RawDevice] = msgspec.field(default_factory=list)  # type: ignore[assignment]


class _ListMeta(msgspec.Struct):
    resourceVersion: Any = None  # noqa: N815
    continue_: Any = msgspec.field(default=None, name="continue")


class _ReportList(msgspec.Struct):
    metadata: _ListMeta = msgspec.field(default_factory=_ListMeta)
    items: list[_RawReport] = msgspec.field(default_factory=list)


class _Event(msgspec.Struct):
    type: Any = None
    object: msgspec.Raw = msgspec.field(default_factory=msgspec.Raw)


class _ReportEvent(msgspec.Struct):
    """A WATCH line read in one pass, its object as a report (no default: a line without one is
    read the general way, which refuses it)."""

    object: _RawReport
    type: Any = None


_PAGE = msgspec.json.Decoder(_ReportList)
_EVENT = msgspec.json.Decoder(_Event)
_REPORT_EVENT = msgspec.json.Decoder(_ReportEvent)
_REPORT = msgspec.json.Decoder(_RawReport)
_WATCHED = ("ADDED", "MODIFIED", "DELETED")  # the types whose object is a report


def decode_page(raw: bytes) -> tuple[list[Report], str, str]:
    """One DeviceReport LIST page's body -> its reports as kept, its resourceVersion and its
    continue token (``kube.Kube.list_pages``'s ``decode``). A body that is not a list of objects
    raises ``ValueError``, as ``json.loads`` would."""
    try:
        page = _PAGE.decode(raw)
    except (msgspec.DecodeError, msgspec.ValidationError) as e:
        raise ValueError(f"a DeviceReport LIST page that cannot be read: {e}") from e
    meta = page.metadata
    return [Report.from_wire(item) for item in page.items], _text(meta.resourceVersion), _text(meta.continue_)


def decode_event(line: bytes) -> tuple[str, str, Any]:
    """One line of a DeviceReport WATCH -> its type, its object's resourceVersion, and for ADDED,
    MODIFIED and DELETED the report as kept (like ``decode_page``'s); for any other type (BOOKMARK,
    ERROR's Status) the object as a dict. A line that cannot be read raises ``ValueError``.

    A report's event is read in one pass, its object straight into the structs; until 2026-12-02
    the line was read first with its object kept as raw bytes, then that object again (a second
    scan of up to 0.73 MB). Any other event, or an object no report's shape fits, is read the
    general way below: the event first, then its object by its type."""
    try:
        one = _REPORT_EVENT.decode(line)
    except msgspec.ValidationError:
        pass  # not a report's shape (a Status, a bookmark's odd object, a broken report): below
    except msgspec.DecodeError as e:
        raise ValueError(f"a DeviceReport WATCH event that cannot be read: {e}") from e
    else:
        if (kind := _text(one.type)) in _WATCHED:
            return kind, _text(one.object.metadata.get("resourceVersion")), Report.from_wire(one.object)
    try:
        event = _EVENT.decode(line)
        kind = _text(event.type)
        if kind in _WATCHED:
            report = _REPORT.decode(event.object)
            return kind, _text(report.metadata.get("resourceVersion")), Report.from_wire(report)
        obj = msgspec.json.decode(event.object) if event.object else {}
    except (msgspec.DecodeError, msgspec.ValidationError) as e:
        raise ValueError(f"a DeviceReport WATCH event that cannot be read: {e}") from e
    if not isinstance(obj, dict):
        obj = {}
    meta = obj.get("metadata")
    return kind, _text(meta.get("resourceVersion")) if isinstance(meta, dict) else "", obj
