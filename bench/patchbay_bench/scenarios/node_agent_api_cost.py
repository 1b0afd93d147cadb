"""What the shared node agent costs the API server on a big cluster: N kwok nodes, P profiles, the
operator as a process. Two designs, each in the cluster state it needs (they cannot alternate
round by round: one needs N pods, the other P x N):

1. after, ONE node agent: P DevicePlugin profiles without agent settings, one DaemonSet whose N
   pods kwok runs. kwok runs no process, so the agents' side is SIMULATED, and named so: per
   node, the exact requests the node agent's follower makes (a GET, then a WATCH from its
   resourceVersion, of its ConfigMap and of its Node, each by ``metadata.name``), held open from
   one asyncio process. Per round, one profile change (a patch of one profile's
   ``plugin.allocation.envs``): the requests and watch events the API server served for the
   resources a change can touch during a window, less an idle window of the same length just
   before (kwok's heartbeats, the controllers' resyncs), and when the last simulated agent had it.
2. before, an agent DaemonSet per profile: P DaemonSets, P x N pods. One change rolls that
   profile's DaemonSet node by node; rolling N nodes takes long, so it is measured over a window
   (less an idle one): nodes rolled and writes served, per rolled node; the figures for N nodes
   are those rates times N (extrapolated, not observed: the record says so).
"""

from __future__ import annotations

import asyncio
import base64
import json
import re
import ssl
import threading
import time
from collections.abc import AsyncIterator, Callable
from pathlib import Path
from typing import Any

import yaml

from patchbay_bench import kube
from patchbay_bench.harness import Param, Run, Scenario, wait
from patchbay_bench.kube import PROFILES, WRITE_VERBS
from patchbay_bench.setup import Cluster, kwok_cluster, operator, status_mib

NAMESPACE, SHARED = "patchbay-system", "patchbay-node-agent"
#: what a profile change can cause: everything else (kwok's node heartbeats and leases, the
#: controllers' resyncs) is background here
RELEVANT = {
    "configmaps",
    "daemonsets",
    "devicepluginprofiles",
    "devicereports",
    "pods",
    "controllerrevisions",
    "events",
}


def profile(i: int, own_agent: bool) -> dict[str, Any]:
    spec: dict[str, Any] = {
        "resourceName": f"bench.patchbay.dev/r{i}",
        "mode": "DevicePlugin",
        "nodeSelector": {"matchLabels": {"type": "kwok"}},
        "plugin": {"discovery": {"virtual": {"count": 2}}},
        # The API cost of a change that reaches every node (staged rollouts move one wave at a time).
        "rollout": {"strategy": "Immediate"},
    }
    if own_agent:  # kwok nodes are tainted; the shared agent tolerates every taint, an own agent what it says
        spec["agent"] = {
            "updateStrategy": {"maxSurge": 1, "maxUnavailable": 0},
            "tolerations": [{"operator": "Exists"}],
        }
    return kube.profile(f"p{i}", spec)


