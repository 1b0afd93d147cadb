"""A run of one scenario: parameters, interleaved comparisons, figures, the machine, the record.

Rules every scenario follows through this module:

- a comparison runs its sides interleaved, A B A B ..., for ``rounds`` rounds (at least
  ``MIN_ROUNDS`` in a full run), so drift in the machine's load hits every side alike;
- a figure keeps every round's value of every side; it reports the median with min-max of each
  side and of the ratio of the first side to each other side, pair by pair (round i with round i);
- a run writes one JSON record (``records.write``): the figures, the parameters, date, commit,
  the machine's core count and load average at start and end, whether the machine was quiet, its
  CPU model and its speed (``yardstick``: the same fixed work timed on every machine);
- nothing here fails on a value: a figure is a figure.
"""

from __future__ import annotations

import contextlib
import datetime
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
import traceback
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, TypeVar

from patchbay_bench import REPO

MIN_ROUNDS = 5
"""Rounds a full run's comparison takes at least (quick runs take fewer: they check that the
figures come out, never their values)."""

SETTLE_S = 30.0
"""How long a full run waits, at its start, for a kubelet or API server still exiting (the
previous scenario's) before it judges whether the machine is quiet."""

QUIET_LOAD = 1.0
"""A machine whose 1-minute load average is below this, with no other cluster or test run, is
quiet; timings taken otherwise say so in their record."""

QUIET_WAIT_S = 240.0
"""In a sitting (several scenarios in one command), how long each scenario waits
for the 1-minute load average to fall below ``QUIET_LOAD`` less 0.1 before it starts anyway (its record
then says NOT quiet): the previous scenario's clusters and pod bursts leave load behind."""

SITTINGS: dict[str, str] = {
    "per-node": "one node: the agent against its Go peers, its memory, the paths from apply to the "
    "kubelet and the pod, DRA prepare, rollouts on the default release (about 1 h here)",
    "scale": "the control plane at 1,000-5,000 nodes: the operator's writes, memory and start, "
    "health and DRA at scale, the kubectl plugin (about 2 h here)",
    "builds": "the images' builds (not in the headline table)",
}
"""The sittings of the headline table: each table of docs/benchmarks.md is rerun in one sitting,
``make bench SCENARIO=<sitting>``, its scenarios one after the other at one commit. Two tables,
not one: the whole set takes about 4 h on the 2-core machine, longer than a working session."""

T = TypeVar("T")
Value = int | float | str | bool


@dataclass(frozen=True)
class Param:
    """One parameter of a scenario: its value in a full run and in a quick one."""

    full: Value
    quick: Value
    help: str = ""

    def parse(self, text: str) -> Value:
        if isinstance(self.full, bool):
            return text.lower() in ("1", "true", "yes", "on")
        if isinstance(self.full, int):
            return int(text)
        if isinstance(self.full, float):
            return float(text)
        return text


@dataclass(frozen=True)
class Target:
    """A goal a figure is judged against, declared beside the scenario so that the headline table
    computes "met" or "missed" from the record (``records.verdict``) instead of a person writing
    it. ``against`` names the side the ratio is taken to (the figure's first side over it); None:
    the first side's median itself, in the figure's unit."""

    figure: str
    at_most: float
    against: str | None = None
    #: why this target, or what missing it means (shown after the verdict)
    note: str = ""
    #: the cluster size the goal is set at (a scale scenario's ``nodes``): a run at another size
    #: is drawn without a verdict (1,000 nodes meeting a goal set at 5,000 says nothing of it)
    nodes: int | None = None


@dataclass(frozen=True)
class Scenario:
    """One scenario, as ``scenarios/catalogue.toml`` declares it, with the ``run`` of its module."""

    name: str
    about: str
    run: Callable[[Run], None]
    params: Mapping[str, Param] = field(default_factory=dict)
    #: the figures a run records (``bench-quick`` checks each is there, never its value): names,
    #: or a function of the run's parameters that gives them
    figures: Sequence[str] | Callable[[Mapping[str, Value]], Sequence[str]] = ()
    #: what it needs beyond a local control plane: "real-node" (the machine's one real kubelet
    #: node), "images" (the operator and agent images), "go" (a Go peer built here)
    needs: Sequence[str] = ()
    #: what the quick size leaves out, and why (printed by bench-quick)
    quick_note: str = ""
    #: it measures the Kubernetes release ``K8S_VERSION`` names (``make`` exports it): its record
    #: says which, and the headline table keeps the newest record of every release side by side
    per_release: bool = False
    #: the sitting (``SITTINGS``) and so the headline table its rows belong to
    sitting: str = "per-node"
    #: the goals its figures are judged against in the headline table
    targets: Sequence[Target] = ()

    def figure_names(self, params: Mapping[str, Value]) -> Sequence[str]:
        return self.figures(params) if callable(self.figures) else self.figures


