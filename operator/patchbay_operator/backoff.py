"""The operator's one retry rhythm: capped exponential backoff with jitter.

Used wherever the operator tries again after a failure it cannot fix itself: a watch that broke
(informer.py) and a node patch the API server refused (nodes.py). Jitter spreads retries, so
replicas or nodes that failed together do not knock again in step.
"""

from __future__ import annotations

import random


class Backoff:
    """Delays ``first``, ``first*factor``, ... up to ``maximum``, each +-20%; ``reset`` after a success."""

    def __init__(self, first: float = 0.5, maximum: float = 30.0, factor: float = 2.0) -> None:
        self.first, self.maximum, self.factor = first, maximum, factor
        self._next = first

    def next(self) -> float:
        delay = self._next
        self._next = min(self.maximum, self._next * self.factor)
        return delay * random.uniform(0.8, 1.2)  # noqa: S311 - jitter, not crypto

    def reset(self) -> None:
        self._next = self.first
