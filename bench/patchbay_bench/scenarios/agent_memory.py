"""The node agent's memory, MiB by MiB (issue 31): where its RSS goes, import by import in the
order the agent imports, and profile by profile, in fresh processes, with no cluster.

Every process measured here runs in an environment made like the agent image's: a virtualenv
with exactly the agent's dependency closure (``patchbay-agent``'s requirements, resolved from the
installed distributions, each file linked in) and the agent's package from this tree, compiled
ahead and run with the image's interpreter settings (``-OO`` bytecode, no column tables,
``MALLOC_ARENA_MAX=2``). The dev virtualenv holds more than the image (every program's
dependencies, editable installs): the dev venv's agent is a side of its own, so what that costs is
a measured figure too. RSS and PSS are read by this process from ``/proc/<pid>/smaps_rollup`` of
the child; each round is a fresh child.

1. Imports: a child that imports ``STEPS`` one after the other when told, RSS/PSS read after each:
   the bare interpreter, then each step, cumulative and the step's own share. The steps are the
   agent's own imports in its order (found with ``-X importtime`` on the agent serving profiles:
   the first, warm-up run of part 2 runs that way, and the record notes the order it saw), each
   third-party library as a step before the agent module that first imports it.
2. The node agent (``--node-config``, the DaemonSet's mode) serving 0, 1, 2, 3 DevicePlugin
   profiles on FAKE devices (``FakeHardware``), registered with the upstream kubelet device
   manager (the Go conformance peer, as the ``agent`` scenario), reading a PodResources peer, and
   writing its DeviceReports to a stand-in for the API server (``fakeapi``: the node agent reads
   its Node's labels before it starts any profile, and writes a report per profile). Memory is
   read once the kubelet counts every device of every profile as allocatable and every report is
   written, after a settle pause; then the kubelet must still count them (none dropped). Each
   count is a fresh process; counts interleaved per round.
3. What would be saved, measured: the node agent with nothing to serve but one DevicePlugin
   unit's modules imported (what serving adds beyond its imports), and the same agent from the
   dev venv (what the dev venv's extra modules add to a host-process figure such as
   ``node_memory``'s).

Not measured here: a DRA profile (it needs ResourceSlices from the API server: ``node_memory``
measures issue 19's set, 2 DevicePlugin + 1 DRA, against a real control plane); the DRA modules'
import is step ``dra``.
"""

from __future__ import annotations

import importlib.metadata
import os
import re
import statistics
import subprocess
import sys
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml
from packaging.requirements import Requirement

from patchbay_bench import REPO
from patchbay_bench.fakeapi import FakeApi
from patchbay_bench.harness import Run, Value, interleave, wait
from patchbay_bench.peers import FakeHardware, KubeletPeer, PodResourcesPeer, ThreadedPeers, build_peer
from patchbay_bench.setup import AGENT, IMAGE_ENV, Child, host_agent_args, rss_pss_mib, smaps_rollup_mib


@dataclass(frozen=True)
class Step:
    """One import step: a short key, what it is, the modules it imports (in order)."""

    key: str
    label: str
    modules: tuple[str, ...]


