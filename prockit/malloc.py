"""The C allocator of a long-running server (glibc's malloc): how many arenas it may make, and
giving back to the kernel the free memory it holds.

A server process runs many threads that allocate (gRPC's completion queues and polling
threads, the executors that write snapshots and segments, the event loop). glibc gives each
thread that meets a locked arena an arena of its own, up to 8 per core, and an arena keeps the
pages a burst of load took after they are freed: a node's ``RssAnon`` then steps up by tens of
MB under load and only partly falls back (docs/PERFORMANCE.md, "A deep backlog").
``cap_arenas`` holds a process to ``SERVER_MALLOC_ARENAS`` arenas (``mallopt(M_ARENA_MAX)``,
called at start-up before the server's threads exist; an operator's ``MALLOC_ARENA_MAX`` in
the environment wins), and ``trim`` returns the free pages of every arena to the kernel
(``malloc_trim(0)``). On a C library without these calls (musl, macOS) both do nothing.
"""

from __future__ import annotations

import asyncio
import ctypes
import ctypes.util
import logging
import os
from collections.abc import Mapping

log = logging.getLogger(__name__)

# glibc's mallopt parameter number of M_ARENA_MAX (malloc.h: #define M_ARENA_MAX -8).
M_ARENA_MAX = -8
# Arenas a server may use. One is the main heap; a second lets a thread that finds the main
# one locked (gRPC's threads while the loop allocates) go on without waiting. More arenas only
# keep more freed memory per thread (docs/PERFORMANCE.md, "A deep backlog": 3-node groups
# filled with 600,000 and 1,000,000 messages of 128 B side by side; the send rate moved with
# the machine's load, not with the cap).
SERVER_MALLOC_ARENAS = 2
# How often a server gives its allocator's free pages back (``trim_periodically``): a
# malloc_trim(0) of a node's ~100 MB heap took 0.8-1.5 ms here, off the event loop, so every
# 30 s costs nothing measurable, and a burst's pages go back within half a minute of it.
TRIM_INTERVAL_S = 30.0
# The environment variable glibc reads at its initialisation (it then overrides the cap).
ARENA_ENV = "MALLOC_ARENA_MAX"


def _libc() -> ctypes.CDLL | None:
    name = ctypes.util.find_library("c")
    if name is None:
        return None
    try:
        return ctypes.CDLL(name)
    except OSError:
        return None


_LIBC = _libc()


def cap_arenas(env: Mapping[str, str] | None = None) -> int | None:
    """Hold this process to ``SERVER_MALLOC_ARENAS`` malloc arenas, unless ``MALLOC_ARENA_MAX``
    is set in ``env`` (default: this process's environment; glibc applied it already) or the C
    library has no ``mallopt``. Returns the cap set here, or None. Call it before the
    process starts its threads: an arena already made stays."""
    env = os.environ if env is None else env
    if ARENA_ENV in env or _LIBC is None or not hasattr(_LIBC, "mallopt"):
        return None
    if _LIBC.mallopt(M_ARENA_MAX, SERVER_MALLOC_ARENAS) != 1:  # 1: success (malloc.h)
        log.warning("mallopt(M_ARENA_MAX, %d) refused", SERVER_MALLOC_ARENAS)
        return None
    return SERVER_MALLOC_ARENAS


def trim() -> bool:
    """Give the free pages of every malloc arena back to the kernel (``malloc_trim(0)``).
    True if some memory was released; False also without ``malloc_trim``."""
    if _LIBC is None or not hasattr(_LIBC, "malloc_trim"):
        return False
    return bool(_LIBC.malloc_trim(0))


async def trim_periodically(interval_s: float = TRIM_INTERVAL_S) -> None:
    """Call ``trim`` every ``interval_s`` on the loop's default executor (it holds each arena's
    lock for about a millisecond; the event loop does not wait for it) until cancelled."""
    assert interval_s > 0, interval_s
    loop = asyncio.get_running_loop()
    while True:
        await asyncio.sleep(interval_s)
        await loop.run_in_executor(None, trim)