@dataclass
class Stats:
    median: float
    min: float
    max: float

    @classmethod
    def of(cls, values: Sequence[float]) -> Stats | None:
        return cls(statistics.median(values), min(values), max(values)) if values else None


@dataclass
class Side:
    name: str
    values: list[float]
    stats: Stats | None = None

    def __post_init__(self) -> None:
        self.stats = Stats.of(self.values)


@dataclass
class Ratio:
    """The first side over another, round by round (rounds where both have a value)."""

    of: str
    to: str
    values: list[float]
    stats: Stats | None = None

    def __post_init__(self) -> None:
        self.stats = Stats.of(self.values)


@dataclass
class Figure:
    name: str
    unit: str
    sides: list[Side]
    ratios: list[Ratio]
    rounds: int
    headline: bool = False
    note: str = ""
    #: set when the figure could not be measured in this run (and why), instead of values
    missing: str = ""


def ratios_of(sides: Sequence[Side]) -> list[Ratio]:
    """The first side over each other side, pair by pair (a round with a zero baseline or a
    missing value has no ratio)."""
    if len(sides) < 2:
        return []
    ours = sides[0]
    out = []
    for base in sides[1:]:
        pairs = zip(ours.values, base.values, strict=False)
        out.append(Ratio(ours.name, base.name, [a / b for a, b in pairs if b]))
    return out


def interleave(
    rounds: int,
    sides: Mapping[str, Callable[[int], T]],
    progress: Callable[[str], None] | None = None,
    alternate: bool = False,
) -> dict[str, list[T]]:
    """Run every side once per round, in the order given, for ``rounds`` rounds (A B A B ...);
    each side's callable gets the round's index. Returns each side's results in round order.
    ``progress`` (a scenario's ``log``), for sides that take minutes: told as each side ends.

    ``alternate``: every other round runs the sides in the reverse order (A B, B A, A B, ...), so
    no side always runs right after the same other one, whose after-effects (a cache it warmed,
    CPU it left busy, a socket still closing) would otherwise land on it in every round. Only for
    sides that do not depend on the one before them."""
    out: dict[str, list[T]] = {name: [] for name in sides}
    for r in range(rounds):
        order = list(sides.items())
        if alternate and r % 2 == 1:
            order.reverse()
        for name, side in order:
            t0 = time.monotonic()
            out[name].append(side(r))
            if progress is not None:
                progress(f"round {r + 1}/{rounds}: {name} done in {time.monotonic() - t0:.1f} s")
    return out


def pct(values: Sequence[float], q: float) -> float:
    """The ``q`` quantile of ``values`` (nearest rank)."""
    s = sorted(values)
    return s[min(len(s) - 1, round(q * (len(s) - 1)))]


def wait(what: str, check: Callable[[], T], timeout: float = 180, every: float = 0.02) -> T:
    """Poll ``check`` until it returns something truthy (and return it); a bounded wait that fails
    naming ``what``."""
    deadline = time.monotonic() + timeout
    while True:
        got = check()
        if got:
            return got
        if time.monotonic() > deadline:
            raise TimeoutError(f"bench: timed out after {timeout:g} s waiting for {what}")
        time.sleep(every)


# --- the machine ---------------------------------------------------------------------------


def commit() -> tuple[str, bool]:
    """The checkout's commit and whether tracked files differ from it."""
    head = subprocess.run(
        ["git", "rev-parse", "--short=12", "HEAD"], cwd=REPO, capture_output=True, text=True
    )
    dirty = subprocess.run(
        ["git", "status", "--porcelain", "--untracked-files=no"], cwd=REPO, capture_output=True, text=True
    )
    return head.stdout.strip() or "unknown", bool(dirty.stdout.strip())


