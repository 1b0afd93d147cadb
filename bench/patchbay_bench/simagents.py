"""SIMULATED node agents for N kwok nodes, from one asyncio process (kwok runs no process).

``Followers``: per node, the exact requests the node agent's follower makes (a GET, then a WATCH
from its resourceVersion, of the node agent's ConfigMap, or of a profile's own agent's, and of
its Node, each by ``metadata.name``), held open; each ConfigMap watch's MODIFIED events are timed, and where a
handler is given, every object a node's follower gets (the GET's and each event's) is handed to
it with the node's name.

``SimAgents``: what each node's agent does with its ConfigMap as the real one decides it: the
profiles that select the node and the revision it serves of each come from
``patchbay_agent.nodeconfig.selected`` (the real agent's function, ``Rollout.served`` inside it);
when what a node serves changes, its DeviceReport is written (server-side apply, as the agent's
field manager) naming that revision, with the devices ``served_devices`` says the simulated node
has; for a DRA profile its ResourceSlice first, as the real agent builds it (``resource_slices``:
the agent's own ``slice_devices`` and ``slice_documents`` over the devices its discovery finds:
the same driver, pool, node, device names and attributes, owned by the Node). The config text is
parsed once per resourceVersion (every node's agent would parse the same text; the simulation
does it once).
"""

from __future__ import annotations

import asyncio
import base64
import json
import re
import ssl
import threading
import time
from collections.abc import AsyncIterator, Callable, Mapping
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import urllib3
import yaml

from patchbay_agent.config import VirtualDiscovery
from patchbay_agent.core.inventory import Snapshot
from patchbay_agent.discovery.base import PhysicalDevice
from patchbay_agent.discovery.virtual import VirtualBackend
from patchbay_agent.dra.slices import (
    RESOURCE_GROUP,
    RESOURCE_VERSION,
    SLICE_PLURAL,
    partitioned,
    slice_devices,
    slice_documents,
    with_generation,
)
from patchbay_agent.nodeconfig import NODE_CONFIG_KEY, Mode, ProfileEntry, parse_node_config, selected
from patchbay_bench.harness import wait
from patchbay_bench.kube import Api

SHARED = "patchbay-node-agent"
"""The shared node agent's ConfigMap (and DaemonSet)."""

Handler = Callable[[str, dict[str, Any]], None]


def client_files(kubeconfig: Mapping[str, Any], tmp: Path) -> tuple[str, str, str]:
    """The kubeconfig's first user and cluster as files: (CA, client certificate, client key)."""
    user, cluster = kubeconfig["users"][0]["user"], kubeconfig["clusters"][0]["cluster"]
    paths = []
    for name, data in (
        ("ca.crt", cluster["certificate-authority-data"]),
        ("c.crt", user["client-certificate-data"]),
        ("c.key", user["client-key-data"]),
    ):
        (tmp / name).write_bytes(base64.b64decode(data))
        paths.append(str(tmp / name))
    return paths[0], paths[1], paths[2]


