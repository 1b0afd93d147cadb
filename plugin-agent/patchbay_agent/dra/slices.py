"""DRA mode's ResourceSlices: this node's devices as resource.k8s.io/v1 objects. Pure: no I/O.

What the scheduler allocates from is the devices a driver publishes in ResourceSlices; a claim's
allocation names a device by (driver, pool, device name). So the names here are the contract
between the slices (`dra/slicepublisher.py`) and NodePrepareResources (`dra/preparer.py`): both derive
them from the same physical IDs with `device_name`.

The shape follows the API server's validation of resource.k8s.io/v1 (docs/dra.md#slice-rules):

* one pool per node, named after the node (pool names are DNS subdomains, like node names), in
  one or more slices named `<node>-<driver>[-<chunk>]`, owned by the Node (collected with it);
* at most 128 devices per slice, but only 64 when any device of the slice has a taint, so a pool
  with a tainted device is cut into 64-device chunks; `pool.resourceSliceCount` says how many;
* a device name is a DNS label (at most 63, lowercase); attributes are `<domain>/<C identifier
  of at most 32>` with exactly one of string/int/bool/version, strings at most 64 characters;
* an unhealthy device carries one taint whose key names the kind of fault
  (`patchbay.dev/vanished=Vanished`, `patchbay.dev/probe-failed=ProbeFailed`: `fault_taint_key`)
  with the profile's effect (`health.taintEffect`): NoSchedule (the default: new claims avoid it,
  claims that have it keep it), NoExecute (pods using it are evicted) or None (informational);
  healthy again, the taint goes.

An API server whose DRADeviceTaints gate is off (before 1.36) drops device taints on write,
silently (docs/facts.md#dra-dropped-fields). Whether this one keeps them is read back, never
guessed from its version: `taint_probe_document` is a slice with one tainted device to create
with `dryRun=All` (nothing is stored), `taints_kept` reads the answer, and `lost_taints` checks
what a real write stored. Where taints are dropped, `published` leaves every device that would
carry one out of the slice, so an unhealthy device is never allocatable there either.

A shared device (`plugin.sharing.replicas` > 1) allows multiple allocations and has a
consumable capacity `patchbay.dev/shares` of that many whole shares (KEP-5075, beta and on from
1.36): each claim takes one unless it asks for more. An API server whose DRAConsumableCapacity gate
is off drops both fields, silently, which would make the device exclusive without a word; the
same dry-run probe carries them and `sharing_kept` reads whether they were kept (the publisher
then publishes the devices unshared and says so).

A partitioned device (`plugin.partitions`, KEP-4815, beta and on from 1.36) is published as a
counter set named after the device with one counter per slot (`s0`, `s1`... each 1), in slices of
their own (a slice has `sharedCounters` or `devices`, never both; at most 8 sets per slice), and
one device per size and place, `<device>-s<first>-<last>`, that consumes its slots' counters: the
scheduler picks a shape and never over-commits the device. An API server whose
DRAPartitionableDevices gate is off drops both fields; the same dry-run probe carries a device
that consumes counters and `partitions_kept` reads whether it was kept (the publisher then
publishes the devices whole).

`pool.generation` is not part of what `slice_documents` compares: the publisher sets it when the
content changed.
"""

from __future__ import annotations

import hashlib
import re
from collections.abc import Callable, Collection, Mapping, Sequence
from dataclasses import dataclass, field, replace
from typing import Any, Protocol

from patchbay_agent.config import Partitions
from patchbay_agent.core.inventory import Snapshot
from patchbay_agent.kubeobjects import owner_reference  # the Node owns slices as it owns reports

RESOURCE_GROUP = "resource.k8s.io"
RESOURCE_VERSION = "v1"
SLICE_KIND = "ResourceSlice"
SLICE_PLURAL = "resourceslices"
CLAIM_PLURAL = "resourceclaims"

