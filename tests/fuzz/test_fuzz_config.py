"""Bad input, tried: the agent's config files (the profile's rendered config and the node agent's
list of profiles), as YAML documents shaped at random, as a valid config with one value replaced
at random, and with one value left out. Nothing but `ConfigError` escapes (no KeyError, TypeError,
AttributeError: the agent would crash instead of reporting `ConfigInvalid`), and both outcomes
are judged:

* a refusal names the field at fault: the replaced field (or one inside the new value, or the
  object that holds it when the value is empty); in a random document, a place the document has
  (or a known field it left out);
* an accepted config is the document: within the parser's documented bounds, holding every value
  the document gave (hex IDs lowercased), and parsing back to itself from the document it means
  (`_render`); a node agent's entry is accepted or refused exactly as the profile's config is.

The last tests run the fuzzers with parsers broken on purpose (one that blames `plugin` for
every refusal, one that loses the health probe, one without the replicas minimum) and see each
judge fail."""

from __future__ import annotations

import copy
import dataclasses
import re
from collections.abc import Callable, Iterator, Mapping
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from support.fuzzing import PROVE, tally

from patchbay_agent.config import (
    AgentConfig,
    Allocation,
    ConfigError,
    Health,
    PathsDiscovery,
    PciDiscovery,
    UsbDiscovery,
    VirtualDiscovery,
    parse,
)
from patchbay_agent.nodeconfig import parse_node_config

VALID: dict[str, Any] = {
    "resourceName": "example.com/serial",
    "plugin": {
        "discovery": {
            "paths": {"globs": ["/dev/ttyUSB*"], "groups": [{"id": "pair", "paths": ["/dev/a", "/dev/b"]}]}
        },
        "sharing": {"replicas": 2},
        "health": {
            "periodSeconds": 10,
            "failureThreshold": 3,
            "exec": {"command": ["/bin/true"], "timeoutSeconds": 2},
        },
        "allocation": {
            "permissions": "rw",
            "devicesEnvName": "SERIALS",
            "envs": {"A": "b"},
            "mounts": [{"hostPath": "/opt/x", "containerPath": "/x", "readOnly": True}],
            "annotations": {"example.com/a": "b"},
        },
        "preferredAllocation": {"policy": "Pack"},
        "preStart": {"command": ["/bin/true"], "timeoutSeconds": 5},
    },
}

_json = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats(allow_nan=True) | st.text(max_size=30),
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=15), inner, max_size=4),
    max_leaves=20,
)


def _paths(doc: Any, prefix: tuple[Any, ...] = ()) -> list[tuple[Any, ...]]:
    out = [prefix]
    if isinstance(doc, dict):
        for k, v in doc.items():
            out += _paths(v, (*prefix, k))
    elif isinstance(doc, list):
        for i, v in enumerate(doc):
            out += _paths(v, (*prefix, i))
    return out


def _replace(doc: Any, path: tuple[Any, ...], value: Any) -> Any:
    if not path:
        return value
    out = copy.deepcopy(doc)
    node = out
    for key in path[:-1]:
        node = node[key]
    node[path[-1]] = value
    return out


def _remove(doc: Any, path: tuple[Any, ...]) -> Any:
    """`doc` without the key or list item at `path` (not the root)."""
    out = copy.deepcopy(doc)
    node = out
    for key in path[:-1]:
        node = node[key]
    del node[path[-1]]
    return out


# ---------------------------------------------------------------------------------------------
# The judges. A refusal names the field at fault; what is accepted is the document, within the
# parser's documented rules (docs/api.md, the module doc of patchbay_agent/config.py).

#: Every field name the config and the node config know: a refusal may name one that the
#: document left out (a required field), never one the document does not have and the schema
#: does not know.
KNOWN = frozenset(
    """resourceName plugin discovery paths globs groups id pci vendor device class vfio usb product
    serial virtual count nvml sharing replicas partitions slots sizes health periodSeconds
    failureThreshold successThreshold recoveryHoldSeconds taintEffect exec command timeoutSeconds
    allocation permissions devicesEnvName envs mounts hostPath containerPath readOnly annotations
    cdi kind deviceMetadata preferredAllocation policy preStart profiles profile mode driver
    nodeSelectorTerms nodeGroups name""".split()  # noqa: SIM905 - a word list
)


