"""DevicePlugin and DRA modes: a profile -> the agent's ConfigMap and DaemonSet (and, for DRA,
its DeviceClass), as plain dicts (pure).

Templates live in ``templates/`` and are rendered with Jinja2 ``StrictUndefined`` (a missing
value is an error, not an empty string); every value goes through ``tojson`` so no input can
break the YAML. Every agent is a node agent that follows its ConfigMap live (``node.yaml``: one
entry per profile it serves, `node_entry`, the rollout stanza included): the shared one serves
every profile without agent settings of its own, an agent of its own serves its one profile. No
pod template depends on the plugin settings, so a change of them reaches the agents in place,
wave by wave (staging.py), and only a change of the pod itself (``spec.agent``, the image) rolls
a DaemonSet.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Callable, Mapping, Sequence
from functools import cache
from typing import Any

import jinja2
import yaml

from patchbay_api.revisions import NOBODY, Rollout, spec_revision
from patchbay_operator.config import Settings
from patchbay_operator.constants import (
    AGENT_CONFIG_DIR,
    API_GROUP,
    API_VERSION,
    CONFIG_HASH_ANNOTATION,
    DEVICE_CLASS_API_VERSION,
    DEVICE_PLUGIN_DIR,
    DRA_DRIVER_SUFFIX,
    FIELD_MANAGER,
    HOST_ROOT,
    KIND,
    LABEL_COMPONENT,
    LABEL_INSTANCE,
    LABEL_MANAGED_BY,
    LABEL_NAME,
    LABEL_PROFILE,
    LABEL_SHARED_AGENT,
    NODE_AGENT_PLUGINS_DIR,
    SHARED_AGENT_VALUE,
    Mode,
)
from patchbay_operator.profiles import Profile, Selector

DEFAULT_RESOURCES: dict[str, Any] = {
    # Go plugins ask for 10-45 MiB; the Python agent (grpcio + pykube-ng) sits near 41 MiB.
    "requests": {"cpu": "10m", "memory": "64Mi"},
    "limits": {"memory": "128Mi"},
}

HARDENED: dict[str, Any] = {
    "allowPrivilegeEscalation": False,
    "privileged": False,
    "readOnlyRootFilesystem": True,
    "capabilities": {"drop": ["ALL"]},
}


def _tojson(value: Any) -> str:
    """JSON (valid YAML) for any value; an undefined one is an error even when nested.

    Jinja's own ``tojson`` hands an Undefined to ``json.dumps``, which fails with a confusing
    TypeError; this names the missing variable instead.
    """
    if isinstance(value, jinja2.Undefined):
        value._fail_with_undefined_error()
    return json.dumps(value, sort_keys=False)


@cache
def _env() -> jinja2.Environment:
    env = jinja2.Environment(
        loader=jinja2.PackageLoader("patchbay_operator", "templates"),
        undefined=jinja2.StrictUndefined,
        autoescape=False,  # noqa: S701 - YAML, not HTML; values are emitted with tojson
        keep_trailing_newline=True,
    )
    env.filters["tojson"] = _tojson
    return env


POD_RESOURCES_MOUNT = "/var/lib/kubelet/pod-resources"
"""Where the agent container sees the kubelet's pod-resources directory (whatever the node's
kubelet root dir is)."""

CDI_SPEC_MOUNT = "/var/run/cdi"
"""Where the agent container sees the runtime's CDI spec directory (whatever it is on the node)."""


def driver_name(profile: str) -> str:
    """A DRA profile's driver name, which is also its DeviceClass's name: ``<profile>.patchbay.dev``
    (the CRD caps DRA profile names at 50 characters, so this fits the 63 a driver may have)."""
    return f"{profile}{DRA_DRIVER_SUFFIX}"


def plugins_registry_dir(kubelet_root_dir: str) -> str:
    """Where the kubelet's plugin watcher looks for registration sockets (kubelet plugins, DRA)."""
    return f"{kubelet_root_dir.rstrip('/')}/plugins_registry"


#: sockaddr_un's path limit as the agent counts it (bytes, without the NUL).
_MAX_UNIX_SOCKET_PATH = 107