#: Devices per slice (ResourceSliceMaxDevices), and when any device of it has a taint
#: (ResourceSliceMaxDevicesWithAdvancedFeatures): docs/dra.md#slice-rules.
MAX_DEVICES_PER_SLICE = 128
MAX_TAINTED_DEVICES_PER_SLICE = 64
MAX_NAME_LENGTH = 253
MAX_DEVICE_NAME_LENGTH = 63
MAX_ATTRIBUTE_VALUE_LENGTH = 64
MAX_LABEL_VALUE_LENGTH = 63
#: The attribute domain of what discovery knows, and the standard NUMA attribute.
ATTRIBUTE_DOMAIN = "patchbay.dev"
NUMA_ATTRIBUTE = "resource.kubernetes.io/numaNode"
#: Discovery's attributes that have a standard name the scheduler and other drivers match on
#: (k8s.io/dynamic-resource-allocation deviceattribute, docs/dra.md#resourceslices): published
#: under it, besides `patchbay.dev/<attribute>`, when the value has the standard's form.
STANDARD_ATTRIBUTES = {
    "pciAddress": (
        "resource.kubernetes.io/pciBusID",
        re.compile(r"[0-9a-f]{4}:[0-9a-f]{2}:[0-9a-f]{2}\.[0-7]"),
    ),
    "pcieRoot": ("resource.kubernetes.io/pcieRoot", re.compile(r"pci[0-9a-f]{4}:[0-9a-f]{2}")),
}
TAINT_KEY = "patchbay.dev/unhealthy"
#: The consumable capacity of a shared device (`plugin.sharing.replicas` > 1, KEP-5075): a claim
#: takes one share unless its request asks for more (`capacity.requests`), never more than all.
SHARES_CAPACITY = "patchbay.dev/shares"
#: The attributes of a partition (`plugin.partitions`): its size and first slot (ints), the
#: device it is cut from (its slice name) and the number of slots of that device.
SLOTS_ATTRIBUTE = f"{ATTRIBUTE_DOMAIN}/slots"
FIRST_SLOT_ATTRIBUTE = f"{ATTRIBUTE_DOMAIN}/firstSlot"
PARENT_ATTRIBUTE = f"{ATTRIBUTE_DOMAIN}/parent"
OF_SLOTS_ATTRIBUTE = f"{ATTRIBUTE_DOMAIN}/ofSlots"
#: Counter sets per slice (ResourceSliceMaxCounterSets): docs/dra.md#slice-rules.
MAX_COUNTER_SETS_PER_SLICE = 8
#: A device a running pod still holds through the DEVICE PLUGIN of the same resource (a node being
#: migrated to DRA): DRA must not hand it out a second time (docs/dra.md#migration).
PLUGIN_HELD_TAINT_KEY = "patchbay.dev/held-by-device-plugin"
TAINT_EFFECT = "NoSchedule"
_HASH_LENGTH = 8

_DNS_LABEL = re.compile(r"[a-z0-9]([-a-z0-9]*[a-z0-9])?")
_DNS_SUBDOMAIN = re.compile(r"[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*")
_C_IDENTIFIER = re.compile(r"[A-Za-z_][A-Za-z0-9_]{0,31}")
_NOT_LABEL = re.compile(r"[^a-z0-9-]")
_NOT_LABEL_VALUE = re.compile(r"[^A-Za-z0-9_.-]")


class SliceClient(Protocol):
    """What publishing needs of the API (synchronous; `kubeclient.KubeClient` in the agent)."""

    def apply_slice(self, doc: Mapping[str, Any]) -> Mapping[str, Any]:
        """Create or update one ResourceSlice; the slice as stored; raise on failure."""

    def dry_run_slice(self, doc: Mapping[str, Any]) -> Mapping[str, Any]:
        """Create one ResourceSlice with `dryRun=All`; the slice as it would be stored; raise on
        failure."""

    def slice_names(self, driver: str, node_name: str) -> list[str]:
        """Names of the driver's slices on the node; raise on failure."""

    def delete_slice(self, name: str) -> None:
        """Delete one ResourceSlice (gone already is fine); raise on failure."""

    def node_uid(self, node_name: str) -> str:
        """The Node's UID; raise when it cannot be found."""