def others_running() -> list[str]:
    """Processes of other sessions that make timings unfair: a kubelet, an API server or a
    pytest run this process did not start (read from /proc, so nothing is signalled).

    Not counted: a zombie (it has exited: a previous run's API server whose parent has not
    collected it yet read as a cluster still running, and the next scenario's record said "not
    quiet"), and this process's own descendants (the bench session's shared cluster)."""
    mine = os.getpid()
    procs: dict[int, tuple[str, str, int, str]] = {}  # pid: comm, state, ppid, cmdline
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            stat = (entry / "stat").read_text()
            cmdline = (entry / "cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
        except OSError:
            continue
        # "pid (comm) state ppid ...": comm may hold spaces and parentheses; the last ")" ends it.
        head, _, rest = stat.rpartition(")")
        fields = rest.split()
        procs[int(entry.name)] = (head.partition("(")[2], fields[0], int(fields[1]), cmdline)

    def ours(pid: int) -> bool:
        seen: set[int] = set()
        while pid in procs and pid not in seen:
            if pid == mine:
                return True
            seen.add(pid)
            pid = procs[pid][2]
        return False

    found = []
    for pid, (comm, state, _, cmdline) in procs.items():
        if state == "Z" or ours(pid):
            continue
        if comm in ("kubelet", "kube-apiserver"):
            found.append(f"{pid} {comm}")
        elif "pytest" in cmdline and comm.startswith("python"):
            found.append(f"{pid} pytest")
    return sorted(found)


@dataclass
class Machine:
    cores: int
    load_start: list[float]
    load_end: list[float] = field(default_factory=list)
    others: list[str] = field(default_factory=list)
    quiet: bool = False
    python: str = ""
    #: the CPU's model name (``/proc/cpuinfo``); "" where it does not say
    cpu: str = ""
    #: milliseconds of ``yardstick()`` at the run's start (median of ``YARDSTICK_ROUNDS``); 0.0 in
    #: records written before 2026-12-02
    yardstick_ms: float = 0.0

    @classmethod
    def now(cls, settle: float = 0.0) -> Machine:
        """The machine at a run's start. With ``settle``, a kubelet or API server found is given
        up to that many seconds to exit first: the previous scenario's, stopping, is not another
        session's (its load average is read after the wait)."""
        others = others_running()
        deadline = time.monotonic() + settle
        while any(o.endswith(("kubelet", "kube-apiserver")) for o in others) and time.monotonic() < deadline:
            time.sleep(1.0)
            others = others_running()
        load = [round(x, 2) for x in os.getloadavg()]
        return cls(
            cores=os.cpu_count() or 0,
            load_start=load,
            others=others,
            quiet=load[0] < QUIET_LOAD and not others,
            python=sys.version.split()[0],
            cpu=cpu_model(),
            yardstick_ms=round(statistics.median(yardstick() for _ in range(YARDSTICK_ROUNDS)), 2),
        )


YARDSTICK_ROUNDS = 5


def yardstick(items: int = 2000) -> float:
    """Milliseconds this process takes for a fixed piece of work that is mostly the interpreter's:
    ``items`` small dicts built, written as JSON, read back and sorted. The same work on every
    machine, so records from two machines can be compared: a run whose figures moved by as much as
    its yardstick did measured the machine, not the code.

    Why: the sessions run on machines that are not alike. On 2026-12-02 a new machine of the same
    kind (2 cores, "AMD EPYC") took 4.4x as long for the same report decode as the machine of
    2026-12-01, and every CPU-bound figure of that day's scale sitting moved with it;
    only a figure inside that scenario showed it (docs/benchmarks.md, "The scale sitting of
    2026-12-02, stopped: machines differ")."""
    t0 = time.perf_counter()
    rows = [{"name": f"node-{i:05d}", "devices": i % 9, "healthy": i % 7 != 0} for i in range(items)]
    sorted(json.loads(json.dumps(rows)), key=lambda r: (-r["devices"], r["name"]))
    return (time.perf_counter() - t0) * 1000


def cpu_model(cpuinfo: Path = Path("/proc/cpuinfo")) -> str:
    """The first ``model name`` of ``cpuinfo`` ("" where there is none: another kernel, or an
    architecture that names its CPU otherwise)."""
    try:
        for line in cpuinfo.read_text().splitlines():
            key, sep, value = line.partition(":")
            if sep and key.strip() == "model name":
                return value.strip()
    except OSError:
        pass
    return ""


# --- a run -----------------------------------------------------------------------------------


class Run:
    """One run of one scenario: what it measured, for its record."""

    def __init__(self, scenario: Scenario, params: Mapping[str, Value], quick: bool, work: Path) -> None:
        self.scenario, self.params, self.quick, self.work = scenario, dict(params), quick, work
        self.figures: list[Figure] = []
        self.notes: list[str] = []

    # parameters, typed
    def integer(self, name: str) -> int:
        return int(self.params[name])

    def number(self, name: str) -> float:
        return float(self.params[name])

    def text(self, name: str) -> str:
        return str(self.params[name])

    def flag(self, name: str) -> bool:
        return bool(self.params[name])

    @property
    def min_rounds(self) -> int:
        return 1 if self.quick else MIN_ROUNDS

    def rounds(self, name: str = "rounds") -> int:
        """A comparison's rounds parameter, raised to ``MIN_ROUNDS`` in a full run."""
        n = self.integer(name)
        if n < self.min_rounds:
            self.log(f"{name}={n} raised to {self.min_rounds}: comparisons take at least that many")
        return max(n, self.min_rounds)

    def log(self, msg: str) -> None:
        print(f"[{time.strftime('%H:%M:%S')} {self.scenario.name}] {msg}", flush=True)

    def note(self, text: str) -> None:
        """A remark for the record (what differs from the usual method in this run)."""
        self.notes.append(text)
        self.log(text)

    def figure(
        self,
        name: str,
        unit: str,
        sides: Mapping[str, Sequence[float]],
        *,
        headline: bool = False,
        note: str = "",
        ratio: bool = True,
    ) -> Figure:
        """Record a figure: ``sides`` in order, Patchbay's (or the measured thing's) first, then
        its baselines or peers; one value per round each. ``ratio=False``: the sides are parts
        of one measure (p50 and p99), not a comparison."""
        built = [Side(k, [float(x) for x in v]) for k, v in sides.items()]
        rounds = max((len(s.values) for s in built), default=0)
        fig = Figure(name, unit, built, ratios_of(built) if ratio else [], rounds, headline, note)
        self.figures.append(fig)
        self.log(describe(fig))
        return fig

    def missing(self, name: str, why: str) -> Figure:
        """A figure this run cannot measure (a release without the feature, a peer not given)."""
        fig = Figure(name, "", [], [], 0, missing=why)
        self.figures.append(fig)
        self.log(f"{name}: not measured: {why}")
        return fig


def fmt(value: float) -> str:
    a = abs(value)
    if a >= 100:
        return f"{value:,.0f}"
    if a >= 10:
        return f"{value:.1f}"
    if a >= 1:
        return f"{value:.2f}"
    return f"{value:.3f}"


def spread(stats: Stats | None, unit: str = "") -> str:
    """``median (min-max) unit``."""
    if stats is None:
        return "-"
    u = f" {unit}" if unit else ""
    if stats.min == stats.max:
        return f"{fmt(stats.median)}{u}"
    return f"{fmt(stats.median)}{u} ({fmt(stats.min)}-{fmt(stats.max)})"


def ratio_spread(stats: Stats | None) -> str:
    """``median x (min-max)``."""
    if stats is None:
        return "-"
    if stats.min == stats.max:
        return f"{fmt(stats.median)}x"
    return f"{fmt(stats.median)}x ({fmt(stats.min)}-{fmt(stats.max)})"


def describe(fig: Figure) -> str:
    if fig.missing:
        return f"{fig.name}: not measured: {fig.missing}"
    parts = [f"{s.name} {spread(s.stats, fig.unit)}" for s in fig.sides]
    parts += [f"{r.of}/{r.to} {ratio_spread(r.stats)}" for r in fig.ratios]
    return f"{fig.name} ({fig.rounds} rounds): " + "; ".join(parts)


@dataclass
class Record:
    scenario: str
    command: str
    quick: bool
    params: dict[str, Value]
    date: str
    commit: str
    dirty: bool
    machine: Machine
    seconds: float = 0.0
    figures: list[Figure] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)
    error: str = ""
    #: the Kubernetes release of a ``per_release`` scenario's run; "" for the others
    release: str = ""
    #: the sitting run it was part of (``per-node 2026-11-28T06:00:00Z``: the name and start of
    #: ``make bench SCENARIO=per-node``); "" for a scenario run on its own
    sitting: str = ""

    def to_json(self) -> dict[str, Any]:
        return asdict(self)


