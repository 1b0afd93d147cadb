"""Child processes of the tests and benches: how one is stopped."""

from __future__ import annotations

import signal
import subprocess


def stop_process(proc: subprocess.Popen[bytes], grace: float = 20.0) -> None:
    """SIGTERM to ``proc`` if it still runs; SIGKILL when it has not ended ``grace`` s later."""
    if proc.poll() is None:
        proc.send_signal(signal.SIGTERM)
        try:
            proc.wait(grace)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait(10)
