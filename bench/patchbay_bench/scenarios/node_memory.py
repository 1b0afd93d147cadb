"""Memory on a node: ONE node agent serving every profile against one agent per profile (the design
before it) and, when its binary is given, squat/generic-device-plugin serving the same resources;
for 1, 3 and 5 profiles, and the node agent idle on a node no profile selects.

Every agent is the real program as a host process with the image's interpreter settings, its own
sockets, registering with the Python kubelet peer, reading a PodResources peer and writing its
DeviceReports (the DRA profile also its ResourceSlices) to a real local control plane; devices are
FAKE files. RSS and PSS (summed over the processes, ``smaps_rollup``) are read once every resource
is registered and every report written, after a settle pause. Sides interleaved per round."""

from __future__ import annotations

import json
import subprocess
import time
from collections.abc import Callable, Mapping, Sequence
from typing import Any

import yaml

from patchbay_bench.harness import Run, Value, interleave, wait
from patchbay_bench.peers import binary_provenance
from patchbay_bench.setup import AGENT, IMAGE_ENV, Child, Cluster, HostNode, kwok_cluster, rss_pss_mib

#: Five kinds of device; the first three are issue 19's set: two DevicePlugin, one DRA.
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
SIDES = {"node agent": "node-agent", "an agent per profile": "per-profile", "squat": "squat"}


def entry(p: Mapping[str, Any]) -> dict[str, Any]:
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


def reports(cluster: Cluster) -> set[str]:
    items = cluster.api.items("/apis/patchbay.dev/v1beta1/namespaces/default/devicereports")
    return {r["profile"] for r in items if not r.get("agentError")}


def case(
    r: Run, cluster: Cluster, how: str, chosen: Sequence[Mapping[str, Any]], i: int
) -> tuple[float, float]:
    """Start ``chosen``'s processes the ``how`` way; (RSS, PSS) summed, in MiB."""
    work = r.work / f"{how[:2]}{len(chosen)}{i}"
    node = HostNode(work)
    procs: list[Child] = []
    log = work / "agents.log"
    try:
        for p in chosen:
            for k in range(p["n"]):
                node.device(f"{p['glob']}{k}")
        common = node.agent_args(cluster.kubeconfig)
        if how in ("node-agent", "idle"):
            entries = [entry(p) for p in chosen]
            if how == "idle":  # listed, but no profile selects this node
                for e in entries:
                    e["nodeSelectorTerms"] = [[{"key": "example.com/nowhere", "operator": "Exists"}]]
            (work / "node.yaml").write_text(yaml.safe_dump({"profiles": entries}))
            procs.append(Child([AGENT, "--node-config", str(work / "node.yaml"), *common], log, IMAGE_ENV))
        elif how == "per-profile":
            for p in chosen:
                e = entry(p)
                cfg = work / f"{p['profile']}.yaml"
                cfg.write_text(yaml.safe_dump({"resourceName": e["resourceName"], "plugin": e["plugin"]}))
                extra = ["--profile", p["profile"], *(["--dra-driver", e["driver"]] if "driver" in e else [])]
                procs.append(Child([AGENT, "--config", str(cfg), *extra, *common], log, IMAGE_ENV))
        else:
            argv = [
                r.text("squat"),
                "--plugin-directory",
                str(node.plugin_dir),
                "--domain",
                "example.com",
                "--listen",
                "127.0.0.1:0",
            ]
            for p in chosen:
                group = {"paths": [{"path": f"{node.host}/dev/{p['glob']}*"}]}
                argv += ["--device", json.dumps({"name": p["profile"], "groups": [group]})]
            procs.append(Child(argv, log))
        if how == "idle":
            time.sleep(r.number("settle") * 2)
        elif how == "squat":
            wait(
                "squat's registrations",
                lambda: all(node.healthy(f"example.com/{p['profile']}") == p["n"] for p in chosen),
                60,
                0.2,
            )
        else:
            plugins = [p for p in chosen if p["mode"] == "DevicePlugin"]
            wait(
                "every registration",
                lambda: all(node.healthy(p["resourceName"]) == p["n"] for p in plugins),
                60,
                0.2,
            )
            wait("every DeviceReport", lambda: {p["profile"] for p in chosen} <= reports(cluster), 90, 0.2)
        time.sleep(r.number("settle"))
        mem = [rss_pss_mib(p.pid) for p in procs]
        return sum(m[0] for m in mem), sum(m[1] for m in mem)
    finally:
        for child in procs:
            child.stop()
        node.close()
        subprocess.run(
            cluster.kubectl("-n", "default", "delete", "devicereports", "--all"), capture_output=True
        )


def counts(params: Mapping[str, Value]) -> list[int]:
    return [int(n) for n in str(params["profiles"]).split(",")]


def run(r: Run) -> None:
    with kwok_cluster(r, nodes=1) as cluster:
        # A warm-up run writes the optimized bytecode (.opt-2.pyc) the image ships compiled.
        case(r, cluster, "node-agent", PROFILES[:1], -1)
        sides = {k: v for k, v in SIDES.items() if v != "squat" or r.text("squat")}
        if r.text("squat"):
            r.note(f"squat: {binary_provenance(r.text('squat'))}")
        for n in counts(r.params):
            chosen = PROFILES[:n]

            def side(how: str, chosen: Sequence[Mapping[str, Any]]) -> Callable[[int], tuple[float, float]]:
                return lambda i: case(r, cluster, how, chosen, i)

            got = interleave(r.rounds(), {s: side(how, chosen) for s, how in sides.items()})
            note = f"{n} profile(s): " + ", ".join(f"{p['profile']} ({p['mode']})" for p in chosen)
            if "squat" not in sides:
                note += "; squat not measured (its binary not given: squat=PATH)"
            r.figure(
                f"node memory, {n} profiles: RSS",
                "MiB",
                {s: [x[0] for x in v] for s, v in got.items()},
                headline=n == 3,
                note=note,
            )
            r.figure(
                f"node memory, {n} profiles: PSS",
                "MiB",
                {s: [x[1] for x in v] for s, v in got.items()},
                note=note,
            )
        idle = [case(r, cluster, "idle", PROFILES[:5], i) for i in range(r.rounds())]
        r.figure(
            "node memory: the node agent idle (5 profiles listed, none selecting the node): RSS",
            "MiB",
            {"node agent": [x[0] for x in idle]},
        )


def figures(params: Mapping[str, Value]) -> list[str]:
    """The figures a run of ``params`` records (catalogue.toml)."""
    return [f"node memory, {n} profiles: RSS" for n in counts(params)] + [
        "node memory: the node agent idle (5 profiles listed, none selecting the node): RSS"
    ]
