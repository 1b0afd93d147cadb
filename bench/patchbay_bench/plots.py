"""Plots beside the tables of docs/benchmarks.md (matplotlib, PNG in docs/img/).

``python -m patchbay_bench plots`` redraws the figures of runs recorded in docs/benchmarks.md from
the numbers printed there (``RECORDED``: each entry names the table it comes from), so a plot
never shows a number the tables do not; the scale curves (``CURVES``) from the committed records
of each cluster size, the same ones ``make bench-table`` draws its rows from; given the
``rollouts`` scenario's timelines (bench/results/rollouts-<release>.json), it draws them:

    make bench-plots
    PYTHONPATH=bench:tests .venv/bin/python -m patchbay_bench plots bench/results/rollouts-v1.3*.json
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import matplotlib

matplotlib.use("Agg")  # files only, no display
import matplotlib.pyplot as plt

from patchbay_bench import RECORDS, REPO, records

IMG = REPO / "docs" / "img"


def scale_axes(ax: Any, nodes: Sequence[int], series: Mapping[str, Sequence[float]], ylabel: str) -> None:
    """One line per series against the node count (log x), each point labelled with its value."""
    for i, (label, values) in enumerate(series.items()):
        (line,) = ax.plot(nodes, values, marker="o", label=label)
        for x, y in zip(nodes, values, strict=True):
            # values of several series sit close together: each series' labels on their own line
            ax.annotate(
                f"{y:.3g}",
                (x, y),
                textcoords="offset points",
                xytext=(6, 8 - 10 * i),
                fontsize=8,
                color=line.get_color(),
            )
    ax.set_xscale("log")
    ax.set_xlim(min(nodes) / 1.5, max(nodes) * 2)
    ax.set_xticks(list(nodes), [f"{n:,}" for n in nodes])
    ax.minorticks_off()
    ax.set_xlabel("nodes")
    ax.set_ylabel(ylabel)
    ax.set_ylim(bottom=0)
    ax.grid(True, alpha=0.3)


def scaling(
    path: Path,
    title: str,
    nodes: Sequence[int],
    series: Mapping[str, Sequence[float]],
    ylabel: str = "seconds",
    note: str = "",
) -> Path:
    """One plot of ``scale_axes``."""
    fig, ax = plt.subplots(figsize=(7, 4), dpi=110)
    scale_axes(ax, nodes, series, ylabel)
    ax.set_title(title)
    ax.legend(fontsize=8)
    if note:
        fig.text(0.01, 0.01, note, fontsize=7, color="0.4")
    fig.tight_layout(rect=(0, 0.04, 1, 1))
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path)
    plt.close(fig)
    return path


def bars(
    path: Path, title: str, values: Mapping[str, float], xlabel: str = "seconds", note: str = ""
) -> Path:
    """Horizontal bars, one per command, with their values."""
    fig, ax = plt.subplots(figsize=(9, 0.45 * len(values) + 1.2), dpi=110)
    labels = list(values)
    ax.barh(labels, [values[k] for k in labels], color="tab:blue")
    for i, k in enumerate(labels):
        ax.annotate(
            f"{values[k]:.2f}", (values[k], i), textcoords="offset points", xytext=(3, -3), fontsize=8
        )
    ax.invert_yaxis()
    ax.set_xlabel(xlabel)
    ax.set_title(title, fontsize=10)
    ax.grid(True, axis="x", alpha=0.3)
    if note:
        fig.text(0.01, 0.01, note, fontsize=7, color="0.4")
    fig.tight_layout(rect=(0, 0.05, 1, 1))
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path)
    plt.close(fig)
    return path


def rollout_timelines(path: Path, runs: Sequence[Mapping[str, object]]) -> Path:
    """One panel per release (the rollouts scenario's timelines): the kubelet's own allocatable
    count over the run, sampled every 10 ms, five rollouts under a pod burst. A dip to 0 on a
    kubelet before v1.37 is the drop of the new agent when the old one leaves."""
    fig, axes = plt.subplots(len(runs), 1, figsize=(9, 1.7 * len(runs) + 0.6), dpi=110, sharex=False)
    axes = [axes] if len(runs) == 1 else list(axes)
    for ax, run in zip(axes, runs, strict=True):
        timeline = run["timeline"]
        assert isinstance(timeline, list)
        xs = [float(t) for t, _ in timeline]
        ys = [0 if v is None else int(v) for _, v in timeline]
        ax.step(xs, ys, where="post", linewidth=0.8)
        full = max(ys) if ys else 0
        ax.set_ylim(-4, full * 1.15 + 1)
        ax.set_ylabel("allocatable")
        refused = run.get("refusedAtAdmission")
        ax.set_title(
            f"Kubernetes {run['release']}: lowest {min(ys) if ys else '-'} of {full}, "
            f"longest dip {run.get('longestDipSeenMs')}-{run.get('longestDipBoundMs')} ms, "
            f"burst pods refused {refused}/{run.get('burstPods')} (load average {run.get('loadAverage1m')})",
            fontsize=8,
        )
        ax.grid(True, alpha=0.3)
    axes[-1].set_xlabel("seconds since sampling started (5 agent rollouts)")
    fig.text(
        0.01,
        0.005,
        "bench rollouts: the kubelet's PodResources GetAllocatableResources every 10 ms",
        fontsize=7,
        color="0.4",
    )
    fig.tight_layout(rect=(0, 0.02, 1, 1))
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path)
    plt.close(fig)
    return path


def memory_per_node(
    path: Path, profiles: Sequence[int], series: Mapping[str, Sequence[float]], note: str
) -> Path:
    """RSS on one node against the number of profiles that select it, one line per design."""
    fig, ax = plt.subplots(figsize=(7, 4), dpi=110)
    for label, values in series.items():
        (line,) = ax.plot(profiles, values, marker="o", label=label)
        for x, y in zip(profiles, values, strict=True):
            ax.annotate(
                f"{y:.1f}",
                (x, y),
                textcoords="offset points",
                xytext=(5, 5),
                fontsize=8,
                color=line.get_color(),
            )
    ax.set_xticks(list(profiles))
    ax.set_xlabel("profiles selecting the node")
    ax.set_ylabel("RSS on the node, MiB")
    ax.set_ylim(bottom=0)
    ax.set_title("Agent memory per node against the number of profiles")
    ax.grid(True, alpha=0.3)
    ax.legend(fontsize=8)
    fig.text(0.01, 0.01, note, fontsize=7, color="0.4")
    fig.tight_layout(rect=(0, 0.04, 1, 1))
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path)
    plt.close(fig)
    return path


CURVES: dict[str, tuple[str, str, dict[str, str]]] = {
    # scenario -> (the PNG, its title, {recorded figure: the y axis}): a scale scenario's figures
    # against the cluster size, one point per size, from the newest full record at each size (of
    # the variant CURVE_VARIANTS names, where the scenario has several: records.VARIANTS)
    "operator_memory": (
        "operator-scale.png",
        "The operator's start and memory against the cluster size",
        {
            "operator: start -> /healthz answers (its first LISTs done)": "start -> /healthz, s",
            "operator: peak RSS (VmHWM) with a report per node": "peak RSS (VmHWM), MiB",
        },
    ),
    "takeover": (
        "takeover-scale.png",
        "A warm standby taking over a killed leader (small reports)",
        {"operator: leader killed -> the standby's first status write": "leader killed -> first write, s"},
    ),
}


CURVE_VARIANTS: dict[str, dict[str, str]] = {
    # The takeover's curve: small reports, the size measured at 20,000 nodes too (reports at the
    # bounds are 3.7 GB at 5,000 nodes: 20,000 of them do not fit this machine's etcd).
    "takeover": {"size": "small"},
}


def record_points(
    recs: Sequence[Mapping[str, Any]], figure: str
) -> tuple[list[int], dict[str, list[float]], list[str]]:
    """The sizes, each side's median at each size and each point's provenance (date, commit and,
    where the record has it, the machine's yardstick), from records of one scenario at several
    sizes (``records.newest_full``'s choice per size), smallest first. A side not measured at
    every size is left out (a line needs every point)."""
    by_size = sorted(
        ((n, r) for r in recs if (n := records.nodes_of(r)) is not None), key=lambda pair: pair[0]
    )
    sizes: list[int] = []
    series: dict[str, list[float]] = {}
    whence: list[str] = []
    for n, rec in by_size:
        fig = next((f for f in rec["figures"] if f["name"] == figure and not f.get("missing")), None)
        if fig is None:
            continue
        sizes.append(n)
        for side in fig["sides"]:
            series.setdefault(side["name"], []).append(float(side["stats"]["median"]))
        # The yardstick (records since 2026-12-02) tells the machines of the points apart: a curve
        # whose points came from machines of different speed says so under the plot.
        stick = (rec.get("machine") or {}).get("yardstick_ms")
        machine = f", yardstick {stick:.3g} ms" if stick else ""
        whence.append(f"{n:,} nodes: {rec['date'][:10]} at {rec['commit'][:7]}{machine}")
    return sizes, {k: v for k, v in series.items() if len(v) == len(sizes)}, whence


def curves(results: Path = RECORDS) -> list[Path]:
    """``CURVES``' plots, from the committed records; a scenario recorded at fewer than two sizes
    draws nothing."""
    newest = records.newest_full(records.load(results))
    out = []
    for scenario, (png, title, figures) in CURVES.items():
        wanted = CURVE_VARIANTS.get(scenario, {})
        recs = [
            r
            for r in newest.values()
            if r["scenario"] == scenario
            and not r["params"].get("baseline")
            and all(r["params"].get(k) == v for k, v in wanted.items())
        ]
        panels = [(label, *record_points(recs, figure)) for figure, label in figures.items()]
        panels = [p for p in panels if len(p[1]) >= 2]
        if not panels:
            continue
        fig, axes = plt.subplots(1, len(panels), figsize=(6.5 * len(panels), 4.2), dpi=110, squeeze=False)
        for ax, (label, sizes, series, _whence) in zip(axes[0], panels, strict=True):
            scale_axes(ax, sizes, series, label)
            ax.set_xlabel("kwok nodes (log scale)")
            ax.legend(fontsize=7)
        whence = "; ".join(panels[0][3])
        fig.suptitle(title, fontsize=10)
        fig.text(
            0.01, 0.01, f"bench {scenario}, medians, 2 cores; records: {whence}", fontsize=7, color="0.4"
        )
        fig.tight_layout(rect=(0, 0.04, 1, 1))
        path = IMG / png
        path.parent.mkdir(parents=True, exist_ok=True)
        fig.savefig(path)
        plt.close(fig)
        out.append(path)
    return out


RECORDED: dict[str, Any] = {
    # docs/benchmarks.md, "Memory on a node: before (one agent per profile) and after (one node
    # agent), and squat": RSS summed over the processes, MiB
    "node_memory": {
        "profiles": [1, 3, 5],
        "before: one agent pod per profile": [48.0, 145.3, 241.3],
        "after: one node agent": [48.2, 49.7, 50.3],
        "squat/generic-device-plugin (Go)": [16.2, 16.7, 18.0],
    },
    # docs/benchmarks.md, "Operator: static capacity at scale", current code, medians of 3 rounds
    "static_scale": {
        "nodes": [1000, 5000],
        "apply: operator": [2.96, 15.12],
        "apply: baseline (plain concurrent client)": [2.55, 13.40],
        "delete: operator": [2.63, 14.93],
        "delete: baseline": [2.60, 13.90],
    },
    # docs/benchmarks.md, "Explained health at scale": one health change -> the profile's status
    # (GET), after the fix: 20 nodes (p50 "about 1.0 s") and 5,000 nodes (p50 1.13 s, p99 1.22 s)
    "health_scale": {"nodes": [20, 5000], "p50": [1.0, 1.13]},
    # docs/benchmarks.md, "kubectl patchbay at scale", 5,000 nodes, median wall seconds of 5 runs
    # (the machine's load average was 14-47 on 2 cores: CPU seconds are in the table)
    "kubectl_scale_5000": {
        "devices (every device)": 8.51,
        "devices --unhealthy": 17.82,
        "devices --node N": 10.98,
        "nodes": 40.79,
        "nodes --node N": 4.67,
        "why serial": 14.48,
        "baseline: kubectl get devicereports -o json": 30.29,
        "baseline: kubectl get nodes -o json": 21.44,
    },
}


def main(args: Sequence[str]) -> None:
    import json

    if args:
        # Rollout timelines from the rollouts scenario's JSON, oldest release first.
        runs = [json.loads(Path(a).read_text()) for a in args]
        runs.sort(key=lambda r: [int(x) for x in str(r["release"]).lstrip("v").split(".")])
        print(f"wrote {rollout_timelines(IMG / 'rollouts-per-release.png', runs).relative_to(REPO)}")
        return
    st = RECORDED["static_scale"]
    out = [
        scaling(
            IMG / "static-scale.png",
            "Static capacity: every node shows the value (apply) / is clean (delete)",
            st["nodes"],
            {k: v for k, v in st.items() if k != "nodes"},
            note="bench static_scale, 2 cores, medians of 3 alternating rounds (docs/benchmarks.md)",
        ),
        scaling(
            IMG / "health-status-latency.png",
            "One device health change -> the profile's status shows it",
            RECORDED["health_scale"]["nodes"],
            {"p50 (1 s of it is the status debounce window)": RECORDED["health_scale"]["p50"]},
            note="bench health_scale, 2 cores (docs/benchmarks.md)",
        ),
        bars(
            IMG / "kubectl-patchbay-5000.png",
            "kubectl patchbay at 5,000 kwok nodes: median wall time",
            RECORDED["kubectl_scale_5000"],
            note="bench kubectl_scale nodes=5000, 5 runs each, load average 14-47 on 2 cores",
        ),
    ]
    out += curves()
    mem = RECORDED["node_memory"]
    out.append(
        memory_per_node(
            IMG / "node-memory-per-profiles.png",
            mem["profiles"],
            {k: v for k, v in mem.items() if k != "profiles"},
            note="bench node_memory, host processes, FAKE devices (docs/benchmarks.md)",
        )
    )
    for p in out:
        print(f"wrote {p.relative_to(REPO)}")
