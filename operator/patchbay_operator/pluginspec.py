"""A profile's ``spec.plugin`` (the agent's configuration) as the operator reads it: typed, in one place.

The operator does not interpret the agent's configuration: it hands ``spec.plugin`` to the agents
verbatim (render.py writes it into their ConfigMap) and the agent parses and validates all of it
(``patchbay_agent.config``). It acts on three of its fields only, and reads them here and nowhere
else:

- ``sharing.replicas``: how many pods or claims may hold a device at once (the kubelet counts each
  device that many times; a DRA profile's sharing needs consumable capacity);
- ``allocation.cdi.kind``: the CDI kind of a DevicePlugin profile's CDI names (two profiles must
  not share one, and only then does the agent get the runtime's CDI directory);
- ``partitions.slots``: whether a DRA profile's devices are cut into partitions (a profile whose
  agents find the API server drops counters is Degraded).

The CRD (crds/) is the source of truth: the API server validates and defaults ``spec.plugin`` at
admission, so what the operator reads has been admitted. ``FIELDS`` mirrors the CRD for the fields
read here (their paths and their value when absent), and a unit test checks it against the CRD
and this parser against the agent's on the same documents.

A node group's ``plugin`` (``spec.nodeGroups[].plugin``) is partial: ``merge`` lays it over
``spec.plugin``, and the result is a ``PluginSpec`` like any other, handed to the agents whole.

Why the operator does not import the agent's parser: no program imports another (import-linter),
the operator's image installs the operator only, and the agent's parser refuses what a node agent
must refuse (a full validation with messages), where the operator needs two admitted values.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

REPLICAS = ("sharing", "replicas")
CDI_KIND = ("allocation", "cdi", "kind")
PARTITION_SLOTS = ("partitions", "slots")
FIELDS: dict[tuple[str, ...], Any] = {REPLICAS: 1, CDI_KIND: None, PARTITION_SLOTS: None}
"""Every field of ``spec.plugin`` the operator reads (its path below ``plugin``) and its value when
absent: the CRD's default, or None where the CRD has none."""


def _at(document: Mapping[str, Any], path: tuple[str, ...]) -> Any:
    """The value at ``path``, or the field's value when absent (``FIELDS``)."""
    value: Any = document
    for key in path:
        if not isinstance(value, Mapping) or value.get(key) is None:
            return FIELDS[path]
        value = value[key]
    return value


@dataclass(frozen=True)
class PluginSpec:
    """``spec.plugin``: the section verbatim (for the agents) and the fields the operator reads."""

    #: the section as the profile has it, handed to the agents unchanged
    document: Mapping[str, Any] = field(default_factory=dict)
    #: ``sharing.replicas``
    replicas: int = 1
    #: ``allocation.cdi.kind``, or None (the agent then names no CDI devices for the device plugin)
    cdi_kind: str | None = None
    #: ``partitions.slots``: how many slots each device is cut into; 0 when offered whole
    partition_slots: int = 0

    @classmethod
    def parse(cls, plugin: Mapping[str, Any] | None) -> PluginSpec:
        document = dict(plugin or {})
        kind = _at(document, CDI_KIND)
        return cls(
            document,
            int(_at(document, REPLICAS) or 1),
            str(kind) if kind else None,
            int(_at(document, PARTITION_SLOTS) or 0),
        )


#: The top-level keys of ``spec.plugin`` that a node group replaces whole instead of merging: a
#: discovery backend is one choice among several (``paths`` merged into ``pci`` would be two).
REPLACED_WHOLE = frozenset({"discovery"})


def merge(base: Mapping[str, Any], override: Mapping[str, Any]) -> dict[str, Any]:
    """``override`` (a node group's partial ``plugin``) deep-merged over ``base`` (``spec.plugin``):
    mappings merge key by key, lists and values replace, ``REPLACED_WHOLE`` keys replace whole;
    a null leaves the base's value. Neither input is changed (the registry's profiles are
    shared). Pure and total: what comes out is checked by whoever reads it (the agent's parser,
    as for ``spec.plugin``), and the CRD has checked each part at admission."""
    return _merge(base, override, top=True)


def _merge(base: Mapping[str, Any], override: Mapping[str, Any], *, top: bool) -> dict[str, Any]:
    out: dict[str, Any] = {k: plain(v) for k, v in base.items()}
    for key, value in override.items():
        if value is None:
            continue
        old = out.get(key)
        if isinstance(value, Mapping) and isinstance(old, Mapping) and not (top and key in REPLACED_WHOLE):
            out[key] = _merge(old, value, top=False)
        else:
            out[key] = plain(value)
    return out


def plain(value: Any) -> Any:
    """A deep copy into plain dicts and lists (kopf hands over read-only views, and the registry's
    documents are shared: a copy is never the original)."""
    if isinstance(value, Mapping):
        return {str(k): plain(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [plain(v) for v in value]
    return value
