"""The tool's few calls to the API server, through the official client (``kubernetes``).

Health (``/readyz``), creating kwok Nodes and listing which Nodes are Ready. Answers are read raw
(``_preload_content=False``) and parsed as JSON: the tool reads three fields of each Node, and
turning a list of 1000 kwok Nodes into model objects takes about five times as long as the
request itself, on every poll of a wait.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any, cast

import urllib3
from kubernetes import client, config
from kubernetes.client.exceptions import ApiException

UNAVAILABLE: tuple[type[BaseException], ...] = (
    OSError,
    urllib3.exceptions.HTTPError,
    ApiException,
    config.ConfigException,
)
"""What a call raises while the API server is not there, not (yet) ready, or has no kubeconfig."""


def connect(kubeconfig: Path) -> client.ApiClient:
    """A client for the cluster of ``kubeconfig``. Keep it (``DevCluster.api`` does): it holds
    the open connections, and loading a kubeconfig writes its certificates to temporary files."""
    # One attempt per call, as the waits poll anyway: urllib3's retries would only log each
    # refused connection while the API server starts.
    cfg = client.Configuration(retries=False)
    api = config.new_client_from_config(  # type: ignore[no-untyped-call]
        config_file=str(kubeconfig), client_configuration=cfg
    )
    return cast(client.ApiClient, api)


def get(api: client.ApiClient, path: str, timeout: float = 10.0) -> tuple[int, str]:
    """A plain ``GET`` of a path outside the resource API (``/readyz?verbose``, ``/version``):
    (status, body) whatever the status; connection errors propagate."""
    method, url, headers, _, _ = api.param_serialize("GET", path, auth_settings=["BearerToken"])
    resp = api.call_api(method, url, header_params=headers, _request_timeout=timeout)
    raw = resp.read()  # type: ignore[no-untyped-call]
    return resp.status, bytes(raw).decode(errors="replace")


def readyz(api: client.ApiClient, timeout: float = 5.0) -> bool:
    return get(api, "/readyz", timeout)[0] == 200


def close(api: client.ApiClient) -> None:
    api.close()  # type: ignore[no-untyped-call]


def create_node(api: client.ApiClient, body: dict[str, Any], timeout: float = 10.0) -> bool:
    """Create a Node; False if one of that name exists already (HTTP 409)."""
    try:
        # The client sends a plain dict as the JSON body, as it is (its type says V1Node).
        resp = client.CoreV1Api(api).create_node(
            cast(client.V1Node, body), _preload_content=False, _request_timeout=timeout
        )
    except ApiException as e:
        if e.status == 409:
            return False
        raise
    # Not read, so not turned into a model; drained, so the connection goes back to the pool.
    cast(urllib3.BaseHTTPResponse, resp).drain_conn()
    return True


def ready_nodes(api: client.ApiClient, label_selector: str = "", timeout: float = 60.0) -> set[str]:
    """Names of the Nodes (matching ``label_selector``) whose Ready condition is True."""
    resp = client.CoreV1Api(api).list_node(
        label_selector=label_selector or None, _preload_content=False, _request_timeout=timeout
    )
    ready = set()
    for n in json.loads(cast(urllib3.BaseHTTPResponse, resp).data)["items"]:
        for c in n.get("status", {}).get("conditions") or []:
            if c.get("type") == "Ready" and c.get("status") == "True":
                ready.add(n["metadata"]["name"])
    return ready
