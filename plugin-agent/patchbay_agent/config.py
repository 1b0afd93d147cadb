"""The agent's whole input: `resourceName` plus the profile's `plugin` section (see
docs/design/profile-contract.md), parsed into frozen, typed dataclasses.

The operator renders this file from a `DevicePluginProfile` whose CRD schema already rejects bad
input and applies defaults. The agent validates again anyway, because it also runs by hand on a
node and in tests, and because a half-understood config on a node is worse than a clear refusal:
every error is a `ConfigError` whose message starts with the dotted path of the offending field.

This module imports no gRPC (an import-linter contract checks it), so the operator's tests and
tools can use it without the agent's runtime.
"""

from __future__ import annotations

import enum
import json
import re
from collections.abc import Mapping
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

from patchbay_api import discovery as discovery_rules

# Extended resource names: "<domain>/<name>", never in the kubernetes.io domains (the kubelet's
# registration server refuses those), and a valid qualified name (docs/facts.md#extended-resources).
_DNS_SUBDOMAIN = re.compile(r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*$")
_QUALIFIED_NAME_PART = re.compile(r"^[A-Za-z0-9]([-A-Za-z0-9_.]*[A-Za-z0-9])?$")
_HEX4 = re.compile(r"^[0-9a-fA-F]{4}$")
_ENV_NAME = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")
_CDI_KIND = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.-]*/[A-Za-z0-9][A-Za-z0-9_.-]*$")
_DEVICE_ID = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.:-]*$")

#: The longest device ID the kubelet accepts in a ListAndWatch response (docs/facts.md#device-plugin-api).
MAX_DEVICE_ID_LENGTH = discovery_rules.MAX_DEVICE_ID_LENGTH
#: The kubelet's gRPC client refuses larger ListAndWatch messages (its default receive limit;
#: docs/facts.md#device-plugin-api).
MAX_LIST_AND_WATCH_BYTES = 4 * 1024 * 1024


class ConfigError(ValueError):
    """A config the agent refuses. `field` is the dotted path of the bad setting."""

    def __init__(self, field_path: str, message: str) -> None:
        super().__init__(f"{field_path}: {message}")
        self.field = field_path


class PreferredPolicy(enum.StrEnum):
    """How GetPreferredAllocation chooses among the devices the kubelet offers."""

    NONE = "None"
    PACK = "Pack"
    SPREAD = "Spread"


@dataclass(frozen=True)
class PathGroup:
    """Several device files that together are ONE device (e.g. a DRM card and its render node)."""

    id: str
    paths: tuple[str, ...]


@dataclass(frozen=True)
class PathsDiscovery:
    """Device files under the host's /dev: each glob match is a device, each group is one device."""

    globs: tuple[str, ...] = ()
    groups: tuple[PathGroup, ...] = ()


@dataclass(frozen=True)
class PciDiscovery:
    """PCI functions from sysfs, filtered by vendor (and optionally device and class prefix)."""

    vendor: str
    device: str | None = None
    device_class: str | None = None
    vfio: bool = False


@dataclass(frozen=True)
class UsbDiscovery:
    """USB devices from sysfs by idVendor (and optionally idProduct and serial)."""

    vendor: str
    product: str | None = None
    serial: str | None = None


@dataclass(frozen=True)
class VirtualDiscovery:
    """N countable tokens with no device files (licences, bandwidth units, slots)."""

    count: int


@dataclass(frozen=True)
class NvmlDiscovery:
    """NVIDIA GPUs through NVML (the optional `nvml` extra)."""


Discovery = PathsDiscovery | PciDiscovery | UsbDiscovery | VirtualDiscovery | NvmlDiscovery


@dataclass(frozen=True)
class ExecProbe:
    """A command run per device; exit 0 within the timeout means healthy, anything else does not."""

    command: tuple[str, ...]
    timeout_seconds: float = 2.0


#: `health.recoveryHoldSeconds` when a profile leaves it out (core/health.py says why).
DEFAULT_RECOVERY_HOLD_SECONDS = 10


