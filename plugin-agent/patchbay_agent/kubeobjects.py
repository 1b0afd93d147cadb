"""Small pieces of Kubernetes objects that several writers share (the Node as owner)."""

from __future__ import annotations

from typing import Any


def owner_reference(node_name: str, node_uid: str) -> dict[str, Any]:
    """The Node as the report's owner: collected with the node, never blocking its deletion."""
    return {
        "apiVersion": "v1",
        "kind": "Node",
        "name": node_name,
        "uid": node_uid,
        "blockOwnerDeletion": False,
        "controller": False,
    }