def dra_service_dir(kubelet_root_dir: str, driver: str) -> str:
    """The one directory under the kubelet's plugins directory that an agent of `driver` makes
    its endpoint socket in: `<plugins>/<driver>`, or `<plugins>/patchbay-<hash>` when a socket
    there would not fit sockaddr_un. The agent's own rule (`patchbay_agent.kubelet.draplugin.service_dir`,
    kept equal by tests/unit/operator/test_operator_dra.py): an agent of its own
    mounts only this directory, not every other driver's sockets."""
    plugins = kubelet_plugins_dir(kubelet_root_dir)
    plain = f"{plugins}/{driver}"
    if len(f"{plain}/dra-0123456789abcdef.sock".encode()) <= _MAX_UNIX_SOCKET_PATH:
        return plain
    return f"{plugins}/patchbay-{hashlib.sha256(driver.encode()).hexdigest()[:12]}"


def kubelet_plugins_dir(kubelet_root_dir: str) -> str:
    """The kubelet's plugins directory, which holds every CSI and DRA driver's directory. No agent
    mounts it whole: an agent of its own mounts only its driver's directory (`dra_service_dir`),
    the shared node agent only its own one (`node_agent_plugins_dir`)."""
    return f"{kubelet_root_dir.rstrip('/')}/plugins"


def node_agent_plugins_dir(kubelet_root_dir: str) -> str:
    """``<plugins>/patchbay_node-agent``: the shared node agent's one directory under the kubelet's
    plugins directory, in which it keeps a directory per DRA driver it serves (its sockets, lock
    file and claim records). Its pod template must not depend on which profiles it serves (it
    follows its ConfigMap live), so it cannot mount each driver's ``<plugins>/<driver>``; this one
    directory of its own keeps the other drivers' sockets out of its pod. The kubelet dials the
    endpoint the agent announces wherever it lies (docs/facts.md#dra-endpoint-path), and the
    container sees the directory at this same path. The agent's rule is
    `patchbay_agent.options.node_agent_plugins_dir` (kept equal by
    tests/unit/operator/test_operator_dra.py); the name is no DNS subdomain (the underscore), so
    no driver's own directory can be it."""
    return f"{kubelet_plugins_dir(kubelet_root_dir)}/{NODE_AGENT_PLUGINS_DIR}"


AGENT_NAME = "patchbay-agent"
"""The agents' ``app.kubernetes.io/name``: what the operator's DaemonSet informer selects on."""


def object_name(profile: str) -> str:
    """ConfigMap and DaemonSet name; the CRD caps profile names at 52 so this fits in 63."""
    return f"patchbay-{profile}"


def selector_labels(profile: str) -> dict[str, str]:
    return {LABEL_NAME: AGENT_NAME, LABEL_PROFILE: profile}


def labels(profile: str, mode: Mode = Mode.DEVICE_PLUGIN) -> dict[str, str]:
    """The agent objects' labels; the component says what the agent is to the kubelet."""
    return {
        **selector_labels(profile),
        LABEL_COMPONENT: "dra-driver" if mode is Mode.DRA else "device-plugin",
        LABEL_INSTANCE: profile,
        LABEL_MANAGED_BY: FIELD_MANAGER,
    }


def owner_reference(profile: Profile) -> dict[str, Any]:
    return {
        "apiVersion": f"{API_GROUP}/{API_VERSION}",
        "kind": KIND,
        "name": profile.name,
        "uid": profile.uid,
        "controller": True,
        "blockOwnerDeletion": True,
    }


def _render(template: str, **values: Any) -> dict[str, Any]:
    text = _env().get_template(template).render(**values)
    obj = yaml.safe_load(text)
    if not isinstance(obj, dict):
        raise TypeError(f"{template} did not render to a mapping")
    return obj


def device_class(profile: Profile) -> dict[str, Any]:
    """A DRA profile's DeviceClass: every device of its driver, and ``extendedResourceName`` so
    pods that request ``<resourceName>: N`` (unchanged, no ResourceClaim) are served by DRA."""
    driver = driver_name(profile.name)
    return _render(
        "deviceclass.yaml.j2",
        api_version=DEVICE_CLASS_API_VERSION,
        name=driver,
        labels=labels(profile.name, Mode.DRA),
        owner=owner_reference(profile),
        # The driver name is a DNS subdomain (the CRD checks the profile name), so it needs no
        # escaping inside the CEL string literal.
        expression=f'device.driver == "{driver}"',
        resource=profile.resource,
    )