def _digest(text: str) -> str:
    return hashlib.sha256(text.encode()).hexdigest()[:_HASH_LENGTH]


def is_dns_subdomain(name: str) -> bool:
    return len(name) <= MAX_NAME_LENGTH and _DNS_SUBDOMAIN.fullmatch(name) is not None


def device_name(physical_id: str) -> str:
    """The ResourceSlice device name of a physical device ID: a DNS label.

    Lowercased, characters outside `[a-z0-9-]` as `-`. When that changed anything (`ttyUSB0`,
    `0000:3b:00.0`) or is too long, a hash of the ID is appended, so two IDs that clean up alike
    (`ttyUSB0` and `ttyusb0`) still get different names; an ID that is a label already stays as it is.
    """
    cleaned = _NOT_LABEL.sub("-", physical_id.lower())
    if cleaned == physical_id and _DNS_LABEL.fullmatch(cleaned) and len(cleaned) <= MAX_DEVICE_NAME_LENGTH:
        return cleaned
    base = cleaned[: MAX_DEVICE_NAME_LENGTH - _HASH_LENGTH - 1].strip("-") or "device"
    return f"{base}-{_digest(physical_id)}"


#: A shortened slice name starts with at least this many characters of `<node>-<driver>`: the
#: chart's slice admission policy checks them (CEL has no hash; charts/patchbay/templates/agents.yaml).
CHECKED_PREFIX = 230


def slice_base_name(node_name: str, driver: str) -> str:
    """`<node>-<driver>`, or, when that is not a valid name with room for a chunk suffix, a
    trimmed form plus a hash of both (unique per node and driver) that keeps the first
    CHECKED_PREFIX characters (a node name is a DNS subdomain, so nothing in them changes)."""
    name = f"{node_name}-{driver}"
    # Room for "-<chunk>" (up to 4 characters): chunk names must be valid too.
    limit = MAX_NAME_LENGTH - 5
    if len(name) <= limit and is_dns_subdomain(name):
        return name
    cleaned = re.sub(r"[^a-z0-9.-]", "-", name.lower())
    cleaned = re.sub(r"\.(?=[.-])|-(?=\.)", "", cleaned)
    head = cleaned[: limit - _HASH_LENGTH - 1].strip(".-") or "slice"
    return f"{head}-{_digest(node_name + chr(0) + driver)}"


def slice_name(base: str, chunk: int, chunks: int) -> str:
    """The name of chunk `chunk` of `chunks`: the base alone for a single slice, else `<base>-<n>`."""
    return base if chunks == 1 else f"{base}-{chunk}"


def label_value(text: str) -> str:
    """`text` as a valid label value (a taint's value): allowed characters, at most 63, starting
    and ending with a letter or digit; empty when nothing is left."""
    cleaned = _NOT_LABEL_VALUE.sub("-", text)[:MAX_LABEL_VALUE_LENGTH]
    return cleaned.strip("-_.")


def _string_attribute(value: str) -> dict[str, str]:
    return {"string": value[:MAX_ATTRIBUTE_VALUE_LENGTH]}


@dataclass(frozen=True)
class Place:
    """Where a partition lies on its device: `size` slots from slot `first`, of `slots`."""

    size: int
    first: int
    slots: int
    #: the counter set it consumes from: the device's own, named like the device
    counter_set: str

    @property
    def last(self) -> int:
        return self.first + self.size - 1

    @property
    def counters(self) -> list[str]:
        """The names of the slot counters it consumes."""
        return [slot_counter(n) for n in range(self.first, self.first + self.size)]


def slot_counter(n: int) -> str:
    """The counter of slot `n` in a device's counter set (a DNS label)."""
    return f"s{n}"


