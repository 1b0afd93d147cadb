"""The bench's API calls: plain JSON over the official client's transport (no typed models), and
the Prometheus text format read back (the API server's, the operator's and the agents' /metrics).
"""

from __future__ import annotations

import contextlib
import json
import re
import socket
from collections import defaultdict
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import Any
from urllib.parse import quote, urlencode

import urllib3
from kubernetes import client

from patchbay_devcluster import kubeapi

GROUP, VERSION = "patchbay.dev", "v1beta1"
PROFILES = f"/apis/{GROUP}/{VERSION}/devicepluginprofiles"
NODES = "/api/v1/nodes"
JSON_PATCH = "application/json-patch+json"
MERGE_PATCH = "application/merge-patch+json"


def profile(name: str, spec: Mapping[str, Any]) -> dict[str, Any]:
    """A DevicePluginProfile of ``name`` with ``spec``."""
    return {
        "apiVersion": f"{GROUP}/{VERSION}",
        "kind": "DevicePluginProfile",
        "metadata": {"name": name},
        "spec": dict(spec),
    }


def reports(namespace: str) -> str:
    return f"/apis/{GROUP}/{VERSION}/namespaces/{namespace}/devicereports"


def ns_path(namespace: str, plural: str, api: str = "/api/v1") -> str:
    return f"{api}/namespaces/{namespace}/{plural}"


def named(collection: str, name: str) -> str:
    return f"{collection}/{quote(name, safe='')}"


class ApiError(RuntimeError):
    def __init__(self, status: int, what: str, body: str) -> None:
        super().__init__(f"{what}: HTTP {status}: {body[:400]}")
        self.status = status


class Api:
    """Blocking calls to one API server as the kubeconfig's user (the dev cluster's admin)."""

    def __init__(self, kubeconfig: Path, timeout: float = 30.0) -> None:
        self.client = kubeapi.connect(kubeconfig)
        self.client.user_agent = "patchbay-bench/python"
        self.timeout = timeout

    def close(self) -> None:
        kubeapi.close(self.client)

    def raw(
        self,
        method: str,
        path: str,
        body: Any = None,
        *,
        content_type: str = "application/json",
        query: Mapping[str, str] | None = None,
    ) -> tuple[int, bytes]:
        full = path + ("?" + urlencode(query) if query else "")
        headers = {"Accept": "application/json", "Content-Type": content_type}
        m, url, hdrs, data, _ = self.client.param_serialize(
            method=method, resource_path=full, header_params=headers, body=body, auth_settings=["BearerToken"]
        )
        try:
            resp = self.client.call_api(m, url, header_params=hdrs, body=data, _request_timeout=self.timeout)
        except urllib3.exceptions.HTTPError as e:
            raise ApiError(0, f"{method} {full}", str(e)) from e
        return resp.status, bytes(resp.read())  # type: ignore[no-untyped-call]

    def call(
        self,
        method: str,
        path: str,
        body: Any = None,
        *,
        content_type: str = "application/json",
        query: Mapping[str, str] | None = None,
        ok: tuple[int, ...] = (),
    ) -> Any:
        """The decoded answer; None for a status in ``ok``; ApiError for any other non-2xx."""
        status, data = self.raw(method, path, body, content_type=content_type, query=query)
        if 200 <= status < 300:
            return json.loads(data) if data else None
        if status in ok:
            return None
        raise ApiError(status, f"{method} {path}", data.decode(errors="replace"))

    def get(self, path: str) -> dict[str, Any] | None:
        obj: dict[str, Any] | None = self.call("GET", path, ok=(404,))
        return obj

    def items(self, path: str, **query: str) -> list[dict[str, Any]]:
        got: list[dict[str, Any]] = self.call("GET", path, query=query)["items"]
        return got

    def create(self, path: str, body: Mapping[str, Any]) -> dict[str, Any]:
        made: dict[str, Any] = self.call("POST", path, body)
        return made

    def merge(self, path: str, patch: Mapping[str, Any]) -> dict[str, Any]:
        done: dict[str, Any] = self.call("PATCH", path, patch, content_type=MERGE_PATCH)
        return done

    def json_patch(self, path: str, ops: list[dict[str, Any]]) -> dict[str, Any]:
        done: dict[str, Any] = self.call("PATCH", path, ops, content_type=JSON_PATCH)
        return done

    def delete(self, path: str) -> None:
        self.call("DELETE", path, ok=(404,))

    def text(self, path: str, **query: str) -> str:
        status, data = self.raw("GET", path, query=query or None)
        if status != 200:
            raise ApiError(status, f"GET {path}", data.decode(errors="replace"))
        return data.decode(errors="replace")

    def watch(self, path: str, **query: str) -> Stream:
        """A WATCH of ``path`` (``query``: its selectors, resourceVersion, timeoutSeconds)."""
        q = {"watch": "1", **query}
        m, url, hdrs, _, _ = self.client.param_serialize(
            "GET",
            path,
            query_params=list(q.items()),
            header_params={"Accept": "application/json"},
            auth_settings=["BearerToken"],
        )
        timeout = float(query.get("timeoutSeconds", 300)) + 60
        resp = self.client.call_api(m, url, header_params=hdrs, _request_timeout=(10, timeout)).response
        if resp.status != 200:
            raise ApiError(resp.status, f"WATCH {path}", resp.read().decode(errors="replace"))
        return Stream(resp)

    def metrics(self) -> Metrics:
        """The API server's own counters."""
        return Metrics.parse(self.text("/metrics"))

    def official(self) -> client.ApiClient:
        """The official client, for the helpers of the test suites that take one."""
        return self.client


