"""The bench harness's own rules (bench/patchbay_bench): interleaving, the statistics of a figure,
the ratio pair by pair, what bench-quick counts as produced, the headline rows of a record."""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import time
from collections.abc import Callable
from pathlib import Path

import pytest

from patchbay_bench import __main__ as bench_main
from patchbay_bench import harness, records
from patchbay_bench.__main__ import check
from patchbay_bench.harness import (
    Interrupted,
    Machine,
    Param,
    Run,
    Scenario,
    Target,
    execute,
    interleave,
    others_running,
)
from patchbay_devcluster.poll import poll_until


def nothing(_r: Run) -> None:
    pass


def test_sides_run_interleaved_a_b_a_b() -> None:
    calls: list[str] = []
    got = interleave(
        3, {"a": lambda i: calls.append(f"a{i}") or i, "b": lambda i: calls.append(f"b{i}") or -i}
    )
    assert calls == ["a0", "b0", "a1", "b1", "a2", "b2"]
    assert got == {"a": [0, 1, 2], "b": [0, -1, -2]}


def test_alternated_sides_swap_order_every_other_round_and_keep_their_results_apart() -> None:
    calls: list[str] = []

    def side(name: str) -> Callable[[int], str]:
        def run(i: int) -> str:
            calls.append(f"{name}{i}")
            return f"{name}{i}"

        return run

    got = interleave(3, {name: side(name) for name in "abc"}, alternate=True)
    assert calls == ["a0", "b0", "c0", "c1", "b1", "a1", "a2", "b2", "c2"]
    assert got == {"a": ["a0", "a1", "a2"], "b": ["b0", "b1", "b2"], "c": ["c0", "c1", "c2"]}


def test_a_figure_has_median_min_max_per_side_and_the_ratio_pair_by_pair(tmp_path: Path) -> None:
    r = Run(Scenario("x", "x", nothing), {}, quick=False, work=tmp_path)
    fig = r.figure("f", "ms", {"ours": [2.0, 4.0, 9.0], "theirs": [1.0, 4.0, 3.0]})
    ours, theirs = fig.sides
    assert ours.stats is not None
    assert (ours.stats.median, ours.stats.min, ours.stats.max) == (4.0, 2.0, 9.0)
    assert theirs.stats is not None
    assert theirs.stats.median == 3.0
    # round by round: 2/1, 4/4, 9/3; not the ratio of the medians (4/3)
    (ratio,) = fig.ratios
    assert ratio.values == [2.0, 1.0, 3.0]
    assert ratio.stats is not None
    assert ratio.stats.median == 2.0
    assert fig.rounds == 3


def test_a_full_run_takes_at_least_five_rounds(tmp_path: Path) -> None:
    sc = Scenario("x", "x", nothing, params={"rounds": Param(2, 1)})
    assert Run(sc, {"rounds": 2}, quick=False, work=tmp_path).rounds() == 5
    assert Run(sc, {"rounds": 1}, quick=True, work=tmp_path).rounds() == 1


def test_quick_checks_that_figures_came_out_never_their_values(tmp_path: Path) -> None:
    def measures(r: Run) -> None:
        r.figure("made", "s", {"a": [1e9]})
        r.missing("n/a here", "this release lacks the feature")

    sc = Scenario("x", "x", measures, figures=("made", "n/a here", "never made"))
    rec = execute(sc, {}, quick=True)
    assert check(sc, rec) == ["no figure 'never made'"]


def test_a_scenario_that_fails_keeps_what_it_measured(tmp_path: Path) -> None:
    def breaks(r: Run) -> None:
        r.figure("made", "s", {"a": [1.0]})
        raise RuntimeError("boom")

    sc = Scenario("x", "x", breaks, figures=("made",))
    rec = execute(sc, {}, quick=True)
    assert [f.name for f in rec.figures] == ["made"]
    assert check(sc, rec) == ["stopped: RuntimeError: boom"]


def test_the_headline_rows_come_from_the_newest_full_record(tmp_path: Path) -> None:
    def measures(r: Run) -> None:
        r.figure("latency", "ms", {"agent": [2.0, 3.0], "peer": [1.0, 1.0]}, headline=True)
        r.figure("detail", "ms", {"agent": [1.0]})

    sc = Scenario("lat", "x", measures, params={"n": Param(10, 1)})
    for quick in (False, True):
        rec = execute(sc, {"n": 20}, quick=quick)
        records.write(rec, tmp_path)
    table = records.table(tmp_path)
    lines = table.splitlines()
    assert len(lines) == 3, table  # the header, its rule, one headline row (quick records never count)
    row = lines[2]
    assert "agent: 2.50 ms (2.00-3.00)" in row
    assert "peer: 1.00 ms" in row
    assert "2.50x (2.00-3.00)" in row
    assert 'make bench SCENARIO=lat BENCH_ARGS="n=20"' in row
    saved = json.loads(next(tmp_path.glob("lat/*.json")).read_text())
    assert saved["machine"]["cores"] >= 1
    assert len(saved["machine"]["load_start"]) == 3


