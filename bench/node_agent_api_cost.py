"""What the shared node agent costs the API server on a big cluster, measured: N kwok nodes and
P profiles (default 5,000 and 10).

Starts its own local cluster (real etcd, kube-apiserver, controller manager, scheduler, kwok; no
real node) with N kwok nodes, the CRDs, and the operator (the real program, a host process). Then:

1. **After (one node agent).** P DevicePlugin profiles without agent settings select every node:
   ONE DaemonSet (`patchbay-node-agent`), whose N pods kwok runs. kwok runs no process, so the
   agents' side is SIMULATED, and named so: for each node, the exact requests the node agent's
   follower makes (`patchbay_agent/nodeagent.py` Follower: a GET, then a WATCH from its
   resourceVersion, of its ConfigMap and of its Node, each by `metadata.name`), held open from one
   asyncio process. Measured: DaemonSets and agent pods, the WATCH requests the API server holds
   (`apiserver_longrunning_requests`), the API server's RSS before and after the watches, and for
   one profile change (a kubectl-style patch of one profile's plugin section): the requests the
   API server served in `--window` seconds from the patch (`apiserver_request_total`, by verb and
   resource) and the watch events it sent (`apiserver_watch_events_total`), both for the resources
   a change can touch and less an idle window of the same length measured just before (the
   baseline: kwok's heartbeats and the controllers' resyncs), and when the last simulated agent
   had the new config. An in-place change writes no DeviceReport (the report does not change), so the
   simulated agents write nothing.
2. **Before (one agent DaemonSet per profile).** The same P profiles with an `agent` section of
   their own: P DaemonSets, P x N pods (created by the controller manager; kwok runs them). One
   profile change rolls that profile's DaemonSet node by node (maxSurge 1). Rolling N nodes takes
   long here, so the roll is measured over a window (`--before-window` seconds, less an idle
   window of the same length): nodes rolled, and writes served, per rolled node; the totals for
   N nodes are those rates times N (printed as such: extrapolated, not observed).

Prints figures, asserts nothing; results also in bench/results/node-agent-api-cost-<N>.json.

    export PATCHBAY_KUBE_BIN=$(hack/kube-binaries.sh --print-bin-dir)
    .venv/bin/python bench/node_agent_api_cost.py --nodes 5000 --profiles 10
"""

from __future__ import annotations

import argparse
import asyncio
import base64
import json
import os
import re
import signal
import ssl
import subprocess
import sys
import tempfile
import time
from collections import Counter
from pathlib import Path
from typing import Any

import yaml
from kubernetes import client
from kubernetes.client.rest import ApiException

REPO = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(REPO / "tests")]

from support.clusters import apply_crd  # noqa: E402

from patchbay_devcluster import DevCluster, find_bin_dir  # noqa: E402

GROUP, VERSION, PLURAL = "patchbay.dev", "v1beta1", "devicepluginprofiles"
NAMESPACE = "patchbay-system"
SHARED = "patchbay-node-agent"
NODE_PREFIX = "kwok-node-"


def log(msg: str) -> None:
    print(f"[{time.strftime('%H:%M:%S')}] {msg}", flush=True)


def wait(what: str, check: Any, timeout: float = 600, every: float = 1.0) -> Any:
    deadline = time.monotonic() + timeout
    while True:
        got = check()
        if got:
            return got
        if time.monotonic() > deadline:
            raise SystemExit(f"node_agent_api_cost: timed out waiting for {what}")
        time.sleep(every)


def profile(i: int, own_agent: bool) -> dict[str, Any]:
    spec: dict[str, Any] = {
        "resourceName": f"bench.patchbay.dev/r{i}",
        "mode": "DevicePlugin",
        "nodeSelector": {"matchLabels": {"type": "kwok"}},
        "plugin": {"discovery": {"virtual": {"count": 2}}},
    }
    if own_agent:
        # kwok nodes carry a NoSchedule taint; the shared agent tolerates every taint, an agent of
        # a profile's own only what the profile says.
        spec["agent"] = {
            "updateStrategy": {"maxSurge": 1, "maxUnavailable": 0},
            "tolerations": [{"operator": "Exists"}],
        }
    return {
        "apiVersion": f"{GROUP}/{VERSION}",
        "kind": "DevicePluginProfile",
        "metadata": {"name": f"p{i}"},
        "spec": spec,
    }