class Followers:
    """The simulated node agents' follows (module doc)."""

    def __init__(
        self,
        server: str,
        kubeconfig: dict[str, Any],
        tmp: Path,
        namespace: str,
        on_config: Handler | None = None,
        on_node: Handler | None = None,
        config_map: str = SHARED,
    ) -> None:
        m = re.match(r"https://([^:/]+):(\d+)", server)
        assert m, server
        self.host, self.port = m.group(1), int(m.group(2))
        self.namespace, self.on_config, self.on_node = namespace, on_config, on_node
        #: the ConfigMap each node's agent follows: the shared node agent's, or a profile's own agent's
        self.config_map = config_map
        ca, crt, key = client_files(kubeconfig, tmp)
        self.ctx = ssl.create_default_context(cafile=ca)
        self.ctx.load_cert_chain(crt, key)
        self.modified: list[float] = []
        self.open = self.failed = 0
        #: what a handler raised (a follow goes on without it)
        self.errors: list[str] = []
        self.loop = asyncio.new_event_loop()
        threading.Thread(target=self.loop.run_forever, daemon=True).start()
        self._tasks: list[asyncio.Task[None]] = []

    async def _request(self, path: str) -> tuple[asyncio.StreamReader, asyncio.StreamWriter, int, int | None]:
        """A GET's reader, writer, status and Content-Length (None: a chunked body)."""
        reader, writer = await asyncio.open_connection(self.host, self.port, ssl=self.ctx)
        writer.write(f"GET {path} HTTP/1.1\r\nHost: {self.host}\r\nAccept: application/json\r\n\r\n".encode())
        await writer.drain()
        status = int((await reader.readline()).split()[1])
        length = None
        while (line := await reader.readline()) not in (b"\r\n", b""):
            key, _, value = line.decode("latin-1").partition(":")
            if key.strip().lower() == "content-length":
                length = int(value.strip())
        return reader, writer, status, length

    async def _chunks(self, reader: asyncio.StreamReader) -> AsyncIterator[bytes]:
        while size := int((await reader.readline()).strip() or b"0", 16):
            data = await reader.readexactly(size)
            await reader.readexactly(2)
            yield data

    async def _follow(
        self, node: str, get_path: str, list_path: str, is_config: bool, gate: asyncio.Semaphore
    ) -> None:
        handler = self.on_config if is_config else self.on_node
        async with gate:
            try:
                reader, writer, status, length = await self._request(get_path)
                # A small object comes with a Content-Length, a bigger one chunked.
                if length is not None:
                    body = await reader.readexactly(length)
                else:
                    body = b"".join([c async for c in self._chunks(reader)])
                writer.close()
                obj = json.loads(body)
                rv = obj["metadata"]["resourceVersion"]
                reader, watch, status, _ = await self._request(f"{list_path}&watch=1&resourceVersion={rv}")
                if status != 200:
                    watch.close()
                    raise RuntimeError(f"WATCH {list_path}: {status}")
            except Exception:
                self.failed += 1
                return
        self.open += 1
        self._handle(handler, node, obj)
        buf = b""
        try:
            async for data in self._chunks(reader):
                buf += data
                while b"\n" in buf:
                    line, buf = buf.split(b"\n", 1)
                    if b'"type":"MODIFIED"' in line:
                        if is_config:
                            self.modified.append(time.monotonic())
                        if handler is not None:
                            self._handle(handler, node, json.loads(line)["object"])
        finally:
            # Closed on stop (the task cancelled), at once (no TLS close handshake: the loop stops
            # right after): a watch left open kept the cluster's kube-apiserver from exiting on
            # SIGTERM, and its stop waited out the 15 s grace before SIGKILL.
            watch.transport.abort()

    def _handle(self, handler: Handler | None, node: str, obj: dict[str, Any]) -> None:
        if handler is None:
            return
        try:
            handler(node, obj)
        except Exception as e:
            self.errors.append(f"{node}: {e!r}")

    async def _start(self, nodes: list[str]) -> None:
        gate = asyncio.Semaphore(64)
        cm = f"/api/v1/namespaces/{self.namespace}/configmaps"
        for n in nodes:
            # The Node first: a real agent knows its labels before it serves anything.
            self._tasks.append(
                asyncio.create_task(
                    self._follow(
                        n,
                        f"/api/v1/nodes/{n}",
                        f"/api/v1/nodes?fieldSelector=metadata.name%3D{n}",
                        False,
                        gate,
                    )
                )
            )
            self._tasks.append(
                asyncio.create_task(
                    self._follow(
                        n,
                        f"{cm}/{self.config_map}",
                        f"{cm}?fieldSelector=metadata.name%3D{self.config_map}",
                        True,
                        gate,
                    )
                )
            )

    def start(self, nodes: list[str]) -> None:
        asyncio.run_coroutine_threadsafe(self._start(nodes), self.loop).result()

    async def _stop(self) -> None:
        for t in self._tasks:
            t.cancel()
        await asyncio.gather(*self._tasks, return_exceptions=True)

    def stop(self) -> None:
        asyncio.run_coroutine_threadsafe(self._stop(), self.loop).result(60)
        self.loop.call_soon_threadsafe(self.loop.stop)