def command_line(scenario: Scenario, params: Mapping[str, Value], quick: bool, release: str = "") -> str:
    changed = [f"{k}={v}" for k, v in params.items() if v != scenario.params[k].full]
    args = f' BENCH_ARGS="{" ".join(changed)}"' if changed and not quick else ""
    args += f" K8S_VERSION={release}" if release else ""
    return "make bench-quick" if quick else f"make bench SCENARIO={scenario.name}{args}"


class Interrupted(KeyboardInterrupt):
    """Ctrl-C (or SIGTERM) during a scenario: its record, with what it measured until then, for
    the caller to write before it stops. A KeyboardInterrupt, so a caller that does not know it
    stops all the same; the scenarios after it must not run."""

    def __init__(self, record: Record) -> None:
        super().__init__(f"{record.scenario} interrupted after {record.seconds:g} s")
        self.record = record


def wait_for_quiet(
    limit: float,
    load: Callable[[], float] = lambda: os.getloadavg()[0],
    sleep: Callable[[float], None] = time.sleep,
    clock: Callable[[], float] = time.monotonic,
    every: float = 5.0,
) -> float:
    """Wait until the 1-minute load average is below ``QUIET_LOAD`` less a margin of 0.1, at most
    ``limit`` seconds, saying so every 30 s; the seconds waited. A sitting calls it before each
    scenario, the first too: it followed `make setup`'s pip install and image builds at once and
    ran NOT quiet (2026-12-01). A scenario run on its own starts at once: its record says whether
    it was quiet. The margin: the record reads the load again a few seconds later, rounded to two
    digits, and a wait that ended at 0.996 gave a record of 1.0, NOT quiet (2026-11-28)."""
    below = QUIET_LOAD - 0.1
    start = say = clock()
    while (now := load()) >= below:
        if clock() - start >= limit:
            print(f"[bench] load still {now:.2f} after {limit:.0f} s: starting anyway", flush=True)
            break
        if clock() >= say:
            print(f"[bench] waiting for the load to fall below {below:.1f} (now {now:.2f})", flush=True)
            say = clock() + 30.0
        sleep(every)
    return clock() - start


