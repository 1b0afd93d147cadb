"""Waiting for something to become true: one loop for the tool, the demo and the tests.

Every wait here is bounded: :func:`poll_until` calls ``check`` until it returns something truthy
and returns that, or gives up after ``timeout`` seconds with an error that names what was awaited
and what was last seen. It is a wait for a system to converge, never a timing assertion.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import TypeVar

T = TypeVar("T")


def poll_until(
    what: str,
    check: Callable[[], T],
    *,
    timeout: float,
    interval: float = 0.2,
    error: Callable[[str], BaseException] = TimeoutError,
    detail: Callable[[], str] | None = None,
    ignore: tuple[type[BaseException], ...] = (),
) -> T:
    """Call ``check`` every ``interval`` seconds until it returns something truthy; return that.

    ``check`` runs at least once, and once more at the deadline. An exception of a type in
    ``ignore`` counts as "not yet" (a server that is still starting refuses connections); any
    other propagates at once. After ``timeout`` seconds this raises ``error(message)``, where the
    message reads ``timed out after <timeout>s waiting for <what>`` followed by ``detail()`` when
    given, else the last value ``check`` returned, and the last ignored exception, if the last
    call raised one.
    """
    deadline = time.monotonic() + timeout
    last: T | None = None
    failure: BaseException | None = None
    while True:
        try:
            last = check()
        except ignore as e:
            last, failure = None, e
        else:
            failure = None
            if last:
                return last
        left = deadline - time.monotonic()
        if left <= 0:
            break
        time.sleep(min(interval, left))
    seen = detail() if detail is not None else f"last={last!r}"
    if failure is not None:
        seen += f"\nlast error: {type(failure).__name__}: {failure}"
    sep = "\n" if "\n" in seen else "; "
    raise error(f"timed out after {timeout:g}s waiting for {what}{sep}{seen}")