def found_devices(entry: ProfileEntry) -> list[PhysicalDevice]:
    """The devices a simulated node has for the settings it serves: what a ``virtual`` discovery
    finds (the agent's own backend, so the same IDs); any other discovery (paths, PCI, USB...)
    finds nothing on a kwok node, which has no device files (so a glob is "a glob matching
    nothing"); a refused config: none."""
    config = entry.config
    if config is None or not isinstance(config.discovery, VirtualDiscovery):
        return []
    return VirtualBackend(config.discovery).scan()


def served_devices(entry: ProfileEntry) -> int:
    """How many devices the simulated node serves (``found_devices``), all healthy."""
    return len(found_devices(entry))


def device_report(namespace: str, entry: ProfileEntry, node: str, agent: str) -> dict[str, Any]:
    """The DeviceReport a simulated agent writes for what it serves: the revision, and its devices
    all healthy (``found_devices``)."""
    ids = [d.id for d in found_devices(entry)]
    count = len(ids)
    body: dict[str, Any] = {
        "apiVersion": "patchbay.dev/v1beta1",
        "kind": "DeviceReport",
        "metadata": {"name": f"{entry.profile}.{node}", "namespace": namespace},
        "profile": entry.profile,
        "nodeName": node,
        "agent": agent,
        "resourceName": entry.config.resource_name if entry.config is not None else "",
        "devices": [{"id": i, "health": "Healthy"} for i in ids],
        "summary": {"total": count, "healthy": count, "unhealthy": 0, "allocated": 0},
    }
    if entry.revision:
        body["revision"] = entry.revision
    return body


def resource_slices(entry: ProfileEntry, node: str, node_uid: str, generation: int) -> list[dict[str, Any]]:
    """A DRA entry's ResourceSlices as the real agent publishes them on ``node`` (its pool, owned by
    the Node): ``found_devices``, all healthy, through the agent's ``slice_devices`` (the
    profile's taint effect and sharing) and ``partitioned`` (its partitions), then
    ``slice_documents`` with ``generation``. A node without devices publishes one empty slice."""
    config = entry.config
    found = found_devices(entry)
    snap = Snapshot(
        1,
        physical={d.id: d for d in found},
        replica_of={d.id: d.id for d in found},
        healthy=frozenset(d.id for d in found),
    )
    devices = (
        slice_devices(snap, (), config.health.taint_effect, config.replicas) if config is not None else []
    )
    if config is not None and config.partitions is not None:
        devices = partitioned(devices, config.partitions)
    docs = slice_documents(entry.driver, node, devices, node_uid=node_uid or None)
    return with_generation(docs, generation)


@dataclass(frozen=True)
class Served:
    """A change of what one node serves of one profile, as its report was written."""

    node: str
    profile: str
    revision: str
    healthy: int
    #: when it was decided (the ConfigMap or Node event), and when the write returned (monotonic)
    decided: float
    written: float


