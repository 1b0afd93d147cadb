"""The node agent's input: every profile one shared agent serves, and which of them select THIS node.

The operator renders one file for all the profiles that share the default agent (docs/design/
profile-contract.md): a list of entries, each the profile's name, mode (DevicePlugin or DRA; a DRA
entry names its driver), `resourceName` and `plugin` section (exactly the single-profile config,
`config.parse`), and `nodeSelectorTerms`: the node affinity terms of its agent (ORed terms of
ANDed expressions, the KEP-5004 exclusion of a DRA profile included), which the agent evaluates
against its own Node's labels with the scheduler's semantics.

Parsing never lets one entry spoil the others: an entry whose `plugin` is refused keeps its
`ConfigError`, and the node agent reports it in that profile's DeviceReport while the rest serve.
Pure: no I/O besides reading the file, no gRPC (like `config.py`).
"""

from __future__ import annotations

import enum
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

from patchbay_agent.config import AgentConfig, ConfigError, parse

#: The node config's key in the ConfigMap the operator renders.
NODE_CONFIG_KEY = "node.yaml"
_DNS_LABEL = re.compile(r"[a-z0-9]([-a-z0-9]*[a-z0-9])?")
_DNS_SUBDOMAIN = re.compile(r"[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*")
_OPERATORS = frozenset({"In", "NotIn", "Exists", "DoesNotExist", "Gt", "Lt"})


class Mode(enum.StrEnum):
    DEVICE_PLUGIN = "DevicePlugin"
    DRA = "DRA"


@dataclass(frozen=True)
class Expression:
    """One node selector requirement (`key`, `operator`, `values`)."""

    key: str
    operator: str
    values: tuple[str, ...] = ()

    def matches(self, labels: Mapping[str, str]) -> bool:
        """The scheduler's rule for one requirement (NotIn and DoesNotExist hold for a node
        without the label; Gt/Lt compare integers and fail on anything else)."""
        value = labels.get(self.key)
        op = self.operator
        if op == "In":
            return value is not None and value in self.values
        if op == "NotIn":
            return value is None or value not in self.values
        if op == "Exists":
            return value is not None
        if op == "DoesNotExist":
            return value is None
        try:
            have, want = int(value or ""), int(self.values[0])
        except (ValueError, IndexError):
            return False
        return have > want if op == "Gt" else have < want


@dataclass(frozen=True)
class ProfileEntry:
    """One profile the shared agent may serve."""

    profile: str
    mode: Mode
    #: ORed terms of ANDed expressions; no term at all selects every node
    terms: tuple[tuple[Expression, ...], ...]
    #: the parsed `resourceName` + `plugin`; None when refused (then `error` says why)
    config: AgentConfig | None
    #: the raw `resourceName` + `plugin`, compared to tell a changed entry from an unchanged one
    raw: Mapping[str, Any] = field(compare=False, repr=False)
    driver: str = ""
    error: str = ""

    def selects(self, labels: Mapping[str, str]) -> bool:
        if not self.terms:
            return True
        return any(all(e.matches(labels) for e in term) for term in self.terms)

    @property
    def key(self) -> tuple[object, ...]:
        """What serving this entry depends on: a change of it restarts the entry's unit."""
        return (self.mode, self.driver, yaml.safe_dump(dict(self.raw), sort_keys=True))


def _terms(raw: Any, path: str) -> tuple[tuple[Expression, ...], ...]:
    if raw is None:
        return ()
    if not isinstance(raw, list):
        raise ConfigError(path, "must be a list of node selector terms")
    terms = []
    for i, term in enumerate(raw):
        exprs = term.get("matchExpressions") if isinstance(term, Mapping) else term
        if not isinstance(exprs, list):
            raise ConfigError(f"{path}[{i}]", "must be a list of expressions")
        out = []
        for j, e in enumerate(exprs):
            where = f"{path}[{i}][{j}]"
            if not isinstance(e, Mapping) or not isinstance(e.get("key"), str):
                raise ConfigError(where, "must be an expression with a key")
            if e.get("operator") not in _OPERATORS:
                raise ConfigError(f"{where}.operator", f"must be one of {sorted(_OPERATORS)}")
            values = e.get("values") or []
            if not isinstance(values, list) or not all(isinstance(v, str) for v in values):
                raise ConfigError(f"{where}.values", "must be a list of strings")
            out.append(Expression(e["key"], e["operator"], tuple(values)))
        terms.append(tuple(out))
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
        name = item.get("profile")
        if not isinstance(name, str) or len(name) > 63 or not _DNS_LABEL.fullmatch(name):
            raise ConfigError(f"{path}.profile", "must be a profile name (a DNS label)")
        if name in seen:
            raise ConfigError(f"{path}.profile", f"{name!r} is listed twice")
        seen.add(name)
        body = {"resourceName": item.get("resourceName"), "plugin": item.get("plugin")}
        try:
            mode = Mode(item.get("mode", Mode.DEVICE_PLUGIN))
        except ValueError:
            mode = Mode.DEVICE_PLUGIN
        driver = str(item.get("driver") or "")
        config: AgentConfig | None = None
        error = ""
        try:
            if item.get("mode", Mode.DEVICE_PLUGIN) not in tuple(Mode):
                raise ConfigError(f"{path}.mode", f"must be one of {[m.value for m in Mode]}")
            if mode is Mode.DRA and (len(driver) > 63 or not _DNS_SUBDOMAIN.fullmatch(driver)):
                raise ConfigError(f"{path}.driver", "a DRA entry needs a driver name (a DNS subdomain)")
            terms = _terms(item.get("nodeSelectorTerms"), f"{path}.nodeSelectorTerms")
            config = parse(body)
        except ConfigError as e:
            error = str(e)
            terms = () if "nodeSelectorTerms" in error else _safe_terms(item, path)
        entries.append(ProfileEntry(name, mode, terms, config, body, driver, error))
    return entries


def _safe_terms(item: Mapping[str, Any], path: str) -> tuple[tuple[Expression, ...], ...]:
    try:
        return _terms(item.get("nodeSelectorTerms"), f"{path}.nodeSelectorTerms")
    except ConfigError:
        return ()


def load_node_config(path: str | Path) -> list[ProfileEntry]:
    """Read and parse the node config file the operator mounts."""
    p = Path(path)
    try:
        text = p.read_text(encoding="utf-8")
    except OSError as e:
        raise ConfigError("config", f"cannot read {p}: {e.strerror or e}") from None
    try:
        raw = yaml.safe_load(text)
    except yaml.YAMLError as e:
        raise ConfigError("config", f"{p} is not valid YAML: {e}") from None
    return parse_node_config(raw)


def selected(entries: Sequence[ProfileEntry], labels: Mapping[str, str]) -> list[ProfileEntry]:
    """The entries whose terms select a node with these labels."""
    return [e for e in entries if e.selects(labels)]