def agent_objects(
    profile: Profile, settings: Settings, exclude: Selector | None = None, stage: Stage | None = None
) -> list[dict[str, Any]]:
    """[ConfigMap, DaemonSet] for a DevicePlugin profile, [ConfigMap, DaemonSet, DeviceClass] for
    a DRA one, ready for server-side apply.

    `exclude`: for a DRA profile, the selector of the profile that serves the same resource
    through node capacity (KEP-5004: never both ways on one node): the DaemonSet's node affinity
    leaves those nodes out, so a node matching both runs only the device plugin's agent.

    `stage`: how the profile's entry renders mid-rollout (staging.py; None: every node serves
    the spec). The agent of its own is a node agent serving this ONE profile: its ConfigMap holds
    a node config of one entry (`node_config`, as the shared agent's), its pods follow it
    (``--watch-config``) and reconfigure live, so its pod template depends only on
    ``spec.agent`` (image, resources, tolerations, privileged, ...), the node selector and the
    mode: a change of the plugin settings or node groups moves the nodes in waves, a change of
    ``spec.agent`` rolls the DaemonSet by its updateStrategy.

    The DRA agent is the DevicePlugin agent serving a DRA entry: the same hardening, account and
    report flags, but the kubelet's ``plugins_registry`` directory and the driver's own
    directory under ``plugins`` (`dra_service_dir`) instead of ``device-plugins``, and always the
    CDI spec directory (a DRA driver hands devices to containers through CDI only)."""
    agent: Mapping[str, Any] = profile.spec.get("agent") or {}
    strategy: Mapping[str, Any] = agent.get("updateStrategy") or {}
    name = object_name(profile.name)
    dra, driver = profile.mode is Mode.DRA, driver_name(profile.name)
    common = {
        "name": name,
        "object_namespace": settings.namespace,
        "labels": labels(profile.name, profile.mode),
        "owners": [owner_reference(profile)],
    }
    text = node_config([(profile, exclude)], stage)
    configmap = _render("configmap.yaml.j2", **common, data={NODE_CONFIG_KEY: text})
    security = {"privileged": True} if agent.get("privileged") else HARDENED
    daemonset = _render(
        "daemonset.yaml.j2",
        **common,
        selector_labels=selector_labels(profile.name),
        max_surge=strategy.get("maxSurge", 1),
        max_unavailable=strategy.get("maxUnavailable", 0),
        hash_annotation=CONFIG_HASH_ANNOTATION,
        # No config hash: the agent follows its ConfigMap and reconfigures live (as the shared one).
        config_hash="",
        priority_class=agent.get("priorityClassName") or "",
        node_selector_terms=[t for t in profile.selector.node_selector_terms(exclude) if t],
        tolerations=list(agent.get("tolerations") or []),
        image=agent.get("image") or settings.agent_image,
        pull_policy=agent.get("imagePullPolicy") or "",
        config_path=f"{AGENT_CONFIG_DIR}/{NODE_CONFIG_KEY}",
        config_dir=AGENT_CONFIG_DIR,
        device_plugin_dir=DEVICE_PLUGIN_DIR,
        host_root=HOST_ROOT,
        resources=agent.get("resources") or DEFAULT_RESOURCES,
        container_security=security,
        profile=profile.name,
        service_account=settings.agent_dra_service_account if dra else settings.agent_service_account,
        api_server=list(settings.agent_api_server) if settings.agent_api_server else None,
        kubelet_root_dir=settings.kubelet_root_dir,
        holder_labels=settings.agent_metrics_holder_labels,
        cdi_spec_dir=settings.cdi_spec_dir if dra or profile.cdi_kind else "",  # only where specs are written
        cdi_mount=CDI_SPEC_MOUNT,
        pod_resources_mount=POD_RESOURCES_MOUNT,
        dra_driver="",
        node_config=True,
        # One profile's agent: the shared node agent keeps the node's inventory, not this one;
        # its DRA driver's directory is its own (`dra_service_dir`), under the kubelet's plugins.
        own_agent=True,
        node_plugins_dir=kubelet_plugins_dir(settings.kubelet_root_dir),
        dra_mounts=dra,
        device_plugin_mounts=not dra,
        plugins_registry_dir=plugins_registry_dir(settings.kubelet_root_dir),
        # Its own driver's directory only (the shared node agent, serving several drivers from a
        # template that depends on no profile, mounts its one directory: node_agent_plugins_dir).
        kubelet_plugins_dir=dra_service_dir(settings.kubelet_root_dir, driver)
        if dra
        else kubelet_plugins_dir(settings.kubelet_root_dir),
    )
    if dra:
        return [configmap, daemonset, device_class(profile)]
    return [configmap, daemonset]