def test_a_record_says_how_fast_its_machine_was_and_the_row_shows_it(tmp_path: Path) -> None:
    """Records from two machines compare only through the same work timed on both: the yardstick
    (its milliseconds, and the CPU's model where the kernel names it) is in every record and row."""
    sc = Scenario("lat", "x", lambda r: r.figure("latency", "ms", {"agent": [2.0]}, headline=True))
    records.write(execute(sc, {}, quick=False), tmp_path)
    machine = json.loads(next(tmp_path.glob("lat/*.json")).read_text())["machine"]
    assert machine["yardstick_ms"] > 0
    assert machine["cpu"] == harness.cpu_model()
    row = records.table(tmp_path).splitlines()[2]
    assert f"yardstick {records.fmt(machine['yardstick_ms'])} ms" in row
    # A record written before the yardstick (no such field) still makes its row, without it.
    old = json.loads(next(tmp_path.glob("lat/*.json")).read_text())
    del old["machine"]["yardstick_ms"], old["machine"]["cpu"]
    assert "yardstick" not in records.rows(old)[0]


def test_the_yardstick_reads_the_cpu_model_and_times_its_work(tmp_path: Path) -> None:
    cpuinfo = tmp_path / "cpuinfo"
    cpuinfo.write_text(
        "processor\t: 0\nvendor_id\t: AuthenticAMD\nmodel name\t: AMD EPYC\n\n"
        "processor\t: 1\nmodel name\t: x\n"
    )
    assert harness.cpu_model(cpuinfo) == "AMD EPYC"
    assert harness.cpu_model(tmp_path / "absent") == ""
    # Milliseconds of work done, never a comparison of two timings (the machines are shared).
    assert 0 < harness.yardstick(200) < float("inf")


def test_a_run_against_another_checkout_never_hides_the_scenarios_headline_rows(tmp_path: Path) -> None:
    def measures(r: Run) -> None:
        against = bool(r.text("baseline"))
        r.figure(
            "rss" + (", against an older one" if against else ""), "MiB", {"x": [1.0]}, headline=not against
        )

    sc = Scenario("mem", "x", measures, params={"baseline": Param("", "")})
    own, against = (
        execute(sc, {"baseline": ""}, quick=False),
        execute(sc, {"baseline": "/work/old"}, quick=False),
    )
    against.date = "9" + against.date[1:]  # the newest by far
    for rec in (own, against):
        records.write(rec, tmp_path)
    assert [row.split(" | ")[0] for row in records.table(tmp_path).splitlines()[2:]] == ["| rss"]
    every = records.table(tmp_path, everything=True)
    assert "rss, against an older one" in every and "| rss |" in every


def test_a_scale_figure_says_the_size_it_was_measured_at(tmp_path: Path) -> None:
    def measures(r: Run) -> None:
        r.figure("apply", "s", {"operator": [1.0]}, headline=True)
        r.figure("the reports of 5000 nodes", "MiB", {"operator": [2.0]}, headline=True)

    sc = Scenario("scale", "x", measures, params={"nodes": Param(5000, 10)})
    records.write(execute(sc, {"nodes": 5000}, quick=False), tmp_path)
    names = [row.split(" | ")[0].removeprefix("| ") for row in records.table(tmp_path).splitlines()[2:]]
    assert names == ["apply, 5,000 nodes", "the reports of 5000 nodes"]


