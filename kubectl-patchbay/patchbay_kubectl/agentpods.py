"""Which agent pods serve a profile on a node, and whether the profile is registered there. Pure.

Two shapes of agent serve DevicePlugin and DRA profiles (docs/architecture.md):

* the shared node agent: ONE DaemonSet (``patchbay-node-agent``) whose pods carry
  ``patchbay.dev/agent=shared`` and no profile label; each pod serves every profile of its node's
  config (the ConfigMap's ``node.yaml``: one entry per profile that leaves ``spec.agent`` alone,
  with the node selector terms the pod evaluates against its own Node's labels, the KEP-5004
  exclusion of a DRA twin included);
* an agent of a profile's own (``spec.agent`` set): pods labelled ``patchbay.dev/profile=<name>``.

During a rollout a node has two pods of one DaemonSet (the old one serves until the new one is
Ready), and while a profile moves from one shape to the other, one pod of each: every one of them
is the profile's agent there. Which pod serves a profile on a node is, first, what the agent
itself says: its DeviceReport names the pod that wrote it (``agent``; the chart's admission
policy makes it the writer's own pod); then the shape the profile asks for, and for the shared
node agent its node's config.

Registration: an agent pod is Ready only once the kubelet holds its registration (the readiness
probe; the node agent's once every profile it serves registered or failed), and the node agent
reports a profile it cannot serve in that profile's DeviceReport (``agentError``: its config was
refused, or its discovery or front-end failed and is being restarted; its other profiles keep
serving). So a profile is registered on a node when one of its agent pods there is Ready and its
report carries no ``agentError``; a pod of the node agent counts only once the profile's report
is there (its readiness speaks for all its profiles, the report for this one).
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import yaml

from patchbay_api import constants as api
from patchbay_api.selectors import LabelSelector, Requirement, SelectorError, any_term_matches

Obj = dict[str, Any]

LABEL_PROFILE = api.LABEL_PROFILE
LABEL_SHARED = api.LABEL_SHARED_AGENT
SHARED_VALUE = api.SHARED_AGENT_VALUE
AGENT_SELECTOR = f"{api.LABEL_NAME}={api.AGENT_NAME}"
#: The shared node agent's pods and its ConfigMap (profiles without an agent section of their own).
SHARED_AGENT_SELECTOR = f"{AGENT_SELECTOR},{LABEL_SHARED}={SHARED_VALUE}"
#: The key of the node agent's config in its ConfigMap (the operator's render.NODE_CONFIG_KEY).
NODE_CONFIG_KEY = "node.yaml"

NodeConfig = Mapping[str, Sequence[Any]]
"""The shared node agent's config as the plugin uses it: profile -> its nodeSelectorTerms."""


def _meta(obj: Obj) -> Obj:
    return obj.get("metadata") or {}


def _node_of(pod: Obj) -> str:
    return str((pod.get("spec") or {}).get("nodeName") or "")


def is_ready(pod: Obj) -> bool:
    """The pod's Ready condition is True."""
    conds = (pod.get("status") or {}).get("conditions") or []
    return any(c.get("type") == "Ready" and c.get("status") == "True" for c in conds)


def is_shared(pod: Obj) -> bool:
    """A pod of the shared node agent."""
    return (_meta(pod).get("labels") or {}).get(LABEL_SHARED) == SHARED_VALUE


def uses_shared_agent(profile: Obj) -> bool:
    """A profile without ``spec.agent`` is served by the shared node agent (even an empty
    ``agent: {}`` gives it agents of its own, as the operator reads it)."""
    return "agent" not in (profile.get("spec") or {})


def node_config(configmaps: Iterable[Obj]) -> dict[str, list[Any]]:
    """The shared node agent's config from its ConfigMap(s) (one per namespace; with ``-A`` a
    stale one may be there too): every entry's profile -> its node selector terms. An entry the
    file does not parse into is left out (the agent reports that profile's ``agentError``)."""
    out: dict[str, list[Any]] = {}
    for cm in configmaps:
        try:
            doc = yaml.safe_load(str((cm.get("data") or {}).get(NODE_CONFIG_KEY) or "")) or {}
        except yaml.YAMLError:
            continue
        for entry in (doc.get("profiles") if isinstance(doc, dict) else None) or []:
            if isinstance(entry, dict) and entry.get("profile"):
                out.setdefault(str(entry["profile"]), list(entry.get("nodeSelectorTerms") or []))
    return out