class SimAgents:
    """The simulated agents' side (module doc): wire ``on_config`` and ``on_node`` into
    ``Followers``. ``agents``: node -> the name of the shared agent pod kwok runs there (a report
    names its writer)."""

    def __init__(
        self,
        server: str,
        files: tuple[str, str, str],
        namespace: str,
        agents: Mapping[str, str],
        writers: int = 16,
    ) -> None:
        self.server, self.namespace, self.agents = server, namespace, dict(agents)
        ca, crt, key = files
        self.http = urllib3.PoolManager(
            maxsize=writers, ca_certs=ca, cert_file=crt, key_file=key, cert_reqs="CERT_REQUIRED", timeout=30.0
        )
        self.pool = ThreadPoolExecutor(writers)
        self._lock = threading.Lock()
        #: resourceVersion -> (first seen, the parsed entries); the newest few
        self.configs: dict[str, tuple[float, list[ProfileEntry]]] = {}
        self._labels: dict[str, dict[str, str]] = {}
        #: node -> its uid (a slice is owned by its Node)
        self._uids: dict[str, str] = {}
        self._config_of: dict[str, str] = {}
        #: (node, profile) -> (revision, healthy) last decided
        self._last: dict[tuple[str, str], tuple[str, int]] = {}
        #: every change written, in order
        self.log: list[Served] = []
        #: (node, profile) -> the revision its last written report names
        self.current: dict[tuple[str, str], str] = {}
        #: (profile, revision) -> the nodes that ever decided to serve it
        self.ever: dict[tuple[str, str], set[str]] = {}
        self.errors: list[str] = []
        #: DRA pools written (each its node's slices of one profile's driver)
        self.slices = 0

    def _entries(self, obj: Mapping[str, Any]) -> str:
        rv = str(obj["metadata"]["resourceVersion"])
        if rv not in self.configs:
            text = str((obj.get("data") or {}).get(NODE_CONFIG_KEY) or "")
            self.configs[rv] = (time.monotonic(), parse_node_config(yaml.safe_load(text) or {"profiles": []}))
        return rv

    def on_config(self, node: str, obj: dict[str, Any]) -> None:
        self._config_of[node] = self._entries(obj)
        self._decide(node)

    def on_node(self, node: str, obj: dict[str, Any]) -> None:
        meta = obj.get("metadata") or {}
        labels = {str(k): str(v) for k, v in (meta.get("labels") or {}).items()}
        self._uids[node] = str(meta.get("uid") or "")
        if labels != self._labels.get(node):
            self._labels[node] = labels
            self._decide(node)

    def _decide(self, node: str) -> None:
        rv = self._config_of.get(node)
        if rv is None or node not in self._labels:
            return
        now = time.monotonic()
        for entry in selected(self.configs[rv][1], self._labels[node], node):
            what = (entry.revision, served_devices(entry))
            key = (node, entry.profile)
            if self._last.get(key) == what:
                continue
            self._last[key] = what
            with self._lock:
                self.ever.setdefault((entry.profile, entry.revision), set()).add(node)
            self.pool.submit(self._write, entry, node, now)

    def _apply(self, path: str, body: dict[str, Any]) -> None:
        """Server-side apply as the agent's field manager; raise on failure."""
        url = f"{self.server}{path}/{body['metadata']['name']}?fieldManager=patchbay-agent&force=true"
        got = self.http.request(
            "PATCH", url, body=json.dumps(body), headers={"Content-Type": "application/apply-patch+yaml"}
        )
        if got.status >= 300:
            raise RuntimeError(f"{got.status} {got.data[:300]!r}")

    def _write(self, entry: ProfileEntry, node: str, decided: float) -> None:
        body = device_report(self.namespace, entry, node, self.agents.get(node, ""))
        try:
            if entry.mode is Mode.DRA and entry.driver:
                # The slices first: the report then never says more than the node publishes.
                generation = int(time.time() * 1000)
                for doc in resource_slices(entry, node, self._uids.get(node, ""), generation):
                    self._apply(f"/apis/{RESOURCE_GROUP}/{RESOURCE_VERSION}/{SLICE_PLURAL}", doc)
                with self._lock:
                    self.slices += 1
            self._apply(f"/apis/patchbay.dev/v1beta1/namespaces/{self.namespace}/devicereports", body)
        except Exception as e:
            with self._lock:
                self.errors.append(f"report of {node}: {e}")
            return
        served = Served(node, entry.profile, entry.revision, served_devices(entry), decided, time.monotonic())
        with self._lock:
            self.log.append(served)
            self.current[(node, entry.profile)] = entry.revision

    def serving(self, profile: str, revision: str) -> int:
        """Nodes whose last written report names ``revision``."""
        with self._lock:
            return sum(1 for (_, p), r in self.current.items() if p == profile and r == revision)

    def close(self) -> None:
        self.pool.shutdown(wait=True, cancel_futures=True)
        self.http.clear()


def shared_agent_pods(api: Api, namespace: str, n: int, timeout: float = 1800) -> dict[str, str]:
    """Wait until the shared node agent's DaemonSet has ``n`` pods ready (kwok "runs" them); node
    -> its agent pod's name."""
    ds = f"/apis/apps/v1/namespaces/{namespace}/daemonsets/{SHARED}"
    wait(
        "the node agent's pods ready on every node",
        lambda: ((api.get(ds) or {}).get("status") or {}).get("numberReady", 0) >= n,
        timeout,
        0.5,
    )
    pods = api.items(
        f"/api/v1/namespaces/{namespace}/pods", labelSelector="app.kubernetes.io/component=node-agent"
    )
    return {p["spec"]["nodeName"]: p["metadata"]["name"] for p in pods if p["spec"].get("nodeName")}