class Metrics:
    """The API server's own counters, read from its /metrics."""

    LINE = re.compile(r"^(\w+)\{([^}]*)\} ([0-9.e+-]+)$")

    def __init__(self, api: client.ApiClient) -> None:
        self.api = api

    def scrape(self) -> dict[str, Counter[tuple[str, ...]]]:
        resp = self.api.call_api("GET", f"{self.api.configuration.host}/metrics")
        resp.read()
        text = resp.data.decode()
        out: dict[str, Counter[tuple[str, ...]]] = {
            "requests": Counter(),
            "watch_events": Counter(),
            "longrunning": Counter(),
        }
        for line in text.splitlines():
            m = self.LINE.match(line)
            if not m:
                continue
            name, labels, value = (
                m.group(1),
                dict(re.findall(r'(\w+)="([^"]*)"', m.group(2))),
                float(m.group(3)),
            )
            if name == "apiserver_request_total":
                out["requests"][(labels.get("verb", ""), labels.get("resource", ""))] += value
            elif name == "apiserver_watch_events_total":
                out["watch_events"][(labels.get("kind", labels.get("resource", "")),)] += value
            elif name == "apiserver_longrunning_requests":
                out["longrunning"][(labels.get("verb", ""), labels.get("resource", ""))] += value
        return out


def delta(after: Counter[tuple[str, ...]], before: Counter[tuple[str, ...]]) -> dict[str, int]:
    out = {"/".join(k): round(after[k] - before.get(k, 0)) for k in after}
    return {k: v for k, v in sorted(out.items(), key=lambda kv: -kv[1]) if v > 0}


def rss_mib(pid: int) -> float:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    return 0.0


class Agents:
    """The simulated agents: per node, GET then WATCH of the node agent's ConfigMap and of the
    Node, each by metadata.name, as the node agent's Follower does; records when each ConfigMap
    watch saw a MODIFIED event."""

    def __init__(self, server: str, kubeconfig: dict[str, Any], tmp: Path) -> None:
        m = re.match(r"https://([^:/]+):(\d+)", server)
        assert m, server
        self.host, self.port = m.group(1), int(m.group(2))
        user = kubeconfig["users"][0]["user"]
        cluster = kubeconfig["clusters"][0]["cluster"]
        (tmp / "ca.crt").write_bytes(base64.b64decode(cluster["certificate-authority-data"]))
        (tmp / "c.crt").write_bytes(base64.b64decode(user["client-certificate-data"]))
        (tmp / "c.key").write_bytes(base64.b64decode(user["client-key-data"]))
        self.ctx = ssl.create_default_context(cafile=str(tmp / "ca.crt"))
        self.ctx.load_cert_chain(str(tmp / "c.crt"), str(tmp / "c.key"))
        self.modified: list[float] = []
        self.open = 0
        self.failed = 0
        self._tasks: list[asyncio.Task[None]] = []
        self._connect = asyncio.Semaphore(64)

    async def _request(self, path: str) -> tuple[asyncio.StreamReader, asyncio.StreamWriter, int]:
        reader, writer = await asyncio.open_connection(self.host, self.port, ssl=self.ctx)
        writer.write(f"GET {path} HTTP/1.1\r\nHost: {self.host}\r\nAccept: application/json\r\n\r\n".encode())
        await writer.drain()
        status = int((await reader.readline()).split()[1])
        while (await reader.readline()) not in (b"\r\n", b""):
            pass
        return reader, writer, status

    async def _chunks(self, reader: asyncio.StreamReader) -> Any:
        while True:
            size = int((await reader.readline()).strip() or b"0", 16)
            if size == 0:
                return
            data = await reader.readexactly(size)
            await reader.readexactly(2)
            yield data

    async def _get_rv(self, path: str) -> str:
        reader, writer, status = await self._request(path)
        body = b"".join([c async for c in self._chunks(reader)])
        writer.close()
        if status != 200:
            raise RuntimeError(f"GET {path}: {status}")
        return str(json.loads(body)["metadata"]["resourceVersion"])

    async def _follow(self, get_path: str, list_path: str, is_config: bool) -> None:
        async with self._connect:
            try:
                rv = await self._get_rv(get_path)
                reader, _writer, status = await self._request(f"{list_path}&watch=1&resourceVersion={rv}")
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

    async def start(self, nodes: list[str]) -> None:
        cm = f"/api/v1/namespaces/{NAMESPACE}/configmaps"
        for n in nodes:
            self._tasks.append(
                asyncio.create_task(
                    self._follow(f"{cm}/{SHARED}", f"{cm}?fieldSelector=metadata.name%3D{SHARED}", True)
                )
            )
            self._tasks.append(
                asyncio.create_task(
                    self._follow(
                        f"/api/v1/nodes/{n}", f"/api/v1/nodes?fieldSelector=metadata.name%3D{n}", False
                    )
                )
            )

    def stop(self) -> None:
        for t in self._tasks:
            t.cancel()


