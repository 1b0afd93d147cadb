"""The full runs' JSON records (committed under ``docs/benchmarks/records/``) and the headline
tables drawn from them.

A record is ``<records>/<scenario>/<date>-<commit>.json`` (``harness.Record``). The headline
tables of docs/benchmarks.md are this module's output for the newest full run of each scenario,
one table per sitting (``harness.SITTINGS``), each under a line that says whether its rows came
from one sitting at one commit: ``make bench-table`` prints them (``python -m patchbay_bench table``).
A row its table's newest sitting did not measure (a curve's other cluster sizes, another variant,
each run alone) is printed in a table beside it, so the sitting's own table stays one sitting.
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Mapping, Sequence
from pathlib import Path
from typing import Any

from patchbay_bench.harness import SITTINGS, Record, Stats, Target, fmt, ratio_spread, spread


def write(record: Record, results: Path) -> Path:
    folder = results / record.scenario
    folder.mkdir(parents=True, exist_ok=True)
    stem = f"{record.date.replace(':', '')}-{record.commit}{'-quick' if record.quick else ''}"
    path, n = folder / f"{stem}.json", 1
    while path.exists():  # two runs in one second
        n += 1
        path = folder / f"{stem}-{n}.json"
    path.write_text(json.dumps(record.to_json(), indent=1) + "\n")
    return path


def load(results: Path) -> list[dict[str, Any]]:
    out = []
    for path in sorted(results.glob("*/*.json")):
        try:
            data = json.loads(path.read_text())
        except (OSError, ValueError):
            continue
        if isinstance(data, dict) and "scenario" in data and "figures" in data:
            data["path"] = str(path)
            out.append(data)
    return out


def nodes_of(record: Mapping[str, Any]) -> int | None:
    """The cluster size a scale scenario's run was made at (its ``nodes`` parameter), else None."""
    nodes = (record.get("params") or {}).get("nodes")
    return nodes if isinstance(nodes, int) and not isinstance(nodes, bool) else None


VARIANTS = {"size": "reports"}
"""Parameters that change what a run measures, not how closely (the takeover's ``size``: small
reports or reports at the CRD's bounds): runs that differ in one are different rows, and the
newest of one never hides the other's (``newest_full``); a row names its variant (``rows``). The
value: what a row calls the parameter."""


def variant_of(record: Mapping[str, Any]) -> str:
    """``"bounds reports"``: the record's ``VARIANTS`` parameters as a row names them ("" if none)."""
    params = record.get("params") or {}
    return ", ".join(f"{params[k]} {label}" for k, label in VARIANTS.items() if k in params)


def key_of(rec: Mapping[str, Any]) -> str:
    """What a row of the tables stands for: the scenario; of a scenario that measures a release,
    of each release (``rollouts@v1.34.4``); of a scale scenario, of each cluster size
    (``operator_memory at 20000 nodes``: the points of its curve); a run against another
    checkout's program (``baseline=``) apart from the scenario's own runs; of a run with a
    ``VARIANTS`` parameter, of each value (``takeover at 05000 nodes, bounds reports``)."""
    name = str(rec["scenario"]) + (f"@{rec['release']}" if rec.get("release") else "")
    if (nodes := nodes_of(rec)) is not None:
        name += f" at {nodes:05d} nodes"  # zero-padded: the sizes sort as numbers
    if variant := variant_of(rec):
        name += f", {variant}"
    if baseline := (rec.get("params") or {}).get("baseline"):
        name += f" against {baseline}"
    return name


def is_full(rec: Mapping[str, Any]) -> bool:
    """A full (not quick) run that recorded figures: the only runs the tables are drawn from."""
    return not rec.get("quick") and bool(rec.get("figures"))


def newest_full(records: Iterable[dict[str, Any]]) -> dict[str, dict[str, Any]]:
    """The newest full (not quick) run that recorded figures of each row (``key_of``): none of
    a curve's points, a release's or a variant's runs hides another's."""
    out: dict[str, dict[str, Any]] = {}
    for rec in records:
        if not is_full(rec):
            continue
        name = key_of(rec)
        if name not in out or rec["date"] > out[name]["date"]:
            out[name] = rec
    return out


