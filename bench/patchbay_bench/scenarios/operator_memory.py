"""The operator's memory with one DeviceReport per node at the CRD's bounds (2,048 devices,
64-character reasons, 65,536 characters of messages, 512 holders: 0.75 MB of JSON each).

1. The operator's RSS: the real program as a host process on a cluster of N kwok nodes with a
   DevicePlugin profile selecting them (its agent DaemonSet's N pods run by kwok). Its reports
   come through ``reportproxy`` (etcd's 2 GiB quota cannot hold 5,000 such reports: see there).
   Sides, interleaved, a fresh operator each round: reports at the bounds, and small reports (4
   devices) as the baseline. Read once the operator holds every report and has computed the
   profile's status: VmHWM (its peak) and VmRSS. Then the operator's start to every report held
   against a bare LIST of the same reports through a fresh proxy (``bare_list``), interleaved:
   how much of the start is the LIST itself (the proxy, TLS, JSON) and how much the operator's.
2. The decoder's share, in this process (tracemalloc): what the operator keeps per report
   (``devicereports.Report``), against the whole decoded object (what a cache of full objects
   would hold) and the decode with its bound lifted (every unhealthy device kept); and the
   status computation over N nodes and reports (``status.plugin_status``); and the CPU of the
   decode per report, the LIST page's reading against the dict reading (``decode_speed``).
"""

from __future__ import annotations

import contextlib
import gc
import json
import os
import subprocess
import time
import tracemalloc
import urllib.request
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

from patchbay_bench.harness import Run, interleave, wait
from patchbay_bench.peers import largest_report
from patchbay_bench.setup import (
    Cluster,
    agents_everywhere,
    cpu_seconds,
    kwok_cluster,
    operator,
    report_proxy,
    status_mib,
)
from patchbay_operator import agentwatch, devicereports
from patchbay_operator.capacity import NodeState
from patchbay_operator.devicereports import Report
from patchbay_operator.informer import LIST_CHUNK
from patchbay_operator.kube import Kube, json_page, load_configuration
from patchbay_operator.profiles import Profile
from patchbay_operator.status.deviceplugin import plugin_status

NS, PROFILE, LABEL = "patchbay-bench", "bench-mem", "patchbay.dev/bench"
MIB = 2**20


@contextlib.contextmanager
def program_of(tree: Path | None) -> Iterator[None]:
    """Operators started in the block run ``tree``'s operator (and API package) instead of this
    tree's: PYTHONPATH goes before the venv's editable installs (their finders come last)."""
    if tree is None:
        yield
        return
    saved = os.environ.get("PYTHONPATH")
    os.environ["PYTHONPATH"] = os.pathsep.join(
        [str(tree / "operator"), str(tree / "api"), *([saved] if saved else [])]
    )
    try:
        yield
    finally:
        if saved is None:
            del os.environ["PYTHONPATH"]
        else:
            os.environ["PYTHONPATH"] = saved


def repairs_served(port: int | None) -> bool:
    """Whether the operator on /metrics ``port`` has repairs (repairs.py): its counter's HELP
    line is there with no repair done yet."""
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5) as answer:
        return b"# HELP patchbay_operator_repairs" in answer.read()


def git_commit(tree: Path) -> str:
    argv = ["git", "rev-parse", "--short=12", "HEAD"]
    done = subprocess.run(argv, cwd=tree, capture_output=True, text=True, check=False)
    return done.stdout.strip() or "?"


def operator_rss(r: Run, cluster: Cluster, size: str, tree: Path | None = None) -> dict[str, float]:
    """One fresh operator (``tree``'s: ``program_of``) against the proxy serving ``size``
    reports; its memory once it holds them all and has computed the status."""
    with report_proxy(r, cluster, size, namespace=NS, profile=PROFILE, node_label=f"{LABEL}=1") as proxy:
        t0, proxy_cpu0 = time.monotonic(), proxy.cpu_seconds()
        n = len(cluster.nodes)
        # /healthz answers only after the first LISTs: 3.7 GB of reports at the bounds took
        # over 60 s here (the chart's startup probe allows operator.startupSeconds for that).
        with (
            program_of(tree),
            operator(r, proxy.kubeconfig, NS, "--status-debounce", "1", start_timeout=max(60, n * 0.2)) as op,
        ):
            r.log(f"operator of {tree or 'this tree'}: repairs {repairs_served(op.metrics_port)}")
            wait(
                "the operator to hold every report",
                lambda: op.stats().get("deviceReports", 0) >= n,
                max(300, n * 0.2),
                0.5,
            )
            held = time.monotonic() - t0
            assert op.proc is not None
            cpu = {"operator_cpu": cpu_seconds(op.proc.pid), "proxy_cpu": proxy.cpu_seconds() - proxy_cpu0}
            computes = op.stats().get("statusComputes", 0)
            wait(
                "a status computation with them",
                lambda: op.stats().get("statusComputes", 0) > computes,
                300,
                0.2,
            )
            time.sleep(r.number("settle"))
            assert op.proc is not None
            return {
                "hwm": status_mib(op.proc.pid, "VmHWM"),
                "rss": status_mib(op.proc.pid, "VmRSS"),
                "held": held,
                "live": op.live_after,
                **cpu,
            }