@dataclass(frozen=True)
class Health:
    """How often devices are checked and how many results in a row flip their state."""

    period_seconds: float = 5.0
    failure_threshold: int = 3
    success_threshold: int = 1
    #: seconds an Unhealthy device's checks must pass before it is published Healthy (0: at once)
    recovery_hold_seconds: float = DEFAULT_RECOVERY_HOLD_SECONDS
    exec: ExecProbe | None = None
    #: DRA mode: the effect of an unhealthy device's taint in the ResourceSlice
    taint_effect: str = "NoSchedule"


@dataclass(frozen=True)
class Mount:
    host_path: str
    container_path: str
    read_only: bool = True


@dataclass(frozen=True)
class Allocation:
    """What Allocate hands the kubelet for every container, besides the device files themselves."""

    permissions: str = "rw"
    devices_env_name: str = "PATCHBAY_DEVICES"
    envs: Mapping[str, str] = field(default_factory=dict)
    mounts: tuple[Mount, ...] = ()
    annotations: Mapping[str, str] = field(default_factory=dict)
    cdi_kind: str | None = None
    #: DRA: write each prepared request's device metadata file into its containers (KEP-5304,
    #: dra/metadata.py); a device plugin has none
    device_metadata: bool = True


@dataclass(frozen=True)
class PreStart:
    """A command PreStartContainer runs before a container with these devices starts."""

    command: tuple[str, ...]
    timeout_seconds: float = 10.0


#: The most slots a device may be cut into: a counter set holds at most 32 counters
#: (ResourceSliceMaxCountersPerCounterSet, docs/dra.md#partitions).
MAX_PARTITION_SLOTS = 32


@dataclass(frozen=True)
class Partitions:
    """DRA `plugin.partitions`: each device is cut into `slots` equal slots and offered at once in
    every size of `sizes` (in slots), at every place aligned to its size (a 2-slot partition starts
    at slot 0, 2, 4...), so the scheduler picks a shape and the slots' counters keep it from
    over-committing the device (docs/dra.md#partitions)."""

    slots: int
    sizes: tuple[int, ...]

    def places(self) -> list[tuple[int, int]]:
        """Every (size, first slot) offered, smallest size first."""
        return [(size, first) for size in self.sizes for first in range(0, self.slots, size)]


def _parse_partitions(value: Any, path: str) -> Partitions | None:
    """`plugin.partitions`, or None when absent. `sizes` defaults to every divisor of `slots`."""
    if value is None:
        return None
    m = _mapping(value, path, {"slots", "sizes"})
    if m.get("slots") is None:
        raise ConfigError(f"{path}.slots", "is required")
    slots = _int(m["slots"], f"{path}.slots", minimum=2)
    if slots > MAX_PARTITION_SLOTS:
        raise ConfigError(f"{path}.slots", f"must be <= {MAX_PARTITION_SLOTS}, got {slots}")
    raw = m.get("sizes")
    if raw is None:
        return Partitions(slots, tuple(n for n in range(1, slots + 1) if slots % n == 0))
    if not isinstance(raw, list) or not raw:
        raise ConfigError(f"{path}.sizes", "must be a non-empty list of sizes in slots")
    sizes = []
    for i, item in enumerate(raw):
        size = _int(item, f"{path}.sizes[{i}]", minimum=1)
        if size > slots or slots % size:
            raise ConfigError(
                f"{path}.sizes[{i}]",
                f"{size} must divide slots ({slots}): partitions are aligned slot ranges",
            )
        if size in sizes:
            raise ConfigError(f"{path}.sizes[{i}]", f"{size} is listed twice")
        sizes.append(size)
    return Partitions(slots, tuple(sorted(sizes)))


@dataclass(frozen=True)
class AgentConfig:
    """Everything the agent needs to know about the resource it serves on this node."""

    resource_name: str
    discovery: Discovery
    replicas: int = 1
    health: Health = field(default_factory=Health)
    allocation: Allocation = field(default_factory=Allocation)
    preferred_policy: PreferredPolicy = PreferredPolicy.NONE
    pre_start: PreStart | None = None
    #: DRA: how each device is cut into partitions (`plugin.partitions`); None: offered whole
    partitions: Partitions | None = None
    #: the profile's node group whose settings these are (`nodeconfig`: the node agent chooses it
    #: from its Node's labels); "" for a profile without node groups. Not read from `plugin`: it
    #: only names the choice, for the DeviceReport's `nodeGroup`.
    node_group: str = ""
    #: the hash of the profile's revision these settings are (`nodeconfig`: the node agent chooses
    #: it with `patchbay_api.revisions`; an agent of its own reads it beside its config); "" when
    #: the operator names none (an operator older than revisions). Names the choice, for the
    #: DeviceReport's `revision`.
    revision: str = ""