def newest_sittings(records: Iterable[dict[str, Any]]) -> dict[str, tuple[str, set[str]]]:
    """Of each table (``SITTINGS``): its newest sitting run (the records' ``sitting``, "scale
    2026-12-03T08:03:41Z") and the rows (``key_of``) that sitting measured."""
    newest: dict[str, str] = {}
    full = [r for r in records if is_full(r) and r.get("sitting")]
    for rec in full:
        table_name = rec["sitting"].partition(" ")[0]
        newest[table_name] = max(newest.get(table_name, ""), rec["sitting"])
    return {name: (run, {key_of(r) for r in full if r["sitting"] == run}) for name, run in newest.items()}


def _stats(raw: dict[str, Any] | None) -> Stats | None:
    return None if raw is None else Stats(raw["median"], raw["min"], raw["max"])


def verdict(fig: Mapping[str, Any], target: Target) -> str:
    """ "target: at most 1.25x Go peer; met, 1.10x" from a recorded figure: the median of the
    ratio to ``target.against`` (or of the first side, for an absolute target) against the bound.
    A figure not measured, or without that side, says so instead of a verdict."""
    bound = (
        f"at most {fmt(target.at_most)}x {target.against}"
        if target.against is not None
        else f"at most {fmt(target.at_most)} {fig.get('unit', '')}".rstrip()
    )
    value: float | None = None
    if not fig.get("missing"):
        if target.against is None:
            stats = (fig.get("sides") or [{}])[0].get("stats")
            value = None if stats is None else float(stats["median"])
        else:
            for r in fig.get("ratios") or []:
                if r.get("to") == target.against and r.get("stats") is not None:
                    value = float(r["stats"]["median"])
    if value is None:
        got = "not measured in this run"
    else:
        shown = (
            f"{fmt(value)}x" if target.against is not None else f"{fmt(value)} {fig.get('unit', '')}".rstrip()
        )
        got = f"{'met' if value <= target.at_most else 'missed'}, {shown}"
    return f"target: {bound}; {got}" + (f": {target.note}" if target.note else "")


HEADER = (
    "| figure | Patchbay: median (min-max) | baseline or peer | ratio: median (min-max) | rounds "
    "| date, machine | commit | command | from |\n"
    "| --- | --- | --- | --- | --- | --- | --- | --- | --- |"
)


def rows(record: dict[str, Any], everything: bool = False, targets: Sequence[Target] = ()) -> list[str]:
    """The table rows of one record: its headline figures (every figure with ``everything``),
    each figure with a target followed by its verdict (``verdict``)."""
    m = record["machine"]
    quiet = "quiet" if m.get("quiet") else "NOT quiet"
    when = f"{record['date'][:10]}, {m['cores']} cores, load {fmt(m['load_start'][0])} ({quiet})"
    if m.get("yardstick_ms"):  # the machine's speed (harness.yardstick); records before 2026-12-02 lack it
        when += f", yardstick {fmt(m['yardstick_ms'])} ms"
    dirty = "+changes" if record.get("dirty") else ""
    nodes = nodes_of(record)
    out = []
    for fig in record["figures"]:
        if not (fig.get("headline") or everything):
            continue
        name = fig["name"]
        judged = [verdict(fig, t) for t in targets if t.figure == name and t.nodes in (None, nodes)]
        # The size a scale figure was measured at, where its name does not say it already.
        if nodes is not None and str(nodes) not in name.replace(",", ""):
            name = f"{name}, {nodes:,} nodes"
        if variant := variant_of(record):
            name = f"{name}, {variant}"
        if judged:
            name = f"{name} ({'; '.join(judged)})"
        if fig.get("missing"):
            cells = [name, "not measured", fig["missing"], "-", "-"]
        else:
            sides, ratios = fig["sides"], fig["ratios"]
            ours = f"{sides[0]['name']}: {spread(_stats(sides[0]['stats']), fig['unit'])}"
            base = "; ".join(f"{s['name']}: {spread(_stats(s['stats']), fig['unit'])}" for s in sides[1:])
            ratio = "; ".join(ratio_spread(_stats(r["stats"])) for r in ratios) or "-"
            cells = [name, ours, base or "-", ratio, str(fig["rounds"])]
        cells += [
            when,
            f"`{record['commit']}`{dirty}",
            f"`{record['command']}`",
            f"bench `{record['scenario']}`",
        ]
        out.append("| " + " | ".join(c.replace("|", "/") for c in cells) + " |")
    return out