#: The agent's imports in its order (``-X importtime`` of ``patchbay-agent --node-config`` serving
#: DevicePlugin profiles; the scenario's notes record what the run saw).
STEPS: tuple[Step, ...] = (
    Step("argparse", "argparse (main's first import)", ("argparse",)),
    Step("ssl", "ssl: OpenSSL (asyncio's first heavy import)", ("ssl",)),
    Step("asyncio", "asyncio (with concurrent.futures, subprocess, inspect)", ("asyncio",)),
    Step(
        "stdlib",
        "the rest of main's stdlib: json, logging, threading, signal",
        ("json", "logging", "threading", "signal"),
    ),
    Step("yaml", "PyYAML (with its C loader)", ("yaml",)),
    Step(
        "main",
        "the agent's command line, config and options (patchbay_agent.main; pathlib, dataclasses)",
        ("patchbay_agent.main",),
    ),
    Step(
        "apiget",
        "the agent's API helpers (apiget, satoken)",
        ("patchbay_agent.apiget", "patchbay_agent.satoken"),
    ),
    Step("http_client", "http.client (with email's parser)", ("http.client",)),
    Step(
        "kubeclient",
        "the agent's API client and kubeconfig reader: patchbay_agent.kubeclient",
        ("patchbay_agent.kubeclient",),
    ),
    Step(
        "nodeagent",
        "the node agent: nodeagent, nodeconfig, reports, metrics, HTTP endpoint, ctypes",
        ("patchbay_agent.nodeagent",),
    ),
    Step(
        "unit",
        "a profile's unit: resourceagent (discovery, health, inventory, CDI, inotify)",
        ("patchbay_agent.resourceagent",),
    ),
    Step("grpc", "grpcio (cygrpc, grpc.aio)", ("grpc", "grpc.aio")),
    Step(
        "protobuf",
        "protobuf's runtime (upb, descriptor pool)",
        ("google.protobuf.descriptor_pool", "google.protobuf.internal.builder"),
    ),
    Step(
        "podresources",
        "the PodResources client and its generated modules (a unit's first gRPC use)",
        ("patchbay_agent.kubelet.podresources",),
    ),
    Step(
        "dp_stubs",
        "the Device Plugin API's generated modules (api_pb2, api_pb2_grpc)",
        ("patchbay_agent.api.api_pb2", "patchbay_agent.api.api_pb2_grpc"),
    ),
    Step(
        "dp",
        "the Device Plugin front-end (server, registration, hand-over)",
        ("patchbay_agent.deviceplugin.frontend",),
    ),
    Step(
        "dra",
        "DRA, which DevicePlugin profiles never load: the driver, its stubs, slices, claims",
        (
            "patchbay_agent.dra.preparer",
            "patchbay_agent.kubelet.draplugin",
            "patchbay_agent.dra.slicepublisher",
            "patchbay_agent.dra.claimstatus",
        ),
    ),
)

#: A DevicePlugin unit's modules: what ``unit imported`` preloads into an agent that serves nothing.
UNIT_MODULES = (
    "patchbay_agent.resourceagent",
    "patchbay_agent.deviceplugin.frontend",
    "patchbay_agent.kubelet.podresources",
)

#: The profiles, in the order counts add them: every one DevicePlugin, on FAKE device files.
PROFILES: tuple[dict[str, Any], ...] = (
    {"profile": "serial", "resourceName": "example.com/serial", "glob": "ttyUSB", "n": 4},
    {"profile": "tokens", "resourceName": "example.com/tokens", "glob": "token", "n": 2},
    {"profile": "cams", "resourceName": "example.com/cam", "glob": "video", "n": 2},
)
NODE, NAMESPACE = "node-1", "default"

CHILD = """\
import sys
sys.stdout.write("ready\\n"); sys.stdout.flush()
for line in sys.stdin:
    for name in line.split():
        __import__(name)
    sys.stdout.write("ok\\n"); sys.stdout.flush()
"""
"""The import child: nothing imported beyond the interpreter's start until told (``__import__``,
a builtin, so not even importlib)."""


def launcher(preload: Sequence[str] = ()) -> str:
    """The agent's entry point as its console script runs it, after importing ``preload``."""
    first = "".join(f"import {m}\n" for m in preload)
    return f"{first}import sys\nfrom patchbay_agent.main import main\nsys.exit(main())\n"


# --- an environment like the image's -----------------------------------------------------


def closure(root: str) -> list[importlib.metadata.Distribution]:
    """``root``'s installed distribution and every one it requires (no extras), each once."""
    out: dict[str, importlib.metadata.Distribution] = {}
    todo = [root]
    while todo:
        dist = importlib.metadata.distribution(todo.pop())
        key = re.sub(r"[-_.]+", "-", dist.metadata["Name"]).lower()
        if key in out:
            continue
        out[key] = dist
        for text in dist.requires or []:
            req = Requirement(text)
            if req.marker is None or req.marker.evaluate({"extra": ""}):
                todo.append(req.name)
    return list(out.values())


#: The distributions of this tree in the agent's image, installed editable here: (folder, package).
TREE_PACKAGES = {
    "patchbay-agent": ("plugin-agent", "patchbay_agent"),
    "patchbay-api": ("api", "patchbay_api"),
}


