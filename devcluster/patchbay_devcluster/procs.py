"""The processes the tool starts: how one is recorded, started, probed and stopped.

A process is recorded as a :class:`Proc` (name, PID, binary, log file, and for a program run by
an interpreter an argument that names it), which is all that ``down`` or ``status`` in another
process needs. Nothing is ever signalled unless its PID still runs the recorded binary (with that
argument) (:func:`pid_runs`), so a recycled PID is never hit.
"""

from __future__ import annotations

import contextlib
import http.client
import logging
import os
import random
import signal
import socket
import ssl
import subprocess
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, fields
from pathlib import Path
from typing import Any

log = logging.getLogger(__name__)


@dataclass
class Proc:
    """One started process, as recorded in the state file."""

    name: str
    pid: int
    binary: str
    log: str
    marker: str = ""
    """An argument the command line must also hold, for a program run by an interpreter (the
    relay is ``python -m patchbay_devcluster.relay``): its binary alone matches any Python."""

    def runs(self) -> bool:
        return pid_runs(self.pid, self.binary, self.marker)

    def to_dict(self) -> dict[str, Any]:
        """As recorded; without an empty ``marker``, so records of earlier versions' kinds of
        process read the same to them."""
        out = {"name": self.name, "pid": self.pid, "binary": self.binary, "log": self.log}
        return {**out, "marker": self.marker} if self.marker else out

    @classmethod
    def from_dict(cls, raw: Mapping[str, Any]) -> Proc:
        """From a record, ignoring fields this version does not know (a newer tool's)."""
        known = {f.name for f in fields(cls)}
        return cls(**{k: v for k, v in raw.items() if k in known})


#: The lowest port `free_port` picks; it picks below the kernel's ephemeral range (see there).
PICK_FLOOR = 20000
#: Ports this process handed out, never handed out twice (a pick is not bound until its process
#: starts).
_handed: set[int] = set()


def ephemeral_range() -> tuple[int, int]:
    """The kernel's range of automatic source ports (net.ipv4.ip_local_port_range)."""
    try:
        low, high = Path("/proc/sys/net/ipv4/ip_local_port_range").read_text().split()[:2]
        return int(low), int(high)
    except (OSError, ValueError):
        return 32768, 60999


def free_port(host: str = "127.0.0.1", preferred: int = 0) -> int:
    """A port that is free on ``host`` right now: ``preferred`` if it is, else one picked at random
    BELOW the kernel's ephemeral range. A port from that range (what binding port 0 gives) can be
    taken by any outgoing connection's automatic source port between the pick and the component's
    own bind; seen in CI: a kubelet's healthz port taken so, the kubelet never healthy. Falls back
    to the kernel's pick when the range leaves no room below it."""
    if preferred and _bindable(host, preferred):
        return preferred
    low, _high = ephemeral_range()
    if low - PICK_FLOOR >= 1000:
        rng = random.SystemRandom()
        for _ in range(200):
            port = rng.randrange(PICK_FLOOR, low)
            if port not in _handed and _bindable(host, port):
                _handed.add(port)
                return port
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind((host, 0))
        return int(s.getsockname()[1])


def _bindable(host: str, port: int) -> bool:
    """Whether a listener could bind ``host:port`` now. Asked as asyncio's listeners bind
    (SO_REUSEADDR), so a port whose last connections are in TIME_WAIT counts as free, as it is to
    them; a listener on the port, on ``host`` or on the wildcard address, makes it taken."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            s.bind((host, port))
        except OSError:
            return False
        return True


def pid_runs(pid: int, binary: str, marker: str = "") -> bool:
    """True if ``pid`` is alive and still runs ``binary`` (guards against recycled PIDs), with
    ``marker`` among its arguments when given."""
    try:
        raw = Path(f"/proc/{pid}/cmdline").read_bytes()
    except OSError:
        return False
    args = raw.split(b"\0")
    argv0 = args[0].decode(errors="replace")
    if marker and marker.encode() not in args[1:]:
        return False
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return False
    # state field after the ")" of the command name: Z means a zombie, i.e. already exited.
    if stat.rsplit(")", 1)[1].split()[0] == "Z":
        return False
    return argv0 == binary


def spawn(
    name: str,
    argv: Sequence[str],
    log_dir: Path,
    cwd: Path,
    *,
    marker: str = "",
    env: Mapping[str, str] | None = None,
) -> tuple[Proc, subprocess.Popen[bytes]]:
    """Start ``argv`` in a session of its own, appending its output to ``<log_dir>/<name>.log``
    (``marker``: see :attr:`Proc.marker`; it must be one of ``argv[1:]``; ``env``: the whole
    environment, default this process's)."""
    if marker and marker not in argv[1:]:
        raise ValueError(f"{marker!r} is not an argument of {list(argv)}")
    logfile = log_dir / f"{name}.log"
    with logfile.open("ab") as out:
        child = subprocess.Popen(
            list(argv),
            stdin=subprocess.DEVNULL,
            stdout=out,
            stderr=subprocess.STDOUT,
            cwd=cwd,
            env=None if env is None else dict(env),
            start_new_session=True,  # survives the CLI; never gets the terminal's signals
        )
    return Proc(name=name, pid=child.pid, binary=argv[0], log=str(logfile), marker=marker), child


def stop_pid(p: Proc, grace: float, sig: int = signal.SIGTERM) -> bool:
    """Stop one recorded process (``sig``, then SIGKILL after ``grace``); False if it was not running."""
    if not p.runs():
        return False
    with contextlib.suppress(ProcessLookupError):
        os.kill(p.pid, sig)
    deadline = time.monotonic() + grace
    while time.monotonic() < deadline and p.runs():
        reap(p.pid)
        time.sleep(0.05)
    if p.runs():
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


def tls_ok(host: str, port: int, cafile: Path, timeout: float = 3.0) -> bool:
    """True once a TLS handshake with ``host:port`` verifies: the certificate chains to
    ``cafile`` and names ``host`` (an IP address is matched against the IP SANs). A failed
    verification raises :class:`ssl.SSLCertVerificationError` (an OSError), saying why."""
    ctx = ssl.create_default_context(cafile=str(cafile))
    with (
        socket.create_connection((host, port), timeout=timeout) as raw,
        ctx.wrap_socket(raw, server_hostname=host) as tls,
    ):
        return tls.version() is not None