def _dotted(path: tuple[Any, ...]) -> str:
    """The parser's name for a place: `plugin.discovery.paths.groups[0].id`; the root is `config`."""
    out = ""
    for key in path:
        out += f"[{key}]" if isinstance(key, int) else (f".{key}" if out else str(key))
    return out or "config"


def _resolves(name: str, doc: Any) -> bool:
    """`name` (a refusal's field) is a place in `doc`: each step a key or index the document has,
    and only the last steps may be fields it left out (known ones, below a value it has or null)."""
    rest = name.removeprefix("config").removeprefix(".")
    return _walk(rest, doc)


def _walk(rest: str, node: Any) -> bool:
    if not rest:
        return True
    if isinstance(node, list) and rest.startswith("["):
        index, _, after = rest[1:].partition("]")
        return index.isdigit() and int(index) < len(node) and _walk(after.removeprefix("."), node[int(index)])
    if isinstance(node, Mapping):
        for key in node:
            k = str(key)
            if rest == k:
                return True
            if rest.startswith((k + ".", k + "[")) and _walk(rest[len(k) :].removeprefix("."), node[key]):
                return True
    if node is None or isinstance(node, Mapping):
        head = re.split(r"[.\[]", rest, maxsplit=1)[0]
        return head in KNOWN and (head == rest or _walk(rest[len(head) :].removeprefix("."), None))
    return False


def _at_fault(name: str, where: tuple[Any, ...], value: Any) -> bool:
    """A refusal of the document whose value at `where` was replaced by `value` names that field,
    a field inside the value, or the object that holds it when the value is empty or null (what
    the object needed is missing) or an item of a list (the parser may judge the list whole); or,
    for a `devicesEnvName`, the env it now collides with."""
    field = _dotted(where)
    if name == field or name.startswith((field + ".", field + "[")):
        return True
    parent = _dotted(where[:-1])
    emptied = value is None or (not value and isinstance(value, (str, list, dict)))
    if where and (emptied or isinstance(where[-1], int)) and name == parent:
        return True
    if where[-1:] == ("key",) and "nodeSelectorTerms" in where and name == parent:
        return True  # the selector evaluator (patchbay_api) judges an expression by its key
    return bool(where) and where[-1] == "devicesEnvName" and name == f"{parent}.envs.{value}"


def _refusal_wrong(e: ConfigError, fits: Callable[[str], bool]) -> str:
    problem = str(e).removeprefix(f"{e.field}: ")
    if not problem or problem == str(e):
        return f"refusal without a reason after its field: {str(e)[:200]!r}"
    if not fits(e.field):
        return f"refusal does not name the field at fault: {str(e)[:200]!r}"
    return ""


_ENV = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")
_SUBDOMAIN = re.compile(r"[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*")
_NAME_PART = re.compile(r"[A-Za-z0-9]([-A-Za-z0-9_.]*[A-Za-z0-9])?")
_GROUP_ID = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.:-]*")
_HEX4 = re.compile(r"[0-9a-f]{4}")


