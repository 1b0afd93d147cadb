"""``python -m patchbay_bench``: list, run, quick, table (``make bench``, ``make bench-quick``,
``make bench-table``; the Makefile puts ``bench`` and ``tests`` on PYTHONPATH).

    list                         the scenarios, what each measures, its parameters
    run NAME[,NAME...]|SITTING|all [key=value ...] [NAME.key=value ...]
                                 full size; each run writes its record under
                                 docs/benchmarks/records/ (commit the ones the page uses).
                                 A SITTING (per-node, scale, builds) runs the scenarios of one
                                 headline table one after the other, each once
                                 the load is below 0.9 (at most 4 min); NAME.key=value sets a
                                 parameter of one scenario of several
    quick [NAME ...]             every scenario (or those named) at its quick size; checks that
                                 each recorded its figures (never their values); records under
                                 bench/results/quick/
    table [--all]                the headline table's rows from the newest full records
    plots [TIMELINE.json ...]    redraw docs/img/ (RECORDED figures, or the rollouts' timelines)
"""

from __future__ import annotations

import signal
import sys
import time
from collections.abc import Sequence
from pathlib import Path

from patchbay_bench import RECORDS, RESULTS, records
from patchbay_bench.harness import (
    QUIET_WAIT_S,
    SETTLE_S,
    SITTINGS,
    Interrupted,
    Record,
    Scenario,
    Value,
    execute,
    wait_for_quiet,
)
from patchbay_bench.scenarios import SCENARIOS
from patchbay_bench.setup import SESSION


def usage() -> int:
    print(__doc__)
    return 2


def list_scenarios() -> int:
    width = max(len(n) for n in SCENARIOS)
    print('Scenarios (make bench SCENARIO=<name>|all [BENCH_ARGS="key=value ..."]):\n')
    for name, sc in SCENARIOS.items():
        needs = f" [needs: {', '.join(sc.needs)}]" if sc.needs else ""
        print(f"  {name:<{width}}  {sc.about}{needs}")
        for key, p in sc.params.items():
            print(f"  {'':<{width}}    {key}={p.full} (quick: {p.quick})  {p.help}")
    print("\nSittings (make bench SCENARIO=<sitting>: one headline table, its scenarios in one run):\n")
    for name, about in SITTINGS.items():
        members = ", ".join(n for n, sc in SCENARIOS.items() if sc.sitting == name)
        print(f"  {name:<{width}}  {about}\n  {'':<{width}}    {members}")
    print("\nmake bench-quick runs every one at its quick size; make bench-table prints the headline rows.")
    return 0


def parse_params(sc: Scenario, args: Sequence[str], quick: bool, several: bool = False) -> dict[str, Value]:
    """The scenario's parameters: its defaults, then ``key=value`` arguments; in a run of
    ``several`` scenarios only ``<scenario>.key=value`` ones (those of other scenarios skipped;
    `run` has refused any that names no scenario of the run)."""
    params: dict[str, Value] = {k: (p.quick if quick else p.full) for k, p in sc.params.items()}
    for given in args:
        arg = given
        if several:
            name, _, arg = given.partition(".")
            if name != sc.name:
                continue
        key, sep, value = arg.partition("=")
        if not sep or key not in sc.params:
            raise SystemExit(f"{sc.name}: unknown parameter {arg!r}; known: {', '.join(sc.params) or 'none'}")
        params[key] = sc.params[key].parse(value)
    return params


def chosen(names: str) -> list[Scenario]:
    if names == "all":
        return list(SCENARIOS.values())
    if names in SITTINGS:
        return [sc for sc in SCENARIOS.values() if sc.sitting == names]
    out = []
    for name in names.split(","):
        if name not in SCENARIOS:
            raise SystemExit(f"unknown scenario {name!r}; `make bench` lists them")
        out.append(SCENARIOS[name])
    return out


def run(names: str, args: Sequence[str]) -> int:
    scenarios = chosen(names)
    several = len(scenarios) > 1
    names_here = {sc.name for sc in scenarios}
    if several and (stray := [a for a in args if a.partition(".")[0] not in names_here]):
        raise SystemExit(f"{', '.join(stray)}: not a parameter of a scenario of this run (NAME.key=value)")
    params = {sc.name: parse_params(sc, args, quick=False, several=several) for sc in scenarios}
    started = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())
    sitting = f"{names} {started}" if several else ""
    failed = 0
    try:
        for i, sc in enumerate(scenarios):
            if "real-node" in sc.needs and (busy := SESSION.real_node_busy()):
                print(f"[bench] {sc.name}: not run: it needs the real node, and {busy}", flush=True)
                failed += 1
                continue
            if several:
                print(f"[bench] {sc.name} ({i + 1} of {len(scenarios)})", flush=True)
                # The first too: it follows `make setup` (a pip install, image builds) at once.
                wait_for_quiet(QUIET_WAIT_S)
            try:
                rec = execute(sc, params[sc.name], quick=False, settle=SETTLE_S, sitting=sitting)
            except Interrupted as stop:
                return interrupted(stop.record, RECORDS, scenarios)
            path = records.write(rec, RECORDS)
            print(
                f"[bench] {sc.name}: {len(rec.figures)} figures in {rec.seconds:.0f} s -> {path}", flush=True
            )
            if rec.error:
                print(f"[bench] {sc.name} stopped early: {rec.error}", flush=True)
                failed += 1
    finally:
        SESSION.close()
    return 1 if failed else 0