def terms_select(terms: Sequence[Any], labels: Mapping[str, str]) -> bool:
    """The node config's ``nodeSelectorTerms`` (ORed terms, each a list of ANDed requirements, as
    the operator renders them) against a node's labels, with the scheduler's semantics
    (``patchbay_api.selectors``). No term selects no node; a term the plugin cannot read selects
    none (the agent reports that profile's ``agentError``)."""
    parsed = []
    for i, term in enumerate(terms):
        if not isinstance(term, list):
            continue
        try:
            parsed.append(
                LabelSelector.of_requirements(
                    Requirement.parse(e, f"nodeSelectorTerms[{i}][{j}]") for j, e in enumerate(term)
                )
            )
        except SelectorError:
            continue
    return any_term_matches(parsed, labels)


@dataclass
class AgentPods:
    """Agent pods indexed for the question "who serves profile P on node N"."""

    #: (profile, node) -> pods of the profile's own agent there
    own: dict[tuple[str, str], list[Obj]] = field(default_factory=lambda: defaultdict(list))
    #: node -> the shared node agent's pods there ("" for pods not scheduled yet)
    shared: dict[str, list[Obj]] = field(default_factory=lambda: defaultdict(list))
    #: the shared node agent's config (profile -> node selector terms); None when not read
    config: NodeConfig | None = None

    @classmethod
    def of(cls, pods: Iterable[Obj], config: NodeConfig | None = None) -> AgentPods:
        index = cls(config=config)
        for pod in pods:
            labels = _meta(pod).get("labels") or {}
            if is_shared(pod):
                index.shared[_node_of(pod)].append(pod)
            elif labels.get(LABEL_PROFILE):
                index.own[(str(labels[LABEL_PROFILE]), _node_of(pod))].append(pod)
        return index

    def shared_serves(self, profile: Obj, labels: Mapping[str, str]) -> bool:
        """The shared node agent serves ``profile`` on a node with ``labels``: the profile leaves
        its agent to it and the node's config selects the node for it (without the config, the
        profile's own selection of the node, which the caller made, stands)."""
        if not uses_shared_agent(profile):
            return False
        if self.config is None:
            return True
        terms = self.config.get(str(_meta(profile).get("name", "")))
        return terms is not None and terms_select(terms, labels)

    def shared_serving(
        self, profile: Obj, node: str, labels: Mapping[str, str], report: Obj | None
    ) -> list[Obj]:
        """The shared node agent's pods on ``node`` when they serve ``profile`` there, or when the
        profile's report names one of them (the profile has just left the shared agent, whose
        pod still serves it); else none."""
        here = self.shared.get(node, [])
        writer = str((report or {}).get("agent") or "")
        if self.shared_serves(profile, labels) or any(_meta(p).get("name") == writer for p in here):
            return list(here)
        return []

    def serving(self, profile: Obj, node: str, labels: Mapping[str, str], report: Obj | None) -> list[Obj]:
        """The pods that serve ``profile`` on ``node``, of either shape, sorted by name."""
        pods = self.own.get((str(_meta(profile).get("name", "")), node), [])
        pods = pods + self.shared_serving(profile, node, labels, report)
        return sorted(pods, key=lambda p: str(_meta(p).get("name", "")))

    def unscheduled_shared(self) -> list[Obj]:
        """The shared node agent's pods that have no node (yet): they hold up every shared profile."""
        return list(self.shared.get("", []))


def registered(pods: Sequence[Obj], report: Obj | None) -> bool:
    """See the module doc: a Ready agent pod, and no ``agentError`` in the profile's report; a
    node agent's pod only with the profile's report there (its readiness speaks for every
    profile it serves, the report for this one)."""
    if (report or {}).get("agentError"):
        return False
    return any(is_ready(p) and (report is not None or not is_shared(p)) for p in pods)


def agent_error(report: Obj | None) -> str:
    """The reason the node agent cannot serve the profile on the node ("" when it can)."""
    return str(((report or {}).get("agentError") or {}).get("reason") or "")
