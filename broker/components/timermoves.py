"""The timer loop: while a node leads, it moves timed messages down the timer levels and
delivers them when due (the rules and the entry format are in :mod:`broker.state.timerrules`).

Each pass looks at the head of every timer level's queue (``rmq_sys_wheel_timer``, queue =
level) and stops at the first record whose look-at time has not come: the work of a pass is
one head read per level plus the records it moves, at most :data:`TIMER_BATCH_RECORDS` per
entry, whatever the number of pending messages. Each move is one entry holding the level's
new offset, so a new leader resumes exactly where the applied entries stopped.
"""

from __future__ import annotations

import asyncio
import logging
import time
from dataclasses import dataclass, field, replace

from broker.components.applied import AppliedMessages, Wakeup, run_while_leading, start_leader_task
from broker.state.delayrules import delivered_copy
from broker.state.errors import BrokerError
from broker.state.message import Message, encode_batch
from broker.state.names import TIMER_TOPIC
from broker.state.records import ENTRY_TIMER
from broker.state.timerrules import (
    HOP_RECORD_SIZE,
    MAX_TIMER_LEVELS,
    decode_hop,
    deliver_ms_of,
    encode_hop,
    encode_timer_header,
    level_of,
    look_ms,
)

logger = logging.getLogger(__name__)

# The loop sleeps until the next look-at time, at most this long (bounds how late a message
# filed meanwhile is looked at: level 0's records are due within the precision).
TIMER_IDLE_MS = 50
# With every level empty the loop sleeps until a timed message is stored (a dispatch listener
# wakes it), at most this long: an idle leader's loop then turns once a second, not twenty
# times (each pass looks at every level's queue; docs/PERFORMANCE.md).
TIMER_EMPTY_WAIT_MS = 1000
# One move entry holds at most this many records / bytes of copies (as a schedule delivery).
TIMER_BATCH_RECORDS = 512
TIMER_BATCH_BYTES = 1 << 20


@dataclass(slots=True)
class _Move:
    """One move being gathered: a level's offsets [start, end), hops and copies."""

    start: int
    end: int
    now_ms: int
    size: int = 0
    hops: list[bytes] = field(default_factory=list)
    copies: list[Message] = field(default_factory=list)
    next_look: int | None = None


