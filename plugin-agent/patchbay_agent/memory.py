"""Start-up garbage handed back to the kernel: the agent runs on every node, so its resident
memory is multiplied by the cluster's size (docs/facts.md#client-memory).

Start-up (imports, config parsing, the first API request) leaves garbage, some of it in reference
cycles, and freed C heap that glibc keeps mapped. `settle_memory` collects the cycles and asks
glibc to return free pages (`malloc_trim`). It is called once, when the agent has started, right
before `gc.freeze()`, which would otherwise keep that garbage for the life of the process.
"""

from __future__ import annotations

import ctypes
import gc
import logging

log = logging.getLogger(__name__)


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