def execute(
    scenario: Scenario, params: Mapping[str, Value], quick: bool, settle: float = 0.0, sitting: str = ""
) -> Record:
    """Run ``scenario`` in a temporary directory of its own; the record says what it measured,
    and the error if it stopped early (the figures measured until then are kept). Interrupted,
    it raises :class:`Interrupted` with that record, once the scenario's blocks have stopped what
    they started. ``settle``: see :meth:`Machine.now`; ``sitting``: see ``Record.sitting``."""
    head, dirty = commit()
    machine = Machine.now(settle)
    release = os.environ.get("K8S_VERSION", "") if scenario.per_release else ""
    record = Record(
        scenario=scenario.name,
        command=command_line(scenario, params, quick, release),
        quick=quick,
        params=dict(params),
        date=datetime.datetime.now(datetime.UTC).strftime("%Y-%m-%dT%H:%M:%SZ"),
        commit=head,
        dirty=dirty,
        machine=machine,
        release=release,
        sitting=sitting,
    )
    if not machine.quiet and not quick:
        print(
            f"[bench] the machine is not quiet (load {machine.load_start}, others: "
            f"{', '.join(machine.others) or 'none'}): the record says so",
            flush=True,
        )
    t0 = time.monotonic()
    interrupted = False
    with tempfile.TemporaryDirectory(prefix=f"pb{scenario.name[:4]}", dir="/tmp") as tmp:
        run = Run(scenario, params, quick, Path(tmp))
        try:
            scenario.run(run)
        except KeyboardInterrupt:
            record.error = "interrupted (Ctrl-C or SIGTERM)"
            interrupted = True
        except Exception as e:
            record.error = "".join(traceback.format_exception_only(e)).strip()
            traceback.print_exc()
            _print_log_tails(Path(tmp))
        finally:
            record.figures, record.notes = run.figures, run.notes
    record.seconds = round(time.monotonic() - t0, 1)
    machine.load_end = [round(x, 2) for x in os.getloadavg()]
    if interrupted:
        raise Interrupted(record)
    return record


def _print_log_tails(work: Path, chars: int = 3000) -> None:
    """The end of every log the failed run's programs wrote (operator, proxy, agents): the
    work directory goes with the run, and the reason is usually in one of them."""
    for log in sorted(work.rglob("*.log")):
        try:
            text = log.read_text(errors="replace")
        except OSError:
            continue
        print(f"[bench] --- the last of {log.relative_to(work)} ---\n{text[-chars:]}", flush=True)


@contextlib.contextmanager
def timer() -> Iterator[Callable[[], float]]:
    """``with timer() as took: ...; took()``: seconds since the block began."""
    t0 = time.perf_counter()
    yield lambda: time.perf_counter() - t0