SHARED_AGENT = "patchbay-node-agent"
"""The shared agent's DaemonSet and ConfigMap (one per cluster, in the operator's namespace)."""
SHARED_LABEL = LABEL_SHARED_AGENT
SHARED_VALUE = SHARED_AGENT_VALUE
NODE_CONFIG_KEY = "node.yaml"


def shared_selector_labels() -> dict[str, str]:
    return {LABEL_NAME: AGENT_NAME, SHARED_LABEL: SHARED_VALUE}


def shared_labels() -> dict[str, str]:
    return {
        **shared_selector_labels(),
        LABEL_COMPONENT: "node-agent",
        LABEL_INSTANCE: SHARED_AGENT,
        LABEL_MANAGED_BY: FIELD_MANAGER,
    }


Stage = Callable[[Profile], tuple[Profile | None, Rollout]]
"""A profile -> its current revision as a profile (None: every node serves the spec's) and the
rollout stanza (staging.py's ``Staging.entry``)."""


def node_entry(
    profile: Profile,
    exclude: Selector | None = None,
    current: Profile | None = None,
    rollout: Rollout | None = None,
) -> dict[str, Any]:
    """One profile in the node agent's config (nodeconfig.py in the agent reads it): its name and
    uid, the revision it is (`revision`, the hash) and which revision each node serves
    (`rollout`, `patchbay_api.revisions.Rollout`), then that revision's settings: mode (and DRA
    driver), resourceName, plugin, and the node selector terms of its agent; with
    ``spec.nodeGroups``, each group in list order with its selector as ONE node selector term and
    its settings already merged over ``plugin`` (the agent chooses the first group whose term
    selects its node and validates that group's plugin as it validates ``plugin``). Merging here
    keeps the agent's side a choice, and the merge rule in one place (``pluginspec.merge``).

    `current`: the profile as its current revision had it, when nodes are still to move from it
    (staged rollouts: its settings go under ``revisions`` and the stanza keeps every node on it
    but the ones `rollout` moves, NOBODY when not given). None: every node serves ``profile``."""
    revision = spec_revision(profile.spec)
    stanza = Rollout.settled(revision)
    entry: dict[str, Any] = {"profile": profile.name, "uid": profile.uid, "revision": revision}
    entry |= _revision_body(profile, exclude)
    if current is not None and (was := spec_revision(current.spec)) != revision:
        stanza = rollout if rollout is not None else Rollout(was, revision, threshold=NOBODY)
        entry["revisions"] = {was: _revision_body(current, exclude)}
    entry["rollout"] = stanza.as_dict()
    return entry


def _revision_body(profile: Profile, exclude: Selector | None) -> dict[str, Any]:
    """What one revision of a profile tells the node agent (see `node_entry`)."""
    entry: dict[str, Any] = {
        "mode": profile.mode.value,
        "resourceName": profile.resource,
        "plugin": dict(profile.plugin.document),
        "nodeSelectorTerms": profile.selector.node_selector_terms(exclude),
    }
    if profile.node_groups:
        entry["nodeGroups"] = [
            {
                "name": g.name,
                "nodeSelectorTerms": [g.selector.as_node_affinity_terms()],
                "plugin": dict(g.plugin.document),
            }
            for g in profile.node_groups
        ]
    if profile.mode is Mode.DRA:
        entry["driver"] = driver_name(profile.name)
    return entry