def _out_of_bounds(cfg: AgentConfig) -> list[str]:
    """The documented rules an accepted config breaks (docs/api.md; the parser's docs)."""
    bad = []
    domain, _, short = cfg.resource_name.partition("/")
    if not (_SUBDOMAIN.fullmatch(domain) and _NAME_PART.fullmatch(short) and len(short) <= 63) or (
        domain == "kubernetes.io" or domain.endswith(".kubernetes.io")
    ):
        bad.append(f"resourceName {cfg.resource_name!r}")
    d = cfg.discovery
    if isinstance(d, PathsDiscovery):
        paths = [*d.globs, *(p for g in d.groups for p in g.paths)]
        if not paths or (not d.globs and not d.groups):
            bad.append("discovery.paths without globs or groups")
        bad += [f"device path {p!r}" for p in paths if not p.startswith("/dev/") or "/../" in p + "/"]
        ids = [g.id for g in d.groups]
        bad += [f"group id {i!r}" for i in ids if not _GROUP_ID.fullmatch(i) or len(i) > 63]
        bad += ["group ids twice"] if len(set(ids)) != len(ids) else []
        bad += [f"group {g.id!r} without paths" for g in d.groups if not g.paths]
    elif isinstance(d, (PciDiscovery, UsbDiscovery)):
        hexes = [d.vendor, d.device if isinstance(d, PciDiscovery) else d.product]
        bad += [f"{type(d).__name__} ID {h!r}" for h in hexes if h is not None and not _HEX4.fullmatch(h)]
    elif isinstance(d, VirtualDiscovery) and d.count < 1:
        bad.append(f"virtual.count {d.count}")
    h = cfg.health
    for what, value, least in (
        ("replicas", cfg.replicas, 1),
        ("health.periodSeconds", h.period_seconds, 1),
        ("health.failureThreshold", h.failure_threshold, 1),
        ("health.successThreshold", h.success_threshold, 1),
        ("health.recoveryHoldSeconds", h.recovery_hold_seconds, 0),
        ("health.exec.timeoutSeconds", h.exec.timeout_seconds if h.exec else 1, 1),
        ("preStart.timeoutSeconds", cfg.pre_start.timeout_seconds if cfg.pre_start else 1, 1),
    ):
        if value < least:
            bad.append(f"{what} {value} < {least}")
    for what, command in (("health.exec", h.exec), ("preStart", cfg.pre_start)):
        if command is not None and (not command.command or not all(command.command)):
            bad.append(f"{what}.command {command.command!r}")
    if h.taint_effect not in ("None", "NoSchedule", "NoExecute"):
        bad.append(f"health.taintEffect {h.taint_effect!r}")
    a = cfg.allocation
    if not a.permissions or set(a.permissions) - set("rwm") or len(set(a.permissions)) != len(a.permissions):
        bad.append(f"allocation.permissions {a.permissions!r}")
    bad += [f"env name {n!r}" for n in [a.devices_env_name, *a.envs] if not _ENV.fullmatch(n)]
    bad += [f"envs.{a.devices_env_name} collides with devicesEnvName"] if a.devices_env_name in a.envs else []
    mounts = [p for m in a.mounts for p in (m.host_path, m.container_path)]
    bad += [f"mount path {p!r} not absolute" for p in mounts if not p.startswith("/")]
    if cfg.partitions is not None:
        slots, sizes = cfg.partitions.slots, cfg.partitions.sizes
        if not 2 <= slots <= 32 or not sizes or any(s < 1 or slots % s for s in sizes) or cfg.replicas > 1:
            bad.append(f"partitions {cfg.partitions} (replicas {cfg.replicas})")
    return bad


#: The dataclasses `_render` writes back as a document, with the fields it knows of each: a new
#: field fails the judge until `_render` writes it too.
RENDERED = {
    AgentConfig: "resource_name discovery replicas health allocation preferred_policy pre_start partitions"
    " node_group",
    Health: "period_seconds failure_threshold success_threshold recovery_hold_seconds exec taint_effect",
    Allocation: "permissions devices_env_name envs mounts annotations cdi_kind device_metadata",
}