def partition_device_name(device: str, size: int, first: int) -> str:
    """`<device>-s<first>-<last>` for a partition of the device whose slice name is `device`: a
    DNS label of at most 63; the device's name is cut, with a hash of it, where the whole would be
    longer (device names are unique, so their hashes tell cut ones apart)."""
    suffix = f"-s{first}-{first + size - 1}"
    if len(device) + len(suffix) > MAX_DEVICE_NAME_LENGTH:
        keep = MAX_DEVICE_NAME_LENGTH - len(suffix) - _HASH_LENGTH - 1
        device = f"{device[:keep].strip('-') or 'device'}-{_digest(device)}"
    return device + suffix


@dataclass(frozen=True)
class SliceDevice:
    """One device as the slice shows it."""

    name: str
    physical_id: str
    attributes: Mapping[str, Mapping[str, Any]]
    #: why the device is unhealthy (the taint's value); None when it is healthy
    unhealthy: str | None = None
    #: a pod holds it through the device plugin of the same resource
    plugin_held: bool = False
    #: capacity name -> integer amount (a GPU's memory in bytes)
    capacity: Mapping[str, int] = field(default_factory=dict)
    #: the effect of the unhealthy taint (the profile's `health.taintEffect`)
    effect: str = TAINT_EFFECT
    #: how many claims may hold the device at once (`plugin.sharing.replicas`); above 1 the
    #: device allows multiple allocations and has that many `patchbay.dev/shares` to consume
    shares: int = 1
    #: a partition: where it lies on its device (the physical device is `physical_id`); None:
    #: the whole device, consuming no counters
    place: Place | None = None

    @property
    def tainted(self) -> bool:
        """Whether the device carries a taint that keeps claims off it: where the API server
        drops taints such a device is left out of the slice. An informational taint (effect
        None) keeps nobody off, so its device stays published either way."""
        return (self.unhealthy is not None and self.effect != "None") or self.plugin_held

    def document(self) -> dict[str, Any]:
        doc: dict[str, Any] = {
            "name": self.name,
            "attributes": {k: dict(v) for k, v in sorted(self.attributes.items())},
        }
        capacity: dict[str, Any] = {
            f"{ATTRIBUTE_DOMAIN}/{k}": {"value": str(v)} for k, v in sorted(self.capacity.items())
        }
        if self.shares > 1:
            doc["allowMultipleAllocations"] = True
            capacity[SHARES_CAPACITY] = shares_capacity(self.shares)
        if capacity:
            doc["capacity"] = capacity
        if self.place is not None:
            doc["consumesCounters"] = [
                {
                    "counterSet": self.place.counter_set,
                    "counters": {name: {"value": "1"} for name in self.place.counters},
                }
            ]
        taints = []
        if self.unhealthy is not None:
            taints.append(
                {"key": fault_taint_key(self.unhealthy), "value": self.unhealthy, "effect": self.effect}
            )
        if self.plugin_held:
            taints.append({"key": PLUGIN_HELD_TAINT_KEY, "value": "in-use", "effect": TAINT_EFFECT})
        if taints:
            doc["taints"] = taints
        return doc


def shares_capacity(shares: int) -> dict[str, Any]:
    """The `patchbay.dev/shares` capacity of a device `shares` claims may hold at once: whole
    shares, one by default, from 1 to all of them."""
    return {
        "value": str(shares),
        "requestPolicy": {"default": "1", "validRange": {"min": "1", "max": str(shares), "step": "1"}},
    }