def interrupted(rec: Record, out: Path, scenarios: Sequence[Scenario]) -> int:
    """Ctrl-C or SIGTERM: the interrupted scenario's record is written, with the figures it
    measured until then, and the scenarios after it are not run (exit code 130, as a shell's)."""
    path = records.write(rec, out)
    names = [sc.name for sc in scenarios]
    after = names[names.index(rec.scenario) + 1 :]
    kept = f"{len(rec.figures)} figures -> {path}"
    print(f"[bench] {rec.scenario}: interrupted after {rec.seconds:.0f} s; {kept}", flush=True)
    if after:
        print(f"[bench] not run: {', '.join(after)}", flush=True)
    return 130


def check(sc: Scenario, rec: Record) -> list[str]:
    """What a quick run lacks: an error, or a declared figure not recorded (values are never
    judged; a figure recorded as not measurable here, with its reason, counts as produced)."""
    problems = [f"stopped: {rec.error}"] if rec.error else []
    got = {f.name: f for f in rec.figures}
    for name in sc.figure_names(rec.params):
        fig = got.get(name)
        if fig is None:
            problems.append(f"no figure {name!r}")
        elif not fig.missing and not all(s.values for s in fig.sides):
            problems.append(f"figure {name!r} has a side without values")
    return problems


def quick(names: Sequence[str]) -> int:
    scenarios = [SCENARIOS[n] for n in names] if names else list(SCENARIOS.values())
    out = RESULTS / "quick"
    t0 = time.monotonic()
    summary: list[tuple[str, str, float]] = []
    bad = 0
    try:
        for sc in scenarios:
            if "real-node" in sc.needs and (busy := SESSION.real_node_busy()):
                why = f"LEFT OUT: it needs the machine's one real node, and {busy}"
                summary.append((sc.name, why, 0.0))
                print(f"[bench-quick] {sc.name}: {why}", flush=True)
                bad += 1  # a scenario left out is not one that produced its figures
                continue
            if sc.quick_note:
                print(f"[bench-quick] {sc.name}: {sc.quick_note}", flush=True)
            try:
                rec = execute(sc, parse_params(sc, (), quick=True), quick=True)
            except Interrupted as stop:
                return interrupted(stop.record, out, scenarios)
            records.write(rec, out)
            problems = check(sc, rec)
            bad += bool(problems)
            verdict = "; ".join(problems) if problems else f"ok, {len(rec.figures)} figures"
            summary.append((sc.name, verdict, rec.seconds))
            print(f"[bench-quick] {sc.name}: {verdict} ({rec.seconds:.0f} s)", flush=True)
    finally:
        SESSION.close()
    width = max(len(n) for n, _, _ in summary) if summary else 0
    print(f"\nbench-quick: {len(summary)} scenarios in {time.monotonic() - t0:.0f} s (records in {out})")
    for name, verdict, seconds in summary:
        print(f"  {name:<{width}}  {seconds:5.0f} s  {verdict}")
    return 1 if bad else 0


def main(argv: Sequence[str]) -> int:
    # SIGTERM ends a run as Ctrl-C does: every block's finally stops what it started.
    signal.signal(signal.SIGTERM, signal.default_int_handler)
    if not argv:
        return usage()
    cmd, rest = argv[0], list(argv[1:])
    if cmd == "list":
        return list_scenarios()
    if cmd == "run" and rest:
        return run(rest[0], rest[1:])
    if cmd == "quick":
        return quick(rest)
    if cmd == "plots":
        from patchbay_bench import plots

        plots.main(rest)
        return 0
    if cmd == "table":
        sitting_of = {name: sc.sitting for name, sc in SCENARIOS.items()}
        targets_of = {name: sc.targets for name, sc in SCENARIOS.items()}
        print(
            records.table(RECORDS, everything="--all" in rest, sitting_of=sitting_of, targets_of=targets_of)
        )
        return 0
    return usage()


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
