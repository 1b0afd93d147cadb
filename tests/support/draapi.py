"""An in-memory stand-in for the API server's side of a DRA agent (`dra.preparer.DraClient`): the
tiers without a control plane (tests/sockets, tests/fuzz) use it; the real calls are tried in
tests/integration/agent/test_agent_dra_on_the_api_server.py."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any


class InMemoryApi:
    """Claims by (namespace, name); slices by name, as the agent applied them. Keeps device
    taints, as an API server from 1.36 on does (the real ones of both kinds are in
    tests/integration/agent/test_agent_dra_on_the_api_server.py)."""

    def __init__(self) -> None:
        self.claims: dict[tuple[str, str], dict[str, Any]] = {}
        self.slices: dict[str, dict[str, Any]] = {}
        self.applies = 0

    def claim_read_async(self) -> None:
        """No GET on the event loop: the agent reads claims with `resource_claim` in a thread."""

    def resource_claim(self, namespace: str, name: str, *, timeout: float | None = None) -> dict[str, Any]:
        try:
            return self.claims[namespace, name]
        except KeyError:
            raise RuntimeError(f"404: resourceclaims {name!r} not found") from None

    def apply_slice(self, doc: Mapping[str, Any]) -> Mapping[str, Any]:
        self.applies += 1
        self.slices[doc["metadata"]["name"]] = dict(doc)
        return doc

    def dry_run_slice(self, doc: Mapping[str, Any]) -> Mapping[str, Any]:
        """As an API server that keeps device taints (1.36 on) answers a dry-run create."""
        return doc

    def slice_names(self, driver: str, node_name: str) -> list[str]:
        return sorted(self.slices)

    def delete_slice(self, name: str) -> None:
        self.slices.pop(name, None)

    def node_uid(self, node_name: str) -> str:
        return "node-uid-1"