def run_loop_in_thread() -> asyncio.AbstractEventLoop:
    import threading

    loop = asyncio.new_event_loop()
    threading.Thread(target=loop.run_forever, daemon=True).start()
    return loop


#: What a profile change can cause: the requests and watch events counted for it. Everything else
#: (kwok's node heartbeats and leases, controllers' resyncs) is background on this cluster.
RELEVANT = {
    "configmaps",
    "daemonsets",
    "devicepluginprofiles",
    "devicereports",
    "pods",
    "controllerrevisions",
    "events",
}
WRITES = ("POST", "PUT", "PATCH", "DELETE", "APPLY")


def window(metrics: Metrics, seconds: float, action: Any = None) -> dict[str, dict[str, int]]:
    """Requests (by verb/resource) and watch events (by resource) the API server served during
    `seconds` after `action()` (None: an idle window, the background baseline), for the RELEVANT
    resources."""
    before = metrics.scrape()
    if action is not None:
        action()
    time.sleep(seconds)
    after = metrics.scrape()
    requests = {
        k: v for k, v in delta(after["requests"], before["requests"]).items() if k.split("/")[-1] in RELEVANT
    }
    events = {k: v for k, v in delta(after["watch_events"], before["watch_events"]).items() if k in RELEVANT}
    return {"requests": requests, "watchEvents": events}


def minus(change: dict[str, dict[str, int]], idle: dict[str, dict[str, int]]) -> dict[str, dict[str, int]]:
    """The change's window less the idle one (never below 0)."""
    out: dict[str, dict[str, int]] = {}
    for part, counts in change.items():
        out[part] = {k: v - idle[part].get(k, 0) for k, v in counts.items() if v - idle[part].get(k, 0) > 0}
    return out


def writes(counts: dict[str, int]) -> int:
    return sum(v for k, v in counts.items() if k.split("/")[0] in WRITES)


def change() -> None:
    """The profile change both designs are measured with: one env of p0's allocation."""
    CUSTOM[0].patch_cluster_custom_object(
        GROUP,
        VERSION,
        PLURAL,
        "p0",
        {"spec": {"plugin": {"allocation": {"envs": {"CHANGE": str(time.time())}}}}},
    )


CUSTOM: list[client.CustomObjectsApi] = []