def _render(cfg: AgentConfig) -> dict[str, Any]:
    """The config as the document that means it, every field written (defaults too)."""
    for cls, known in RENDERED.items():
        new = {f.name for f in dataclasses.fields(cls)} - set(known.split())
        assert not new, f"the judge's _render does not write {cls.__name__}.{sorted(new)}: add it"
    d = cfg.discovery
    if isinstance(d, PathsDiscovery):
        found: dict[str, Any] = {
            "paths": {
                "globs": list(d.globs),
                "groups": [{"id": g.id, "paths": list(g.paths)} for g in d.groups],
            }
        }
    elif isinstance(d, PciDiscovery):
        found = {"pci": {"vendor": d.vendor, "device": d.device, "class": d.device_class, "vfio": d.vfio}}
    elif isinstance(d, UsbDiscovery):
        found = {"usb": {"vendor": d.vendor, "product": d.product, "serial": d.serial}}
    elif isinstance(d, VirtualDiscovery):
        found = {"virtual": {"count": d.count}}
    else:
        found = {"nvml": {}}
    h, a = cfg.health, cfg.allocation
    plugin: dict[str, Any] = {
        "discovery": found,
        "sharing": {"replicas": cfg.replicas},
        "health": {
            "periodSeconds": h.period_seconds,
            "failureThreshold": h.failure_threshold,
            "successThreshold": h.success_threshold,
            "recoveryHoldSeconds": h.recovery_hold_seconds,
            "taintEffect": h.taint_effect,
            "exec": None
            if h.exec is None
            else {"command": list(h.exec.command), "timeoutSeconds": h.exec.timeout_seconds},
        },
        "allocation": {
            "permissions": a.permissions,
            "devicesEnvName": a.devices_env_name,
            "envs": dict(a.envs),
            "mounts": [
                {"hostPath": m.host_path, "containerPath": m.container_path, "readOnly": m.read_only}
                for m in a.mounts
            ],
            "annotations": dict(a.annotations),
            "cdi": None if a.cdi_kind is None else {"kind": a.cdi_kind},
            "deviceMetadata": a.device_metadata,
        },
        "preferredAllocation": {"policy": cfg.preferred_policy.value},
        "preStart": None
        if cfg.pre_start is None
        else {"command": list(cfg.pre_start.command), "timeoutSeconds": cfg.pre_start.timeout_seconds},
        "partitions": None
        if cfg.partitions is None
        else {"slots": cfg.partitions.slots, "sizes": list(cfg.partitions.sizes)},
    }
    return {"resourceName": cfg.resource_name, "plugin": plugin}


#: Values the parser writes in its own form: hex IDs in lowercase, partition sizes sorted.
_LOWERED = {"vendor", "device", "class", "product"}


def _leaves(doc: Any, path: tuple[Any, ...] = ()) -> Iterator[tuple[tuple[Any, ...], Any]]:
    if isinstance(doc, Mapping):
        for k, v in doc.items():
            yield from _leaves(v, (*path, k))
    elif isinstance(doc, list) and not (path and path[-1] == "sizes"):
        for i, v in enumerate(doc):
            yield from _leaves(v, (*path, i))
    elif doc is not None:
        yield path, sorted(doc) if isinstance(doc, list) else doc


def _lookup(doc: Any, path: tuple[Any, ...]) -> Any:
    for key in path:
        try:
            doc = doc[key]
        except (KeyError, IndexError, TypeError):
            return _MISSING
    return doc


_MISSING = object()


def _accepted_wrong(doc: Any, cfg: AgentConfig) -> str:
    """What is wrong with a config the parser accepted from `doc`: a documented rule it breaks,
    a value of the document it does not hold, or a config that does not parse back to itself."""
    if bad := _out_of_bounds(cfg):
        return f"accepted a config out of its documented bounds: {bad[:4]}"
    rendered = _render(cfg)
    source = {"resourceName": doc.get("resourceName"), "plugin": doc.get("plugin")}
    for path, value in _leaves(source):
        want = value.lower() if isinstance(value, str) and path[-1] in _LOWERED else value
        got = _lookup(rendered, path)
        if type(got) is not type(want) or got != want:
            shown = "absent" if got is _MISSING else repr(got)[:80]
            field = f"{_dotted(path)} = {value!r:.80}"
            return f"accepted config does not hold the document's {field}: it has {shown}"
    try:
        again = parse(rendered)
    except ConfigError as e:
        return f"accepted config does not parse back: {e}"
    if dataclasses.replace(again, node_group=cfg.node_group) != cfg:  # the node's choice, not the document's
        return f"accepted config parses back as another: {again} != {cfg}"
    return ""


def _judge(
    surface: str, doc: Any, fits: Callable[[str], bool], parser: Callable[[Any], AgentConfig] = parse
) -> None:
    """The profile's config `doc`, parsed by `parser`: refused naming a field that `fits`, or
    accepted as exactly the document (`_accepted_wrong`)."""
    try:
        cfg = parser(doc)
    except ConfigError as e:
        why = _refusal_wrong(e, fits)
        tally(surface, "wrong refusal" if why else "ConfigError")
        assert not why, why
        return
    why = _accepted_wrong(doc, cfg)
    tally(surface, "wrongly accepted" if why else "accepted")
    assert not why, why


