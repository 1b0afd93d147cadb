"""The one base of the cluster's process types (``process.Process``): a process is recorded in
the state file before its readiness wait, replaces earlier records of its name, and is stopped
when it exits or is not ready in time; ``stop`` goes by the recorded PID. Real child processes
(Python sleeping), no cluster."""

from __future__ import annotations

import sys
from collections.abc import Callable
from pathlib import Path

import pytest

from patchbay_devcluster.process import ClusterError, Process, State, StateDir
from patchbay_devcluster.procs import Proc


class Sleeper(Process):
    """A process type as the cluster's are: its command line and its readiness probe."""

    name = "sleeper"
    grace = 2.0

    def __init__(self, home: StateDir, code: str, ready: Callable[[], bool]) -> None:
        super().__init__(home)
        self.code = code
        self.probe = ready

    def argv(self) -> list[str]:
        return [sys.executable, "-c", self.code]

    def ready(self) -> bool:
        return self.probe()


SLEEP = "import time; print('up', flush=True); time.sleep(60)"


def says_up(home: StateDir) -> Callable[[], bool]:
    """Ready once it printed ``up`` (by then it runs its command line, not the parent's)."""
    log = home.logs / "sleeper.log"
    return lambda: log.exists() and "up" in log.read_text()


@pytest.fixture
def home(tmp_path: Path) -> StateDir:
    home = StateDir(tmp_path)
    home.logs.mkdir()
    return home


def test_a_ready_process_is_recorded_in_place_of_its_earlier_record_and_stopped_by_pid(
    home: StateDir,
) -> None:
    stale = Proc("sleeper", 2**22 + 1, sys.executable, "/old")
    other = Proc("etcd", 2**22 + 2, "/bin/etcd", "/e")
    st = State(ports={"x": 1}, procs=[stale, other])
    sleeper = Sleeper(home, SLEEP, says_up(home))
    proc = sleeper.launch(st, timeout=10)
    try:
        assert st.procs == [other, proc]  # the stale record gone, the new one last
        assert State.load(home.state_file).procs == st.procs
        assert proc.log == str(home.logs / "sleeper.log")
        assert sleeper.runs(st)
    finally:
        assert sleeper.stop(st)
    assert not sleeper.runs(st)
    assert not sleeper.stop(st)  # nothing runs any more


def test_a_record_given_a_place_is_replaced_there(home: StateDir) -> None:
    first, last = Proc("etcd", 2**22 + 1, "/bin/etcd", "/e"), Proc("kwok", 2**22 + 2, "/bin/kwok", "/k")
    st = State(procs=[first, Proc("sleeper", 2**22 + 3, sys.executable, "/old"), last])
    sleeper = Sleeper(home, SLEEP, says_up(home))
    proc = sleeper.launch(st, timeout=10, at=1)
    try:
        assert st.procs == [first, proc, last]
    finally:
        sleeper.stop(st)


def test_a_process_that_exits_during_its_start_is_named_with_its_log(home: StateDir) -> None:
    st = State()
    sleeper = Sleeper(home, "print('no config here'); raise SystemExit(3)", lambda: False)
    with pytest.raises(ClusterError, match="sleeper exited during start") as failed:
        sleeper.launch(st, timeout=10)
    assert "exited with code 3" in str(failed.value)
    assert "no config here" in str(failed.value)
    # Recorded before the wait: ``down`` from another process would see it.
    assert [p.name for p in State.load(home.state_file).procs] == ["sleeper"]


def test_a_process_not_ready_in_time_is_stopped(home: StateDir) -> None:
    st = State()
    sleeper = Sleeper(home, SLEEP, lambda: False)
    with pytest.raises(ClusterError, match=r"timed out after 1s waiting for sleeper\n.*running"):
        sleeper.launch(st, timeout=1)
    (proc,) = st.procs
    assert not proc.runs()  # stopped through its Popen handle, not left to run
