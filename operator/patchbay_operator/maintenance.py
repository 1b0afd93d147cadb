"""Device maintenance as the profile's status shows it: the DeviceTaintRules on its devices (pure).

An administrator takes a DRA device out of service with a DeviceTaintRule (resource.k8s.io/v1,
Kubernetes 1.37 on; ``kubectl patchbay cordon|drain|uncordon`` writes them, docs/dra.md#maintenance):
its selector names a driver (``<profile>.patchbay.dev``), a pool (Patchbay's agents name each
node's pool after the node) and a device; its taint's effect says what happens: ``None`` only
previews (the API server's device-taint-eviction controller writes into the rule's status how
many pods WOULD be evicted), ``NoSchedule`` keeps new claims off, ``NoExecute`` also evicts the
pods using it (a pod that tolerates the taint for N seconds stays that long). Deleting the rule
returns the device.

The operator watches every DeviceTaintRule (cluster-scoped, few) where the API server serves them
and keeps a small ``Rule`` per object; ``entries`` turns the rules on one profile's devices into
``status.dra.maintenance``.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any

from patchbay_operator.constants import DRA_DRIVER_SUFFIX

API = "/apis/resource.k8s.io/v1"
"""Where DeviceTaintRules are served (GA in 1.37; beta and off by default in 1.36)."""
RESOURCE = "devicetaintrules"
MAX_SHOWN = 64
"""At most this many rules in one profile's status (the CRD's maxItems)."""
EVICTION = "EvictionInProgress"
"""The condition the device-taint-eviction controller writes into a rule's status."""


@dataclass(frozen=True)
class Rule:
    """The slice of a DeviceTaintRule the operator keeps."""

    name: str
    #: the selector; "" where the rule does not narrow by it (every driver, pool or device)
    driver: str
    pool: str
    device: str
    effect: str
    key: str
    #: the controller's EvictionInProgress condition for the rule's current spec ("" until written)
    eviction: str = ""
    message: str = ""
    #: the rule has no selector at all, which selects no device
    selects_nothing: bool = False

    @classmethod
    def from_object(cls, obj: Mapping[str, Any]) -> Rule:
        meta, spec = obj.get("metadata") or {}, obj.get("spec") or {}
        sel, taint = spec.get("deviceSelector"), spec.get("taint") or {}
        generation = meta.get("generation")
        cond: Mapping[str, Any] = next(
            (
                c
                for c in (obj.get("status") or {}).get("conditions") or []
                if c.get("type") == EVICTION and c.get("observedGeneration") in (None, generation)
            ),
            {},
        )
        return cls(
            name=str(meta.get("name", "")),
            driver=str((sel or {}).get("driver") or ""),
            pool=str((sel or {}).get("pool") or ""),
            device=str((sel or {}).get("device") or ""),
            effect=str(taint.get("effect") or ""),
            key=str(taint.get("key") or ""),
            eviction=str(cond.get("status") or ""),
            message=str(cond.get("message") or "")[:1024],
            selects_nothing=sel is None,
        )

    def applies_to(self, driver: str) -> bool:
        """Whether the rule selects devices of ``driver`` (a rule without a driver selects every
        driver's)."""
        return not self.selects_nothing and self.driver in ("", driver)


COLLECTION = f"{API}/{RESOURCE}"


def served(resources: Mapping[str, Any] | None) -> bool:
    """Whether the API server's resource list of ``API`` (its discovery document, None when the
    group version is not served at all) includes DeviceTaintRules."""
    return any(r.get("name") == RESOURCE for r in (resources or {}).get("resources") or [])


def entries(rules: Iterable[Rule], profile: str) -> list[dict[str, Any]]:
    """``status.dra.maintenance``: the rules on the DRA ``profile``'s devices (its driver's), by
    name; node and device are "" where the rule takes every node's (pool's) or every device."""
    driver = f"{profile}{DRA_DRIVER_SUFFIX}"
    return [
        {
            "rule": r.name,
            "node": r.pool,
            "device": r.device,
            "effect": r.effect,
            "taintKey": r.key,
            "evictionInProgress": r.eviction or None,
            "message": r.message or None,
        }
        for r in sorted(rules, key=lambda r: r.name)
        if r.applies_to(driver)
    ][:MAX_SHOWN]
