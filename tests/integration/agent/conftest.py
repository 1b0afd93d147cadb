"""Fixtures of the agent's tests on the real API server."""

from __future__ import annotations

import contextlib
from collections.abc import Iterator

import pytest
from kubernetes import client
from kubernetes.client.rest import ApiException


@pytest.fixture
def namespace(api: client.ApiClient, name_prefix: str) -> Iterator[str]:
    """A namespace of the test's own (``<prefix>agent``), deleted at its end."""
    core = client.CoreV1Api(api)
    ns = f"{name_prefix}agent"
    core.create_namespace({"metadata": {"name": ns}})
    try:
        yield ns
    finally:
        with contextlib.suppress(ApiException):
            core.delete_namespace(ns)
