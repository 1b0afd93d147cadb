"""The node agent's input: every profile one shared agent serves, and which of them select THIS node.

The operator renders one file for all the profiles that share the default agent (docs/design/
profile-contract.md): a list of entries, each the profile's name, mode (DevicePlugin or DRA; a DRA
entry names its driver), `resourceName` and `plugin` section (exactly the single-profile config,
`config.parse`), and `nodeSelectorTerms`: the node affinity terms of its agent (ORed terms of
ANDed expressions, the KEP-5004 exclusion of a DRA profile included), which the agent evaluates
against its own Node's labels with the scheduler's semantics.

An entry may carry `nodeGroups` (the profile's `spec.nodeGroups`): each a name, node selector
terms, and the group's `plugin`, already merged over the entry's by the operator. A node uses the
FIRST group whose terms select it, or the entry's own `plugin` (group `default`) when none does
(`ProfileEntry.for_labels`); the units run that choice, so a label change that moves the node to
another group reconfigures the unit as a changed profile does.

An entry names the revision its settings are (`revision`, a hash) and may carry the profile's
`uid`, a `rollout` stanza and other revisions' settings (`revisions`: hash -> the same fields as
an entry). A node serves the revision `patchbay_api.revisions.Rollout.served` names for its name
and labels (`ProfileEntry.for_node`), the one function the operator uses to choose which nodes
move; that revision's hash is in its DeviceReport (`revision`).

Parsing never lets one entry spoil the others: an entry whose `plugin` is refused keeps its
`ConfigError`, and the node agent reports it in that profile's DeviceReport while the rest serve;
a group whose `plugin` is refused keeps its own, reported only on the nodes of that group.
Pure: no I/O besides reading the file, no gRPC (like `config.py`).
"""

from __future__ import annotations

import enum
import json
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

from patchbay_agent.config import AgentConfig, ConfigError, parse, read_document
from patchbay_api import constants as api
from patchbay_api.revisions import Rollout
from patchbay_api.selectors import LabelSelector, Requirement, SelectorError, any_term_matches

#: The node config's key in the ConfigMap the operator renders.
NODE_CONFIG_KEY = "node.yaml"
_DNS_LABEL = re.compile(r"[a-z0-9]([-a-z0-9]*[a-z0-9])?")
_DNS_SUBDOMAIN = re.compile(r"[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*")
#: The node group of a node that no group selects (the entry's own `plugin`): the API's name.
DEFAULT_NODE_GROUP = api.DEFAULT_NODE_GROUP


class Mode(enum.StrEnum):
    DEVICE_PLUGIN = "DevicePlugin"
    DRA = "DRA"


#: ORed terms, each a node selector requirement list (ANDed) evaluated by the API package's one
#: evaluator with the scheduler's semantics. A term is the operator's label selector as
#: requirements, so an empty term (from an empty ``spec.nodeSelector``) selects every node.
Terms = tuple[LabelSelector, ...]


def _selects(terms: Terms, labels: Mapping[str, str]) -> bool:
    """ORed terms of ANDed expressions; no term at all selects every node (the file's rule)."""
    return not terms or any_term_matches(terms, labels)


@dataclass(frozen=True)
class GroupEntry:
    """One of a profile's node groups: the nodes its terms select are served with its plugin."""

    name: str
    terms: Terms
    #: the parsed `resourceName` + the group's (merged) `plugin`; None when refused (`error`)
    config: AgentConfig | None
    #: the group's raw `plugin`
    plugin: Mapping[str, Any] = field(compare=False, repr=False)
    error: str = ""