CONFIGMAP_LIMIT = 1 << 20
"""What a ConfigMap's data may hold (the API server refuses more: 1 MiB)."""


def data_size(configmap: Mapping[str, Any]) -> int:
    """The bytes of a ConfigMap's data as the API server counts them (keys and values)."""
    return sum(len(k.encode()) + len(str(v).encode()) for k, v in (configmap.get("data") or {}).items())


def once(profiles: Sequence[tuple[Profile, Selector | None]], stage: Stage | None) -> Stage | None:
    """`stage` asked once per profile (the size check and the config then agree, and the rollout's
    state is read once per write)."""
    if stage is None:
        return None
    table = {p.name: stage(p) for p, _ in profiles}
    return lambda p: table[p.name]


def _entry(profile: Profile, exclude: Selector | None, stage: Stage | None) -> dict[str, Any]:
    """The profile's entry, staged when `stage` says a rollout is in progress."""
    if stage is None:
        return node_entry(profile, exclude)
    current, rollout = stage(profile)
    return node_entry(profile, exclude, current, rollout)


def entry_sizes(
    profiles: Sequence[tuple[Profile, Selector | None]], stage: Stage | None = None
) -> dict[str, int]:
    """Each profile's bytes in the node agent's ConfigMap, exactly: the file is `_HEAD`, the
    entries' dumps (`_dump_entry`) each followed by ",\n", and `_TAIL` (see `node_config`). One
    whose compact JSON is already twice `CONFIGMAP_LIMIT` is not dumped again (counted as the
    limit and one)."""
    sizes: dict[str, int] = {}
    for p, exclude in profiles:
        entry = _entry(p, exclude, stage)
        if len(json.dumps(entry)) > 2 * CONFIGMAP_LIMIT:
            sizes[p.name] = CONFIGMAP_LIMIT + 1
        else:
            sizes[p.name] = len(_dump_entry(entry)) + len(_SEPARATOR)
    return sizes


#: The node config's text around its entries: ``json.dumps({"profiles": [...]}, indent=2)``
#: exactly, so each entry's share of the size is known alone (`entry_sizes`).
_HEAD = '{\n  "profiles": [\n'
_SEPARATOR = ",\n"
#: After the last entry: its newline (one byte less than `_SEPARATOR`), the list's and the
#: document's ends and the file's last newline.
_TAIL = "\n  ]\n}\n"
_FRAME = len(_HEAD) + len(_TAIL) - len(_SEPARATOR)


def _dump_entry(entry: Mapping[str, Any]) -> str:
    """One entry as `node_config` writes it: JSON, keys sorted, indented as the list's item."""
    return "\n".join("    " + line for line in json.dumps(entry, indent=2, sort_keys=True).split("\n"))


def over_limit(profiles: Sequence[tuple[Profile, Selector | None]], stage: Stage | None = None) -> list[str]:
    """The shared profiles that do not fit in the node agent's ConfigMap: taken oldest first, the
    ones whose entry would take it past `CONFIGMAP_LIMIT` (none when the whole config fits)."""
    sizes = entry_sizes(profiles, stage)
    total = len(NODE_CONFIG_KEY) + _FRAME
    if total + sum(sizes.values()) <= CONFIGMAP_LIMIT:
        return []
    refused = []
    for p, _ in sorted(profiles, key=lambda pe: pe[0].sort_key):
        if total + sizes[p.name] <= CONFIGMAP_LIMIT:
            total += sizes[p.name]
        else:
            refused.append(p.name)
    return refused


def node_config(profiles: Sequence[tuple[Profile, Selector | None]], stage: Stage | None = None) -> str:
    """The node agent's config file: every shared profile, sorted by name (a stable hash), as
    ``json.dumps({"profiles": entries}, indent=2, sort_keys=True)`` writes it, plus a newline.

    JSON, not YAML, because the agent then reads it without importing PyYAML (a tenth of its
    start; docs/benchmarks.md, "In its image"), and JSON is YAML too: an agent of any earlier
    version, which reads the key with a YAML parser, reads it unchanged during an upgrade. The
    key stays ``node.yaml`` for that reason. Built from `_dump_entry` so `entry_sizes` counts each
    entry's bytes exactly."""
    entries = [_entry(p, exclude, stage) for p, exclude in sorted(profiles, key=lambda pe: pe[0].name)]
    return _HEAD + _SEPARATOR.join(_dump_entry(e) for e in entries) + _TAIL