def test_each_size_of_a_scale_scenario_keeps_its_row_and_a_goal_is_judged_at_its_own_size(
    tmp_path: Path,
) -> None:
    """A curve's points (1,000, 5,000 and 20,000 nodes) are runs of one scenario: the newest run at
    one size must not hide another size's, and a goal set at 5,000 nodes judges only that run."""

    def measures(r: Run) -> None:
        r.figure("start", "s", {"operator": [r.integer("nodes") / 200]}, headline=True)

    target = Target("start", 30.0, note="at 5,000 nodes", nodes=5000)
    sc = Scenario("om", "x", measures, params={"nodes": Param(5000, 10)}, targets=(target,))
    for nodes in (20000, 1000, 5000, 20000):  # the second 20,000 run is the newest of its size
        rec = execute(sc, {"nodes": nodes}, quick=False)
        rec.date = f"{nodes:06d}" + rec.date  # a distinct, ordered date per size
        records.write(rec, tmp_path)
    rows = records.table(tmp_path, targets_of={"om": (target,)}).splitlines()[2:]
    names = [row.split(" | ")[0].removeprefix("| ") for row in rows]
    assert names == [
        "start, 1,000 nodes",
        "start, 5,000 nodes (target: at most 30.0 s; met, 25.0 s: at 5,000 nodes)",
        "start, 20,000 nodes",
    ]
    assert len(list(tmp_path.glob("om/*.json"))) == 4


def test_the_table_says_met_or_missed_from_the_targets_in_code(tmp_path: Path) -> None:
    """A target declared beside the scenario is judged on the record's median ratio (or the first
    side's median, for an absolute bound): nobody writes "met" by hand."""

    def measures(r: Run) -> None:
        r.figure("p50", "ms", {"agent": [2.0, 3.0, 2.2], "peer": [1.0, 1.0, 2.0], "floor": [2.0, 2.0, 2.0]})
        r.figure("rss", "MiB", {"agent": [44.0, 46.0, 44.5]}, ratio=False)
        r.figure("never", "ms", {"agent": [1.0]})

    targets = (
        Target("p50", 1.25, "peer", "the peer does the same work"),
        Target("p50", 1.2, "floor"),
        Target("rss", 45.0),
        Target("never", 1.0, "squat"),
    )
    sc = Scenario("judged", "x", measures, targets=targets)
    records.write(execute(sc, {}, quick=False), tmp_path)
    rows = records.table(tmp_path, everything=True, targets_of={"judged": targets}).splitlines()[2:]
    names = {row.split(" | ")[0].removeprefix("| ").split(" (")[0]: row.split(" | ")[0] for row in rows}
    assert "target: at most 1.25x peer; missed, 2.00x: the peer does the same work" in names["p50"]
    assert "target: at most 1.20x floor; met, 1.10x" in names["p50"]
    assert "target: at most 45.0 MiB; met, 44.5 MiB" in names["rss"]
    assert "target: at most 1.00x squat; not measured in this run" in names["never"]
    assert "target" not in records.table(tmp_path, everything=True)  # no targets given: no verdict


def test_the_targets_in_code_name_figures_their_scenarios_record() -> None:
    """A target whose figure no scenario records would never be judged: names must match."""
    judged = [sc for sc in bench_main.SCENARIOS.values() if sc.targets]
    assert {sc.name for sc in judged} >= {"agent", "dra_path", "agent_memory"}
    for sc in judged:
        names = set(sc.figure_names({k: p.full for k, p in sc.params.items()}))
        for t in sc.targets:
            assert t.figure in names, (sc.name, t.figure)


@pytest.mark.parametrize(("text", "value"), [("7", 7), ("true", True), ("0.5", 0.5), ("a,b", "a,b")])
def test_parameters_parse_to_their_default_s_type(text: str, value: object) -> None:
    default = value if not isinstance(value, bool) else False
    assert Param(default, default).parse(text) == value


