"""One type per process of the cluster, all on one base: :class:`Process`.

Every process the cluster runs (etcd, the API server, the controller manager, the scheduler,
kwok, the relay, containerd, the kubelet, a registry) is a subclass that says what is its own:
its name (its record in ``state.json`` and its log, ``<state>/logs/<name>.log``), its command line,
its environment and when it is ready. How a process is started, recorded, awaited and stopped is
here, once: the state file gets the new PID before the readiness wait (so a start that fails is
still stopped by ``down``), a child that exits or is not ready in time is stopped through its
Popen handle and the error names it with the end of its log, and stopping goes by the recorded
PID (:func:`patchbay_devcluster.procs.stop_pid`), never by name.

The state directory's layout (:class:`StateDir`) and what ``state.json`` holds (:class:`State`)
are here too, with :class:`ClusterError`, what every process type raises.
"""

from __future__ import annotations

import json
import signal
import subprocess
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path

from patchbay_devcluster import kubeapi
from patchbay_devcluster.poll import poll_until
from patchbay_devcluster.procs import Proc, spawn, stop_child, stop_pid, tail


class ClusterError(RuntimeError):
    """Something the operator of the tool must act on; the message says what and where to look."""


@dataclass(frozen=True)
class StateDir:
    """The places of one cluster's state directory that its processes share."""

    path: Path

    @property
    def pki(self) -> Path:
        return self.path / "pki"

    @property
    def logs(self) -> Path:
        return self.path / "logs"

    @property
    def state_file(self) -> Path:
        return self.path / "state.json"

    @property
    def kubeconfig(self) -> Path:
        """The admin's kubeconfig."""
        return self.path / "kubeconfig"


@dataclass
class State:
    """What ``state.json`` holds: enough for ``down``/``status`` from another process."""

    ports: dict[str, int] = field(default_factory=dict)
    procs: list[Proc] = field(default_factory=list)
    fleet: int = 0
    """The kwok nodes the control plane was sized for at start; a restart keeps its settings."""

    @classmethod
    def load(cls, path: Path) -> State:
        if not path.exists():
            return cls()
        raw = json.loads(path.read_text())
        procs = [Proc.from_dict(p) for p in raw.get("procs", [])]
        return cls(ports=raw.get("ports", {}), procs=procs, fleet=int(raw.get("fleet", 0)))

    def save(self, path: Path) -> None:
        tmp = path.with_suffix(".tmp")
        doc = {"ports": self.ports, "procs": [p.to_dict() for p in self.procs], "fleet": self.fleet}
        tmp.write_text(json.dumps(doc, indent=2))
        tmp.replace(path)


def wait(what: str, check: Callable[[], bool], timeout: float, detail: Callable[[], str]) -> None:
    """Until ``check()`` holds; an API server or component not (yet) answering is "not yet"."""
    poll_until(what, check, timeout=timeout, error=ClusterError, detail=detail, ignore=kubeapi.UNAVAILABLE)


class Process:
    """One kind of process of the cluster. A subclass sets ``name`` (or an instance does, for a
    kind that runs under several names) and says its ``argv`` and when it is ``ready``."""

    name: str
    grace: float = 15.0
    """Seconds between SIGTERM and SIGKILL when it is stopped."""

    def __init__(self, home: StateDir) -> None:
        self.home = home

    # --- what a subclass says --------------------------------------------------------------

    def argv(self) -> list[str]:
        raise NotImplementedError

    def ready(self) -> bool:
        """One readiness probe; an exception of ``kubeapi.UNAVAILABLE`` counts as "not yet"."""
        raise NotImplementedError

    def env(self) -> Mapping[str, str] | None:
        """Its whole environment; None: this process's."""
        return None

    @property
    def marker(self) -> str:
        """An argument its command line must also hold (:attr:`patchbay_devcluster.procs.Proc.marker`)."""
        return ""

    @property
    def what(self) -> str:
        """How waits and errors name it."""
        return self.name

    # --- the same for every process ------------------------------------------------------------

    @property
    def log(self) -> Path:
        return self.home.logs / f"{self.name}.log"

    def recorded(self, st: State) -> list[Proc]:
        return [p for p in st.procs if p.name == self.name]

    def runs(self, st: State) -> bool:
        return any(p.runs() for p in self.recorded(st))

    def launch(self, st: State, timeout: float, *, at: int | None = None) -> Proc:
        """Start it, record it in ``st`` and the state file, and wait until it is ready.

        The record replaces ``st.procs[at]`` (a component started again in its place), else every
        earlier record of this name and goes last. A child that exits, or is not ready within
        ``timeout`` seconds (or the wait is interrupted), is stopped, and ClusterError says why.
        """
        proc, child = spawn(
            self.name, self.argv(), self.home.logs, self.home.path, marker=self.marker, env=self.env()
        )
        if at is None:
            st.procs = [p for p in st.procs if p.name != self.name] + [proc]
        else:
            st.procs[at] = proc
        st.save(self.home.state_file)
        try:
            self._wait_ready(child, timeout)
        except BaseException:
            stop_child(child)
            raise
        return proc

    def _wait_ready(self, child: subprocess.Popen[bytes], timeout: float) -> None:
        # poll() on our own child, not /proc: right after fork the child still runs Python.
        def detail() -> str:
            code = child.poll()
            alive = "running" if code is None else f"exited with code {code}"
            return f"{self.name} (pid {child.pid}) {alive}; {tail(self.log)}"

        def check() -> bool:
            if child.poll() is not None:
                raise ClusterError(f"{self.what} exited during start\n{detail()}")
            return self.ready()

        wait(self.what, check, timeout, detail)

    def stop(self, st: State, grace: float | None = None, sig: int = signal.SIGTERM) -> bool:
        """Stop each recorded process of this name by PID (``sig``, then SIGKILL after ``grace``);
        False if none was running."""
        stopped = [stop_pid(p, self.grace if grace is None else grace, sig=sig) for p in self.recorded(st)]
        return any(stopped)