class Followers:
    """The simulated node agents: per node, GET then WATCH of the node agent's ConfigMap and of
    the Node, each by metadata.name; records when each ConfigMap watch saw a MODIFIED event."""

    def __init__(self, server: str, kubeconfig: dict[str, Any], tmp: Path) -> None:
        m = re.match(r"https://([^:/]+):(\d+)", server)
        assert m, server
        self.host, self.port = m.group(1), int(m.group(2))
        user, cluster = kubeconfig["users"][0]["user"], kubeconfig["clusters"][0]["cluster"]
        for name, data in (
            ("ca.crt", cluster["certificate-authority-data"]),
            ("c.crt", user["client-certificate-data"]),
            ("c.key", user["client-key-data"]),
        ):
            (tmp / name).write_bytes(base64.b64decode(data))
        self.ctx = ssl.create_default_context(cafile=str(tmp / "ca.crt"))
        self.ctx.load_cert_chain(str(tmp / "c.crt"), str(tmp / "c.key"))
        self.modified: list[float] = []
        self.open = self.failed = 0
        self.loop = asyncio.new_event_loop()
        threading.Thread(target=self.loop.run_forever, daemon=True).start()
        self._tasks: list[asyncio.Task[None]] = []

    async def _request(self, path: str) -> tuple[asyncio.StreamReader, asyncio.StreamWriter, int]:
        reader, writer = await asyncio.open_connection(self.host, self.port, ssl=self.ctx)
        writer.write(f"GET {path} HTTP/1.1\r\nHost: {self.host}\r\nAccept: application/json\r\n\r\n".encode())
        await writer.drain()
        status = int((await reader.readline()).split()[1])
        while (await reader.readline()) not in (b"\r\n", b""):
            pass
        return reader, writer, status

    async def _chunks(self, reader: asyncio.StreamReader) -> AsyncIterator[bytes]:
        while size := int((await reader.readline()).strip() or b"0", 16):
            data = await reader.readexactly(size)
            await reader.readexactly(2)
            yield data

    async def _follow(self, get_path: str, list_path: str, is_config: bool, gate: asyncio.Semaphore) -> None:
        async with gate:
            try:
                reader, writer, status = await self._request(get_path)
                body = b"".join([c async for c in self._chunks(reader)])
                writer.close()
                rv = json.loads(body)["metadata"]["resourceVersion"]
                reader, _w, status = await self._request(f"{list_path}&watch=1&resourceVersion={rv}")
                if status != 200:
                    raise RuntimeError(f"WATCH {list_path}: {status}")
            except Exception:
                self.failed += 1
                return
        self.open += 1
        buf = b""
        async for data in self._chunks(reader):
            buf += data
            while b"\n" in buf:
                line, buf = buf.split(b"\n", 1)
                if is_config and b'"type":"MODIFIED"' in line:
                    self.modified.append(time.monotonic())

    async def _start(self, nodes: list[str]) -> None:
        gate = asyncio.Semaphore(64)
        cm = f"/api/v1/namespaces/{NAMESPACE}/configmaps"
        for n in nodes:
            self._tasks.append(
                asyncio.create_task(
                    self._follow(f"{cm}/{SHARED}", f"{cm}?fieldSelector=metadata.name%3D{SHARED}", True, gate)
                )
            )
            self._tasks.append(
                asyncio.create_task(
                    self._follow(
                        f"/api/v1/nodes/{n}", f"/api/v1/nodes?fieldSelector=metadata.name%3D{n}", False, gate
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


def window(
    cluster: Cluster, seconds: float, action: Callable[[], object] | None = None
) -> dict[str, dict[str, float]]:
    """Requests (by verb/resource) and watch events (by kind) the API server served in ``seconds``
    after ``action()`` (None: an idle window), for the resources a change can touch."""
    before = cluster.api.metrics()
    if action is not None:
        action()
    time.sleep(seconds)
    after = cluster.api.metrics()

    out: dict[str, dict[str, float]] = {"requests": {}, "events": {}}
    for part, name, keys in (
        ("requests", "apiserver_request_total", ("verb", "resource")),
        ("events", "apiserver_watch_events_total", ("resource",)),
    ):
        a, b = before.by(name, *keys), after.by(name, *keys)
        for k, v in b.items():
            if k[-1] in RELEVANT:
                out[part]["/".join(k)] = v - a.get(k, 0)
    return out


def minus(
    change: dict[str, dict[str, float]], idle: dict[str, dict[str, float]]
) -> dict[str, dict[str, float]]:
    return {
        part: {k: v - idle[part].get(k, 0) for k, v in counts.items() if v - idle[part].get(k, 0) > 0}
        for part, counts in change.items()
    }


def writes(counts: dict[str, float]) -> float:
    return sum(v for k, v in counts.items() if k.split("/")[0] in WRITE_VERBS)


def run(r: Run) -> None:
    n, p, rounds = r.integer("nodes"), r.integer("profiles"), r.rounds()
    with kwok_cluster(r, n, crds=False) as cluster:
        api = cluster.api
        cluster.chart_without_operator(NAMESPACE)
        apiserver = next(pr.pid for pr in cluster.dev.running() if pr.name == "kube-apiserver")
        stamp = [0]

        def change() -> None:
            stamp[0] += 1
            api.merge(
                f"{PROFILES}/p0", {"spec": {"plugin": {"allocation": {"envs": {"CHANGE": str(stamp[0])}}}}}
            )

        def daemonsets() -> list[dict[str, Any]]:
            return api.items(f"/apis/apps/v1/namespaces/{NAMESPACE}/daemonsets")

        with operator(r, cluster.kubeconfig, NAMESPACE, "--agent-image", "example.invalid/agent:bench"):
            for i in range(p):
                api.create(PROFILES, profile(i, own_agent=False))
            wait(
                "the node agent's pods ready on every node",
                lambda: any(
                    d["metadata"]["name"] == SHARED and (d.get("status") or {}).get("numberReady", 0) >= n
                    for d in daemonsets()
                ),
                1800,
                0.5,
            )
            rss0 = status_mib(apiserver, "VmRSS")
            followers = Followers(cluster.dev.server, yaml.safe_load(cluster.kubeconfig.read_text()), r.work)
            t0 = time.monotonic()
            followers.start(cluster.nodes)
            wait(
                "every simulated agent following",
                lambda: followers.open + followers.failed >= 2 * n,
                1800,
                0.5,
            )
            opened = time.monotonic() - t0
            time.sleep(r.number("settle"))
            rss1 = status_mib(apiserver, "VmRSS")
            after_writes, after_events, fanout = [], [], []
            try:
                for _ in range(rounds):
                    idle = window(cluster, r.number("window"))
                    first, t0 = len(followers.modified), time.monotonic()
                    got = minus(window(cluster, r.number("window"), change), idle)
                    seen = followers.modified[first:]
                    after_writes.append(writes(got["requests"]))
                    after_events.append(sum(got["events"].values()))
                    fanout.append(max(seen) - t0 if len(seen) >= n else float("nan"))
                    r.note(f"after, a change: {json.dumps(got)}; {len(seen)} of {n} simulated agents saw it")
            finally:
                followers.stop()
            r.figure(
                "node agent: the API server's RSS with the agents' watches",
                "MiB",
                {"with 2 watches per node": [rss1], "before the watches": [rss0]},
                note=f"{followers.open} watches opened in {opened:.0f} s ({followers.failed} failed)",
            )
            # --- before: an agent DaemonSet per profile ---
            for i in range(p):
                api.delete(f"{PROFILES}/p{i}")
            wait("the shared agent gone", lambda: not daemonsets(), 900, 0.5)
            # Its 5,000 pods go after it, deleted by the garbage collector for minutes; a roll
            # measured meanwhile competes with them (2026-11-27: 3,029 pod DELETEs and not one
            # node rolled in the 60 s window), so the before design starts once they are gone.
            wait(
                "the shared agent's pods gone",
                lambda: not api.items(f"/api/v1/namespaces/{NAMESPACE}/pods", limit="1"),
                1800,
                5.0,
            )
            bp = r.integer("before_profiles")
            for i in range(bp):
                api.create(PROFILES, profile(i, own_agent=True))
            t0 = time.monotonic()
            wait(
                f"{bp} DaemonSets ready on every node",
                lambda: (
                    len(ds := daemonsets()) == bp
                    and all((d.get("status") or {}).get("numberReady", 0) >= n for d in ds)
                ),
                3600,
                1.0,
            )
            created = time.monotonic() - t0
            bw = r.number("before_window")
            idle = window(cluster, bw)
            got = minus(window(cluster, bw, change), idle)
            ds0 = api.get(f"/apis/apps/v1/namespaces/{NAMESPACE}/daemonsets/patchbay-p0") or {}
            rolled = int((ds0.get("status") or {}).get("updatedNumberScheduled", 0))
            per_node = writes(got["requests"]) / rolled if rolled else float("nan")
            events_per_node = sum(got["events"].values()) / rolled if rolled else float("nan")
            r.note(f"before, the roll over {bw:g} s: {rolled} nodes rolled; {json.dumps(got)}")
        note = (
            f"{n} kwok nodes, {p} profiles; the node agent's side simulated (its follower's requests); "
            f"before: measured over {bw:g} s ({rolled} nodes rolled), extrapolated to {n} nodes; "
            f"before: {bp} of the {p} DaemonSets made ({bp * n} pods in {created:.0f} s), one rolled"
        )
        r.figure(
            "node agent: API writes for one profile change",
            "writes",
            {
                "one node agent (measured)": after_writes,
                "an agent DaemonSet per profile (extrapolated)": [per_node * n],
            },
            headline=True,
            note=note,
        )
        r.figure(
            "node agent: watch events for one profile change",
            "events",
            {
                "one node agent (measured)": after_events,
                "an agent DaemonSet per profile (extrapolated)": [events_per_node * n],
            },
            note=note,
        )
        r.figure(
            "node agent: a profile change -> on every node",
            "s",
            {
                "one node agent (measured)": fanout,
                "an agent DaemonSet per profile (extrapolated)": [
                    bw / rolled * n if rolled else float("nan")
                ],
            },
            headline=True,
            note=note,
        )
        r.figure(
            "node agent: agent pods",
            "pods",
            {"one node agent": [n], "an agent DaemonSet per profile": [p * n]},
        )


SCENARIO = Scenario(
    sitting="scale",
    name="node_agent_api_cost",
    about="one profile change's API cost: the shared node agent vs an agent DaemonSet per profile",
    run=run,
    params={
        "nodes": Param(5000, 10, "kwok nodes"),
        "profiles": Param(10, 2, "profiles selecting every node"),
        "rounds": Param(5, 1, "profile changes measured on the node agent design"),
        "window": Param(15.0, 1.0, "seconds counted after a change (and idle before it)"),
        "before_window": Param(60.0, 3.0, "seconds of the per-profile roll measured"),
        "before_profiles": Param(
            1, 1, "profiles given agents of their own for the before design (P x N pods take long)"
        ),
        "settle": Param(3.0, 1.0, "seconds after the watches opened before the API server's RSS is read"),
    },
    figures=(
        "node agent: API writes for one profile change",
        "node agent: a profile change -> on every node",
        "node agent: the API server's RSS with the agents' watches",
    ),
)
