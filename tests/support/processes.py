"""Child processes of the tests and benches: how one is stopped, and whether its HTTP endpoint
answers."""

from __future__ import annotations

import signal
import subprocess
import urllib.request


def stop_process(proc: subprocess.Popen[bytes], grace: float = 20.0) -> None:
    """SIGTERM to ``proc`` if it still runs; SIGKILL when it has not ended ``grace`` s later."""
    if proc.poll() is None:
        proc.send_signal(signal.SIGTERM)
        try:
            proc.wait(grace)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait(10)


def http_ok(url: str, timeout: float) -> bool:
    """Whether ``url`` answers 200 now; False while nothing listens there or it answers an error
    (a readiness or liveness endpoint polled until the process serves)."""
    try:
        with urllib.request.urlopen(url, timeout=timeout) as r:
            return bool(r.status == 200)
    except OSError:
        return False