RELEASES = "per-release"
"""The table of a per-release scenario's runs made alone, one per release of the matrix."""

BESIDE = " (beside)"
"""The suffix of a sitting's second table: the rows of its scenarios that its newest sitting did
not measure (a curve's other sizes, another variant), each from its own run."""


def provenance(recs: list[dict[str, Any]]) -> str:
    """Where a table's rows come from: one sitting at one commit, or say which runs."""
    sittings = sorted({r.get("sitting", "") for r in recs})
    commits = sorted({r["commit"] + ("+changes" if r.get("dirty") else "") for r in recs})
    dates = sorted(r["date"] for r in recs)
    span = f"{dates[0]} to {dates[-1]}" if dates else "-"
    if len(sittings) == 1 and sittings[0] and len(commits) == 1:
        name, _, started = sittings[0].partition(" ")
        return (
            f"One sitting: `make bench SCENARIO={name}` started {started}, at commit `{commits[0]}`; "
            f"runs {span}."
        )
    if sittings == [""]:
        return f"Each run alone (no sitting): {len(recs)} runs, {span}; commits: {', '.join(commits)}."
    return (
        f"NOT one sitting: {len(recs)} runs, {span}; sittings: "
        f"{', '.join(s or 'none (run alone)' for s in sittings)}; commits: {', '.join(commits)}."
    )


def table(
    results: Path,
    everything: bool = False,
    sitting_of: Mapping[str, str] | None = None,
    targets_of: Mapping[str, Sequence[Target]] | None = None,
) -> str:
    """The headline rows of the newest full records; with ``sitting_of`` (scenario -> sitting),
    one table per sitting, each under its heading and provenance line; ``targets_of`` (scenario
    -> its targets) judges the figures that have one."""
    targets_of = targets_of or {}
    loaded = load(results)
    newest = sorted(newest_full(loaded).items())
    if sitting_of is None:
        lines = [HEADER]
        for _, rec in newest:
            lines += rows(rec, everything, targets_of.get(rec["scenario"], ()))
        return "\n".join(lines)
    sittings = newest_sittings(loaded)
    groups: dict[str, list[dict[str, Any]]] = {}
    for key, rec in newest:
        # A release's run made alone (``make bench SCENARIO=rollouts K8S_VERSION=...``) is not part
        # of its table's sitting, which runs one release: such rows stand in a table of their own.
        alone_on_a_release = rec.get("release") and not rec.get("sitting")
        group = RELEASES if alone_on_a_release else sitting_of.get(rec["scenario"], "other")
        # A row the table's newest sitting never measured (another cluster size, another variant)
        # stands beside the table, not in it: the table stays one sitting. A row the sitting did
        # measure, rerun since, stays in it and makes it say NOT one sitting.
        run, measured = sittings.get(group, ("", set()))
        if run and rec.get("sitting") != run and key not in measured:
            group += BESIDE
        groups.setdefault(group, []).append(rec)
    out: list[str] = []
    order = [name for sitting in SITTINGS for name in (sitting, sitting + BESIDE)]
    for name in [*order, RELEASES, *sorted(set(groups) - {*order, RELEASES})]:
        recs = groups.get(name)
        if not recs:
            continue
        lines = [line for rec in recs for line in rows(rec, everything, targets_of.get(rec["scenario"], ()))]
        if not lines:
            continue
        base = name.removesuffix(BESIDE)
        heading = f"### Beside the {base} table" if name != base else f"### The {name} table"
        out += [heading, "", provenance(recs), "", HEADER, *lines, ""]
    return "\n".join(out).rstrip()
