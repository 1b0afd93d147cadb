"""The processes the tool starts: how one is recorded, started, probed and stopped.

A process is recorded as a :class:`Proc` (name, PID, binary, log file), which is all that
``down`` or ``status`` in another process needs. Nothing is ever signalled unless its PID still
runs the recorded binary (:func:`pid_runs`), so a recycled PID is never hit.
"""

from __future__ import annotations

import contextlib
import http.client
import logging
import os
import signal
import socket
import ssl
import subprocess
import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

log = logging.getLogger(__name__)


@dataclass
class Proc:
    """One started process, as recorded in the state file."""

    name: str
    pid: int
    binary: str
    log: str

    def runs(self) -> bool:
        return pid_runs(self.pid, self.binary)


def free_port() -> int:
    """A port that is free on 127.0.0.1 right now (the kernel picks it)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def pid_runs(pid: int, binary: str) -> bool:
    """True if ``pid`` is alive and still runs ``binary`` (guards against recycled PIDs)."""
    try:
        raw = Path(f"/proc/{pid}/cmdline").read_bytes()
    except OSError:
        return False
    argv0 = raw.split(b"\0", 1)[0].decode(errors="replace")
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return False
    # state field after the ")" of the command name: Z means a zombie, i.e. already exited.
    if stat.rsplit(")", 1)[1].split()[0] == "Z":
        return False
    return argv0 == binary


def spawn(name: str, argv: Sequence[str], log_dir: Path, cwd: Path) -> tuple[Proc, subprocess.Popen[bytes]]:
    """Start ``argv`` in a session of its own, appending its output to ``<log_dir>/<name>.log``."""
    logfile = log_dir / f"{name}.log"
    with logfile.open("ab") as out:
        child = subprocess.Popen(
            list(argv),
            stdin=subprocess.DEVNULL,
            stdout=out,
            stderr=subprocess.STDOUT,
            cwd=cwd,
            start_new_session=True,  # survives the CLI; never gets the terminal's signals
        )
    return Proc(name=name, pid=child.pid, binary=argv[0], log=str(logfile)), child


def stop_pid(p: Proc, grace: float, sig: int = signal.SIGTERM) -> bool:
    """Stop one recorded process (``sig``, then SIGKILL after ``grace``); False if it was not running."""
    if not pid_runs(p.pid, p.binary):
        return False
    with contextlib.suppress(ProcessLookupError):
        os.kill(p.pid, sig)
    deadline = time.monotonic() + grace
    while time.monotonic() < deadline and pid_runs(p.pid, p.binary):
        reap(p.pid)
        time.sleep(0.05)
    if pid_runs(p.pid, p.binary):
        log.warning("%s (pid %d) still running after %.0fs; killing", p.name, p.pid, grace)
        with contextlib.suppress(ProcessLookupError):
            os.kill(p.pid, signal.SIGKILL)
        time.sleep(0.1)
    reap(p.pid)
    return True


def stop_child(child: subprocess.Popen[bytes], grace: float = 10.0) -> None:
    """Stop a child of this process through its Popen handle (it may not have exec'd yet)."""
    if child.poll() is not None:
        return
    child.terminate()
    try:
        child.wait(grace)
    except subprocess.TimeoutExpired:
        child.kill()
        child.wait(5)


def reap(pid: int) -> None:
    """Collect the exit status of our own child (no-op for processes started by another CLI)."""
    with contextlib.suppress(ChildProcessError, OSError):
        os.waitpid(pid, os.WNOHANG)


def tail(path: Path, lines: int = 25) -> str:
    """The last ``lines`` of a log file, headed by its path, for error messages."""
    try:
        text = path.read_text(errors="replace").splitlines()
    except OSError:
        return f"(no log at {path})"
    return f"last lines of {path}:\n" + "\n".join(text[-lines:])


def http_ok(port: int, path: str, tls: bool) -> bool:
    """True if ``GET <path>`` on 127.0.0.1:``port`` answers 200 (a component's health endpoint)."""
    conn: http.client.HTTPConnection
    if tls:
        # The components serve a self-signed certificate of their own for /healthz only.
        ctx = ssl.create_default_context()
        ctx.check_hostname = False
        ctx.verify_mode = ssl.CERT_NONE
        conn = http.client.HTTPSConnection("127.0.0.1", port, context=ctx, timeout=3)
    else:
        conn = http.client.HTTPConnection("127.0.0.1", port, timeout=3)
    try:
        conn.request("GET", path)
        return conn.getresponse().status == 200
    finally:
        conn.close()