def image_env(work: Path) -> Path:
    """A virtualenv with the agent's dependency closure linked in file by file and the agent's
    package from this tree, as the image installs them (no pip, no dev tools, no editable
    finders; a namespace package such as ``google`` holds only what the closure puts there).
    Returns its python."""
    env = work / "image-env"
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(env)], check=True)
    (site,) = env.glob("lib/python*/site-packages")
    for dist in closure("patchbay-agent"):
        if dist.metadata["Name"] in TREE_PACKAGES:
            continue  # editable here: its package is linked from the tree below
        for file in dist.files or []:
            parts = file.parts
            if parts[0] == ".." or "__pycache__" in parts or file.suffix == ".pth":
                continue
            target = site / file
            target.parent.mkdir(parents=True, exist_ok=True)
            if not target.exists():
                target.symlink_to(Path(str(file.locate())).resolve())
    trees = [REPO / folder / package for folder, package in TREE_PACKAGES.values()]
    for tree in trees:
        (site / tree.name).symlink_to(tree)
    python = env / "bin" / "python"
    # Bytecode compiled ahead as the image's build does (-OO, no column tables): a module compiled
    # at import costs memory the image does not spend (docs/facts.md#client-memory). compileall
    # skips linked directories, so the agent's package is compiled where it lies.
    for tree in (site, *trees):
        subprocess.run(
            [str(python), "-OO", "-X", "no_debug_ranges", "-m", "compileall", "-q", str(tree)], check=True
        )
    return python


def child_env() -> dict[str, str]:
    """The image's interpreter settings; no PYTHONPATH (an empty value is ignored), so the child
    sees only its own environment's packages."""
    return {**IMAGE_ENV, "PYTHONPATH": "", **WRITE_BYTECODE}


WRITE_BYTECODE = {"PYTHONDONTWRITEBYTECODE": ""}
"""Bytecode may be written (an empty value is ignored), whatever the caller's shell says: the
warm-up runs leave every module the agent imports compiled, as the image has them; without this
a shell with PYTHONDONTWRITEBYTECODE=1 compiles each module at every start, several MiB more."""


# --- part 1: imports ----------------------------------------------------------------------


def import_round(python: Path) -> list[tuple[float, float]]:
    """One fresh child: (RSS, PSS) in MiB of the bare interpreter, then after each step."""
    proc = subprocess.Popen(
        [str(python), "-c", CHILD],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
        env={**os.environ, **child_env()},
    )
    assert proc.stdin is not None
    assert proc.stdout is not None
    try:
        if proc.stdout.readline().strip() != "ready":
            raise RuntimeError("the import child did not start")
        out = [rss_pss_mib(proc.pid)]
        for step in STEPS:
            proc.stdin.write(" ".join(step.modules) + "\n")
            proc.stdin.flush()
            if proc.stdout.readline().strip() != "ok":
                raise RuntimeError(f"the import child failed at step {step.key} ({', '.join(step.modules)})")
            out.append(rss_pss_mib(proc.pid))
        return out
    finally:
        proc.stdin.close()
        proc.wait(30)


def record_imports(r: Run, python: Path, rounds: int) -> None:
    got = [import_round(python) for _ in range(rounds)]
    labels = ["bare python interpreter (site, the image's environment)"] + [
        f"+ {s.key}: {s.label}" for s in STEPS
    ]
    for i, label in enumerate(labels):
        after = {"RSS after": [g[i][0] for g in got], "PSS after": [g[i][1] for g in got]}
        steps = (
            {}
            if i == 0
            else {
                "RSS of the step": [g[i][0] - g[i - 1][0] for g in got],
                "PSS of the step": [g[i][1] - g[i - 1][1] for g in got],
            }
        )
        r.figure(f"agent_memory: import {i:02d} {label}", "MiB", {**after, **steps}, ratio=False)


def import_order(log: Path) -> str:
    """Where each step's first module finished importing in the agent's ``-X importtime`` log
    (its line number among the import lines), in the agent's order; steps it never imported last."""
    names: dict[str, int] = {}
    for line in log.read_text(errors="replace").splitlines():
        if line.startswith("import time:") and "|" in line:
            name = line.rsplit("|", 1)[1].strip()
            names.setdefault(name, len(names))
    seen = sorted((names[s.modules[0]], s.key) for s in STEPS if s.modules[0] in names)
    never = [s.key for s in STEPS if s.modules[0] not in names]
    return (
        "the agent serving DevicePlugin profiles (-X importtime) imported the steps in this order: "
        + ", ".join(f"{k} (#{n})" for n, k in seen)
        + (f"; never: {', '.join(never)}" if never else "")
    )


# --- part 2: the node agent ---------------------------------------------------------------