@dataclass(frozen=True)
class ProfileEntry:
    """One profile the shared agent may serve; with node groups, `for_labels` is the entry a
    given node serves."""

    profile: str
    mode: Mode
    #: ORed terms of ANDed expressions; no term at all selects every node
    terms: Terms
    #: the parsed `resourceName` + `plugin`; None when refused (then `error` says why)
    config: AgentConfig | None
    #: the raw `resourceName` + `plugin` (+ `nodeGroups`), compared to tell a changed entry from
    #: an unchanged one
    raw: Mapping[str, Any] = field(compare=False, repr=False)
    driver: str = ""
    error: str = ""
    #: the profile's node groups, in list order (the first that selects a node wins)
    groups: tuple[GroupEntry, ...] = ()
    #: in an entry `for_labels` chose: the group it serves ("" for a profile without groups)
    node_group: str = ""
    #: the hash of the profile's revision these settings are ("" from an operator older than
    #: revisions)
    revision: str = ""
    #: the profile's uid, which the assignment hashes with the node's name
    uid: str = ""
    #: which revision each node serves (None: every node serves this entry's own)
    rollout: Rollout | None = None
    #: the other revisions' settings a node may serve (`rollout`), each an entry of its own
    others: tuple[ProfileEntry, ...] = ()

    def for_node(self, node: str, labels: Mapping[str, str]) -> ProfileEntry:
        """The revision a node with this name and these labels serves (`Rollout.served`, the one
        function the operator uses too): this entry's own settings or one of `others`, without
        the rollout (what a unit runs). A revision the config does not carry (it cannot happen
        with the operator's config) is served as this entry's own."""
        chosen = self
        if self.rollout is not None:
            wanted = self.rollout.served(self.uid, node, labels)
            chosen = next((o for o in self.others if o.revision == wanted), self)
        return replace(chosen, uid=self.uid, rollout=None, others=())

    def selects(self, labels: Mapping[str, str]) -> bool:
        return _selects(self.terms, labels)

    def for_labels(self, labels: Mapping[str, str]) -> ProfileEntry:
        """The entry a node with these labels serves: itself without node groups; else the first
        group that selects the node (its config, its error), or the entry's own settings as group
        `default`. The result has no groups and names its `node_group`, so its `key` changes
        when a label change moves the node to another group (the unit is reconfigured)."""
        if not self.groups:
            return self
        group = next((g for g in self.groups if _selects(g.terms, labels)), None)
        if group is None:
            config, error, name = self.config, self.error, DEFAULT_NODE_GROUP
            raw = {k: v for k, v in self.raw.items() if k != "nodeGroups"}
        else:
            config, error, name = group.config, group.error, group.name
            raw = {"resourceName": self.raw.get("resourceName"), "plugin": group.plugin}
        if config is not None:
            config = replace(config, node_group=name)
        return replace(self, config=config, raw=raw, error=error, groups=(), node_group=name)

    @property
    def key(self) -> tuple[object, ...]:
        """What serving this entry depends on: a change of it restarts the entry's unit."""
        return (
            self.mode,
            self.driver,
            _canonical(self.raw),
            self.node_group,
            self.revision,
            self.uid,
            None if self.rollout is None else _canonical(self.rollout.as_dict()),
            tuple(o.key for o in self.others),
        )


def _canonical(value: Any) -> str:
    """`value` (a parsed config document's part) as one text that is equal exactly when the
    value is, whatever its keys' order."""
    try:
        return json.dumps(value, sort_keys=True, default=str)
    except TypeError:  # keys of mixed types (only a hand-written YAML file has them)
        return repr(value)


def _terms(raw: Any, path: str) -> Terms:
    if raw is None:
        return ()
    if not isinstance(raw, list):
        raise ConfigError(path, "must be a list of node selector terms")
    terms = []
    for i, term in enumerate(raw):
        exprs = term.get("matchExpressions") if isinstance(term, Mapping) else term
        if not isinstance(exprs, list):
            raise ConfigError(f"{path}[{i}]", "must be a list of expressions")
        try:
            requirements = [Requirement.parse(e, f"{path}[{i}][{j}]") for j, e in enumerate(exprs)]
        except SelectorError as e:
            raise ConfigError(e.field, e.problem) from None
        terms.append(LabelSelector.of_requirements(requirements))
    return tuple(terms)


def parse_node_config(raw: Any) -> list[ProfileEntry]:
    """Every entry, in order; raises ConfigError only when the file as a whole is unusable (not a
    mapping, no `profiles` list, an entry without a valid name, or a name twice)."""
    if not isinstance(raw, Mapping):
        raise ConfigError("config", "must be a mapping with a `profiles` list")
    items = raw.get("profiles")
    if not isinstance(items, list):
        raise ConfigError("profiles", "must be a list")
    entries: list[ProfileEntry] = []
    seen: set[str] = set()
    for i, item in enumerate(items):
        path = f"profiles[{i}]"
        if not isinstance(item, Mapping):
            raise ConfigError(path, "must be a mapping")
        name = _listed_name(item, "profile", path, seen)
        entry = _entry(item, path, name)
        uid = item.get("uid")
        uid = uid if isinstance(uid, str) else ""
        rollout: Rollout | None = None
        others: list[ProfileEntry] = []
        try:
            if item.get("rollout") is not None:
                try:
                    rollout = Rollout.from_dict(item["rollout"])
                except ValueError as e:
                    field_path, _, problem = str(e).partition(": ")
                    raise ConfigError(f"{path}.{field_path}", problem) from None
            bodies = item.get("revisions") or {}
            if not isinstance(bodies, Mapping):
                raise ConfigError(f"{path}.revisions", "must map revision hashes to their settings")
            for digest, body in sorted(bodies.items(), key=lambda kv: str(kv[0])):
                where = f"{path}.revisions.{digest}"
                if not isinstance(body, Mapping) or not isinstance(digest, str) or not digest:
                    raise ConfigError(where, "must be a revision's settings under its hash")
                others.append(_entry({**body, "revision": digest}, where, name))
        except ConfigError as e:
            entry = replace(entry, config=None, error=str(e), groups=())
            rollout, others = None, []
        entries.append(replace(entry, uid=uid, rollout=rollout, others=tuple(others)))
    return entries


