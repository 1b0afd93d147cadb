"""The agent's start IN ITS IMAGE against Python's gRPC floor in the SAME image: exec -> the
kubelet sees every device, on the upstream kubelet device manager (the conformance peer, on the
host) and FAKE hardware (a temporary /dev tree), as the ``agent`` scenario measures it from the
development virtualenv; its two host sides run beside, interleaved, for the difference the image
makes.

Why in the image: a node runs the agent from the image (its Python, its ``-OO`` bytecode compiled
ahead, ``PYTHONOPTIMIZE=2``, no development packages on the path), and the goal is a ratio to the
least a Python device plugin can do *there* (docs/benchmarks.md). Both image sides are started by
one launcher process inside one long-lived container of the agent image (``podman run -i``), so a
start costs neither side podman's own exec: the launcher takes the time (``time.monotonic``) just
before it starts the process, and the bench takes it again when the kubelet peer shows every
device. The two clocks are one: a container has no time namespace of its own here, which the
bench checks at the start (the launcher's reading falls between two of the host's) and fails if
not. The floor is ``patchbay_bench.floor`` copied into the container's work folder and compiled
ahead with the image's Python at ``-OO``, as the agent's modules are in the image.
"""

from __future__ import annotations

import json
import os
import resource
import shutil
import subprocess
import time
from collections.abc import Callable
from pathlib import Path
from typing import IO, Any

from support.agentrun import AGENT

from patchbay_bench import REPO
from patchbay_bench.harness import Run, interleave
from patchbay_bench.peers import build_peer, conformance_agent_argv
from patchbay_bench.scenarios.agent import DEVICES, INSTANCE, RESOURCE, World
from patchbay_bench.setup import bytecode_ahead
from patchbay_devcluster.imagebuild import BuiltImage, build_all, find_repo

#: The image's Python and the agent's entry point, as its Dockerfile installs them.
IMAGE_PYTHON = "/opt/patchbay/bin/python3"
IMAGE_AGENT = "/opt/patchbay/bin/patchbay-agent"
#: The floor in the image registers a resource of its own (the host's floor has FLOOR_RESOURCE).
IMAGE_FLOOR_RESOURCE = "example.com/pyfloor-image"
#: Inside the container: one JSON request per line in, one JSON answer per line out.
LAUNCHER = r"""
import compileall, json, os, subprocess, sys, time
compileall.compile_dir(sys.argv[1], quiet=1, optimize=2)
procs = {}
print(json.dumps({"ready": True}), flush=True)
for line in sys.stdin:
    req = json.loads(line)
    op, name = req["op"], req.get("name")
    if op == "clock":
        out = {"now": time.monotonic()}
    elif op == "start":
        log = open(req["log"], "ab")
        env = {**os.environ, **req.get("env", {})}
        t0 = time.monotonic()
        procs[name] = subprocess.Popen(req["argv"], stdout=log, stderr=subprocess.STDOUT, env=env)
        out = {"t0": t0}
    elif op == "stop":
        p = procs.pop(name)
        p.terminate()
        try:
            out = {"rc": p.wait(20)}
        except subprocess.TimeoutExpired:
            p.kill()
            out = {"rc": p.wait(), "killed": True}
    else:
        out = {"error": f"unknown op {op}"}
    print(json.dumps(out), flush=True)
"""


class Container:
    """One container of the agent image running the launcher; `start` and `stop` processes in it."""

    def __init__(self, image: str, root: Path, name: str) -> None:
        self.name = name
        self.proc = subprocess.Popen(
            [
                "podman", "run", "-i", "--rm", "--name", name, "--network=none", *host_ulimits(),
                "-v", f"{root}:{root}", "--entrypoint", IMAGE_PYTHON, image,
                "-u", "-c", LAUNCHER, str(root / "pybench"),
            ],
            stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=(root / "container.log").open("wb"),
            text=True,
        )  # fmt: skip
        self._in: IO[str] = self.proc.stdin  # type: ignore[assignment]
        self._out: IO[str] = self.proc.stdout  # type: ignore[assignment]
        self._answer()  # {"ready": true}: compiled, serving

    def _answer(self) -> dict[str, Any]:
        line = self._out.readline()
        if not line:
            raise RuntimeError(f"the launcher in container {self.name} ended (its log: container.log)")
        answer: dict[str, Any] = json.loads(line)
        if "error" in answer:
            raise RuntimeError(answer["error"])
        return answer

    def ask(self, **request: Any) -> dict[str, Any]:
        self._in.write(json.dumps(request) + "\n")
        self._in.flush()
        return self._answer()

    def one_clock(self) -> tuple[float, float, float]:
        """(host before, container, host after): the container's monotonic clock is the host's
        when its reading lies between the two."""
        before = time.monotonic()
        now = float(self.ask(op="clock")["now"])
        return before, now, time.monotonic()

    def close(self) -> None:
        if self.proc.poll() is None:
            self._in.close()
            try:
                self.proc.wait(20)
            except subprocess.TimeoutExpired:
                subprocess.run(["podman", "rm", "-f", "-t", "0", self.name], capture_output=True)
                self.proc.wait(20)