class World:
    """The Go kubelet peer, a PodResources peer, the API stand-in and FAKE devices for every
    profile, in one short temporary directory; agents come and go."""

    def __init__(self, root: Path, peer: Path) -> None:
        self.root = root
        self.plugin_dir = root / "dp"
        for d in (self.plugin_dir, root / "kubelet" / "plugins_registry", root / "kubelet" / "plugins"):
            d.mkdir(parents=True)
        self.hw = FakeHardware(root / "host")
        for p in PROFILES:
            for k in range(p["n"]):
                self.hw.add_dev(f"/dev/{p['glob']}{k}")
        self.kubelet = KubeletPeer(peer, self.plugin_dir, root / "kubelet.log")
        self.api = FakeApi(root / "api", {NODE: {"kubernetes.io/hostname": NODE}})
        self._loop = ThreadedPeers().__enter__()
        self.pr = PodResourcesPeer(root / "pr.sock")
        self._loop.call(self.pr.start())
        self.args = host_agent_args(
            NODE,
            root,
            self.hw.root,
            self.plugin_dir,
            root / "pr.sock",
            self.api.kubeconfig,
            namespace=NAMESPACE,
        )
        self.cases = 0

    def config(self, n: int) -> Path:
        entries = [
            {
                "profile": p["profile"],
                "mode": "DevicePlugin",
                "resourceName": p["resourceName"],
                "plugin": {"discovery": {"paths": {"globs": [f"/dev/{p['glob']}*"]}}},
                "nodeSelectorTerms": [[]],
            }
            for p in PROFILES[:n]
        ]
        path = self.root / f"node{n}.yaml"
        path.write_text(yaml.safe_dump({"profiles": entries}))
        return path

    def case(
        self,
        n: int,
        argv: Sequence[str],
        settle: float,
        extra_env: Mapping[str, str] | None = None,
    ) -> tuple[float, float, float]:
        """Start the node agent (``argv`` + its flags) serving the first ``n`` profiles; (RSS,
        PSS, anonymous RSS) once every profile is registered and reported and ``settle`` seconds
        have passed."""
        self.cases += 1
        chosen = PROFILES[:n]
        self.api.clear()
        reads = self.api.node_reads
        log = self.root / f"agent{self.cases}.log"
        # The dev venv's agent as node_memory runs it (the image's settings, the bench's PYTHONPATH).
        env = {**(IMAGE_ENV | WRITE_BYTECODE if argv[0] == AGENT else child_env()), **(extra_env or {})}
        argv = [*argv, "--node-config", str(self.config(n)), *self.args]
        with Child(argv, log, env) as agent:
            try:
                wait("the agent reading its Node", lambda: self.api.node_reads > reads, 60, 0.05)
                for p in chosen:
                    self.kubelet.wait(
                        p["resourceName"], capacity=p["n"], allocatable=p["n"], timeout_ms=60000
                    )
                want = {p["profile"] for p in chosen}
                wait("every DeviceReport", lambda: want <= self.api.profiles(), 60, 0.05)
                time.sleep(settle)
                if not agent.alive():
                    raise RuntimeError(f"the agent exited; log {log}")
                sizes = smaps_rollup_mib(agent.pid)
                mem = (sizes["Rss"], sizes["Pss"], sizes["Anonymous"])
                for p in chosen:  # none dropped while it settled
                    self.kubelet.wait(p["resourceName"], capacity=p["n"], allocatable=p["n"], timeout_ms=2000)
            except Exception:
                print(log.read_text(errors="replace")[-3000:], file=sys.stderr)
                raise
        for p in chosen:  # gone from the kubelet before the next case starts
            self.kubelet.wait(p["resourceName"], allocatable=0, timeout_ms=30000)
        return mem

    def close(self) -> None:
        self._loop.call(self.pr.stop())
        self._loop.__exit__()
        self.api.close()
        self.kubelet.quit()


def counts(params: Mapping[str, Value]) -> list[int]:
    return sorted({int(n) for n in str(params["profiles"]).split(",")})


def paired(a: Sequence[float], b: Sequence[float]) -> list[float]:
    """``a - b``, round by round."""
    return [x - y for x, y in zip(a, b, strict=True)]


