"""A profile's ``spec.plugin`` (the agent's configuration) as the operator reads it: typed, in one place.

The operator does not interpret the agent's configuration: it hands ``spec.plugin`` to the agents
verbatim (render.py writes it into their ConfigMap) and the agent parses and validates all of it
(``patchbay_agent.config``). It acts on two of its fields only, and reads them here and nowhere
else:

- ``sharing.replicas``: how many pods or claims may hold a device at once (the kubelet counts each
  device that many times; a DRA profile's sharing needs consumable capacity);
- ``allocation.cdi.kind``: the CDI kind of a DevicePlugin profile's CDI names (two profiles must
  not share one, and only then does the agent get the runtime's CDI directory).

The CRD (crds/) is the source of truth: the API server validates and defaults ``spec.plugin`` at
admission, so what the operator reads has been admitted. ``FIELDS`` mirrors the CRD for the fields
read here (their paths and their value when absent), and a unit test checks it against the CRD
and this parser against the agent's on the same documents.

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
FIELDS: dict[tuple[str, ...], Any] = {REPLICAS: 1, CDI_KIND: None}
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
    """``spec.plugin``: the section verbatim (for the agents) and the two fields the operator reads."""

    #: the section as the profile has it, handed to the agents unchanged
    document: Mapping[str, Any] = field(default_factory=dict)
    #: ``sharing.replicas``
    replicas: int = 1
    #: ``allocation.cdi.kind``, or None (the agent then names no CDI devices for the device plugin)
    cdi_kind: str | None = None

    @classmethod
    def parse(cls, plugin: Mapping[str, Any] | None) -> PluginSpec:
        document = dict(plugin or {})
        kind = _at(document, CDI_KIND)
        return cls(document, int(_at(document, REPLICAS) or 1), str(kind) if kind else None)
