"""Running the profile's commands (health exec probes, preStart): bounded, killable, summarised.

One place for the rules both follow: the command runs in its own session with extra
environment variables; on timeout its whole process group is killed and reaped; the result is
ok, "cannot run", "timed out" or "exited N" with the last line of its stderr.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import signal
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from enum import Enum


class Outcome(Enum):
    OK = "ok"
    CANNOT_RUN = "cannot run"
    TIMED_OUT = "timed out"
    FAILED = "exited non-zero"


@dataclass(frozen=True)
class CommandResult:
    outcome: Outcome
    #: Human words after the command's name: "cannot run: ...", "timed out after 2s", "exited 3: ..."
    detail: str = ""

    @property
    def ok(self) -> bool:
        return self.outcome is Outcome.OK


async def run_command(
    argv: Sequence[str], extra_env: Mapping[str, str], limit_seconds: float
) -> CommandResult:
    """Run ``argv`` with ``extra_env`` added; never longer than ``limit_seconds``."""
    env = {**os.environ, **extra_env}
    try:
        proc = await asyncio.create_subprocess_exec(
            *argv,
            env=env,
            stdin=asyncio.subprocess.DEVNULL,
            stdout=asyncio.subprocess.DEVNULL,
            stderr=asyncio.subprocess.PIPE,
            start_new_session=True,
        )
    except OSError as e:
        return CommandResult(Outcome.CANNOT_RUN, f"cannot run: {e.strerror or e}")
    try:
        _, stderr = await asyncio.wait_for(proc.communicate(), timeout=limit_seconds)
    except TimeoutError:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, signal.SIGKILL)
        await proc.wait()
        return CommandResult(Outcome.TIMED_OUT, f"timed out after {limit_seconds:g}s")
    if proc.returncode != 0:
        tail = stderr.decode(errors="replace").strip().splitlines()[-1:] if stderr else []
        return CommandResult(Outcome.FAILED, f"exited {proc.returncode}" + (f": {tail[0]}" if tail else ""))
    return CommandResult(Outcome.OK)
