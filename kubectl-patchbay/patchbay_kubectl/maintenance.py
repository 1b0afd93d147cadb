"""Device maintenance: the DeviceTaintRules ``cordon``, ``drain`` and ``uncordon`` write (pure).

A DRA profile's devices are published by its agents in ResourceSlices of driver
``<profile>.patchbay.dev``, one pool per node named after the node. A DeviceTaintRule
(resource.k8s.io/v1, Kubernetes 1.37 on) selects devices by driver, pool and device name and
taints them as if the driver had: ``NoSchedule`` keeps new claims off (cordon), ``NoExecute``
also evicts the pods using them (drain; a pod that tolerates the taint for N seconds stays that
long), ``None`` changes nothing but has the API server's device-taint-eviction controller write
into the rule's status how many pods a drain WOULD evict (drain --preview). Deleting the rule
returns the devices (uncordon). Here: the rule for one (profile, node[, device]), its name, and
the checks of the user's input; the command line (cli.py) reads and writes the cluster.
"""

from __future__ import annotations

import hashlib
import re
from collections.abc import Iterable, Mapping
from typing import Any

Obj = dict[str, Any]

RULES_API = "/apis/resource.k8s.io/v1"
RULES = f"{RULES_API}/devicetaintrules"
TAINT_KEY = "patchbay.dev/maintenance"
"""The taint key of every rule the plugin writes (a key the eviction controller and scheduler
treat like any other; tolerate it to keep a pod through a drain)."""
FIELD_MANAGER = "kubectl-patchbay"
EVICTION = "EvictionInProgress"
EFFECTS = {"cordon": "NoSchedule", "drain": "NoExecute"}
PREVIEW = "None"
MAX_NAME = 253
_LABEL_VALUE = re.compile(r"^(([A-Za-z0-9][-A-Za-z0-9_.]*)?[A-Za-z0-9])?$")


class InputError(ValueError):
    """The command's input cannot be used; the message names the flag and what to change."""


def rule_name(profile: str, node: str, device: str | None) -> str:
    """``<profile>.<node>[.<device>]`` (each part is a DNS name already), or, past the 253
    characters a name may have, ``<profile>.<hash of node and device>``."""
    name = f"{profile}.{node}" + (f".{device}" if device else "")
    if len(name) <= MAX_NAME:
        return name
    digest = hashlib.sha256(f"{node}/{device or ''}".encode()).hexdigest()[:20]
    return f"{profile}.{digest}"


def selector(driver: str, node: str, device: str | None) -> Obj:
    """The rule's device selector: the driver's pool on ``node`` (Patchbay names each node's pool
    after the node), one device of it or all."""
    sel: Obj = {"driver": driver, "pool": node}
    if device:
        sel["device"] = device
    return sel


def rule(name: str, driver: str, node: str, device: str | None, *, effect: str, reason: str) -> Obj:
    """The whole DeviceTaintRule for server-side apply."""
    taint: Obj = {"key": TAINT_KEY, "effect": effect}
    if reason:
        taint["value"] = reason
    return {
        "apiVersion": "resource.k8s.io/v1",
        "kind": "DeviceTaintRule",
        "metadata": {"name": name, "labels": {"app.kubernetes.io/managed-by": FIELD_MANAGER}},
        "spec": {"deviceSelector": selector(driver, node, device), "taint": taint},
    }


def check_reason(reason: str) -> None:
    """A taint value must be a label value: up to 63 characters, alphanumerics and ``-_.``."""
    if len(reason) > 63 or not _LABEL_VALUE.match(reason):
        raise InputError(
            f"--reason {reason!r}: a taint value has at most 63 characters, letters, digits and "
            "'-', '_' or '.', starting and ending with a letter or digit"
        )


def served(resources: Mapping[str, Any] | None) -> bool:
    """Whether the discovery document of resource.k8s.io/v1 lists DeviceTaintRules."""
    return any(r.get("name") == "devicetaintrules" for r in (resources or {}).get("resources") or [])


def slice_devices(slices: Iterable[Obj]) -> dict[str, str]:
    """A pool's devices: their ResourceSlice name -> their ``patchbay.dev/id`` (the physical ID
    ``kubectl patchbay devices`` shows; the name itself where there is none)."""
    found: dict[str, str] = {}
    for s in slices:
        for d in (s.get("spec") or {}).get("devices") or []:
            name = str(d.get("name"))
            found[name] = str(
                (((d.get("attributes") or {}).get("patchbay.dev/id") or {}).get("string")) or name
            )
    return found


def resolve_device(device: str | None, known: Mapping[str, str], profile: str, node: str) -> str | None:
    """``--device`` as the rule names it (the ResourceSlice's name): given as that name, or as the
    ID ``kubectl patchbay devices`` shows. Anything else is refused with the node's devices."""
    if device is None or device in known:
        return device
    by_id: dict[str, list[str]] = {}
    for name, physical in known.items():
        by_id.setdefault(physical, []).append(name)
    if len(names := by_id.get(device, [])) == 1:
        return names[0]
    if names:
        # A partitioned device (plugin.partitions) is published as one slice device per size and
        # place; a rule names one device, so the user must choose (or cordon the whole node).
        raise InputError(
            f"--device {device}: DevicePluginProfile {profile} publishes it on node {node} as "
            f"{len(names)} partitions ({', '.join(sorted(names)[:8])}{' ...' if len(names) > 8 else ''}); "
            "name one of them, or leave --device out to take the node's devices out of service"
        )
    ids = sorted(by_id)
    shown = ", ".join(ids[:20]) + (f" and {len(ids) - 20} more" if len(ids) > 20 else "")
    raise InputError(
        f"--device {device}: no such device of DevicePluginProfile {profile} on node {node} "
        f"(its devices: {shown or 'none'}; `kubectl patchbay devices --profile {profile} --node {node}`)"
    )


def same_target(existing: Mapping[str, Any], wanted: Mapping[str, Any]) -> bool:
    """Whether a rule already stored under the name selects the same devices (a different one is
    someone else's rule, or a name two dotted names share)."""
    return bool((existing.get("spec") or {}).get("deviceSelector") == wanted["spec"]["deviceSelector"])


def eviction(obj: Mapping[str, Any]) -> Obj | None:
    """The controller's EvictionInProgress condition for the rule's current spec, or None."""
    generation = (obj.get("metadata") or {}).get("generation")
    for c in (obj.get("status") or {}).get("conditions") or []:
        if c.get("type") == EVICTION and c.get("observedGeneration") in (None, generation):
            return dict(c)
    return None


def summary(obj: Mapping[str, Any], profile: str, node: str, device: str | None) -> str:
    """One line about what the rule does."""
    effect = ((obj.get("spec") or {}).get("taint") or {}).get("effect", "")
    what = f"device {device}" if device else "every device"
    doing = {
        "None": "a preview, nothing changes",
        "NoSchedule": "no new claims get it",
        "NoExecute": "no new claims get it, and the pods using it are evicted",
    }.get(effect, effect)
    name = (obj.get("metadata") or {}).get("name", "")
    return f"devicetaintrule/{name}: {what} of {profile} on node {node}: {effect} ({doing})"
