"""A profile's revisions and which one each node serves: ONE definition for the operator and agents.

A revision is what agents or node capacity act on (``revision_data``: ``resourceName``, ``mode``,
``plugin``, ``nodeGroups``, ``nodeSelector`` and, for Static, ``capacity``), named by a hash of its
canonical JSON (sorted keys), so an edit of anything else (labels, annotations, the agent's pod
settings) makes no revision. The operator keeps each as a ControllerRevision
``<profile>-<hash>`` (docs/design/staged-rollouts.md).

Which revision a node serves is a pure function of inputs that do not grow with the nodes
(``Rollout.served``): the operator computes it to choose "the next k nodes" (``threshold_for``)
and every agent computes it for its own node, from its name, its labels and the profile's uid.
Standard library only (this package's rule).
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

from patchbay_api.selectors import label_selector_matches

HASH_LENGTH = 10
"""Hex digits of a revision's hash (a ControllerRevision's ``controller-revision-hash``); the CRD
caps profile names at 52, so ``<profile>-<hash>`` stays a DNS label."""
LABEL_REVISION_HASH = "controller-revision-hash"
"""The label a ControllerRevision carries with its hash (the DaemonSet controller's own name)."""
DEFAULT_HISTORY_LIMIT = 10
"""``spec.revisionHistoryLimit`` when absent: revisions kept besides those in use."""
EVERYONE = 1 << 64
"""The threshold above every node's ``node_hash``: every node serves the update revision."""
NOBODY = 0
"""The threshold below every node's ``node_hash``: only the canaries and exceptions move."""

_DATA_FIELDS = ("resourceName", "mode", "plugin", "nodeGroups", "nodeSelector")


def revision_data(spec: Mapping[str, Any]) -> dict[str, Any]:
    """What a revision holds of a profile's spec: only what agents or node capacity act on. An
    absent field is left out (so adding ``nodeSelector: {}`` is a change, as it is to the API)."""
    data = {k: spec[k] for k in _DATA_FIELDS if spec.get(k) is not None}
    static = spec.get("static")
    if spec.get("mode") == "Static" and isinstance(static, Mapping):
        data["capacity"] = {
            k: static[k] for k in ("capacity", "capacityFromLabel") if static.get(k) is not None
        }
    return data


def canonical(data: Mapping[str, Any]) -> str:
    """The canonical JSON of a revision's data: sorted keys, no spaces (the hashed text)."""
    return json.dumps(data, sort_keys=True, separators=(",", ":"), ensure_ascii=False)


def revision_hash(data: Mapping[str, Any]) -> str:
    """The revision's name part: the first ``HASH_LENGTH`` hex digits of sha256(canonical JSON)."""
    return hashlib.sha256(canonical(data).encode()).hexdigest()[:HASH_LENGTH]


def spec_revision(spec: Mapping[str, Any]) -> str:
    """The hash of the revision a spec makes."""
    return revision_hash(revision_data(spec))


def revision_name(profile: str, digest: str) -> str:
    """The ControllerRevision's name: ``<profile>-<hash>``."""
    return f"{profile}-{digest}"


def node_hash(uid: str, node: str) -> int:
    """h(node): the first 8 bytes of sha256(profile uid + "/" + node name), as an integer."""
    return int.from_bytes(hashlib.sha256(f"{uid}/{node}".encode()).digest()[:8], "big")


@dataclass(frozen=True)
class Rollout:
    """The ``rollout`` stanza of a profile's entry in the agents' config: which revision each node
    serves. ``threshold`` is in [NOBODY, EVERYONE]: a node with ``node_hash < threshold`` serves
    ``update``. With no rollout in progress ``current == update`` and every node serves it."""

    current: str
    update: str
    #: a label selector (matchLabels / matchExpressions); None selects no node
    canary_selector: Mapping[str, Any] | None = None
    threshold: int = EVERYONE
    #: node name -> the revision it serves whatever the rest says (put back after a halt, held)
    exceptions: Mapping[str, str] = field(default_factory=dict)

    @classmethod
    def settled(cls, revision: str) -> Rollout:
        """No rollout in progress: every node serves ``revision``."""
        return cls(revision, revision)

    def served(self, uid: str, node: str, labels: Mapping[str, str]) -> str:
        """The revision ``node`` serves (docs/design/staged-rollouts.md): its exception, else the
        update when the canary selector selects it or its hash is under the threshold, else the
        current one."""
        held = self.exceptions.get(node)
        if held is not None:
            return held
        if self.canary_selector is not None and label_selector_matches(self.canary_selector, labels):
            return self.update
        if node_hash(uid, node) < self.threshold:
            return self.update
        return self.current

    def as_dict(self) -> dict[str, Any]:
        """The stanza as the operator writes it into the agents' config."""
        return {
            "current": self.current,
            "update": self.update,
            "canarySelector": dict(self.canary_selector) if self.canary_selector is not None else None,
            "threshold": self.threshold,
            "exceptions": dict(sorted(self.exceptions.items())),
        }

    @classmethod
    def from_dict(cls, raw: Any) -> Rollout:
        """The stanza as an agent reads it; raises ValueError naming the field."""
        if not isinstance(raw, Mapping):
            raise ValueError("rollout: must be a mapping")
        current, update = raw.get("current"), raw.get("update")
        if not isinstance(current, str) or not current:
            raise ValueError("rollout.current: must be a revision hash")
        if not isinstance(update, str) or not update:
            raise ValueError("rollout.update: must be a revision hash")
        threshold = raw.get("threshold", EVERYONE)
        if (
            isinstance(threshold, bool)
            or not isinstance(threshold, int)
            or not NOBODY <= threshold <= EVERYONE
        ):
            raise ValueError(f"rollout.threshold: must be an integer in [0, 2^64], got {threshold!r}")
        selector = raw.get("canarySelector")
        if selector is not None:
            if not isinstance(selector, Mapping):
                raise ValueError("rollout.canarySelector: must be a label selector")
            try:
                label_selector_matches(selector, {})
            except ValueError as e:
                raise ValueError(f"rollout.canarySelector: {e}") from None
        exceptions = raw.get("exceptions") or {}
        if not isinstance(exceptions, Mapping) or not all(
            isinstance(k, str) and isinstance(v, str) and v for k, v in exceptions.items()
        ):
            raise ValueError("rollout.exceptions: must map node names to revision hashes")
        return cls(current, update, selector, threshold, dict(exceptions))


def threshold_for(uid: str, nodes: Iterable[str], k: int) -> int:
    """The threshold under which exactly the first ``k`` of ``nodes`` (sorted by ``node_hash``)
    fall: just above the k-th hash (NOBODY for k <= 0, EVERYONE for k >= len(nodes)). The
    operator picks "the next k nodes" with it without the agents knowing the other nodes."""
    hashes = sorted({node_hash(uid, n) for n in nodes})
    if k <= 0 or not hashes:
        return NOBODY
    if k >= len(hashes):
        return EVERYONE
    return hashes[k - 1] + 1
