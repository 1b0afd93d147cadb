"""Memory on a node: per-profile agents (before) vs ONE node agent serving every profile (after),
and squat/generic-device-plugin serving the same resources, for 1, 3 and 5 profiles.

Every agent here is the real program (`patchbay-agent`) as a host process, with the image's
interpreter settings (PYTHONOPTIMIZE=2, PYTHONNODEBUGRANGES=1, MALLOC_ARENA_MAX=2), its own
sockets, registering with a Python kubelet peer (tests/support/pykubelet.py), reading a
PodResources peer, and writing its DeviceReports (and, for the DRA profile, its ResourceSlices) to
a real local control plane (devcluster, no real node: this needs no lock). Devices are FAKE (files
under a temporary tree). RSS and PSS are read from /proc once every resource is registered and
every report written, after a settle pause; `idle` is the node agent on a node no profile selects
(the shared DaemonSet runs on every node). squat's binary is built from its repository with
`go build -mod=vendor` (--squat PATH; left out without it).

    python bench/node_memory.py [--profiles 1,3,5] [--squat /tmp/squat-gdp/generic-device-plugin]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(REPO / "tests")]

import yaml  # noqa: E402
from support.podresources_peer import PodResourcesPeer  # noqa: E402
from support.pykubelet import PyKubelet  # noqa: E402

from patchbay_devcluster import DevCluster, find_bin_dir  # noqa: E402

AGENT = str(Path(sys.executable).parent / "patchbay-agent")
ENV = {"PYTHONOPTIMIZE": "2", "PYTHONNODEBUGRANGES": "1", "MALLOC_ARENA_MAX": "2"}
NODE = "kwok-node-0"
#: Five kinds of device; the first three are the issue's set: two DevicePlugin, one DRA.
PROFILES: list[dict[str, Any]] = [
    {
        "profile": "serial",
        "mode": "DevicePlugin",
        "resourceName": "example.com/serial",
        "glob": "ttyUSB",
        "n": 4,
    },
    {
        "profile": "tokens",
        "mode": "DevicePlugin",
        "resourceName": "example.com/tokens",
        "glob": "token",
        "n": 2,
    },
    {"profile": "sensors", "mode": "DRA", "resourceName": "example.com/sensor", "glob": "sensor", "n": 3},
    {"profile": "cams", "mode": "DevicePlugin", "resourceName": "example.com/cam", "glob": "video", "n": 2},
    {"profile": "fpgas", "mode": "DevicePlugin", "resourceName": "example.com/fpga", "glob": "fpga", "n": 2},
]


def entry(p: dict[str, Any]) -> dict[str, Any]:
    out = {
        "profile": p["profile"],
        "mode": p["mode"],
        "resourceName": p["resourceName"],
        "plugin": {"discovery": {"paths": {"globs": [f"/dev/{p['glob']}*"]}}},
        "nodeSelectorTerms": [[]],
    }
    if p["mode"] == "DRA":
        out["driver"] = f"{p['profile']}.patchbay.dev"
    return out


def glob_of(tree: Path, p: dict[str, Any]) -> str:
    return f"{tree}/dev/{p['glob']}*"


def memory(pid: int) -> tuple[float, float]:
    """(RSS, PSS) in MiB."""
    rss = pss = 0.0
    for line in Path(f"/proc/{pid}/smaps_rollup").read_text().splitlines():
        if line.startswith("Rss:"):
            rss = int(line.split()[1]) / 1024
        elif line.startswith("Pss:"):
            pss = int(line.split()[1]) / 1024
    return rss, pss


class Peers:
    """The Python kubelet and PodResources peers on a loop of their own."""

    def __init__(self, plugin_dir: Path, pr_socket: Path) -> None:
        self.loop = asyncio.new_event_loop()
        self.kubelet = PyKubelet(plugin_dir)
        self.pr = PodResourcesPeer(pr_socket)
        threading.Thread(target=self.loop.run_forever, daemon=True).start()
        self.call(self.kubelet.start())
        self.call(self.pr.start())

    def call(self, coro: Any) -> Any:
        return asyncio.run_coroutine_threadsafe(coro, self.loop).result(60)

    def healthy(self, resource: str) -> int:
        return self.kubelet.healthy(resource)

    def stop(self) -> None:
        self.call(self.pr.stop())
        self.call(self.kubelet.stop())
        self.loop.call_soon_threadsafe(self.loop.stop)


def wait(what: str, check: Any, timeout: float = 60, every: float = 0.2) -> None:
    """Poll `check` every `every` seconds (a latency measured with it is only as fine as that)."""
    deadline = time.monotonic() + timeout
    while not check():
        if time.monotonic() > deadline:
            raise SystemExit(f"node_memory: timed out waiting for {what}")
        time.sleep(every)


def reports(kubectl: list[str]) -> set[str]:
    out = subprocess.run(
        [*kubectl, "-n", "default", "get", "devicereports", "-o", "json"], capture_output=True, text=True
    )
    if out.returncode != 0:
        return set()
    return {r["profile"] for r in json.loads(out.stdout)["items"] if not r.get("agentError")}


def run_case(
    how: str,
    chosen: list[dict[str, Any]],
    work: Path,
    kubeconfig: Path,
    kubectl: list[str],
    squat: str | None,
) -> tuple[int, float, float]:
    """Start the processes for `chosen` the `how` way; (processes, RSS sum, PSS sum)."""
    case = work / f"{how}-{len(chosen)}"
    tree, plugin_dir, kubelet_root = case / "host", case / "dp", case / "kubelet"
    for d in (tree / "dev", plugin_dir, kubelet_root / "plugins_registry", kubelet_root / "plugins"):
        d.mkdir(parents=True)
    for p in chosen:
        for i in range(p["n"]):
            (tree / "dev" / f"{p['glob']}{i}").write_text("")
    peers = Peers(plugin_dir, case / "pr.sock")
    common = [
        "--node-name", NODE, "--device-plugin-dir", str(plugin_dir), "--host-root", str(tree),
        "--host-path-prefix", str(tree), "--kubeconfig", str(kubeconfig), "--report-namespace", "default",
        "--pod-resources-socket", str(case / "pr.sock"), "--http-address", "off",
        "--kubelet-root-dir", str(kubelet_root), "--cdi-spec-dir", str(case / "cdi"),
    ]  # fmt: skip
    procs: list[subprocess.Popen[bytes]] = []
    env = {**os.environ, **ENV}
    log = open(case / "agents.log", "wb")  # noqa: SIM115
    try:
        if how in ("node-agent", "idle"):
            cfg = case / "node.yaml"
            entries = [entry(p) for p in chosen]
            if how == "idle":  # listed, but no profile selects this node
                for e in entries:
                    e["nodeSelectorTerms"] = [[{"key": "example.com/nowhere", "operator": "Exists"}]]
            cfg.write_text(yaml.safe_dump({"profiles": entries}))
            procs.append(
                subprocess.Popen([AGENT, "--node-config", str(cfg), *common], env=env, stdout=log, stderr=log)
            )
        elif how == "per-profile":
            for p in chosen:
                e = entry(p)
                cfg = case / f"{p['profile']}.yaml"
                cfg.write_text(yaml.safe_dump({"resourceName": e["resourceName"], "plugin": e["plugin"]}))
                extra = ["--profile", p["profile"]] + (["--dra-driver", e["driver"]] if "driver" in e else [])
                procs.append(
                    subprocess.Popen(
                        [AGENT, "--config", str(cfg), *extra, *common], env=env, stdout=log, stderr=log
                    )
                )
        else:
            assert squat is not None
            devices = [
                json.dumps({"name": p["profile"], "groups": [{"paths": [{"path": glob_of(tree, p)}]}]})
                for p in chosen
            ]
            argv = [
                squat,
                "--plugin-directory",
                str(plugin_dir),
                "--domain",
                "example.com",
                "--listen",
                "127.0.0.1:0",
            ]
            for d in devices:
                argv += ["--device", d]
            procs.append(subprocess.Popen(argv, stdout=log, stderr=log))
        if how == "idle":
            time.sleep(10.0)
        elif how == "squat":
            wait(
                "squat's registrations",
                lambda: all(peers.healthy(f"example.com/{p['profile']}") == p["n"] for p in chosen),
            )
        else:
            plugins = [p for p in chosen if p["mode"] == "DevicePlugin"]
            wait(
                "every registration", lambda: all(peers.healthy(p["resourceName"]) == p["n"] for p in plugins)
            )
            wait("every DeviceReport", lambda: {p["profile"] for p in chosen} <= reports(kubectl), 90)
        time.sleep(5.0)
        mem = [memory(p.pid) for p in procs]
        return len(procs), sum(m[0] for m in mem), sum(m[1] for m in mem)
    finally:
        for p in procs:
            p.terminate()
        for p in procs:
            try:
                p.wait(20)
            except subprocess.TimeoutExpired:
                p.kill()
        log.close()
        peers.stop()
        subprocess.run([*kubectl, "-n", "default", "delete", "devicereports", "--all"], capture_output=True)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--profiles", default="1,3,5")
    parser.add_argument("--squat", help="path to squat/generic-device-plugin's binary")
    parser.add_argument("--only", help="comma-separated subset of per-profile,node-agent,squat,idle")
    args = parser.parse_args()
    counts = [int(n) for n in args.profiles.split(",")]
    with tempfile.TemporaryDirectory(prefix="nodemem", dir="/tmp") as tmp:
        work = Path(tmp)
        cluster = DevCluster(work / "cluster")
        cluster.up(nodes=1, timeout=120)
        try:
            kubectl = [str(find_bin_dir() / "kubectl"), "--kubeconfig", str(cluster.kubeconfig)]
            subprocess.run(
                [*kubectl, "apply", "-f", str(REPO / "crds" / "patchbay.dev_devicereports.yaml")],
                check=True,
                capture_output=True,
            )
            wait(
                "the DeviceReport CRD",
                lambda: (
                    subprocess.run([*kubectl, "get", "devicereports"], capture_output=True).returncode == 0
                ),
            )
            # A warm-up run writes the optimized bytecode (.opt-2.pyc) the image ships compiled.
            run_case("node-agent", PROFILES[:1], work / "warm", cluster.kubeconfig, kubectl, None)
            hows = ["per-profile", "node-agent"] + (["squat"] if args.squat else []) + ["idle"]
            if args.only:
                hows = [h for h in hows if h in args.only.split(",")]
            print(f"{'profiles':>8} {'how':>12} {'processes':>9} {'RSS MiB':>8} {'PSS MiB':>8}")
            for n in counts:
                for how in hows:
                    procs, rss, pss = run_case(
                        how, PROFILES[:n], work, cluster.kubeconfig, kubectl, args.squat
                    )
                    print(f"{n:>8} {how:>12} {procs:>9} {rss:>8.1f} {pss:>8.1f}", flush=True)
        finally:
            cluster.down()


if __name__ == "__main__":
    main()
