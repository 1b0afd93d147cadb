"""Start-up garbage handed back to the kernel: the agent runs on every node, so its resident
memory is multiplied by the cluster's size (docs/facts.md#client-memory).

Start-up (imports, config parsing, the first API request) leaves garbage, some of it in reference
cycles, and freed C heap that glibc keeps mapped. `settle_memory` collects the cycles and asks
glibc to return free pages (`malloc_trim`). It is called once, when the agent is ready, right
before `gc.freeze()`, which would otherwise keep that garbage for the life of the process
(`settle_when_ready`).
"""

from __future__ import annotations

import asyncio
import contextlib
import ctypes
import gc
import logging
import time
from collections.abc import Callable

log = logging.getLogger(__name__)

#: How long `settle_when_ready` waits for readiness at most, and how often it looks.
SETTLE_WAIT = 5.0
SETTLE_POLL = 0.01


def settle_memory() -> int:
    """Collect cyclic garbage and return free C heap to the kernel; the number of objects freed.

    `malloc_trim` exists only in glibc; with another C library (musl) only the collection runs.
    """
    freed = gc.collect()
    try:
        # The process's own symbols, C library included (dlopen(NULL)): no search for libc.so.
        trim = ctypes.CDLL(None).malloc_trim
    except (OSError, AttributeError):
        log.debug("No malloc_trim in this C library: start-up heap stays mapped")
        return freed
    trim.argtypes = [ctypes.c_size_t]
    trim.restype = ctypes.c_int
    trim(0)
    return freed


async def settle_when_ready(ready: Callable[[], bool], stop: asyncio.Event) -> None:
    """Once `ready()` (the kubelet holds a device plugin's stream, or the DRA driver is
    registered), or `stop` is set, or `SETTLE_WAIT` seconds passed: `settle_memory()`, then move
    everything allocated so far (modules, config, grpc: it lives as long as the process) out of
    the garbage collector's generations, so full collections stop walking it. They otherwise land
    in the middle of Allocate calls and stretch its tail latency (docs/facts.md#plugin-sockets).

    After readiness, not before the first registration: the collection takes 5-10 ms of the event
    loop, which the kubelet's first sight of the devices waited for (docs/benchmarks.md, "In its
    image, after the JSON config and the late freeze")."""
    deadline = time.monotonic() + SETTLE_WAIT
    # Polled: readiness is a state of the front-end's streams, with no event of its own.
    while not (ready() or stop.is_set()) and time.monotonic() < deadline:
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(stop.wait(), SETTLE_POLL)
    settle_memory()
    gc.freeze()