class Sides:
    """The four sides, one running at a time: each start first stops whichever runs (and waits
    until the kubelet shows its devices gone), so every start is timed from a clean state. The
    image's agent and the host's are the same resource and socket (the same command line); the
    floors are two resources."""

    def __init__(self, world: World, box: Container) -> None:
        self.world, self.box = world, box
        self.running: str | None = None
        command = conformance_agent_argv(
            world.config, world.plugin_dir, world.hw.root, "--instance", INSTANCE
        )
        # The host side runs `python -m patchbay_agent.main`: the image's entry point instead.
        self.argv: dict[str, list[str]] = {
            "agent": [IMAGE_AGENT, *command[len(AGENT) :]],
            "floor": [
                IMAGE_PYTHON, "-m", "patchbay_bench.floor", str(world.plugin_dir / "img-floor.sock"),
                "--register", str(world.plugin_dir / "kubelet.sock"), IMAGE_FLOOR_RESOURCE, str(DEVICES),
            ],
        }  # fmt: skip
        self.env = {"agent": {}, "floor": {"PYTHONPATH": str(world.root / "pybench")}}
        self.resource = {"agent": RESOURCE, "floor": IMAGE_FLOOR_RESOURCE}

    def stop(self) -> None:
        side, self.running = self.running, None
        if side == "host agent":
            self.world.stop_agent()
        elif side == "host floor":
            self.world.stop_registered_floor()
        elif side is not None:
            self.box.ask(op="stop", name=side)
            self.world.kubelet.wait(self.resource[side], allocatable=0, timeout_ms=20000)

    def start(self, side: str) -> float:
        """Seconds from exec to the kubelet seeing every device of `side`."""
        self.stop()
        self.running = side
        if side == "host agent":
            return self.world.start_agent()
        if side == "host floor":
            return self.world.start_registered_floor()
        log = str(self.world.root / f"img-{side}.log")
        t0 = float(
            self.box.ask(op="start", name=side, argv=self.argv[side], env=self.env[side], log=log)["t0"]
        )
        self.world.kubelet.wait(self.resource[side], capacity=DEVICES, allocatable=DEVICES, timeout_ms=20000)
        return time.monotonic() - t0


#: Processes a container may have: podman's default is above what runc may set here.
NPROC = 4096


def host_ulimits() -> list[str]:
    """`--ulimit` flags: this process's own open-file limit (podman's default, 1048576, is above
    this machine's hard limit, which runc may not raise here: `error setting rlimit type 7`) and
    `NPROC` processes (the same for type 6: runc under podman's conmon may go no higher than
    32768 here)."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    return ["--ulimit", f"nofile={soft}:{hard}", "--ulimit", f"nproc={NPROC}:{NPROC}"]


def in_podman(image: BuiltImage) -> str:
    """The image's reference in podman's store (loaded from its cached archive when only that is
    there, as after a fresh machine's first warm build)."""
    if subprocess.run(["podman", "image", "exists", image.ref], capture_output=True).returncode != 0:
        subprocess.run(["podman", "load", "-q", "-i", str(image.archive)], check=True, capture_output=True)
    return image.ref


def run(r: Run) -> None:
    peer = build_peer()
    bytecode_ahead()  # the host sides start from compiled bytecode too
    image = in_podman(build_all(find_repo(REPO))["agent"])
    world = World(Path(r.work), peer, recovery_hold=1)
    pybench = world.root / "pybench" / "patchbay_bench"
    pybench.mkdir(parents=True)
    (pybench / "__init__.py").write_text("")
    shutil.copy(REPO / "bench" / "patchbay_bench" / "floor.py", pybench / "floor.py")
    box: Container | None = None
    sides: Sides | None = None
    try:
        box = Container(image, world.root, f"patchbay-bench-start-{os.getpid()}")
        clocks = [box.one_clock() for _ in range(5)]
        if not all(before <= now <= after for before, now, after in clocks):
            raise RuntimeError(f"the container's monotonic clock is not the host's: {clocks}")
        r.log(f"image {image}; the container's monotonic clock is the host's ({len(clocks)} readings)")
        sides = Sides(world, box)
        names = {
            "agent in its image": "agent",
            "Python gRPC floor in the agent image": "floor",
            "agent, dev venv": "host agent",
            "Python gRPC floor, dev venv": "host floor",
        }

        def starter(side: str) -> Callable[[int], float]:
            return lambda _i: sides.start(side)

        starts = interleave(r.rounds(), {k: starter(v) for k, v in names.items()}, alternate=True)
        r.figure(
            "agent_image: exec -> the kubelet sees its devices",
            "ms",
            {k: [x * 1000 for x in v] for k, v in starts.items()},
            headline=True,
            note="in the image: started by a launcher inside one container of the agent image (no podman "
            "exec in the time), from its time.monotonic() just before the start to the host's when the "
            "kubelet peer's GetCapacity shows every device; each round a fresh process of each side, one "
            "side running at a time",
        )
    finally:
        if sides is not None:
            sides.stop()
        if box is not None:
            box.close()
        world.close()
