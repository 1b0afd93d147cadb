"""The allocation failures one agent answered for its profile: the DeviceReport's
`allocationFailures` (a staged rollout's gate fails a node whose count rises during its wave).

Counted here, where the agent answers the kubelet: a device plugin's `Allocate` or
`PreStartContainer` that returns an error (an admission refusal for the pod), a DRA
`NodePrepareResources` claim answered with an error (the claim's read, its devices, its CDI
spec). A failure counts at once; the report is written through the reporter's change writer
(`notify`), which coalesces a storm of failures into few writes. The count starts at 0 with the
agent (`since`: when), so a new agent's count is told apart from its predecessor's by `since`.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any


class AllocationFailures:
    """A running count, the last failure's time and message, and who to tell."""

    def __init__(self, clock: Callable[[], float] = time.time) -> None:
        self._clock = clock
        self.since = clock()
        self.count = 0
        self.last_time = 0.0
        self.last_message = ""
        self._listeners: list[Callable[[], None]] = []

    def subscribe(self, listener: Callable[[], None]) -> None:
        self._listeners.append(listener)

    def record(self, message: str) -> None:
        """One call (or claim) answered with an error: counted now, the listeners told (they
        must not block: this runs before the answer goes)."""
        self.count += 1
        self.last_time = self._clock()
        self.last_message = message
        for listener in self._listeners:
            listener()

    def field(self) -> dict[str, Any] | None:
        """The report's `allocationFailures` (None while nothing failed: the field is left out)."""
        if not self.count:
            return None
        # Imported here: an agent without a report (no profile) counts too, but must not load the
        # report's modules (their memory is the report's price; tests/sockets/test_agent_report_cli.py).
        from patchbay_agent.report.devicereport import MAX_MESSAGE_LENGTH, cap, rfc3339

        return {
            "count": self.count,
            "since": rfc3339(self.since),
            "last": {"time": rfc3339(self.last_time), "message": cap(self.last_message, MAX_MESSAGE_LENGTH)},
        }