def _judge_node_file(surface: str, doc: Any) -> None:
    """The node agent's file: refused as a whole naming a place of it, or each entry judged as a
    profile's config (its refusal naming a place of the entry)."""
    try:
        entries = parse_node_config(doc)
    except ConfigError as e:
        why = _refusal_wrong(e, lambda name: _resolves(name, doc))
        tally(surface, "wrong refusal" if why else "ConfigError")
        assert not why, why
        return
    tally(surface, "accepted")
    for i, entry in enumerate(entries):
        item = doc["profiles"][i]
        if entry.config is None:
            name = entry.error.partition(": ")[0].removeprefix(f"profiles[{i}].")
            assert _resolves(name, item), f"refusal does not name the field at fault: {entry.error[:200]!r}"
        else:
            why = _accepted_wrong(item, entry.config)
            assert not why, why


@settings(max_examples=500, deadline=None)
@given(doc=_json)
def test_random_documents(doc: Any) -> None:
    _judge("config (profile)", doc, lambda name: _resolves(name, doc))
    _judge_node_file("config (node agent)", doc)


PATHS = _paths(VALID)
GOOD_ENTRY = {
    "profile": "good",
    "resourceName": "example.com/good",
    "plugin": {"discovery": {"virtual": {"count": 1}}},
}


def _fuzz_replaced(
    where: tuple[Any, ...], value: Any, parser: Callable[[Any], AgentConfig] = parse, surface: str = ""
) -> None:
    doc = _replace(VALID, where, value)
    _judge(f"config (profile){surface}", doc, lambda name: _at_fault(name, where, value), parser)


@settings(max_examples=1000, deadline=None)
@given(where=st.sampled_from(PATHS), value=_json)
def test_one_value_replaced(where: tuple[Any, ...], value: Any) -> None:
    _fuzz_replaced(where, value)
    # The node agent's file: each entry carries its resourceName and plugin; a bad one is refused
    # on its own, exactly as the profile's config is; the file and the other entries stay usable.
    doc = _replace(VALID, where, value)
    body = doc if isinstance(doc, dict) else {}
    serial, other = parse_node_config(
        {"profiles": [{"profile": "serial", "mode": "DevicePlugin", **body}, GOOD_ENTRY]}
    )
    assert other.config is not None and other.error == ""
    try:
        alone: AgentConfig | str = parse(
            {"resourceName": body.get("resourceName"), "plugin": body.get("plugin")}
        )
    except ConfigError as e:
        alone = str(e)
    if serial.config is None:
        assert serial.error == alone or (
            serial.error.startswith("profiles[0].") and _resolves(serial.error.partition(": ")[0][12:], body)
        ), (serial.error, alone)
        tally("config (node agent entry)", "refused")
    else:
        assert serial.config == alone and serial.error == "", (serial.config, alone)
        tally("config (node agent entry)", "accepted")


#: Every key and list item of the valid config, each left out once.
REMOVABLE = [p for p in PATHS if p]


def _fuzz_removed(
    where: tuple[Any, ...], parser: Callable[[Any], AgentConfig] = parse, surface: str = ""
) -> None:
    doc = _remove(VALID, where)
    _judge(f"config (profile, one left out){surface}", doc, lambda name: _at_fault(name, where, None), parser)


@settings(max_examples=100, deadline=None)
@given(where=st.sampled_from(REMOVABLE))
def test_one_value_left_out(where: tuple[Any, ...]) -> None:
    _fuzz_removed(where)


def test_the_valid_config_is_valid() -> None:
    cfg = parse(VALID)
    assert cfg.resource_name == "example.com/serial"
    assert _accepted_wrong(VALID, cfg) == ""


GROUPED = {
    "profile": "serial",
    "mode": "DevicePlugin",
    **VALID,
    "nodeGroups": [
        {
            "name": "fast",
            "nodeSelectorTerms": [[{"key": "fast", "operator": "Exists"}]],
            "plugin": copy.deepcopy(VALID["plugin"]),
        }
    ],
}
GROUP_PATHS = [p for p in _paths(GROUPED) if p[:1] == ("nodeGroups",)]


