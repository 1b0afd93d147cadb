"""The profile and the DeviceReport as Patchbay's programs read them: typed dictionaries.

The objects come from the API server as JSON; these ``TypedDict``s name the fields the programs
read, with their types, in one place that is checked: a program that annotates an object with
them gets its values typed (``report["summary"]["healthy"]`` is an ``int``). Every key is optional
(``total=False``): the programs read leniently, and the API server has already refused what the
schema does not allow. The CRDs in ``crds/`` are the truth: a unit test
walks every model here and fails on any field its schema does not have (and on an enum of
``constants`` that differs from the schema's).
"""

from __future__ import annotations

from typing import Any, TypedDict


class ObjectMeta(TypedDict, total=False):
    name: str
    namespace: str
    uid: str
    generation: int
    resourceVersion: str
    creationTimestamp: str
    deletionTimestamp: str
    labels: dict[str, str]
    annotations: dict[str, str]


class SelectorRequirement(TypedDict, total=False):
    key: str
    operator: str
    values: list[str]


class LabelSelectorSpec(TypedDict, total=False):
    matchLabels: dict[str, str]
    matchExpressions: list[SelectorRequirement]


class StaticSpec(TypedDict, total=False):
    capacity: int
    capacityFromLabel: str


class NodeGroupSpec(TypedDict, total=False):
    name: str
    nodeSelector: LabelSelectorSpec
    #: the group's partial ``plugin``, merged over ``spec.plugin`` (the agent's config: its own parser)
    plugin: dict[str, Any]


class AgentSpec(TypedDict, total=False):
    image: str
    imagePullPolicy: str
    resources: dict[str, Any]
    tolerations: list[dict[str, Any]]
    priorityClassName: str
    privileged: bool
    updateStrategy: dict[str, Any]


class CanarySpec(TypedDict, total=False):
    #: absent: 1; 0: no canary wave
    nodes: int
    nodeSelector: LabelSelectorSpec


class RolloutSpec(TypedDict, total=False):
    """``spec.rollout``: how a new revision reaches the nodes (docs/design/staged-rollouts.md).
    Every field may be absent; absent means the documented default, never written back."""

    strategy: str  # Staged (absent) | Immediate
    paused: bool
    canary: CanarySpec
    #: a count, or a percentage string such as "25%" (absent: 25%)
    maxNodesPerWave: int | str
    healthySeconds: int
    minHealthyPercent: int
    progressDeadlineSeconds: int
    onFailure: str  # Rollback (absent) | Pause


class ProfileSpec(TypedDict, total=False):
    resourceName: str
    mode: str  # constants.Mode
    #: absent or empty: every node (docs/api.md)
    nodeSelector: LabelSelectorSpec
    static: StaticSpec
    #: the agent's configuration (the agent's ``config.parse`` and the operator's ``pluginspec``)
    plugin: dict[str, Any]
    nodeGroups: list[NodeGroupSpec]
    agent: AgentSpec
    #: old ControllerRevisions kept besides the one in use (absent: revisions.DEFAULT_HISTORY_LIMIT)
    revisionHistoryLimit: int
    rollout: RolloutSpec


class Condition(TypedDict, total=False):
    type: str  # constants.ConditionType
    status: str
    observedGeneration: int
    lastTransitionTime: str
    reason: str  # constants.Reason
    message: str


class Problem(TypedDict, total=False):
    node: str
    device: str
    reason: str
    message: str
    since: str


class NodeGroupStatus(TypedDict, total=False):
    name: str
    nodes: int
    matching: int


class RolloutStatus(TypedDict, total=False):
    """``status.rollout``: where the change from currentRevision to updateRevision stands."""

    phase: str  # Progressing | Paused | Halted | Complete
    wave: int
    waveStartTime: str
    waveNodes: int
    #: a decimal string: the threshold reaches 2^64, past a JSON int64
    threshold: str
    haltedNodes: list[str]
    message: str
    #: node of the current wave -> the healthy devices it reported before it moved (the gate's
    #: "not fewer than before", kept for a restarted operator)
    baseline: dict[str, int]


class ProfileStatus(TypedDict, total=False):
    observedGeneration: int
    conditions: list[Condition]
    nodesReady: str
    devicesAllocatable: str
    problemCount: int
    problems: list[Problem]
    nodeGroups: list[NodeGroupStatus]
    #: the ControllerRevisions ``<profile>-<hash>`` nodes not yet moved serve, and moved ones serve
    currentRevision: str
    updateRevision: str
    #: nodes that should serve the profile; of them, those serving updateRevision; of those, the
    #: ones serving it without an agent error (a DaemonSet's names)
    desiredNumberScheduled: int
    updatedNumberScheduled: int
    updatedNumberReady: int
    rollout: RolloutStatus


class Profile(TypedDict, total=False):
    """A DevicePluginProfile (``crds/patchbay.dev_devicepluginprofiles.yaml``)."""

    apiVersion: str
    kind: str
    metadata: ObjectMeta
    spec: ProfileSpec
    status: ProfileStatus


class PodRef(TypedDict, total=False):
    namespace: str
    name: str
    container: str


class ReportedDevice(TypedDict, total=False):
    id: str
    health: str  # constants.DeviceHealth
    reason: str  # constants.HealthReason
    message: str
    since: str
    withheld: bool
    pods: list[PodRef]


class ReportSummary(TypedDict, total=False):
    total: int
    healthy: int
    unhealthy: int
    allocated: int
    withheld: int


class AgentError(TypedDict, total=False):
    reason: str
    message: str
    since: str


class AllocationFailure(TypedDict, total=False):
    time: str
    message: str


class AllocationFailures(TypedDict, total=False):
    """The kubelet's calls the agent answered with an error since ``since`` (its start)."""

    count: int
    since: str
    last: AllocationFailure


class DeviceReport(TypedDict, total=False):
    """One agent's DeviceReport (``crds/patchbay.dev_devicereports.yaml``)."""

    apiVersion: str
    kind: str
    metadata: ObjectMeta
    profile: str
    nodeName: str
    resourceName: str
    agent: str
    observedAt: str
    nodeGroup: str
    #: the hash of the profile's revision the agent serves (``patchbay_api.revisions``)
    revision: str
    deviceTaints: str  # constants.Served
    consumableCapacity: str  # constants.Served
    partitionableDevices: str  # constants.Served
    agentError: AgentError
    allocationFailures: AllocationFailures
    summary: ReportSummary
    devices: list[ReportedDevice]