# --------------------------------------------------------------------------------------------
# Parsing helpers: each takes the dotted path so errors name the field.


def _mapping(value: Any, path: str, allowed: set[str]) -> Mapping[str, Any]:
    if value is None:
        return {}
    if not isinstance(value, Mapping):
        raise ConfigError(path, f"must be a mapping, got {type(value).__name__}")
    unknown = sorted(str(k) for k in value if k not in allowed)
    if unknown:
        raise ConfigError(f"{path}.{unknown[0]}", f"unknown field (allowed: {', '.join(sorted(allowed))})")
    return value


def _str(value: Any, path: str, *, pattern: re.Pattern[str] | None = None, hint: str = "") -> str:
    if not isinstance(value, str) or not value:
        raise ConfigError(path, "must be a non-empty string")
    if pattern is not None and not pattern.match(value):
        raise ConfigError(path, f"{value!r} is not valid{': ' + hint if hint else ''}")
    return value


def _int(value: Any, path: str, *, minimum: int) -> int:
    # bool is an int in Python; "replicas: true" is a mistake, not 1.
    if not isinstance(value, int) or isinstance(value, bool):
        raise ConfigError(path, f"must be an integer, got {value!r}")
    if value < minimum:
        raise ConfigError(path, f"must be >= {minimum}, got {value}")
    return value


def _bool(value: Any, path: str) -> bool:
    if not isinstance(value, bool):
        raise ConfigError(path, f"must be true or false, got {value!r}")
    return value


def _command(value: Any, path: str) -> tuple[str, ...]:
    if not isinstance(value, list) or not value or not all(isinstance(a, str) and a for a in value):
        raise ConfigError(path, "must be a non-empty list of non-empty strings")
    return tuple(value)


def _str_map(value: Any, path: str, key_pattern: re.Pattern[str] | None = None) -> dict[str, str]:
    if value is None:
        return {}
    if not isinstance(value, Mapping):
        raise ConfigError(path, "must be a mapping of strings")
    out: dict[str, str] = {}
    for k, v in value.items():
        if not isinstance(k, str) or (key_pattern is not None and not key_pattern.match(k)):
            raise ConfigError(f"{path}.{k}", "is not a valid key")
        if not isinstance(v, str):
            raise ConfigError(f"{path}.{k}", f"must be a string, got {v!r}")
        out[k] = v
    return out


def _dev_path(value: Any, path: str) -> str:
    s = _str(value, path)
    if not s.startswith("/dev/") or "/../" in s + "/" or s.endswith("/.."):
        raise ConfigError(path, f"{s!r} must be an absolute path under /dev/")
    return s


def validate_resource_name(name: Any, path: str = "resourceName") -> str:
    """Check an extended resource name the way the kubelet will, so registration cannot fail on it."""
    s = _str(name, path)
    domain, sep, short = s.partition("/")
    if not sep or not domain or not short:
        raise ConfigError(path, f"{s!r} must be '<domain>/<name>'")
    if len(domain) > 253 or not _DNS_SUBDOMAIN.match(domain):
        raise ConfigError(path, f"domain {domain!r} must be a DNS subdomain")
    if domain == "kubernetes.io" or domain.endswith(".kubernetes.io"):
        raise ConfigError(
            path, f"domain {domain!r} is reserved: extended resources may not use kubernetes.io"
        )
    if len(short) > 63 or not _QUALIFIED_NAME_PART.match(short):
        raise ConfigError(path, f"name {short!r} must be a valid qualified name part (<= 63 chars)")
    # The kubelet's quota key is "requests.<name>", which must itself be a qualified name.
    if len(s) + len("requests.") > 253 + 64:
        raise ConfigError(path, f"{s!r} is too long")
    return s