def bare_list(r: Run, cluster: Cluster, size: str) -> dict[str, float]:
    """Seconds for the operator's own client (``kube.Kube.list_pages``, the informer's paging) to
    LIST every report through a fresh proxy serving ``size`` reports, each page decoded as the
    operator's informer decodes it (``devicereports.decode_page``) and dropped: the transport, the
    proxy's sending and the decode of the operator's start, without the operator (no other LIST,
    no kopf)."""
    reports = agentwatch.sources(NS)[3]
    with report_proxy(r, cluster, size, namespace=NS, profile=PROFILE, node_label=f"{LABEL}=1") as proxy:
        kube = Kube(load_configuration(str(proxy.kubeconfig), 2))
        t0, cpu0, proxy_cpu0 = time.monotonic(), time.process_time(), proxy.cpu_seconds()
        held = 0
        pages = kube.list_pages(
            reports.path,
            LIST_CHUNK,
            reports.selectors,
            first=reports.first_page,
            decode=reports.decode_page or json_page,
        )
        for page in pages:
            held += len(page.items)
        took = time.monotonic() - t0
        cpu = {"client_cpu": time.process_time() - cpu0, "proxy_cpu": proxy.cpu_seconds() - proxy_cpu0}
    if held < len(cluster.nodes):
        raise AssertionError(f"the bare LIST got {held} reports of {len(cluster.nodes)}")
    return {"held": took, **cpu}


def kept(make: Callable[[int], Any], count: int) -> tuple[float, list[Any]]:
    """Bytes per item that ``make(i)`` returns and the caller keeps (tracemalloc), and the items."""
    gc.collect()
    tracemalloc.start()
    before = tracemalloc.get_traced_memory()[0]
    items = [make(i) for i in range(count)]
    gc.collect()
    after = tracemalloc.get_traced_memory()[0]
    tracemalloc.stop()
    return (after - before) / count, items


def keep_every_device(obj: dict[str, Any]) -> Report:
    saved, devicereports.MAX_KEPT_DEVICES = devicereports.MAX_KEPT_DEVICES, 1 << 30
    try:
        return Report.from_object(obj)
    finally:
        devicereports.MAX_KEPT_DEVICES = saved