def save(results: dict[str, Any]) -> None:
    """Written after each phase: a run cut short keeps what it measured."""
    out = REPO / "bench" / "results"
    out.mkdir(parents=True, exist_ok=True)
    only = "-before" if results.get("skipAfter") else ""
    path = out / f"node-agent-api-cost-{results['nodes']}{only}.json"
    path.write_text(json.dumps(results, indent=1))
    print(f"wrote {path}", flush=True)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--nodes", type=int, default=5000)
    ap.add_argument("--profiles", type=int, default=10)
    ap.add_argument(
        "--before-window", type=float, default=60.0, help="seconds of the per-profile roll measured"
    )
    ap.add_argument("--window", type=float, default=15.0, help="seconds counted after the change (after)")
    ap.add_argument("--skip-before", action="store_true")
    ap.add_argument(
        "--skip-after",
        action="store_true",
        help="only the before design (P profiles with agents of their own; with --profiles 1 the roll of "
        "one profile's DaemonSet is measured without the other P-1 DaemonSets' standing pods)",
    )
    args = ap.parse_args()
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))
    n, p = args.nodes, args.profiles
    results: dict[str, Any] = {
        "nodes": n,
        "profiles": p,
        "skipAfter": args.skip_after,
        "at": time.strftime("%Y-%m-%d %H:%M:%S"),
    }
    with tempfile.TemporaryDirectory(prefix="pb-apicost-") as tmpdir:
        tmp = Path(tmpdir)
        cluster = DevCluster(tmp / "c", find_bin_dir())
        operator: subprocess.Popen[bytes] | None = None
        loop = run_loop_in_thread()
        try:
            log(f"cluster with {n} kwok nodes")
            cluster.up(nodes=0, timeout=180)
            nodes = cluster.add_kwok_nodes(n, prefix=NODE_PREFIX, workers=16)
            api = cluster.api()
            core, apps, custom = client.CoreV1Api(api), client.AppsV1Api(api), client.CustomObjectsApi(api)
            CUSTOM.append(custom)
            for crd in ("patchbay.dev_devicereports.yaml", "patchbay.dev_devicepluginprofiles.yaml"):
                apply_crd(api, REPO / "crds" / crd)
            core.create_namespace({"metadata": {"name": NAMESPACE}})
            core.create_namespaced_service_account(NAMESPACE, {"metadata": {"name": "patchbay-agent"}})
            oplog = (tmp / "operator.log").open("wb")
            operator = subprocess.Popen(
                [sys.executable, "-m", "patchbay_operator.main", "--kubeconfig", str(cluster.kubeconfig),
                 "--namespace", NAMESPACE, "--agent-image", "example.invalid/agent:bench"],
                stdout=oplog, stderr=subprocess.STDOUT,
            )  # fmt: skip
            metrics = Metrics(api)
            apiserver = next(pr.pid for pr in cluster.running() if pr.name == "kube-apiserver")

            # --- after: one node agent -----------------------------------------------------
            if not args.skip_after:
                log(f"after: {p} profiles sharing the node agent")
                for i in range(p):
                    custom.create_cluster_custom_object(GROUP, VERSION, PLURAL, profile(i, own_agent=False))

                def shared_ready() -> bool:
                    try:
                        ds = apps.read_namespaced_daemon_set(SHARED, NAMESPACE)
                    except ApiException:
                        return False
                    st = ds.status
                    return (st.number_ready or 0) >= n

                wait("the node agent's pods ready on every node", shared_ready, 1800, 5)
                cm = core.read_namespaced_config_map(SHARED, NAMESPACE)
                listed = len(yaml.safe_load(cm.data["node.yaml"])["profiles"])
                daemonsets = len(apps.list_namespaced_daemon_set(NAMESPACE).items)
                pods = len(core.list_namespaced_pod(NAMESPACE, limit=1).items) and sum(
                    (d.status.current_number_scheduled or 0)
                    for d in apps.list_namespaced_daemon_set(NAMESPACE).items
                )
                rss0 = rss_mib(apiserver)
                before_watch = metrics.scrape()
                kubeconfig = yaml.safe_load(Path(cluster.kubeconfig).read_text())
                agents = Agents(cluster.server, kubeconfig, tmp)
                t0 = time.monotonic()
                asyncio.run_coroutine_threadsafe(agents.start(nodes), loop).result()
                wait("every simulated agent following", lambda: agents.open + agents.failed >= 2 * n, 1800, 1)
                opened = time.monotonic() - t0
                time.sleep(5)
                after_watch = metrics.scrape()
                rss1 = rss_mib(apiserver)
                log(f"{agents.open} watches open ({agents.failed} failed) in {opened:.0f}s")

                idle = window(metrics, args.window)
                first_modified = len(agents.modified)
                change_t0 = time.monotonic()
                changed = minus(window(metrics, args.window, change), idle)
                seen = len(agents.modified) - first_modified
                fanout = max(agents.modified) - change_t0 if seen else None
                results["after"] = {
                    "daemonSets": daemonsets,
                    "agentPods": pods,
                    "profilesInConfig": listed,
                    "watchesOpened": agents.open,
                    "watchesFailed": agents.failed,
                    "secondsToOpenWatches": round(opened, 1),
                    "longrunningWatchesHeld": delta(after_watch["longrunning"], before_watch["longrunning"]),
                    "apiserverRssMiB": {"beforeWatches": round(rss0), "withWatches": round(rss1)},
                    "change": {
                        "windowSeconds": args.window,
                        **changed,
                        "writes": writes(changed["requests"]),
                        "simulatedAgentsThatSawIt": seen,
                        "lastAgentHasItSeconds": round(fanout, 2) if fanout is not None else None,
                    },
                }
                log(f"after: {json.dumps(results['after'], indent=1)}")
                save(results)
                agents.stop()

            # --- before: one DaemonSet per profile --------------------------------------------
            if not args.skip_before:
                log(f"before: {p} profiles with agents of their own ({p * n} pods)")
                for i in range(p if not args.skip_after else 0):
                    custom.delete_cluster_custom_object(GROUP, VERSION, PLURAL, f"p{i}")
                wait(
                    "the shared agent gone",
                    lambda: not apps.list_namespaced_daemon_set(NAMESPACE).items,
                    900,
                    5,
                )
                for i in range(p):
                    custom.create_cluster_custom_object(GROUP, VERSION, PLURAL, profile(i, own_agent=True))

                def all_ready() -> bool:
                    dss = apps.list_namespaced_daemon_set(NAMESPACE).items
                    return len(dss) == p and all((d.status.number_ready or 0) >= n for d in dss)

                t_create = time.monotonic()
                wait(f"{p} DaemonSets ready on every node", all_ready, 3600, 10)
                created = time.monotonic() - t_create
                rss2 = rss_mib(apiserver)
                idle = window(metrics, args.before_window)
                rolled_changed = minus(window(metrics, args.before_window, change), idle)
                ds = apps.read_namespaced_daemon_set("patchbay-p0", NAMESPACE)
                rolled = int(ds.status.updated_number_scheduled or 0) if ds.status else 0
                total = writes(rolled_changed["requests"])
                results["before"] = {
                    "daemonSets": p,
                    "agentPods": p * n,
                    "secondsToCreateAllPods": round(created),
                    "apiserverRssMiB": round(rss2),
                    "change": {
                        "windowSeconds": args.before_window,
                        "nodesRolledInWindow": rolled,
                        **rolled_changed,
                        "writes": total,
                        "writesPerRolledNode": round(total / rolled, 1) if rolled else None,
                        "extrapolatedWritesForAllNodes": round(total / rolled * n) if rolled else None,
                        "extrapolatedRollSeconds": round(args.before_window / rolled * n) if rolled else None,
                    },
                }
                log(f"before: {json.dumps(results['before'], indent=1)}")
        finally:
            loop.call_soon_threadsafe(loop.stop)
            if operator is not None:
                operator.terminate()
                try:
                    operator.wait(20)
                except subprocess.TimeoutExpired:
                    operator.kill()
            cluster.down()
    save(results)


if __name__ == "__main__":
    os.environ.setdefault("PYTHONUNBUFFERED", "1")
    main()