def _parse_discovery(raw: Any, path: str) -> Discovery:
    backends = {"paths", "pci", "usb", "virtual", "nvml"}
    d = _mapping(raw, path, backends)
    present = [k for k in d if d[k] is not None]
    if len(present) != 1:
        raise ConfigError(
            path, f"exactly one backend of {sorted(backends)} is required, got {sorted(present)}"
        )
    kind = present[0]
    p = f"{path}.{kind}"
    body = d[kind]
    if kind == "paths":
        m = _mapping(body, p, {"globs", "groups"})
        globs_raw = [] if m.get("globs") is None else m["globs"]  # false or 0 is no list
        if not isinstance(globs_raw, list):
            raise ConfigError(f"{p}.globs", "must be a list of paths")
        globs = tuple(_dev_path(g, f"{p}.globs[{i}]") for i, g in enumerate(globs_raw))
        groups_raw = [] if m.get("groups") is None else m["groups"]
        if not isinstance(groups_raw, list):
            raise ConfigError(f"{p}.groups", "must be a list")
        groups: list[PathGroup] = []
        seen: set[str] = set()
        for i, g in enumerate(groups_raw):
            gp = f"{p}.groups[{i}]"
            gm = _mapping(g, gp, {"id", "paths"})
            gid = _str(
                gm.get("id"), f"{gp}.id", pattern=_DEVICE_ID, hint="letters, digits, '_', '.', ':', '-'"
            )
            if len(gid) > MAX_DEVICE_ID_LENGTH:
                raise ConfigError(f"{gp}.id", f"must be at most {MAX_DEVICE_ID_LENGTH} characters")
            if gid in seen:
                raise ConfigError(f"{gp}.id", f"duplicate group id {gid!r}")
            seen.add(gid)
            paths_raw = gm.get("paths")
            if not isinstance(paths_raw, list) or not paths_raw:
                raise ConfigError(f"{gp}.paths", "must be a non-empty list of paths")
            groups.append(
                PathGroup(gid, tuple(_dev_path(x, f"{gp}.paths[{j}]") for j, x in enumerate(paths_raw)))
            )
        if not globs and not groups:
            raise ConfigError(p, "needs at least one of globs / groups")
        return PathsDiscovery(globs=globs, groups=tuple(groups))
    if kind == "pci":
        m = _mapping(body, p, {"vendor", "device", "class", "vfio"})
        vendor = _str(m.get("vendor"), f"{p}.vendor", pattern=_HEX4, hint="4 hex digits like '10de'")
        device = m.get("device")
        cls = m.get("class")
        return PciDiscovery(
            vendor=vendor.lower(),
            device=None
            if device is None
            else _str(device, f"{p}.device", pattern=_HEX4, hint="4 hex digits").lower(),
            device_class=None
            if cls is None
            else _str(
                cls, f"{p}.class", pattern=re.compile(r"^(0x)?[0-9a-fA-F]{1,6}$"), hint="like 0x0302"
            ).lower(),
            vfio=_bool(m.get("vfio", False), f"{p}.vfio"),
        )
    if kind == "usb":
        m = _mapping(body, p, {"vendor", "product", "serial"})
        product = m.get("product")
        serial = m.get("serial")
        return UsbDiscovery(
            vendor=_str(m.get("vendor"), f"{p}.vendor", pattern=_HEX4, hint="4 hex digits").lower(),
            product=None
            if product is None
            else _str(product, f"{p}.product", pattern=_HEX4, hint="4 hex digits").lower(),
            serial=None if serial is None else _str(serial, f"{p}.serial"),
        )
    if kind == "virtual":
        m = _mapping(body, p, {"count"})
        return VirtualDiscovery(count=_int(m.get("count"), f"{p}.count", minimum=1))
    _mapping(body, p, set())
    return NvmlDiscovery()