def _entry(item: Mapping[str, Any], path: str, name: str) -> ProfileEntry:
    """One revision's settings of profile `name` (the entry's own, or one under `revisions`)."""
    body = {"resourceName": item.get("resourceName"), "plugin": item.get("plugin")}
    if item.get("nodeGroups") is not None:
        body["nodeGroups"] = item["nodeGroups"]
    groups: tuple[GroupEntry, ...] = ()
    try:
        mode = Mode(item.get("mode", Mode.DEVICE_PLUGIN))
    except ValueError:
        mode = Mode.DEVICE_PLUGIN
    driver = str(item.get("driver") or "")
    revision = item.get("revision")
    revision = revision if isinstance(revision, str) else ""
    config: AgentConfig | None = None
    error = ""
    try:
        if item.get("mode", Mode.DEVICE_PLUGIN) not in tuple(Mode):
            raise ConfigError(f"{path}.mode", f"must be one of {[m.value for m in Mode]}")
        if mode is Mode.DRA and (len(driver) > 63 or not _DNS_SUBDOMAIN.fullmatch(driver)):
            raise ConfigError(f"{path}.driver", "a DRA entry needs a driver name (a DNS subdomain)")
        terms = _terms(item.get("nodeSelectorTerms"), f"{path}.nodeSelectorTerms")
        groups = _groups(item.get("nodeGroups"), body["resourceName"], f"{path}.nodeGroups", revision)
        # The entry's own settings: what its nodes of no group (`default`) serve.
        config = replace(
            parse({"resourceName": body["resourceName"], "plugin": body["plugin"]}), revision=revision
        )
    except ConfigError as e:
        error = str(e)
        terms = () if "nodeSelectorTerms" in error else _safe_terms(item, path)
        if "nodeGroups" in error.partition(":")[0]:
            groups = ()  # the list is unusable: every node is refused with the entry's error
    return ProfileEntry(name, mode, terms, config, body, driver, error, groups, revision=revision)


def _listed_name(item: Mapping[str, Any], key: str, path: str, seen: set[str]) -> str:
    """`item[key]`, a DNS label not in `seen` (names listed before it, or reserved); added to
    `seen`. Raises ConfigError naming `<path>.<key>`."""
    name = item.get(key)
    if not isinstance(name, str) or len(name) > 63 or not _DNS_LABEL.fullmatch(name):
        raise ConfigError(f"{path}.{key}", f"must be a {key} name (a DNS label)")
    if name in seen:
        raise ConfigError(f"{path}.{key}", f"{name!r} is listed twice (or reserved)")
    seen.add(name)
    return name


def _groups(raw: Any, resource: Any, path: str, revision: str = "") -> tuple[GroupEntry, ...]:
    """The entry's node groups, in order. A group whose `plugin` is refused keeps its error (only
    its nodes are refused, naming the group's field: `nodeGroups[1].plugin.sharing.replicas`);
    a list that is not one, a group without a valid name or terms, or a name twice refuses the
    whole entry (raises)."""
    if raw is None:
        return ()
    if not isinstance(raw, list):
        raise ConfigError(path, "must be a list of node groups")
    out: list[GroupEntry] = []
    seen: set[str] = set()
    for i, item in enumerate(raw):
        where = f"{path}[{i}]"
        if not isinstance(item, Mapping):
            raise ConfigError(where, "must be a mapping")
        name = _listed_name(item, "name", where, seen | {DEFAULT_NODE_GROUP})
        seen.add(name)
        terms = _terms(item.get("nodeSelectorTerms"), f"{where}.nodeSelectorTerms")
        plugin = item.get("plugin")
        config: AgentConfig | None = None
        error = ""
        try:
            config = replace(parse({"resourceName": resource, "plugin": plugin}), revision=revision)
        except ConfigError as e:
            # The group's path in the profile's terms (`nodeGroups[1].plugin...`), not the node
            # config's: the message is read in the profile's status.
            field_path = e.field if e.field.startswith("plugin") else f"plugin ({e.field})"
            error = f"nodeGroups[{i}].{field_path}: {str(e).partition(': ')[2]}"
        out.append(GroupEntry(name, terms, config, plugin if isinstance(plugin, Mapping) else {}, error))
    return tuple(out)


def _safe_terms(item: Mapping[str, Any], path: str) -> Terms:
    try:
        return _terms(item.get("nodeSelectorTerms"), f"{path}.nodeSelectorTerms")
    except ConfigError:
        return ()


def load_node_config(path: str | Path) -> list[ProfileEntry]:
    """Read and parse the node config file the operator mounts."""
    return parse_node_config(read_document(Path(path)))


def selected(
    entries: Sequence[ProfileEntry], labels: Mapping[str, str], node: str = ""
) -> list[ProfileEntry]:
    """The entries whose terms select a node with this name and these labels, each as this node
    serves it: its revision chosen (`ProfileEntry.for_node`), then its node group
    (`ProfileEntry.for_labels`)."""
    chosen = (e.for_node(node, labels) for e in entries)
    return [e.for_labels(labels) for e in chosen if e.selects(labels)]