def test_a_per_release_scenario_keeps_a_row_per_release(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """rollouts runs once per release (``make bench SCENARIO=rollouts K8S_VERSION=...``): the
    table keeps the newest record of each release, and the command says which release it ran."""

    def measures(r: Run) -> None:
        r.figure("count", "devices", {"kubelet": [4.0]}, headline=True)

    sc = Scenario("roll", "x", measures, per_release=True)
    for release in ("release-old", "release-new", "release-new"):  # any K8S_VERSION value
        monkeypatch.setenv("K8S_VERSION", release)
        records.write(execute(sc, {}, quick=False), tmp_path)
    rows = records.table(tmp_path).splitlines()[2:]
    assert len(rows) == 2, rows
    # Run alone, not in a sitting: in a table of their own, under the sitting tables.
    grouped = records.table(tmp_path, sitting_of={"roll": "per-node"})
    assert "### The per-release table" in grouped and "### The per-node table" not in grouped
    assert "Each run alone (no sitting): 3 runs" not in grouped  # the newest of each release: 2
    assert "Each run alone (no sitting): 2 runs" in grouped
    assert "make bench SCENARIO=roll K8S_VERSION=release-new" in rows[0]
    assert "make bench SCENARIO=roll K8S_VERSION=release-old" in rows[1]
    plain = Scenario("plain", "x", measures)
    assert execute(plain, {}, quick=False).command == "make bench SCENARIO=plain"


def test_ctrl_c_keeps_the_record_and_runs_no_further_scenario(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """``make bench SCENARIO=a,b``: Ctrl-C (or SIGTERM, which the harness turns into it) during
    ``a`` writes a's record with the figure it measured, and ``b`` does not start: an earlier
    harness caught the interrupt as a failure and went on to the next scenario."""
    ran: list[str] = []

    def interrupted(r: Run) -> None:
        ran.append("a")
        r.figure("before", "s", {"x": [1.0]})
        raise KeyboardInterrupt

    def after(_r: Run) -> None:
        ran.append("b")

    a, b = Scenario("a", "x", interrupted), Scenario("b", "x", after)
    with pytest.raises(Interrupted) as stop:
        execute(a, {}, quick=False)
    assert stop.value.record.error == "interrupted (Ctrl-C or SIGTERM)"
    assert [f.name for f in stop.value.record.figures] == ["before"]

    monkeypatch.setattr(bench_main, "SETTLE_S", 0.0)
    # A sitting waits up to 240 s for a quiet machine before each scenario; under the suite's own
    # load (CI) this test waited all of it (240 s against 13 s alone, 2026-12-01).
    monkeypatch.setattr(bench_main, "QUIET_WAIT_S", 0.0)
    monkeypatch.setattr(bench_main, "SCENARIOS", {"a": a, "b": b})
    monkeypatch.setattr(bench_main, "RECORDS", tmp_path)
    ran.clear()
    assert bench_main.run("a,b", []) == 130
    assert ran == ["a"]
    (written,) = tmp_path.rglob("*.json")
    assert json.loads(written.read_text())["figures"][0]["name"] == "before"


def running(pid: int, name: str) -> None:
    """Until ``pid`` runs ``name`` (its command name in /proc). A fork returns before the child's
    exec is done: ``Popen`` returns, and a shell's ``echo $!`` prints, while the child may still be
    named after its parent, and the quiet check, reading command names, would not see it yet."""

    def named() -> bool:
        return Path(f"/proc/{pid}/comm").read_text().strip() == name

    poll_until(f"pid {pid} to run {name}", named, timeout=10, interval=0.01)


def test_the_quiet_check_counts_other_sessions_api_servers_not_its_own(tmp_path: Path) -> None:
    """A real process named kube-apiserver (a copy of sleep): started by this process, it is the
    bench's own (the session's shared cluster) and not counted; orphaned by a shell that exits,
    as another session's cluster is, it is counted."""
    fake = tmp_path / "kube-apiserver"
    shutil.copy(shutil.which("sleep") or "/bin/sleep", fake)
    own = subprocess.Popen([str(fake), "30"])
    out = subprocess.run(
        ["sh", "-c", f"{fake} 30 >/dev/null 2>&1 & echo $!"], capture_output=True, text=True, check=True
    )
    orphan = int(out.stdout)
    try:
        running(own.pid, "kube-apiserver")
        running(orphan, "kube-apiserver")
        found = others_running()
        assert f"{orphan} kube-apiserver" in found
        assert f"{own.pid} kube-apiserver" not in found
    finally:
        own.kill()
        own.wait()
        os.kill(orphan, signal.SIGKILL)


def test_a_full_run_waits_for_an_api_server_that_is_exiting(tmp_path: Path) -> None:
    """Another session's-looking API server (orphaned, a copy of sleep) that exits within the
    settle time is not in the record's others: the previous scenario's cluster, stopping."""
    fake = tmp_path / "kube-apiserver"
    shutil.copy(shutil.which("sleep") or "/bin/sleep", fake)
    out = subprocess.run(
        ["sh", "-c", f"{fake} 2 >/dev/null 2>&1 & echo $!"], capture_output=True, text=True, check=True
    )
    exiting = f"{int(out.stdout)} kube-apiserver"
    running(int(out.stdout), "kube-apiserver")
    assert exiting in others_running()
    assert exiting not in Machine.now(settle=10).others


def test_a_sitting_runs_one_tables_scenarios_and_each_record_names_it(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """``make bench SCENARIO=per-node``: only that sitting's scenarios run, in their order; a
    parameter is given to one of them as ``<scenario>.key=value``; every record names the sitting
    run, and the table says its rows came from one sitting at one commit. A scenario rerun on its
    own afterwards makes the table say NOT one sitting."""
    ran: list[tuple[str, object]] = []

    def measures(r: Run) -> None:
        ran.append((r.scenario.name, r.params["n"]))
        r.figure(f"{r.scenario.name} latency", "ms", {"x": [1.0] * 5}, headline=True)

    a = Scenario("a", "x", measures, params={"n": Param(1, 1)})
    b = Scenario("b", "x", measures, params={"n": Param(1, 1)})
    c = Scenario("c", "x", measures, params={"n": Param(1, 1)}, sitting="scale")
    monkeypatch.setattr(bench_main, "SETTLE_S", 0.0)
    monkeypatch.setattr(bench_main, "QUIET_WAIT_S", 0.0)
    monkeypatch.setattr(bench_main, "SCENARIOS", {"a": a, "c": c, "b": b})
    monkeypatch.setattr(bench_main, "RECORDS", tmp_path)
    assert bench_main.run("per-node", ["b.n=7"]) == 0
    assert ran == [("a", 1), ("b", 7)]
    saved = [json.loads(p.read_text()) for p in sorted(tmp_path.rglob("*.json"))]
    assert {s["scenario"] for s in saved} == {"a", "b"}
    (sitting,) = {s["sitting"] for s in saved}
    assert sitting.startswith("per-node 20")
    b_record = next(s for s in saved if s["scenario"] == "b")
    assert b_record["command"] == 'make bench SCENARIO=b BENCH_ARGS="n=7"'
    for stray in ("n=7", "c.n=7"):  # no scenario named, or one not in this sitting: refused
        with pytest.raises(SystemExit, match="not a parameter of a scenario of this run"):
            bench_main.run("per-node", [stray])

    groups = {"a": "per-node", "b": "per-node", "c": "scale"}
    text = records.table(tmp_path, sitting_of=groups)
    assert "### The per-node table" in text and "### The scale table" not in text
    assert "One sitting: `make bench SCENARIO=per-node` started" in text
    assert bench_main.run("b", []) == 0  # b alone, later
    text = records.table(tmp_path, sitting_of=groups)
    assert "NOT one sitting" in text and "none (run alone)" in text


def test_a_sitting_table_holds_only_its_sitting_and_other_sizes_stand_beside_it(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The scale sitting measures 5,000 nodes; the curve's other points (1,000 and 20,000 nodes)
    are runs made alone. They stand in a table beside the sitting's, which stays "One sitting";
    a row the sitting measured, rerun alone since, stays in it and makes it say NOT one sitting."""

    def measures(r: Run) -> None:
        r.figure("start", "s", {"operator": [r.integer("nodes") / 200]}, headline=True)

    om = Scenario("om", "x", measures, params={"nodes": Param(5000, 10)}, sitting="scale")

    def counts(r: Run) -> None:
        r.figure("writes", "writes", {"operator": [1.0]}, headline=True)

    other = Scenario("other", "x", counts, sitting="scale")  # a sitting is several scenarios
    monkeypatch.setattr(bench_main, "SETTLE_S", 0.0)
    monkeypatch.setattr(bench_main, "QUIET_WAIT_S", 0.0)
    monkeypatch.setattr(bench_main, "SCENARIOS", {"om": om, "other": other})
    monkeypatch.setattr(bench_main, "RECORDS", tmp_path)
    for nodes in (1000, 20000):  # alone, before the sitting
        assert bench_main.run("om", [f"nodes={nodes}"]) == 0
    assert bench_main.run("scale", []) == 0
    groups = {"om": "scale", "other": "scale"}
    text = records.table(tmp_path, sitting_of=groups)
    sitting_table, beside = text.split("### Beside the scale table")
    assert "One sitting: `make bench SCENARIO=scale` started" in sitting_table
    assert "start, 5,000 nodes" in sitting_table and "20,000" not in sitting_table
    assert "Each run alone (no sitting): 2 runs" in beside
    assert "start, 1,000 nodes" in beside and "start, 20,000 nodes" in beside
    time.sleep(1.0)  # the records' dates are to the second: the rerun must be the newer
    assert bench_main.run("om", []) == 0  # 5,000 nodes alone, after the sitting
    text = records.table(tmp_path, sitting_of=groups)
    assert "NOT one sitting" in text.split("### Beside the scale table")[0]


def test_a_sitting_waits_for_the_load_to_fall_and_gives_up_at_its_limit(
    capsys: pytest.CaptureFixture[str],
) -> None:
    """``wait_for_quiet`` polls the 1-minute load (here a list of readings, on a clock that the
    sleeps advance) until it is below 0.9 (1.0, the record's bound for quiet, less a margin), at
    most its limit."""
    now = [0.0]

    def sleep(s: float) -> None:
        now[0] += s

    readings = iter([3.0, 2.0, 0.95, 0.5])
    waited = harness.wait_for_quiet(240.0, load=lambda: next(readings), sleep=sleep, clock=lambda: now[0])
    assert waited == 15.0  # three readings not below 0.9, 5 s apart each
    assert "waiting for the load to fall below 0.9 (now 3.00)" in capsys.readouterr().out
    now[0] = 0.0
    waited = harness.wait_for_quiet(20.0, load=lambda: 4.0, sleep=sleep, clock=lambda: now[0])
    assert waited == 20.0
    assert "load still 4.00 after 20 s: starting anyway" in capsys.readouterr().out


def test_a_scale_curve_is_drawn_from_the_newest_record_at_each_size(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The curve's points are the records' medians, size by size; one size alone draws nothing."""
    from patchbay_bench import plots

    figure = "operator: start -> /healthz answers (its first LISTs done)"

    def measures(r: Run) -> None:
        n = r.integer("nodes")
        r.figure(figure, "s", {"bounds": [n / 100, n / 50], "small": [n / 1000]}, headline=True)

    sc = Scenario("operator_memory", "x", measures, params={"nodes": Param(5000, 10)})
    results = tmp_path / "records"
    monkeypatch.setattr(plots, "IMG", tmp_path / "img")
    records.write(execute(sc, {"nodes": 1000}, quick=False), results)
    assert plots.curves(results) == []
    records.write(execute(sc, {"nodes": 20000}, quick=False), results)
    sizes, series, whence = plots.record_points(
        [r for r in records.newest_full(records.load(results)).values()], figure
    )
    assert sizes == [1000, 20000]
    assert series == {"bounds": [15.0, 300.0], "small": [1.0, 20.0]}
    assert [w.split(":")[0] for w in whence] == ["1,000 nodes", "20,000 nodes"]
    assert all(" ms" in w.split("yardstick ")[1] for w in whence)  # each point names its machine's speed
    assert [p.name for p in plots.curves(results)] == ["operator-scale.png"]
    assert (tmp_path / "img" / "operator-scale.png").stat().st_size > 1000


def test_runs_of_another_variant_are_rows_of_their_own_and_the_curve_takes_one_variant(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The takeover with reports at the bounds (5,000 nodes only) and with small reports (5,000 and
    20,000): the newest bounds run does not hide the small one at the same size, each row says
    which it is, and the curve is drawn from the small runs alone (one point per size)."""
    from patchbay_bench import plots

    figure = "operator: leader killed -> the standby's first status write"

    def measures(r: Run) -> None:
        slower = 2.0 if r.text("size") == "bounds" else 1.0
        r.figure(figure, "s", {"ours": [slower * r.integer("nodes") / 1000]}, headline=True)

    params = {"nodes": Param(5000, 10), "size": Param("small", "small")}
    sc = Scenario("takeover", "x", measures, params=params)
    results = tmp_path / "records"
    monkeypatch.setattr(plots, "IMG", tmp_path / "img")
    for nodes, size in ((5000, "small"), (5000, "bounds"), (20000, "small")):
        records.write(execute(sc, {"nodes": nodes, "size": size}, quick=False), results)
    newest = records.newest_full(records.load(results))
    assert sorted(newest) == [
        "takeover at 05000 nodes, bounds reports",
        "takeover at 05000 nodes, small reports",
        "takeover at 20000 nodes, small reports",
    ]
    labels = [records.rows(rec)[0].split(" | ")[0] for _, rec in sorted(newest.items())]
    assert labels == [
        f"| {figure}, 5,000 nodes, bounds reports",
        f"| {figure}, 5,000 nodes, small reports",
        f"| {figure}, 20,000 nodes, small reports",
    ]
    monkeypatch.setattr(plots, "CURVES", {"takeover": plots.CURVES["takeover"]})
    drawn = []
    real = plots.record_points

    def points(recs: list[dict[str, object]], name: str) -> object:
        got = real(recs, name)
        drawn.append(got[:2])
        return got

    monkeypatch.setattr(plots, "record_points", points)
    assert [p.name for p in plots.curves(results)] == ["takeover-scale.png"]
    assert drawn == [([5000, 20000], {"ours": [5.0, 20.0]})]