def decode_speed(r: Run, text: str) -> None:
    """CPU per report at the bounds, in this process: a LIST page's reading (msgspec into the
    operator's structs, ``decode_page``) and a WATCH line's (``decode_event``) against the dict
    reading the operator had before (``json.loads`` then ``Report.from_object``) and ``json.loads``
    alone (the floor of any dict reading). Pages of 10 reports (10 lines a round
    for the WATCH); the sides interleaved per round."""
    body = text.encode()
    page = b'{"metadata":{"resourceVersion":"1"},"items":[' + b",".join([body] * 10) + b"]}"
    lines = [b'{"type":"MODIFIED","object":' + body + b"}"] * 10
    per_round = max(1, r.integer("sample") // 10)

    def timed(read: Callable[[], object]) -> Callable[[int], float]:
        def once(_i: int) -> float:
            t0 = time.perf_counter()
            for _ in range(per_round):
                read()
            return (time.perf_counter() - t0) * 1000 / (per_round * 10)

        return once

    got = interleave(
        r.rounds(),
        {
            "a LIST page's reading (devicereports.decode_page, msgspec)": timed(
                lambda: devicereports.decode_page(page)
            ),
            "the dict reading (json.loads, then Report.from_object)": timed(
                lambda: [Report.from_object(o) for o in json.loads(page)["items"]]
            ),
            "a WATCH line's reading (devicereports.decode_event, msgspec)": timed(
                lambda: [devicereports.decode_event(line) for line in lines]
            ),
            "json.loads alone": timed(lambda: json.loads(page)),
        },
    )
    r.figure(
        "operator: the decode of a report at the CRD bounds (CPU per report)",
        "ms",
        got,
        headline=True,
        note=f"{per_round * 10} reports (pages of 10) per round, 0.73 MB of JSON each, in this process",
    )


def decoder(r: Run, nodes: int) -> None:
    text = json.dumps(largest_report(NS, "NODE", PROFILE))

    def decoded(i: int) -> dict[str, Any]:
        obj: dict[str, Any] = json.loads(text.replace("NODE", f"node-{i}"))
        return obj

    sample = r.integer("sample")
    got = interleave(
        r.rounds(),
        {
            "the operator's Report": lambda _i: (
                kept(lambda i: Report.from_object(decoded(i)), sample)[0] / 1024
            ),
            "whole decoded object": lambda _i: kept(decoded, sample)[0] / 1024,
            "decode without the bound": lambda _i: (
                kept(lambda i: keep_every_device(decoded(i)), sample)[0] / 1024
            ),
        },
    )
    r.figure(
        "operator: kept per report at the CRD bounds (tracemalloc)",
        "KiB",
        got,
        note=f"{sample} reports per round, each 0.75 MB as JSON",
    )
    decode_speed(r, text)
    t0 = time.perf_counter()
    ours, reports = kept(lambda i: Report.from_object(decoded(i)), nodes)
    decode_s = time.perf_counter() - t0
    r.figure(
        f"operator: the decoded Reports of {nodes} nodes, kept (tracemalloc: the decoder's share)",
        "MiB",
        {"the operator's Report": [ours * nodes / MIB]},
        headline=True,
        note=f"decoded in {decode_s:.1f} s ({decode_s / nodes * 1000:.1f} ms each)",
    )
    profile = Profile.from_body(
        {
            "metadata": {"name": PROFILE, "uid": "u", "generation": 1},
            "spec": {"resourceName": "example.com/serial", "mode": "DevicePlugin", "nodeSelector": {}},
        }
    )
    states = [
        NodeState(f"node-{i}", capacity={"example.com/serial": "2048"}, allocatable={}) for i in range(nodes)
    ]
    timings = []
    for _ in range(r.rounds()):
        t0 = time.perf_counter()
        plugin_status(profile, None, states, {}, "2026-11-25T12:00:00Z", reports=reports)
        timings.append((time.perf_counter() - t0) * 1000)
    r.figure(
        f"operator: status computation over {nodes} nodes and reports at the bounds",
        "ms",
        {"status.plugin_status": timings},
    )


def run(r: Run) -> None:
    nodes = r.integer("nodes")
    with kwok_cluster(r, nodes, prefix="om-", labels={LABEL: "1"}, crds=False) as cluster:
        cluster.chart_without_operator(NS)
        agents_everywhere(r, cluster, NS, PROFILE, LABEL)

        def side(size: str, tree: Path | None = None) -> Callable[[int], dict[str, float]]:
            return lambda _i: operator_rss(r, cluster, size, tree)

        if baseline := r.text("baseline"):
            base = Path(baseline).resolve()
            if not (base / "operator" / "patchbay_operator").is_dir():
                raise AssertionError(f"baseline={baseline}: no operator/patchbay_operator there")
            got = interleave(
                r.rounds(), {"bounds": side("bounds"), "baseline": side("bounds", base)}, progress=r.log
            )
            commit = git_commit(base)
            names = {
                "bounds": "reports at the CRD bounds, this tree",
                "baseline": f"the same, the operator at {commit} ({base.name})",
            }
        else:
            # A third side, a bare LIST of the same reports: how much of the start is the LIST itself.
            sides = {size: side(size) for size in ("bounds", "small")}
            sides["bare"] = lambda _i: bare_list(r, cluster, "bounds")
            got = interleave(r.rounds(), sides, progress=r.log)
            bare = got.pop("bare")
            names = {"bounds": "reports at the CRD bounds", "small": "small reports (4 devices)"}
            # (figure, unit, the operator's key, the bare LIST's key, the sides' names, note)
            against_bare = (
                (
                    "operator: start -> every report held, against a bare LIST of them",
                    "held",
                    "held",
                    ("the operator, reports at the CRD bounds", "a bare LIST of the same reports"),
                    "the bare LIST: the operator's client and decode, the bench proxy and TLS on loopback",
                ),
                (
                    "operator: CPU seconds to every report held, against a bare LIST of them",
                    "operator_cpu",
                    "client_cpu",
                    ("the operator (its process, from its start)", "the bare LIST's client"),
                    "reports at the CRD bounds; the bench proxy's own CPU is the next figure",
                ),
                (
                    "operator: the bench proxy's CPU seconds serving every report at the CRD bounds",
                    "proxy_cpu",
                    "proxy_cpu",
                    ("to the operator", "to the bare LIST"),
                    "the proxy shares the two cores with the client: its CPU is time the client cannot have",
                ),
            )
            for figure, ours, theirs, (a, b), note in against_bare:
                values = {a: [x[ours] for x in got["bounds"]], b: [x[theirs] for x in bare]}
                r.figure(figure, "s", values, note=note, headline=ours == "operator_cpu")
        # Against an older operator: figures of their own (the headline rows stay bounds/small).
        against = ", against an older operator" if baseline else ""
        for key, what in (("hwm", "peak RSS (VmHWM)"), ("rss", "RSS once settled (VmRSS)")):
            r.figure(
                f"operator: {what} with a report per node{against}",
                "MiB",
                {names[s]: [x[key] for x in v] for s, v in got.items()},
                headline=key == "hwm" and not baseline,
                note=f"{nodes} kwok nodes, a DevicePlugin profile selecting them, its {nodes} agent pods",
            )
        r.figure(
            f"operator: start -> every report held{against}",
            "s",
            {names[s]: [x["held"] for x in v] for s, v in got.items()},
        )
        r.figure(
            f"operator: start -> /healthz answers (its first LISTs done){against}",
            "s",
            {names[s]: [x["live"] for x in v] for s, v in got.items()},
            headline=not baseline,
            note="the chart's startup probe holds the liveness probe off for operator.startupSeconds (600)",
        )
    if not r.text("baseline"):
        decoder(r, nodes)