@settings(max_examples=500, deadline=None)
@given(where=st.sampled_from(GROUP_PATHS), value=_json)
def test_one_value_of_a_node_group_replaced(where: tuple[Any, ...], value: Any) -> None:
    """A bad node group never spoils the file nor the other entries; the node it concerns is
    refused with an error naming the field (`nodeGroups[0].plugin...`, or the entry's path when
    the list itself is unusable); a node of no group is served whenever only the group is bad;
    what a node is served is its group's plugin (or the entry's), exactly."""
    entry = _replace(GROUPED, where, value)
    grouped, other = parse_node_config({"profiles": [entry, {**GROUPED, "profile": "other"}]})
    assert other.for_labels({"fast": ""}).config is not None
    for labels in ({}, {"fast": ""}):
        chosen = grouped.for_labels(labels)
        if chosen.config is None:
            name = chosen.error.partition(": ")[0].removeprefix("profiles[0].")
            assert _at_fault(name, where, value), chosen.error
            tally("config (node group)", "refused")
        else:
            why = _accepted_wrong(
                {"resourceName": entry.get("resourceName"), "plugin": chosen.raw.get("plugin")}, chosen.config
            )
            assert not why, why
            tally("config (node group)", "accepted")


def _blames_plugin(doc: Any) -> AgentConfig:
    """Broken on purpose: every refusal said to be `plugin`'s (the old judge passed any message
    that said `plugin`)."""
    try:
        return parse(doc)
    except ConfigError as e:
        raise ConfigError("plugin", str(e).removeprefix(f"{e.field}: ")) from None


def _loses_the_probe(doc: Any) -> AgentConfig:
    """Broken on purpose: `plugin.health.exec` read and then dropped."""
    return dataclasses.replace(cfg := parse(doc), health=dataclasses.replace(cfg.health, exec=None))


def _no_replicas_minimum(doc: Any) -> AgentConfig:
    """Broken on purpose: `plugin.sharing.replicas` taken as it comes, the minimum not checked."""
    replicas = _lookup(doc, ("plugin", "sharing", "replicas"))
    if not isinstance(replicas, int) or isinstance(replicas, bool) or replicas >= 1:
        return parse(doc)
    return dataclasses.replace(parse(_replace(doc, ("plugin", "sharing", "replicas"), 1)), replicas=replicas)


def test_the_refusal_judge_fails_a_parser_that_blames_the_wrong_field() -> None:
    """The replaced-value fuzzer (PROVE) with a parser that blames `plugin` for every refusal:
    the judge fails (the old one passed it: its message says `plugin`); the real parser passes."""

    @PROVE
    @given(where=st.sampled_from(PATHS), value=_json)
    def fuzz_broken(where: tuple[Any, ...], value: Any) -> None:
        _fuzz_replaced(where, value, _blames_plugin, ", broken on purpose")

    with pytest.raises(AssertionError, match="refusal does not name the field at fault"):
        fuzz_broken()
    _fuzz_replaced(("plugin", "sharing", "replicas"), 0)


def _fuzz_lost(parser: Callable[[Any], AgentConfig]) -> None:
    @PROVE
    @given(where=st.sampled_from(REMOVABLE))
    def fuzz(where: tuple[Any, ...]) -> None:
        _fuzz_removed(where, parser, ", broken on purpose")

    fuzz()


def _fuzz_replicas(parser: Callable[[Any], AgentConfig]) -> None:
    @PROVE
    @given(replicas=st.integers(min_value=-2, max_value=3))
    def fuzz(replicas: int) -> None:
        _fuzz_replaced(("plugin", "sharing", "replicas"), replicas, parser, ", broken on purpose")

    fuzz()


@pytest.mark.parametrize(
    ("parser", "fuzz", "says"),
    [
        (_loses_the_probe, _fuzz_lost, "does not hold the document's plugin.health.exec.command"),
        (_no_replicas_minimum, _fuzz_replicas, "out of its documented bounds: .'replicas 0 < 1'"),
    ],
)
def test_the_acceptance_judge_fails_a_parser_that_accepts_wrongly(
    parser: Callable[[Any], AgentConfig], fuzz: Callable[[Callable[[Any], AgentConfig]], None], says: str
) -> None:
    """The fuzzers (PROVE: a valid config with one value left out; with replicas from -2 to 3)
    with a parser broken on purpose: the acceptance judge fails; the real parser passes both."""
    with pytest.raises(AssertionError, match=says):
        fuzz(parser)
    fuzz(parse)