class Stream:
    """A watch's events, one decoded JSON object each; ``close`` from another thread ends the
    iteration (it shuts the socket down: closing the response there would wait for the reader's
    buffer lock)."""

    def __init__(self, resp: Any) -> None:
        self.resp = resp

    def __iter__(self) -> Iterator[dict[str, Any]]:
        buf = b""
        try:
            for chunk in self.resp.stream(65536):
                buf += chunk
                while b"\n" in buf:
                    line, buf = buf.split(b"\n", 1)
                    if line.strip():
                        yield json.loads(line)
        except (OSError, urllib3.exceptions.HTTPError):
            return
        finally:
            self.resp.release_conn()

    def close(self) -> None:
        sock = getattr(getattr(self.resp, "connection", None), "sock", None)
        if sock is not None:
            with contextlib.suppress(OSError):
                sock.shutdown(socket.SHUT_RDWR)


SAMPLE = re.compile(r"^([a-zA-Z_:][a-zA-Z0-9_:]*)(?:\{(.*)\})? ([0-9.eE+-]+|NaN|[+-]Inf)$")
LABEL = re.compile(r'(\w+)="((?:[^"\\]|\\.)*)"')


class Metrics:
    """Samples of a Prometheus text exposition: ``sum(name, label=value, ...)`` adds every sample
    of ``name`` whose labels match."""

    def __init__(self, samples: list[tuple[str, dict[str, str], float]]) -> None:
        self.samples = samples

    @classmethod
    def parse(cls, text: str) -> Metrics:
        out = []
        for line in text.splitlines():
            m = SAMPLE.match(line)
            if m:
                out.append((m.group(1), dict(LABEL.findall(m.group(2) or "")), float(m.group(3))))
        return cls(out)

    def sum(self, name: str, **labels: str | tuple[str, ...]) -> float:
        def match(have: dict[str, str]) -> bool:
            for k, want in labels.items():
                value = have.get(k, "")
                if value not in (want if isinstance(want, tuple) else (want,)):
                    return False
            return True

        return sum(v for n, lab, v in self.samples if n == name and match(lab))

    def by(self, name: str, *keys: str) -> dict[tuple[str, ...], float]:
        """``name``'s samples summed by the values of ``keys``."""
        out: dict[tuple[str, ...], float] = defaultdict(float)
        for n, lab, v in self.samples:
            if n == name:
                out[tuple(lab.get(k, "") for k in keys)] += v
        return out


WRITE_VERBS = ("POST", "PUT", "PATCH", "APPLY", "DELETE")


def writes(before: Metrics, after: Metrics, resource: str, verbs: tuple[str, ...] = WRITE_VERBS) -> int:
    """Write requests the API server served for ``resource`` between two scrapes of its
    ``apiserver_request_total`` (every client's: the caller makes sure who writes)."""
    name = "apiserver_request_total"
    return round(
        after.sum(name, resource=resource, verb=verbs) - before.sum(name, resource=resource, verb=verbs)
    )
