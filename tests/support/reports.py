"""DeviceReports: one as its agent writes it, and one at the CRD's bounds, for the tests and benches
that need the largest one; and the owner reference every object an agent writes for its node
carries (reports and ResourceSlices)."""

from __future__ import annotations

from typing import Any


def node_owner(name: str, uid: str) -> dict[str, Any]:
    """The Node as the owner of what its agent writes: the garbage collector deletes the object
    with the node; not the controller, and deleting the node is never blocked by it."""
    return {
        "apiVersion": "v1",
        "kind": "Node",
        "name": name,
        "uid": uid,
        "blockOwnerDeletion": False,
        "controller": False,
    }


def device_report(
    namespace: str,
    node_name: str,
    profile: str,
    resource: str,
    devices: list[dict[str, Any]],
    summary: dict[str, int],
    **fields: Any,
) -> dict[str, Any]:
    """A DeviceReport of ``profile`` on ``node_name``, named as its agent names it; ``fields``:
    the rest (``agent``)."""
    return {
        "apiVersion": "patchbay.dev/v1beta1",
        "kind": "DeviceReport",
        "metadata": {"name": f"{profile}.{node_name}", "namespace": namespace},
        "profile": profile,
        "nodeName": node_name,
        "resourceName": resource,
        **fields,
        "summary": summary,
        "devices": devices,
    }


def largest_report(namespace: str, node_name: str, profile: str) -> dict[str, Any]:
    """The largest DeviceReport the CRD admits, every bound at its maximum: 2,048 devices with
    63-character IDs, 64-character reasons, a since time and `withheld`; 65,536 characters of
    messages (128 messages of 512); 512 holders (8 devices with 64 each) with the longest names;
    the longest resource and agent names."""
    devices: list[dict[str, Any]] = []
    for i in range(2048):
        entry: dict[str, Any] = {
            "id": f"{i:04d}" + "d" * 59,
            "health": "Unhealthy",
            "reason": "R" * 64,
            "since": "2026-11-25T12:00:00Z",
            "withheld": True,
        }
        if i < 128:
            entry["message"] = "m" * 512
        if i < 8:
            entry["pods"] = [
                {"namespace": "n" * 63, "name": f"{i}-{j:02d}" + "p" * 248, "container": "c" * 63}
                for j in range(64)
            ]
        devices.append(entry)
    return device_report(
        namespace,
        node_name,
        profile,
        "example.com/" + "r" * 241,
        devices,
        {"total": 2048, "healthy": 0, "unhealthy": 2048, "allocated": 8},
        agent="a" * 253,
    )
