"""The delay scheduler: while a node leads, it delivers due scheduled messages.

Delayed messages (and retries) wait in ``SCHEDULE_TOPIC_XXXX``, one queue per delay level
(the rules are in :mod:`broker.state.delayrules`). Each delivery is one log entry holding the
level's new schedule offset and the copies for the real queues, so a new leader resumes exactly
where the last applied delivery stopped.
"""

from __future__ import annotations

import asyncio
import logging
import time
from dataclasses import replace

from broker.components.applied import AppliedMessages, Wakeup, run_while_leading, start_leader_task
from broker.state.delayrules import delivered_copy, due_ms, encode_schedule_header
from broker.state.errors import BrokerError
from broker.state.message import Message, encode_batch
from broker.state.names import SCHEDULE_TOPIC
from broker.state.records import ENTRY_SCHEDULE

logger = logging.getLogger(__name__)

# The scheduler sleeps until the next due message, at most this long (a new delayed message
# is due one delay after it is stored, so this only bounds lateness for the shortest levels)
# and at least this long between passes.
SCHEDULE_IDLE_MS = 100
SCHEDULE_MIN_WAIT_MS = 5
# With every level empty it sleeps until a scheduled message is stored (a dispatch listener
# wakes it), at most this long: an idle leader's scheduler turns once a second, not ten times.
SCHEDULE_EMPTY_WAIT_MS = 1000
# One delivery entry holds at most this many messages / bytes of copies.
SCHEDULE_BATCH_MESSAGES = 512
SCHEDULE_BATCH_BYTES = 1 << 20


class _Batch:
    """One delivery being gathered: schedule offsets [start, end) and their copies."""

    def __init__(self, start: int) -> None:
        self.start = start
        self.end = start
        self.size = 0
        self.copies: list[Message] = []
        self.next_due: int | None = None


class Scheduler:
    """Delivers due scheduled messages on the leader, in a supervised task per term."""

    def __init__(self, applied: AppliedMessages) -> None:
        self.ctx = applied.ctx
        self.applied = applied
        self.task: asyncio.Task[None] | None = None
        self.wakeup = Wakeup(SCHEDULE_IDLE_MS / 1000)
        self.ctx.sm.add_listener(self.wakeup.wake_on_topic(SCHEDULE_TOPIC))
        self.ctx.sm.add_change_listener(self.maybe_start)

    def maybe_start(self) -> None:
        """A change listener: a node that became leader starts delivering due messages."""
        self.task = start_leader_task(self.ctx, self.task, self._loop, "scheduler")

    async def _loop(self) -> None:
        """While this node leads: deliver every due scheduled message, level by level (one
        entry holds the copies and the offset, so a failed pass leaves nothing half done)."""
        await run_while_leading(
            self.ctx, "scheduler", self._pass, SCHEDULE_IDLE_MS / 1000, self.wakeup
        )

    async def _pass(self) -> float:
        """Every level's due head delivered; seconds until the next is due (bounded), or
        until a scheduled message is stored when every level is empty."""
        next_due: int | None = None
        for level in range(1, len(self.ctx.cfg.delay_levels_ms) + 1):
            due = await self.deliver_level(level)
            if due is not None and (next_due is None or due < next_due):
                next_due = due
        if next_due is None:
            return SCHEDULE_EMPTY_WAIT_MS / 1000
        wait_ms = next_due - time.time() * 1000
        return min(max(wait_ms, SCHEDULE_MIN_WAIT_MS), SCHEDULE_IDLE_MS) / 1000

    async def deliver_level(self, level: int) -> int | None:
        """Deliver the due head of ``level``'s queue; the next due time (ms; one idle period on
        when a delivery was not applied), or None when the queue is empty or fully delivered."""
        while True:
            batch = self._gather(level)
            if batch is None:
                return None
            if batch.end == batch.start:
                return batch.next_due
            current = self.ctx.sm.schedule_offsets.get(level, 0)
            body = encode_schedule_header(level, current, batch.end)
            if batch.copies:
                body += encode_batch(batch.copies, self.ctx.cfg.max_message_size_bytes)[0]
            await self.ctx.node.propose([body], ENTRY_SCHEDULE)
            if self.ctx.sm.schedule_offsets.get(level, 0) != batch.end:
                # Skipped when applied (another pass delivered them first, or the entry was
                # bad): look again one idle period on rather than spin here.
                logger.warning(
                    "schedule entry level=%d [%d, %d) not applied", level, current, batch.end
                )
                return int(time.time() * 1000) + SCHEDULE_IDLE_MS
            logger.debug(
                "delivered level=%d offsets [%d, %d) copies=%d",
                level,
                batch.start,
                batch.end,
                len(batch.copies),
            )
            if batch.end - batch.start < SCHEDULE_BATCH_MESSAGES and batch.next_due is not None:
                return batch.next_due

    def _gather(self, level: int) -> _Batch | None:
        """The due head of ``level``'s queue as one delivery; None when the queue is empty
        or fully delivered."""
        cq = self.ctx.sm.cqs.find(SCHEDULE_TOPIC, level - 1)
        if cq is None:
            return None
        start = self.ctx.sm.schedule_offsets.get(level, 0)
        if start >= cq.max_offset:
            return None
        batch = _Batch(max(start, cq.min_offset))
        now_ms = int(time.time() * 1000)
        for position, msg_size, store_ts in cq.read(batch.start, SCHEDULE_BATCH_MESSAGES):
            due = due_ms(store_ts, level, self.ctx.cfg.delay_levels_ms)
            if due > now_ms:
                batch.next_due = due
                break
            if batch.size + msg_size > SCHEDULE_BATCH_BYTES and batch.copies:
                break
            batch.end += 1
            batch.size += msg_size
            copy = self._delivery(position, now_ms)
            if copy is not None:
                batch.copies.append(copy)
        return batch

    def _delivery(self, position: int, now_ms: int) -> Message | None:
        """The copy of the scheduled message at ``position`` for its real queue; None when it
        cannot be delivered (unreadable, or its topic was deleted): it is skipped."""
        try:
            copy = delivered_copy(self.applied.message(position), now_ms)
        except BrokerError as exc:
            logger.error("scheduled message at %d skipped: %s", position, exc)
            return None
        topic = self.ctx.sm.topics.get(copy.topic)
        if topic is None:
            logger.warning(
                "scheduled message %s dropped: topic %s is gone", copy.uniq_id, copy.topic
            )
            return None
        if copy.queue_id >= topic.write_queue_nums:
            copy = replace(copy, queue_id=copy.queue_id % topic.write_queue_nums)
        return copy