class Timers:
    """Moves and delivers timed messages on the leader, in a supervised task per term."""

    def __init__(self, applied: AppliedMessages) -> None:
        self.ctx = applied.ctx
        self.applied = applied
        self.task: asyncio.Task[None] | None = None
        self.wakeup = Wakeup(TIMER_IDLE_MS / 1000)
        self.ctx.sm.add_listener(self.wakeup.wake_on_topic(TIMER_TOPIC))
        self.ctx.sm.add_change_listener(self.maybe_start)

    def maybe_start(self) -> None:
        """A change listener: a node that became leader starts its timer loop."""
        self.task = start_leader_task(self.ctx, self.task, self._loop, "timers")

    async def _loop(self) -> None:
        # One entry holds the copies, the hops and the offset: a failed pass is not half done.
        await run_while_leading(self.ctx, "timers", self._pass, TIMER_IDLE_MS / 1000, self.wakeup)

    async def _pass(self) -> float:
        """One :meth:`run_pass`; seconds until the next look-at time (bounded), or until a
        timed message is stored when every level is empty."""
        next_look = await self.run_pass()
        if next_look is None:
            return TIMER_EMPTY_WAIT_MS / 1000
        wait_ms = next_look - time.time() * 1000
        # A backlog (a look-at time already past): the next pass at once, after yielding.
        return 0 if wait_ms <= 0 else min(wait_ms, TIMER_IDLE_MS) / 1000

    async def run_pass(self) -> int | None:
        """Move the records of every level whose time has come, one entry's worth per level
        (no level waits behind another's backlog), the entries proposed together (one commit
        for the pass, not one per level); the next look-at time (ms; now when more are
        ready), or None when every level is empty."""
        looks: list[int] = []
        proposals = []
        for level in range(MAX_TIMER_LEVELS):
            move = self._gather(level)
            if move is None:
                continue
            if move.end > move.start:
                proposals.append(self._propose(level, move))
            elif move.next_look is not None:
                looks.append(move.next_look)
        for result in await asyncio.gather(*proposals, return_exceptions=True):
            if isinstance(result, BaseException):
                raise result
            if result is not None:
                looks.append(result)
        return min(looks, default=None)

    async def _propose(self, level: int, move: _Move) -> int | None:
        """Propose one move; its level's next look-at time (now when more are ready; one idle
        period on when the entry was not applied: a repeat, or a bad entry, looked at again
        then)."""
        body = encode_timer_header(level, move.start, move.end, move.now_ms, len(move.hops))
        body += b"".join(move.hops)
        if move.copies:
            body += encode_batch(move.copies, self.ctx.cfg.max_message_size_bytes)[0]
        await self.ctx.node.propose([body], ENTRY_TIMER)
        if self.ctx.sm.timer_offsets.get(level, 0) != move.end:
            logger.warning("timer entry level=%d [%d, %d) not applied", level, move.start, move.end)
            return move.now_ms + TIMER_IDLE_MS
        return move.now_ms if move.next_look is None else move.next_look

    def _gather(self, level: int) -> _Move | None:
        """The head of ``level``'s queue whose time has come, as one move; None when the
        level is empty or fully moved."""
        cq = self.ctx.sm.cqs.find(TIMER_TOPIC, level)
        if cq is None:
            return None
        start = self.ctx.sm.timer_offsets.get(level, 0)
        if start >= cq.max_offset:
            return None
        start = max(start, cq.min_offset)
        now_ms = int(time.time() * 1000)
        move = _Move(start, start, now_ms)
        look = look_ms(level, cq.get(start)[2])
        if look > now_ms:  # the head's time has not come: one row read, nothing more
            move.next_look = look
            return move
        for position, size, filed_ms in cq.read(start, TIMER_BATCH_RECORDS):
            look = look_ms(level, filed_ms)
            if look > now_ms:
                move.next_look = look
                break
            record = self._record(position, size)
            if record is None:  # unreadable: skipped (logged)
                move.end += 1
                continue
            msg, position, size, deliver_ms = record
            remaining = deliver_ms - now_ms
            if remaining > 0 and level == 0 and level_of(remaining) == 0:
                move.next_look = deliver_ms  # due within the precision: it waits at the head
                break
            if remaining <= 0 and move.copies and move.size + size > TIMER_BATCH_BYTES:
                break
            if remaining > 0:
                move.hops.append(encode_hop(level_of(remaining), position, size, deliver_ms))
            else:
                self._add_copy(move, msg, position, size)
            move.end += 1
        return move

    def _record(self, position: int, size: int) -> tuple[Message | None, int, int, int] | None:
        """The timed message a row of a level stands for: ``(message or None for a hop
        record, its position, its size, its delivery time)``; None when unreadable."""
        try:
            if size == HOP_RECORD_SIZE:
                _, position, size, deliver_ms = decode_hop(self.applied.read(position, size))
                return None, position, size, deliver_ms
            msg = self.applied.message(position, size)
            return msg, position, size, deliver_ms_of(msg) or 0
        except (BrokerError, ValueError) as exc:
            logger.error("timer record at %d skipped: %s", position, exc)
            return None

    def _add_copy(self, move: _Move, msg: Message | None, position: int, size: int) -> None:
        copy = self._delivery(msg, position, size, move.now_ms)
        if copy is not None:
            move.copies.append(copy)
            move.size += size

    def _delivery(
        self, msg: Message | None, position: int, size: int, now_ms: int
    ) -> Message | None:
        """The copy of a due timed message for its real queue; None when it cannot be
        delivered (unreadable, or its topic was deleted): it is skipped, with a log line."""
        try:
            if msg is None:
                msg = self.applied.message(position, size)
            copy = delivered_copy(msg, now_ms)
        except BrokerError as exc:
            logger.error("timed message at %d skipped: %s", position, exc)
            return None
        topic = self.ctx.sm.topics.get(copy.topic)
        if topic is None:
            logger.warning("timed message %s dropped: topic %s is gone", copy.uniq_id, copy.topic)
            return None
        if copy.queue_id >= topic.write_queue_nums:
            copy = replace(copy, queue_id=copy.queue_id % topic.write_queue_nums)
        return copy
