"""The background scrubber: every member re-reads its whole log at a low, steady rate and
checks every entry (index record, header and body CRCs), so that damage in segments nobody
reads (old ones, which the open-time check does not cover) is found while the group still
has good copies, not when a consumer or a new follower needs the entry
(docs/STORAGE.md "Damage and repair", metrics in docs/METRICS.md "Scrubber").

The work is split in steps of :data:`SCRUB_STEP_BYTES`, each run in the scrubber's own thread
under the store's lock (a step holds it for about a millisecond), and paced by a
:class:`Pacer` at ``scrub_bytes_per_s``. A pass that finishes waits until
:data:`SCRUB_MIN_PASS_INTERVAL_S` (``scrubMinPassIntervalSeconds``) after it started before
the next begins, so that a small log is not re-read in a tight loop. Damage found goes to
the node's damage handler (which restarts the node to cut and repair its log); the scrubber
stops there.

Extension point: a step is one :class:`ScrubCheck` call over an index range. The entry
check is the only one today; a check that needs more than one entry at a time (a chained
checksum over consecutive entries) is another ``ScrubCheck`` run over the same ranges in
order, carrying its own state from one step to the next.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import logging
import time
from collections.abc import Callable
from typing import Protocol

from dledger.log import CorruptLogError
from dledger.server.snapshots import Pacer
from dledger.storage import SegmentedLogStore, StoreClosedError

logger = logging.getLogger(__name__)

# scrubBytesPerSec default: at 4 MiB/s a 1 GiB segment is checked in ~4.5 minutes and a
# 100 GiB log in ~7 hours, for ~1-3 % of one core on the 2-core test machine (measured:
# docs/STORAGE.md "Damage and repair"); RocketMQ-size logs are scrubbed several times a day.
DEFAULT_SCRUB_BYTES_PER_S = 4 << 20
# 0 turns the scrubber off (benchmarks only); anything else must be at least this (a pass
# must end in finite time) and at most MAX (a bound on its share of the disk).
MIN_SCRUB_BYTES_PER_S = 64 << 10
MAX_SCRUB_BYTES_PER_S = 1 << 30
# Bytes of entries checked per step: the time the store's lock is held (~1 ms at the
# measured 5 GB/s CRC32C plus the per-entry work) and the pacing grain.
SCRUB_STEP_BYTES = 1 << 20
# A new pass starts at most this often (a small log is not re-read in a tight loop): the
# default of scrubMinPassIntervalSeconds, which may be set from 1 s (a test, or a small log
# that must be re-read often) to a day (a large log whose full passes are hours apart anyway).
SCRUB_MIN_PASS_INTERVAL_S = 60
MIN_SCRUB_PASS_INTERVAL_S = 1
MAX_SCRUB_PASS_INTERVAL_S = 86_400
# Pause before retrying after the store was replaced (snapshot install) under a step.
SCRUB_REPLACED_RETRY_S = 1.0
# While the rate is 0 (off, set live: DLedgerNode.retune), the scrubber looks again this often
# whether it was turned back on: one wake-up a second, no I/O.
SCRUB_PAUSED_POLL_S = 1.0


class ScrubCheck(Protocol):
    """One kind of check over the log, run step by step in index order."""

    def __call__(self, store: SegmentedLogStore, start: int, max_bytes: int) -> tuple[int, int]:
        """Check entries from ``start`` on (about ``max_bytes``, at least one); the next index
        and the bytes checked. CorruptLogError on damage."""
        ...


def check_entries(store: SegmentedLogStore, start: int, max_bytes: int) -> tuple[int, int]:
    """The entry check: index record, header and body CRCs of each entry."""
    return store.verify_entries(start, max_bytes)


class Scrubber:
    """Scrubs the store ``get_store()`` returns (the node's current one) for ever, at
    ``bytes_per_s`` (0: paused until :meth:`set_rate` turns it on again)."""

    def __init__(
        self,
        get_store: Callable[[], SegmentedLogStore],
        on_damage: Callable[[CorruptLogError, str], None],
        bytes_per_s: int,
        check: ScrubCheck = check_entries,
        min_pass_interval_s: float = SCRUB_MIN_PASS_INTERVAL_S,
    ) -> None:
        assert bytes_per_s >= 0 and min_pass_interval_s > 0
        self.min_pass_interval_s = min_pass_interval_s
        self._get_store = get_store
        self._on_damage = on_damage
        self._check = check
        self.pacer = Pacer(max(bytes_per_s, 1))
        self.bytes_per_s = bytes_per_s
        # One thread: the scrubber never takes more than one core, and never the loop's.
        self._pool = concurrent.futures.ThreadPoolExecutor(1, "scrub")
        self.bytes_verified = 0
        self.entries_verified = 0
        self.passes = 0
        self.damage_found = 0
        self.position_index = 0  # the next index to check (for status)
        self.last_pass_end_unix_ms = 0  # when the last complete pass ended (0: none yet)

    def set_rate(self, bytes_per_s: int) -> None:
        """The pace from the next step on (0: pause after the step under way)."""
        assert bytes_per_s >= 0
        if bytes_per_s:
            self.pacer.bytes_per_s = bytes_per_s
        self.bytes_per_s = bytes_per_s

    def close(self) -> None:
        self._pool.shutdown(wait=True)

    async def _wait_while_paused(self) -> None:
        while not self.bytes_per_s:
            await asyncio.sleep(SCRUB_PAUSED_POLL_S)

    async def run(self) -> None:
        while True:
            started = time.monotonic()
            if not await self._pass():
                return  # damage: the node restarts
            self.passes += 1
            self.last_pass_end_unix_ms = int(time.time() * 1000)
            rest = self.min_pass_interval_s - (time.monotonic() - started)
            if rest > 0:
                await asyncio.sleep(rest)

    async def _pass(self) -> bool:
        """One pass over the log; False when it found damage."""
        loop = asyncio.get_running_loop()
        index = 0  # verify_entries starts at the first index
        while True:
            await self._wait_while_paused()
            store = self._get_store()
            if index > store.last_index():
                return True
            try:
                nxt, n = await loop.run_in_executor(
                    self._pool, self._check, store, index, SCRUB_STEP_BYTES
                )
            except StoreClosedError:
                # A snapshot install replaced the store: go on with the new one.
                await asyncio.sleep(SCRUB_REPLACED_RETRY_S)
                continue
            except CorruptLogError as exc:
                self.damage_found += 1
                self._on_damage(exc, "scrub")
                return False
            self.entries_verified += max(0, nxt - max(index, store.first_index()))
            self.bytes_verified += n
            self.position_index = index = nxt
            if n:
                await self.pacer.take(n)