def run(r: Run) -> None:
    rounds, settle, ns = r.rounds(), r.number("settle"), counts(r.params)
    python = image_env(r.work)
    peer = build_peer()
    world = World(r.work / "w", peer)
    try:
        image = [str(python), "-c", launcher()]
        preload = [str(python), "-c", launcher(UNIT_MODULES)]
        # Warm-up (writes any -OO bytecode still missing, the stdlib's, as the image ships it
        # compiled) with -X importtime: the agent's own import order, for the record.
        world.case(max(ns), image, 0.0, {"PYTHONPROFILEIMPORTTIME": "1"})
        r.note(import_order(world.root / f"agent{world.cases}.log"))
        world.case(max(ns), [AGENT], 0.0)  # the dev venv's warm-up
        record_imports(r, python, rounds)

        def side(n: int, argv: Sequence[str]) -> Callable[[int], tuple[float, float, float]]:
            return lambda _round: world.case(n, argv, settle)

        sides = {f"{n} profiles": side(n, image) for n in ns}
        sides["0 profiles, a unit's modules imported"] = side(0, preload)
        sides[f"{max(ns)} profiles, dev venv"] = side(max(ns), [AGENT])
        got = interleave(rounds, sides)
        rss = {k: [x[0] for x in v] for k, v in got.items()}
        pss = {k: [x[1] for x in v] for k, v in got.items()}
        anon = {k: [x[2] for x in v] for k, v in got.items()}
        for n in ns:
            note = "DevicePlugin profiles: " + (", ".join(p["profile"] for p in PROFILES[:n]) or "none")
            r.figure(
                f"agent_memory: node agent serving {n} profiles",
                "MiB",
                {"RSS": rss[f"{n} profiles"], "PSS": pss[f"{n} profiles"]},
                ratio=False,
                headline=n == max(ns),
                note=note + "; the image's environment; registered with the Go kubelet peer, reported",
            )
            if n - 1 in ns:
                r.figure(
                    f"agent_memory: profile {n} adds",
                    "MiB",
                    {
                        "RSS": paired(rss[f"{n} profiles"], rss[f"{n - 1} profiles"]),
                        "PSS": paired(pss[f"{n} profiles"], pss[f"{n - 1} profiles"]),
                    },
                    ratio=False,
                    headline=True,
                    note="round by round: the agent serving n profiles minus the agent serving n-1",
                )
        r.figure(
            "agent_memory: node agent serving nothing, a DevicePlugin unit's modules imported",
            "MiB",
            {
                "RSS": rss["0 profiles, a unit's modules imported"],
                "PSS": pss["0 profiles, a unit's modules imported"],
            },
            ratio=False,
            note="imported: " + ", ".join(UNIT_MODULES) + " (grpcio, protobuf and the stubs with them)",
        )
        if 1 in ns:
            r.figure(
                "agent_memory: serving the first profile, beyond its modules' import",
                "MiB",
                {
                    "RSS": paired(rss["1 profiles"], rss["0 profiles, a unit's modules imported"]),
                    "PSS": paired(pss["1 profiles"], pss["0 profiles, a unit's modules imported"]),
                },
                ratio=False,
                headline=True,
                note=(
                    "the agent serving 1 profile minus the agent serving none, the same modules imported "
                    "(an agent that serves nothing trims its start-up heap only if it settles memory itself)"
                ),
            )
        top = f"{max(ns)} profiles"
        r.figure(
            f"agent_memory: node agent serving {max(ns)} profiles: anonymous and file-backed RSS",
            "MiB",
            {"anonymous": anon[top], "file-backed (RSS less anonymous)": paired(rss[top], anon[top])},
            ratio=False,
            headline=True,
            note=(
                "the file-backed part is mostly shared libraries (grpcio's cygrpc: 17 MB); how many of"
                " their pages a process finds mapped depends on how the files came into the page cache"
                " (freshly written or read on demand: about 6 MiB apart for grpcio, docs/benchmarks.md)"
            ),
        )
        r.figure(
            f"agent_memory: node agent serving {max(ns)} profiles, image's environment vs dev venv: RSS",
            "MiB",
            {
                "image's environment": rss[top],
                "dev venv (.venv, as node_memory runs it)": rss[f"{top}, dev venv"],
            },
            headline=True,
            note="the dev venv adds grpc_tools and editable finders",
        )
        r.note("medians, MiB RSS: " + ", ".join(f"{k} {statistics.median(v):.1f}" for k, v in rss.items()))
    finally:
        world.close()


def figures(params: Mapping[str, Value]) -> list[str]:
    """The figures a run of ``params`` records (catalogue.toml)."""
    ns = counts(params)
    labels = ["bare python interpreter (site, the image's environment)"] + [
        f"+ {s.key}: {s.label}" for s in STEPS
    ]
    names = [f"agent_memory: import {i:02d} {label}" for i, label in enumerate(labels)]
    names += [f"agent_memory: node agent serving {n} profiles" for n in ns]
    names += [f"agent_memory: profile {n} adds" for n in ns if n - 1 in ns]
    names.append("agent_memory: node agent serving nothing, a DevicePlugin unit's modules imported")
    if 1 in ns:
        names.append("agent_memory: serving the first profile, beyond its modules' import")
    names.append(f"agent_memory: node agent serving {max(ns)} profiles: anonymous and file-backed RSS")
    names.append(f"agent_memory: node agent serving {max(ns)} profiles, image's environment vs dev venv: RSS")
    return names