def _parse_health(raw: Any, path: str) -> Health:
    m = _mapping(
        raw,
        path,
        {
            "periodSeconds",
            "failureThreshold",
            "successThreshold",
            "recoveryHoldSeconds",
            "exec",
            "taintEffect",
        },
    )
    probe = None
    if m.get("exec") is not None:
        e = _mapping(m["exec"], f"{path}.exec", {"command", "timeoutSeconds"})
        probe = ExecProbe(
            command=_command(e.get("command"), f"{path}.exec.command"),
            timeout_seconds=_int(e.get("timeoutSeconds", 2), f"{path}.exec.timeoutSeconds", minimum=1),
        )
    return Health(
        period_seconds=_int(m.get("periodSeconds", 5), f"{path}.periodSeconds", minimum=1),
        failure_threshold=_int(m.get("failureThreshold", 3), f"{path}.failureThreshold", minimum=1),
        success_threshold=_int(m.get("successThreshold", 1), f"{path}.successThreshold", minimum=1),
        recovery_hold_seconds=_int(
            m.get("recoveryHoldSeconds", DEFAULT_RECOVERY_HOLD_SECONDS),
            f"{path}.recoveryHoldSeconds",
            minimum=0,
        ),
        exec=probe,
        taint_effect=_taint_effect(m.get("taintEffect", "NoSchedule"), f"{path}.taintEffect"),
    )


#: A device taint's effects (resource.k8s.io/v1 DeviceTaintEffect): None is informational only.
TAINT_EFFECTS = ("None", "NoSchedule", "NoExecute")


def _taint_effect(value: Any, path: str) -> str:
    if value not in TAINT_EFFECTS:
        raise ConfigError(path, f"{value!r} must be one of {list(TAINT_EFFECTS)}")
    return str(value)


def _parse_allocation(raw: Any, path: str) -> Allocation:
    m = _mapping(
        raw, path, {"permissions", "devicesEnvName", "envs", "mounts", "annotations", "cdi", "deviceMetadata"}
    )
    perms = _str(m.get("permissions", "rw"), f"{path}.permissions")
    if set(perms) - set("rwm") or len(set(perms)) != len(perms):
        raise ConfigError(f"{path}.permissions", f"{perms!r} must be a non-empty subset of 'rwm'")
    env_name = _str(
        m.get("devicesEnvName", "PATCHBAY_DEVICES"),
        f"{path}.devicesEnvName",
        pattern=_ENV_NAME,
        hint="an env name",
    )
    envs = _str_map(m.get("envs"), f"{path}.envs", _ENV_NAME)
    if env_name in envs:
        raise ConfigError(f"{path}.envs.{env_name}", f"collides with devicesEnvName {env_name!r}")
    mounts_raw = [] if m.get("mounts") is None else m["mounts"]  # false or 0 is no list
    if not isinstance(mounts_raw, list):
        raise ConfigError(f"{path}.mounts", "must be a list")
    mounts: list[Mount] = []
    for i, mr in enumerate(mounts_raw):
        mp = f"{path}.mounts[{i}]"
        mm = _mapping(mr, mp, {"hostPath", "containerPath", "readOnly"})
        host = _str(mm.get("hostPath"), f"{mp}.hostPath")
        cont = _str(mm.get("containerPath"), f"{mp}.containerPath")
        for key, val in (("hostPath", host), ("containerPath", cont)):
            if not val.startswith("/"):
                raise ConfigError(f"{mp}.{key}", f"{val!r} must be an absolute path")
        mounts.append(Mount(host, cont, _bool(mm.get("readOnly", True), f"{mp}.readOnly")))
    cdi_kind = None
    if m.get("cdi") is not None:
        c = _mapping(m["cdi"], f"{path}.cdi", {"kind"})
        cdi_kind = _str(c.get("kind"), f"{path}.cdi.kind", pattern=_CDI_KIND, hint="'<vendor>/<class>'")
    return Allocation(
        permissions=perms,
        devices_env_name=env_name,
        envs=envs,
        mounts=tuple(mounts),
        annotations=_str_map(m.get("annotations"), f"{path}.annotations"),
        cdi_kind=cdi_kind,
        device_metadata=_bool(m.get("deviceMetadata", True), f"{path}.deviceMetadata"),
    )


