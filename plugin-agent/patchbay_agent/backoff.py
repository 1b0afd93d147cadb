"""The agent's one retry rhythm: registration, serving, API writes all back off the same way."""

from __future__ import annotations

import random


class Backoff:
    """Capped exponential backoff with +-20% jitter (so a node's agents do not knock in step)."""

    def __init__(self, initial: float = 0.1, maximum: float = 10.0, factor: float = 2.0) -> None:
        self.initial = initial
        self.maximum = maximum
        self.factor = factor
        self._next = initial

    def next(self) -> float:
        delay = self._next
        self._next = min(self.maximum, self._next * self.factor)
        return delay * random.uniform(0.8, 1.2)  # noqa: S311 - jitter, not crypto

    def reset(self) -> None:
        self._next = self.initial