def shared_agent_objects(
    profiles: Sequence[tuple[Profile, Selector | None]], settings: Settings, stage: Stage | None = None
) -> list[dict[str, Any]]:
    """[ConfigMap, DaemonSet] of the shared node agent serving `profiles` (each with the selector
    its agents must leave out, as in `agent_objects`): each profile's node selector terms are in
    the config, which the agents evaluate against their node's labels; the DaemonSet's pod
    template depends on none of them (see below). Every profile is an owner (none the
    controller), so the garbage collector removes the objects with the last of them."""
    text = node_config(profiles, stage)
    owners = [{**owner_reference(p), "controller": False, "blockOwnerDeletion": False} for p, _ in profiles]
    common = {
        "name": SHARED_AGENT,
        "object_namespace": settings.namespace,
        "labels": shared_labels(),
        "owners": sorted(owners, key=lambda o: o["name"]),
    }
    configmap = _render("configmap.yaml.j2", **common, data={NODE_CONFIG_KEY: text})
    daemonset = _render(
        "daemonset.yaml.j2",
        **common,
        selector_labels=shared_selector_labels(),
        max_surge=1,
        max_unavailable=0,
        hash_annotation=CONFIG_HASH_ANNOTATION,
        # No config hash on the pod template: the node agent follows its ConfigMap and reconfigures
        # live, so only a change of the pod itself (the image) rolls the agents.
        config_hash="",
        priority_class="",
        # Every node (or those with the --node-agent-node-selector labels), and every mount either
        # mode needs: the pod template then depends on no profile, so a new profile, a changed
        # selector or mode reaches the running agents live (they read their config and their
        # node's labels) and only an image change (or that setting) rolls them. An agent on a node
        # no profile selects serves nothing (an idle process).
        node_selector_terms=[
            [{"key": k, "operator": "In", "values": [v]} for k, v in settings.node_agent_node_selector]
        ]
        if settings.node_agent_node_selector
        else [],
        # A node a profile selects gets its agent whatever its taints (a device plugin is part of
        # the node, like the CNI); a profile that wants fewer nodes says so in its selector, or
        # sets agent.tolerations of its own (and gets its own agent).
        tolerations=[{"operator": "Exists"}],
        image=settings.agent_image,
        pull_policy="",
        config_path=f"{AGENT_CONFIG_DIR}/{NODE_CONFIG_KEY}",
        config_dir=AGENT_CONFIG_DIR,
        device_plugin_dir=DEVICE_PLUGIN_DIR,
        host_root=HOST_ROOT,
        resources=DEFAULT_RESOURCES,
        container_security=HARDENED,
        profile="",
        # The shared node agent may serve DRA profiles (its pod template must not depend on which
        # profiles it serves): it runs as the account with the DRA rights.
        service_account=settings.agent_dra_service_account,
        api_server=list(settings.agent_api_server) if settings.agent_api_server else None,
        kubelet_root_dir=settings.kubelet_root_dir,
        holder_labels=settings.agent_metrics_holder_labels,
        cdi_spec_dir=settings.cdi_spec_dir,
        cdi_mount=CDI_SPEC_MOUNT,
        pod_resources_mount=POD_RESOURCES_MOUNT,
        dra_driver="",
        node_config=True,
        own_agent=False,
        node_plugins_dir="",
        dra_mounts=True,
        device_plugin_mounts=True,
        plugins_registry_dir=plugins_registry_dir(settings.kubelet_root_dir),
        # Not the kubelet's whole plugins directory (every other CSI and DRA driver's sockets):
        # only the node agent's own directory in it, which holds every driver's directory it serves.
        kubelet_plugins_dir=node_agent_plugins_dir(settings.kubelet_root_dir),
    )
    return [configmap, daemonset]