def parse(raw: Any) -> AgentConfig:
    """Turn the operator's rendered document into an `AgentConfig`, or raise `ConfigError`."""
    top = _mapping(raw, "config", {"resourceName", "plugin"})
    if not top:
        raise ConfigError("config", "is empty: expected resourceName and plugin")
    resource = validate_resource_name(top.get("resourceName"))
    plugin = _mapping(
        top.get("plugin"),
        "plugin",
        {"discovery", "sharing", "health", "allocation", "preferredAllocation", "preStart", "partitions"},
    )
    if plugin.get("discovery") is None:
        raise ConfigError("plugin.discovery", "is required")
    discovery = _parse_discovery(plugin["discovery"], "plugin.discovery")
    sharing = _mapping(plugin.get("sharing"), "plugin.sharing", {"replicas"})
    replicas = _int(sharing.get("replicas", 1), "plugin.sharing.replicas", minimum=1)
    partitions = _parse_partitions(plugin.get("partitions"), "plugin.partitions")
    if partitions is not None and replicas > 1:
        raise ConfigError(
            "plugin.partitions",
            "cannot be combined with plugin.sharing.replicas above 1: a partition is held by one claim",
        )
    pref = _mapping(plugin.get("preferredAllocation"), "plugin.preferredAllocation", {"policy"})
    policy_raw = pref.get("policy", "None")
    try:
        policy = PreferredPolicy(policy_raw)
    except ValueError:
        raise ConfigError(
            "plugin.preferredAllocation.policy",
            f"{policy_raw!r} must be one of {[p.value for p in PreferredPolicy]}",
        ) from None
    pre_start = None
    if plugin.get("preStart") is not None:
        ps = _mapping(plugin["preStart"], "plugin.preStart", {"command", "timeoutSeconds"})
        pre_start = PreStart(
            command=_command(ps.get("command"), "plugin.preStart.command"),
            timeout_seconds=_int(ps.get("timeoutSeconds", 10), "plugin.preStart.timeoutSeconds", minimum=1),
        )
    # Devices x replicas against the kubelet's 4 MiB cap is checked on the real encoded list
    # (`inventory`), because only discovery knows how many devices there are and their IDs.
    return AgentConfig(
        resource_name=resource,
        discovery=discovery,
        replicas=replicas,
        health=_parse_health(plugin.get("health"), "plugin.health"),
        allocation=_parse_allocation(plugin.get("allocation"), "plugin.allocation"),
        preferred_policy=policy,
        pre_start=pre_start,
        partitions=partitions,
    )


#: Beside an agent of its own's config, in the ConfigMap the operator renders: the hash of the
#: profile's revision the config is (a file of its own, so an older agent's parser never meets it).
REVISION_FILE = "revision"


def parse_document(text: str, where: str) -> Any:
    """The document in a config file's `text`: read as JSON when it is JSON (what the operator
    writes), else as YAML (a hand-written file; JSON is YAML too, so an agent of any version reads
    either). ConfigError names `where` when it is neither.

    Why JSON first: importing PyYAML (its regular expressions compiled at import) was about a
    tenth of the agent's start from exec to registered (docs/benchmarks.md, "In its image"), and
    the agent reads its config once at start; `json` is imported by then anyway."""
    if text.lstrip().startswith("{"):
        try:
            return json.loads(text)
        except ValueError:
            pass  # a YAML flow mapping ({a: 1}) is not JSON: YAML reads it
    import yaml  # only for a file that is not JSON

    try:
        return yaml.safe_load(text)
    except yaml.YAMLError as e:
        raise ConfigError("config", f"{where} is not valid YAML: {e}") from None


def read_document(path: Path) -> Any:
    """The document in the file at `path` (`parse_document`); ConfigError when it cannot be read."""
    try:
        text = path.read_text(encoding="utf-8")
    except OSError as e:
        raise ConfigError("config", f"cannot read {path}: {e.strerror or e}") from None
    return parse_document(text, str(path))


def load(path: str | Path) -> AgentConfig:
    """Read and parse the file the operator mounts (or a hand-written one; JSON or YAML), with the
    revision named in the `REVISION_FILE` beside it (none: "")."""
    p = Path(path)
    config = parse(read_document(p))
    try:
        revision = p.with_name(REVISION_FILE).read_text(encoding="utf-8").strip()
    except OSError:
        return config
    return replace(config, revision=revision[:64])
