"""The background scrubber of derived state (docs/BROKER.md, "Derived state").

Every node walks every ConsumeQueue record, every key index record, then every POP, delay and
timer level and pending transaction row against the commitlog (broker.state.derived,
broker.state.statecheck), over and over, at most ``scrubRecordsPerSecond`` records a second: a slice
of records, then a sleep as long as the slice's share of the rate, on the event loop (the checks
share its state with apply and the read paths; a slice is short). A wrong ConsumeQueue run is
rebuilt in place from the commitlog; a wrong key index record or replicated row, or a run that
cannot be rebuilt in place, makes the next start rebuild every derived store from the log (the
marker ``config/rebuild-derived``), and meanwhile the read paths step around it (a key lookup
skips a candidate that is not its message; a pull rebuilds or answers ``UNAVAILABLE
DERIVED_STATE_DAMAGED``).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time

from broker.state import derived, statecheck
from broker.state.consumequeue import ConsumeQueue
from broker.state.errors import BrokerError, QueueStoreClosedError
from broker.state.machine import BrokerStateMachine
from dledger.log import DLedgerError
from prockit.fatal import spawn

logger = logging.getLogger(__name__)

# Records one slice checks at most: at the default rate a slice is 100 records, a few ms of
# the event loop (measured in docs/BROKER.md); never more, whatever the rate.
MAX_SLICE_RECORDS = 512
# Slices a second at most: the rate is spread over them (a slower rate makes smaller slices).
SLICES_PER_SECOND = 20
# After a pass that could not run (the stores were closed for a snapshot install) or found
# the log unreadable: wait this long before the next one.
RETRY_AFTER_S = 5.0
# While the rate is 0 (off: broker.conf, or a live change), the scrubber looks again this often
# whether it was turned back on (one wake-up a second, no work).
PAUSED_POLL_S = 1.0
# A pass starts at most this often: a small store's pass is over in moments, and an idle
# node's scrubber then wakes every 10 s, not in a loop.
MIN_PASS_INTERVAL_S = 10.0


class Scrubber:
    """Walks the derived stores of ``sm`` at ``records_per_second`` (0: paused until
    :meth:`set_rate` turns it on, a live change)."""

    def __init__(self, sm: BrokerStateMachine, records_per_second: int) -> None:
        self.sm = sm
        self.records_per_second = 0
        self.slice_records = 1
        self.set_rate(records_per_second)
        self._task: asyncio.Task[None] | None = None

    def set_rate(self, records_per_second: int) -> None:
        """The rate from the next slice on (0: pause after the slice under way)."""
        assert records_per_second >= 0
        self.records_per_second = records_per_second
        self.slice_records = max(1, min(MAX_SLICE_RECORDS, records_per_second // SLICES_PER_SECOND))

    def start(self) -> None:
        """Start the passes on the running loop (paused while the rate is 0)."""
        if self._task is None:
            self._task = spawn(self.run(), "derived-scrubber")

    async def stop(self) -> None:
        task, self._task = self._task, None
        if task is not None:
            task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await task

    async def run(self) -> None:
        """Passes, one after the other, until cancelled."""
        logger.info("derived-state scrubber started records_per_second=%d", self.records_per_second)
        while True:
            await self._wait_while_paused()
            started = time.monotonic()
            try:
                await self.one_pass()
            except (QueueStoreClosedError, DLedgerError) as exc:
                logger.info("derived-state scrub pass stopped: %s", exc)
                await asyncio.sleep(RETRY_AFTER_S)
            await asyncio.sleep(max(0.0, started + MIN_PASS_INTERVAL_S - time.monotonic()))

    async def _pace(self, records: int) -> None:
        await self._wait_while_paused()
        await asyncio.sleep(records / self.records_per_second)

    async def _wait_while_paused(self) -> None:
        while not self.records_per_second:
            await asyncio.sleep(PAUSED_POLL_S)

    async def one_pass(self) -> None:
        """Every queue's records, then every index record, at the rate."""
        started = time.monotonic()
        counters = self.sm.derived
        wrong_before = sum(counters.mismatches.values())
        for topic, queue_id in self.sm.cqs.queue_ids():
            cq = self.sm.cqs.find(topic, queue_id)
            if cq is not None:
                await self._queue(cq, topic, queue_id)
        cursor = (0, 1)
        while True:
            cursor, why = derived.check_index(self.sm, "scrub", self.slice_records, cursor)
            if why:
                self.sm.request_rebuild(f"key index {why}")
            await self._pace(self.slice_records)
            if cursor == (0, 1):
                break
        await self._replicated()
        counters.passes += 1
        counters.last_pass_s = time.monotonic() - started
        counters.last_pass_end_unix_s = time.time()
        found = sum(counters.mismatches.values()) > wrong_before
        logger.log(
            logging.INFO if found else logging.DEBUG,
            "derived-state scrub pass done seconds=%.1f checked=%s wrong=%s",
            counters.last_pass_s,
            counters.checked,
            counters.mismatches,
        )

    async def _replicated(self) -> None:
        """The POP, level and transaction rows as they stand when it starts (a row changed or
        gone by the time its slice comes is looked up again, or skipped), a slice at a time."""
        rows = statecheck.rows_of(self.sm)
        for at in range(0, len(rows), self.slice_records):
            part = rows[at : at + self.slice_records]
            statecheck.check_slice(self.sm, part)
            await self._pace(len(part))

    async def _queue(self, cq: ConsumeQueue, topic: str, queue_id: int) -> None:
        """The queue's records as they stand when it starts (newer ones wait for the next
        pass), a slice at a time; it stops when the queue is deleted meanwhile."""
        at, end = cq.min_offset, cq.max_offset
        while at < end and self.sm.cqs.find(topic, queue_id) is cq:
            at = max(at, cq.min_offset)  # retention moved it meanwhile
            n = min(self.slice_records, end - at)
            if n <= 0:
                break
            try:
                derived.check_queue(self.sm, cq, topic, queue_id, at, n, "scrub")
            except derived.AmbiguousRepairError as exc:
                self.sm.request_rebuild(f"queue {topic}/{queue_id} offset {at}: {exc}")
                return
            except QueueStoreClosedError:
                return  # deleted under the scrubber (a topic delete, a snapshot install)
            except BrokerError as exc:
                logger.warning("derived-state scrub of %s/%d stopped: %s", topic, queue_id, exc)
                return
            at += n
            await self._pace(n)