def partitioned(devices: Sequence[SliceDevice], partitions: Partitions) -> list[SliceDevice]:
    """Every device cut into its partitions (one per size and place, `Partitions.places`), in the
    devices' order. A partition has its device's attributes and health, the partition's own
    (`patchbay.dev/slots`, `firstSlot`, `ofSlots`, `parent`) and the share of each capacity its
    slots make (rounded down)."""
    out = []
    for d in devices:
        for size, first in partitions.places():
            attributes = {
                **d.attributes,
                SLOTS_ATTRIBUTE: {"int": size},
                FIRST_SLOT_ATTRIBUTE: {"int": first},
                OF_SLOTS_ATTRIBUTE: {"int": partitions.slots},
                PARENT_ATTRIBUTE: _string_attribute(d.name),
            }
            out.append(
                replace(
                    d,
                    name=partition_device_name(d.name, size, first),
                    attributes=attributes,
                    capacity={k: v * size // partitions.slots for k, v in d.capacity.items()},
                    shares=1,
                    place=Place(size, first, partitions.slots, d.name),
                )
            )
    return out


@dataclass(frozen=True)
class PoolDevices:
    """A snapshot's devices as this node's pool names them: every whole device, then, with
    partitions, each partition of it; the physical device each name stands for, and where each
    partition lies. A claim may name either kind (one allocated while the API server dropped the
    counters names the whole device): prepare and the report's holders read both from here."""

    version: int
    #: whole devices in the snapshot's order, then their partitions
    devices: tuple[SliceDevice, ...]
    #: slice device name -> physical ID
    physical: Mapping[str, str]
    #: partition device name -> where it lies
    places: Mapping[str, Place]

    @classmethod
    def of(cls, snap: Snapshot, partitions: Partitions | None = None) -> PoolDevices:
        devices = slice_devices(snap)
        if partitions is not None:
            devices += partitioned(devices, partitions)
        return cls(
            snap.version,
            tuple(devices),
            {d.name: d.physical_id for d in devices},
            {d.name: d.place for d in devices if d.place is not None},
        )


def pool_devices(partitions: Partitions | None) -> Callable[[Snapshot], PoolDevices]:
    """`PoolDevices.of(snap, partitions)`, computed once per snapshot (by its version: one
    inventory's), however many claims or containers ask."""
    last: PoolDevices | None = None

    def get(snap: Snapshot) -> PoolDevices:
        nonlocal last
        if last is None or last.version != snap.version:
            last = PoolDevices.of(snap, partitions)
        return last

    return get


def counter_sets(devices: Sequence[SliceDevice]) -> list[dict[str, Any]]:
    """The counter sets the partitions among `devices` consume from: one per device, named like
    it, with one counter of 1 per slot."""
    sets: dict[str, int] = {}
    for d in devices:
        if d.place is not None:
            sets[d.place.counter_set] = d.place.slots
    return [
        {"name": name, "counters": {slot_counter(n): {"value": "1"} for n in range(slots)}}
        for name, slots in sets.items()
    ]


def fault_taint_key(reason: str) -> str:
    """One taint key per kind of fault: `patchbay.dev/<reason in kebab case>`
    (`patchbay.dev/vanished`, `patchbay.dev/probe-failed`), so a toleration or a DeviceTaintRule
    can name the faults it accepts; `patchbay.dev/unhealthy` for a reason that is no name."""
    kebab = re.sub(r"(?<=[a-z0-9])(?=[A-Z])", "-", reason).lower()
    kebab = re.sub(r"[^a-z0-9-]+", "-", kebab).strip("-")[:63].strip("-")
    return f"{ATTRIBUTE_DOMAIN}/{kebab}" if kebab else TAINT_KEY


def slice_devices(
    snap: Snapshot, plugin_held: Collection[str] = (), effect: str = TAINT_EFFECT, shares: int = 1
) -> list[SliceDevice]:
    """Every physical device of the snapshot, in the snapshot's order, with its attributes and,
    when it is unhealthy (as the snapshot says: what the device plugin would tell the kubelet),
    its reason; `plugin_held`: physical IDs that running pods hold through the device plugin of
    the same resource (tainted so that DRA does not hand them out again); `shares`: how many
    claims may hold each device at once."""
    healthy = snap.healthy_physical
    out = []
    for pid, dev in snap.physical.items():
        attributes: dict[str, dict[str, Any]] = {f"{ATTRIBUTE_DOMAIN}/id": _string_attribute(pid)}
        if dev.dev_paths:
            attributes[f"{ATTRIBUTE_DOMAIN}/path"] = _string_attribute(dev.dev_paths[0])
        for key, value in dev.attributes:
            if _C_IDENTIFIER.fullmatch(key) and key not in ("id", "path"):
                attributes[f"{ATTRIBUTE_DOMAIN}/{key}"] = _string_attribute(value)
            standard = STANDARD_ATTRIBUTES.get(key)
            if standard is not None and standard[1].fullmatch(value):
                attributes[standard[0]] = _string_attribute(value)
        if dev.numa_nodes:
            attributes[NUMA_ATTRIBUTE] = {"int": dev.numa_nodes[0]}
        reason: str | None = None
        if pid not in healthy:
            st = snap.status_of(pid)
            reason = label_value(st.reason if st is not None and st.reason else "") or "Unhealthy"
        capacity = {k: v for k, v in dev.capacity if _C_IDENTIFIER.fullmatch(k) and v >= 0}
        out.append(
            SliceDevice(
                device_name(pid), pid, attributes, reason, pid in plugin_held, capacity, effect, shares
            )
        )
    return out


def slice_documents(
    driver: str,
    node_name: str,
    devices: Sequence[SliceDevice],
    *,
    generation: int = 0,
    node_uid: str | None = None,
) -> list[dict[str, Any]]:
    """The pool's slices, whole objects for server-side apply (see the module doc): the counter
    sets of partitioned devices first, in slices of their own, then the devices. A pool with no
    device is one slice with no device: it says "this node has none", which differs from "no
    driver here" for the scheduler."""
    advanced = any(d.tainted or d.place is not None for d in devices)
    per_slice = MAX_TAINTED_DEVICES_PER_SLICE if advanced else MAX_DEVICES_PER_SLICE
    sets = counter_sets(devices)
    contents: list[tuple[str, list[dict[str, Any]]]] = [
        ("sharedCounters", sets[i : i + MAX_COUNTER_SETS_PER_SLICE])
        for i in range(0, len(sets), MAX_COUNTER_SETS_PER_SLICE)
    ]
    contents += [
        ("devices", [d.document() for d in devices[i : i + per_slice]])
        for i in range(0, len(devices), per_slice)
    ] or [("devices", [])]
    base = slice_base_name(node_name, driver)
    out = []
    for n, (key, items) in enumerate(contents):
        metadata: dict[str, Any] = {"name": slice_name(base, n, len(contents))}
        if node_uid:
            metadata["ownerReferences"] = [owner_reference(node_name, node_uid)]
        out.append(
            {
                "apiVersion": f"{RESOURCE_GROUP}/{RESOURCE_VERSION}",
                "kind": SLICE_KIND,
                "metadata": metadata,
                "spec": {
                    "driver": driver,
                    "nodeName": node_name,
                    "pool": {
                        "name": node_name,
                        "generation": generation,
                        "resourceSliceCount": len(contents),
                    },
                    key: items,
                },
            }
        )
    return out


#: The dry-run probe slice's name is `<node>-<driver>` plus this suffix: the node's own slice
#: prefix, which the chart's admission policy requires of every slice an agent writes (a generated
#: name would not do: the server cuts a generateName prefix to 58 characters), never a chunk's name
#: (those end in a number) and short enough to fit (`slice_base_name` leaves 5 characters).
TAINT_PROBE_NAME_SUFFIX = "-dry"
TAINT_PROBE_DEVICE = "probe"
TAINT_PROBE_KEY = "patchbay.dev/probe"


def taint_probe_document(driver: str, node_name: str) -> dict[str, Any]:
    """A ResourceSlice of this node and driver with ONE tainted device, to create with
    `dryRun=All`: the answer is the object as the API server would store it, taints or none.
    Shaped and named like the real slices (node, driver, the node's pool, the node's slice name
    prefix), so the chart's admission policy and RBAC judge it as they judge them. A dry run stores
    nothing, so the name never exists."""
    device = {
        "name": TAINT_PROBE_DEVICE,
        "taints": [{"key": TAINT_PROBE_KEY, "value": "dry-run", "effect": TAINT_EFFECT}],
        # and a shared device's fields, dropped where DRAConsumableCapacity is off (before 1.36)
        "allowMultipleAllocations": True,
        "capacity": {SHARES_CAPACITY: shares_capacity(2)},
        # and a partition's counters, dropped where DRAPartitionableDevices is off (before 1.36);
        # the set it names is in no slice (validation does not look across slices)
        "consumesCounters": [
            {"counterSet": TAINT_PROBE_DEVICE, "counters": {slot_counter(0): {"value": "1"}}}
        ],
    }
    return {
        "apiVersion": f"{RESOURCE_GROUP}/{RESOURCE_VERSION}",
        "kind": SLICE_KIND,
        "metadata": {"name": slice_base_name(node_name, driver) + TAINT_PROBE_NAME_SUFFIX},
        "spec": {
            "driver": driver,
            "nodeName": node_name,
            "pool": {"name": node_name, "generation": 0, "resourceSliceCount": 1},
            "devices": [device],
        },
    }


def _taint_keys(doc: Mapping[str, Any]) -> dict[str, set[str]]:
    """Device name -> the keys of its taints, for every device of a slice document."""
    devices = ((doc.get("spec") or {}).get("devices")) or []
    return {str(d.get("name")): {str(t.get("key")) for t in d.get("taints") or []} for d in devices}


def taints_kept(stored: Mapping[str, Any]) -> bool:
    """Whether the dry-run answer to `taint_probe_document` still has the probe device's taint."""
    return TAINT_PROBE_KEY in _taint_keys(stored).get(TAINT_PROBE_DEVICE, set())


def sharing_kept(stored: Mapping[str, Any]) -> bool:
    """Whether the dry-run answer to `taint_probe_document` still lets the probe device be
    allocated more than once, with its shares' request policy (consumable capacity)."""
    for device in (stored.get("spec") or {}).get("devices") or []:
        if device.get("name") == TAINT_PROBE_DEVICE:
            policy = ((device.get("capacity") or {}).get(SHARES_CAPACITY) or {}).get("requestPolicy")
            return device.get("allowMultipleAllocations") is True and bool(policy)
    return False


def partitions_kept(stored: Mapping[str, Any]) -> bool:
    """Whether the dry-run answer to `taint_probe_document` still has the probe device's counter
    consumption (partitionable devices)."""
    for device in (stored.get("spec") or {}).get("devices") or []:
        if device.get("name") == TAINT_PROBE_DEVICE:
            return bool(device.get("consumesCounters"))
    return False


def lost_taints(written: Mapping[str, Any], stored: Mapping[str, Any]) -> list[str]:
    """The devices (sorted) of `written` whose taints `stored` (the API server's answer to the
    write) does not have: taints the API server dropped."""
    kept = _taint_keys(stored)
    return sorted(
        name for name, keys in _taint_keys(written).items() if keys and not keys <= kept.get(name, set())
    )


def published(devices: Sequence[SliceDevice], taints: bool) -> tuple[list[SliceDevice], list[str]]:
    """(the devices to put in the slices, the physical IDs left out). With `taints` (the API
    server keeps them) every device; without, the ones that would carry a taint are left out:
    unhealthy ones and those the device plugin still hands to pods."""
    if taints:
        return list(devices), []
    return [d for d in devices if not d.tainted], [d.physical_id for d in devices if d.tainted]


def with_generation(docs: Sequence[Mapping[str, Any]], generation: int) -> list[dict[str, Any]]:
    """The documents with `spec.pool.generation` set."""
    out = []
    for doc in docs:
        spec = dict(doc["spec"])
        spec["pool"] = {**spec["pool"], "generation": generation}
        out.append({**doc, "spec": spec})
    return out
