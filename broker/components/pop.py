"""POP consumption on the leader: receive (long polling), ack, change the invisible time, and
the redelivery loop that makes expired in-flight messages visible again or dead-letters them.

Each decision is one :data:`broker.state.records.ENTRY_POP` record carrying the leader's clock (a
deadline, or "now" for a redelivery); the state it changes is
:class:`broker.state.popstate.PopState`, applied on every member. The caller answers only from what
was applied, so a leader failover neither redelivers an acknowledged message nor loses an
unacknowledged one. Protocol-neutral: the RocketMQ 5 front end (:mod:`broker.frontends.v2`) and
``raftmq.broker.v1`` call it.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections import Counter
from collections.abc import AsyncIterator, Iterator, Mapping, Sequence
from contextlib import asynccontextmanager
from dataclasses import dataclass
from typing import NamedTuple

from broker.components.applied import (
    MAX_ANSWER_BYTES,
    AppliedMessages,
    require_leader,
    run_while_leading,
    start_leader_task,
)
from broker.components.pulling import (
    MAX_SUSPEND_TIMEOUT_MS,
    PULL_MAX_SCAN_RECORDS,
    parse_subscription,
)
from broker.components.retry import Retries, SendBackItem
from broker.components.topics import Topics
from broker.state import derived
from broker.state.errors import (
    BrokerError,
    InvalidRequestError,
    MessageNotFoundError,
    ResourceExhaustedError,
    TooManyLongPollsError,
)
from broker.state.machine import QueueKey
from broker.state.message import Message, decode_message, tags_hash
from broker.state.names import validate_group_name, validate_topic_name
from broker.state.popstate import (
    MAX_INFLIGHT_PER_QUEUE,
    MAX_INFLIGHT_TOTAL,
    MAX_POP_QUEUES,
    MAX_RECORD_ITEMS,
    OP_ACK,
    OP_CHANGE,
    OP_DROP,
    OP_POP,
    OP_POP_FIFO,
    OP_RENEW,
    OP_REVIVE,
    Handle,
    InFlight,
    InvalidReceiptHandleError,
    PopKey,
    PopRecord,
    check_handle,
    decode_handle,
    encode_handle,
    encode_pop_record,
    fifo_blocked,
)
from broker.state.records import ENTRY_POP
from broker.state.subgroups import SubGroup, default_group
from mqerrors import codes as E

logger = logging.getLogger(__name__)

# RocketMQ's default max delivery attempts of a consumer group (maxReconsumeTimes 16).
DEFAULT_MAX_ATTEMPTS = 16
MAX_ATTEMPTS_LIMIT = 1000
# The proxy's bounds of a simple consumer's invisible time: 10 s to 12 h. The minimum is a
# config key (popMinInvisibleTimeMs) so tests need not wait 10 s per redelivery.
DEFAULT_MIN_INVISIBLE_MS = 10_000
MAX_INVISIBLE_MS = 12 * 3600 * 1000
# A new invisible time (a nack with the group's backoff, a renewal) may be short: the proxy
# takes any from 0 (its ChangeInvisibleDuration checks no minimum). 0 makes the message visible
# again at the next redelivery pass.
MIN_CHANGE_INVISIBLE_MS = 0
# Messages one receive answers at most (the proxy's limit).
MAX_RECEIVE_BATCH = 32
# How often the leader looks for expired in-flight messages: a redelivery is at most this late.
# Each pass walks every in-flight record (MAX_INFLIGHT_TOTAL at ~100 ns: 20 ms at worst).
REVIVE_INTERVAL_MS = 250
# Receives waiting for messages on one node: each costs a handler and a future.
MAX_POP_WAITERS = 10_000
# Of them, one user's at most: broker.conf popWaitersPerUser (ServiceConfig.pop_waiters_per_user).


class InvalidInvisibleTimeError(InvalidRequestError):
    code = E.ILLEGAL_INVISIBLE_TIME


class PopWaitersQuotaError(ResourceExhaustedError):
    """One user holds ``popWaitersPerUser`` waiting receives on this node."""

    code = E.RESOURCE_EXHAUSTED


@dataclass(frozen=True, slots=True)
class ReceiveQuery:
    """One receive: ``queue_id`` -1 for every readable queue of the topic here."""

    group: str
    topic: str
    queue_id: int
    batch_size: int
    invisible_ms: int
    subscription: str = ""
    poll_timeout_ms: int = 0
    # The user receiving ("" without users), and whether it is a Super user: a waiting
    # receive counts against its popWaitersPerUser, but a Super user's.
    owner: str = ""
    unbounded: bool = False


class Received(NamedTuple):
    """A received message: its delivery attempt (1 first) and receipt handle."""

    message: Message
    queue_id: int
    queue_offset: int
    position: int
    attempt: int
    receipt_handle: str


class _Scan(NamedTuple):
    items: list[tuple[int, int]]  # (queue offset, position)
    messages: dict[int, Message]
    to_offset: int


class Pops:
    """The leader's side of POP consumption, over the replicated :class:`PopState`."""

    def __init__(
        self,
        topics: Topics,
        applied: AppliedMessages,
        retries: Retries,
        max_attempts: int = DEFAULT_MAX_ATTEMPTS,
        min_invisible_ms: int = DEFAULT_MIN_INVISIBLE_MS,
    ) -> None:
        if not 1 <= max_attempts <= MAX_ATTEMPTS_LIMIT:
            raise ValueError(f"max_attempts {max_attempts} outside [1, {MAX_ATTEMPTS_LIMIT}]")
        self.ctx = applied.ctx
        self.topics = topics
        self.applied = applied
        self.retries = retries
        self.max_attempts = max_attempts
        self.min_invisible_ms = min_invisible_ms
        self._locks: dict[PopKey, tuple[asyncio.Lock, int]] = {}
        self._waiters: dict[str, set[asyncio.Future[None]]] = {}
        self._waiting = 0
        self._waiting_by: Counter[str] = Counter()  # waiting receives by user
        self.task: asyncio.Task[None] | None = None
        self.ctx.sm.add_listener(self._on_dispatch)
        self.ctx.sm.add_change_listener(self.maybe_start)

    # ------------------------------------------------------------------ receive

    async def receive(self, q: ReceiveQuery) -> list[Received]:
        """Messages for ``q.group`` (at most ``q.batch_size``), each in flight until acked or
        ``q.invisible_ms`` passes; waits up to ``q.poll_timeout_ms`` when there are none."""
        queues = self._check_receive(q)
        tags = parse_subscription(q.subscription)
        loop = asyncio.get_running_loop()
        deadline = loop.time() + min(max(q.poll_timeout_ms, 0), MAX_SUSPEND_TIMEOUT_MS) / 1000
        while True:
            out = await self._pop_rounds(q, queues, tags)
            remaining = deadline - loop.time()
            if out or remaining <= 0:
                return out
            await self._wait(q, min(remaining, REVIVE_INTERVAL_MS / 1000))

    async def _pop_rounds(
        self, q: ReceiveQuery, queues: list[int], tags: frozenset[str] | None
    ) -> list[Received]:
        """Up to ``q.batch_size`` messages from ``queues``, in rounds: each round shares what
        is still wanted among the queues that have messages (in ``queues``' order) and pops
        them at once, so that their records commit together, in one replication round rather
        than one after another. A queue that gives fewer than its share (a tag filter, a FIFO
        batch still out, a pop of another receive) is not asked again by this receive; a
        round that gets nothing ends it."""
        out: list[Received] = []
        left = list(queues)
        while len(out) < q.batch_size and left:
            shares = self._shares(q.group, q.topic, left, q.batch_size - len(out))
            if not shares:
                break
            got = await self._pop_all(q, shares, tags)
            for (qid, share), received in zip(shares, got, strict=True):
                out += received
                if len(received) < share:
                    left.remove(qid)
            if not any(got):
                break
        return out

    def _shares(
        self, group: str, topic: str, queues: Sequence[int], want: int
    ) -> list[tuple[int, int]]:
        """``(queue, share)`` for the first queues of ``queues`` that hold messages for
        ``group`` (visible again, or not yet handed out), shares adding up to at most ``want``;
        an estimate only: each pop takes what it finds under its queue's lock."""
        shares: list[tuple[int, int]] = []
        for qid in queues:
            if want <= 0:
                break
            share = self._available(group, topic, qid, want)
            if share > 0:
                shares.append((qid, share))
                want -= share
        return shares

    def _available(self, group: str, topic: str, qid: int, want: int) -> int:
        """Messages of queue ``qid`` a pop of ``group`` could hand out now (an upper bound),
        counted up to ``want`` only: the in-flight table (up to MAX_INFLIGHT_PER_QUEUE) is
        walked only when the new messages are fewer, and no further than needed."""
        state = self.ctx.sm.pop.get((group, topic, qid))
        cq = self.ctx.sm.cqs.find(topic, qid)
        found = 0
        if cq is not None:
            start = 0 if state is None else state.offset
            found = max(0, cq.max_offset - max(start, cq.min_offset))
        if state is not None:
            for rec in state.inflight.values():
                if found >= want:
                    break
                found += not rec.deadline_ms  # visible again
        return min(found, want)

    async def _pop_all(
        self, q: ReceiveQuery, shares: Sequence[tuple[int, int]], tags: frozenset[str] | None
    ) -> list[list[Received]]:
        """The pops of one round, at once; each holds only its own queue's lock. A failure is
        raised once every pop has ended (what the others handed out comes again after its
        invisible time, as when a receive's answer is lost)."""
        results = await asyncio.gather(
            *(
                self._pop_queue((q.group, q.topic, qid), tags, share, q.invisible_ms)
                for qid, share in shares
            ),
            return_exceptions=True,
        )
        for r in results:
            if isinstance(r, BaseException):
                raise r
        return [r for r in results if not isinstance(r, BaseException)]

    def _check_receive(self, q: ReceiveQuery) -> list[int]:
        require_leader(self.ctx.node)
        validate_group_name(q.group)
        if not 1 <= q.batch_size <= MAX_RECEIVE_BATCH:
            raise InvalidRequestError(f"batch size {q.batch_size} outside [1, {MAX_RECEIVE_BATCH}]")
        self.check_invisible(q.invisible_ms)
        if q.queue_id != -1:
            self.topics.readable_queue(q.topic, q.queue_id)
            return [q.queue_id]
        topic = self.topics.get(q.topic)
        queues = [
            qid for qid in range(topic.read_queue_nums) if self.topics.has_queue(q.topic, qid)
        ]
        # Start at a different queue each time so that one busy queue does not starve others.
        shift = time.monotonic_ns() // 1000 % max(1, len(queues))
        return queues[shift:] + queues[:shift]

    def check_invisible(self, invisible_ms: int, least_ms: int | None = None) -> None:
        least = self.min_invisible_ms if least_ms is None else least_ms
        if not least <= invisible_ms <= MAX_INVISIBLE_MS:
            raise InvalidInvisibleTimeError(
                f"invisible duration {invisible_ms} ms outside [{least}, {MAX_INVISIBLE_MS}]"
            )

    def group(self, name: str) -> SubGroup:
        """The group's replicated config (``broker.state.subgroups``), or the broker's defaults."""
        return self.ctx.sm.subgroups.get(name) or default_group(name, self.max_attempts)

    async def _pop_queue(
        self, key: PopKey, tags: frozenset[str] | None, want: int, invisible_ms: int
    ) -> list[Received]:
        async with self._lock(key):
            require_leader(self.ctx.node)
            state = self.ctx.sm.pop.get(key)
            fifo = self.group(key[0]).fifo
            if fifo and state is not None and fifo_blocked(state, False):
                return []  # the previous batch is still being processed
            start = 0 if state is None else state.offset
            retakes, retaken, gone = self._retakes(key, state.inflight if state else {}, want)
            if gone:
                await self._propose(PopRecord(OP_DROP, *key, items=tuple(gone)))
            room = self._room(state.inflight if state else None) if len(retakes) < want else 0
            if fifo and (retakes or (state is not None and state.inflight)):
                room = 0  # a FIFO queue's next messages wait until its batch is done
            scan = self._scan(key, start, tags, min(want - len(retakes), room))
            if not retakes and scan.to_offset == start:
                return []
            now_ms = int(time.time() * 1000)
            record = PopRecord(
                OP_POP_FIFO if fifo else OP_POP, *key, now_ms, now_ms + invisible_ms, start,
                scan.to_offset, tuple(scan.items), tuple(retakes),
            )  # fmt: skip
            index = await self._propose(record)
            return self._handed_out(key, index, {**scan.messages, **retaken})

    def _room(self, inflight: Mapping[int, InFlight] | None) -> int:
        pops = self.ctx.sm.pop
        if inflight is None and len(pops.queues) >= MAX_POP_QUEUES:
            return 0
        held = 0 if inflight is None else len(inflight)
        return max(0, min(MAX_INFLIGHT_PER_QUEUE - held, MAX_INFLIGHT_TOTAL - pops.inflight_total))

    def _retakes(
        self, key: PopKey, inflight: Mapping[int, InFlight], want: int
    ) -> tuple[list[tuple[int, int]], dict[int, Message], list[tuple[int, int]]]:
        """Visible-again messages to hand out first with their messages, and those that can
        no longer be read (deleted by retention): they are taken out of flight."""
        out: list[tuple[int, int]] = []
        gone: list[tuple[int, int]] = []
        messages: dict[int, Message] = {}
        for offset, rec in inflight.items():
            if len(out) >= want or len(gone) >= MAX_RECORD_ITEMS:
                break
            if rec.deadline_ms:
                continue
            try:
                messages[offset] = self.applied.message(rec.position)
            except MessageNotFoundError as exc:
                logger.warning("pop %s offset %d dropped, unreadable: %s", key, offset, exc)
                gone.append((offset, rec.seq))
                continue
            out.append((offset, rec.seq))
        return out, messages, gone

    def _scan(self, key: PopKey, start: int, tags: frozenset[str] | None, want: int) -> _Scan:
        """New messages from ``start`` matching ``tags`` (at most ``want``, within one answer's
        bytes); the offset the pop position moves to (past skipped ones too). A record that
        does not match the commitlog is rebuilt from it first (broker.state.derived)."""
        count = max(want, PULL_MAX_SCAN_RECORDS)
        return derived.read_repaired(
            self.ctx.sm, key[1], key[2], count, lambda: self._scan_once(key, start, tags, want)
        )

    def _scan_once(self, key: PopKey, start: int, tags: frozenset[str] | None, want: int) -> _Scan:
        _group, topic, qid = key
        cq = self.ctx.sm.cqs.find(topic, qid)
        if cq is None or want <= 0 or start >= cq.max_offset:
            return _Scan([], {}, start)
        begin = max(start, cq.min_offset)
        hashes = None if tags is None else frozenset(tags_hash(t) for t in tags)
        count = want if hashes is None else max(want, PULL_MAX_SCAN_RECORDS)
        scan = _Scan([], {}, begin)
        budget = MAX_ANSWER_BYTES
        sm, read, matcher = self.ctx.sm, self.applied.raw, derived.RowMatcher(topic, qid)
        for i, (position, size, tag_hash) in enumerate(cq.read(begin, count)):
            if scan.items and size > budget:
                break
            offset = begin + i
            scan = scan._replace(to_offset=offset + 1)
            if hashes is not None and tag_hash not in hashes:
                continue
            row = (position, size, tag_hash)
            msg = decode_message(derived.checked_raw(sm, read, matcher, offset, row))
            if tags is not None and msg.tags not in tags:
                continue  # a tag hash collision
            scan.items.append((offset, position))
            scan.messages[offset] = msg
            budget -= size
            if len(scan.items) >= want:
                break
        return scan

    def _handed_out(
        self, key: PopKey, index: int, messages: Mapping[int, Message]
    ) -> list[Received]:
        """What the applied record ``index`` handed out (nothing when it was stale)."""
        state = self.ctx.sm.pop.get(key)
        out = []
        for offset, msg in sorted(messages.items()):
            rec = None if state is None else state.inflight.get(offset)
            if rec is None or rec.seq != index:
                continue
            handle = encode_handle(Handle(*key, offset, index))
            out.append(Received(msg, key[2], offset, rec.position, rec.attempt, handle))
        return out

    # ------------------------------------------------------------------ ack and change

    async def ack(self, group: str, topic: str, handles: Sequence[str]) -> list[BrokerError | None]:
        """Acknowledge received messages: per handle None (done, or done before) or the error
        (:class:`InvalidReceiptHandleError` for a malformed, foreign or stale one)."""
        require_leader(self.ctx.node)
        validate_group_name(group)
        validate_topic_name(topic)  # a handle's topic is always checked (no empty wildcard)
        if not 1 <= len(handles) <= MAX_RECORD_ITEMS:
            raise InvalidRequestError(f"ack 1 to {MAX_RECORD_ITEMS} handles")
        out: list[BrokerError | None] = []
        by_key: dict[PopKey, list[tuple[int, int]]] = {}
        for text in handles:
            try:
                h = decode_handle(text)
                if not self._acked_before(h, group, topic):
                    check_handle(self.ctx.sm.pop, h, group, topic)
                    by_key.setdefault((h.group, h.topic, h.queue_id), []).append((h.offset, h.seq))
                out.append(None)
            except BrokerError as exc:
                out.append(exc)
        for key, items in by_key.items():
            await self._propose(PopRecord(OP_ACK, *key, items=tuple(items)))
            self._wake_topic(key[1])  # a FIFO queue may be free for its next batch
        return out

    def _acked_before(self, h: Handle, group: str, topic: str) -> bool:
        """The handle's message is no longer in flight though its group's position passed it:
        acknowledged (or dead-lettered) before; a repeated ack is answered OK, changing nothing."""
        if h.group != group or h.topic != topic:
            return False
        q = self.ctx.sm.pop.get((h.group, h.topic, h.queue_id))
        return q is not None and h.offset < q.offset and h.offset not in q.inflight

    async def change_invisible(
        self, group: str, topic: str, handle: str, invisible_ms: int, backoff_floor: bool = False
    ) -> Received:
        """A new invisible time for a received message, from now; its new handle (the old one
        is no longer valid). ``backoff_floor`` (a push consumer's nack): at least the group's
        backoff after the delivery's attempt, read here on the leader, not by the member that
        took the request (it may not have applied the delivery yet)."""
        require_leader(self.ctx.node)
        validate_group_name(group)
        validate_topic_name(topic)  # a handle's topic is always checked (no empty wildcard)
        self.check_invisible(invisible_ms, MIN_CHANGE_INVISIBLE_MS)
        h = decode_handle(handle)
        key = (h.group, h.topic, h.queue_id)
        async with self._lock(key):
            held = check_handle(self.ctx.sm.pop, h, group, topic)
            if backoff_floor:
                invisible_ms = max(invisible_ms, self.group(group).backoff.delay_ms(held.attempt))
            now_ms = int(time.time() * 1000)
            record = PopRecord(
                OP_CHANGE, *key, now_ms, now_ms + max(1, invisible_ms), items=((h.offset, h.seq),)
            )
            index = await self._propose(record)
            state = self.ctx.sm.pop.get(key)
            rec = None if state is None else state.inflight.get(h.offset)
            if rec is None or rec.seq != index:
                raise InvalidReceiptHandleError("the receipt handle is stale: acknowledged since")
            msg = self.applied.message(rec.position)
            new = encode_handle(Handle(*key, h.offset, index))
            return Received(msg, h.queue_id, h.offset, rec.position, rec.attempt, new)

    async def renew(
        self, group: str, topic: str, handles: Sequence[str], invisible_ms: int
    ) -> list[BrokerError | None]:
        """auto_renew: each handle's delivery goes on for ``invisible_ms`` more, its handle
        still valid; per handle None or the error (as :meth:`ack`). One record per queue."""
        require_leader(self.ctx.node)
        validate_group_name(group)
        validate_topic_name(topic)  # a handle's topic is always checked (no empty wildcard)
        self.check_invisible(invisible_ms, 1)
        if not 1 <= len(handles) <= MAX_RECORD_ITEMS:
            raise InvalidRequestError(f"renew 1 to {MAX_RECORD_ITEMS} handles")
        out: list[BrokerError | None] = []
        by_key: dict[PopKey, list[tuple[int, int]]] = {}
        for text in handles:
            try:
                h = decode_handle(text)
                check_handle(self.ctx.sm.pop, h, group, topic)
                by_key.setdefault((h.group, h.topic, h.queue_id), []).append((h.offset, h.seq))
                out.append(None)
            except BrokerError as exc:
                out.append(exc)
        now_ms = int(time.time() * 1000)
        for key, items in by_key.items():
            record = PopRecord(OP_RENEW, *key, now_ms, now_ms + invisible_ms, items=tuple(items))
            await self._propose(record)
        return out

    async def dead_letter(self, group: str, topic: str, handle: str) -> None:
        """The consumer gives up on a received message (``ForwardMessageToDeadLetterQueue``):
        its copy goes to ``%DLQ%{group}`` and it leaves flight. Done before: nothing changes."""
        require_leader(self.ctx.node)
        validate_group_name(group)
        validate_topic_name(topic)  # a handle's topic is always checked (no empty wildcard)
        h = decode_handle(handle)
        key = (h.group, h.topic, h.queue_id)
        async with self._lock(key):
            if self._acked_before(h, group, topic):
                return
            rec = check_handle(self.ctx.sm.pop, h, group, topic)
            await self._dead_letter(key, [(h.offset, rec)])
        self._wake_topic(h.topic)

    # ------------------------------------------------------------------ redelivery

    def maybe_start(self) -> None:
        """A change listener: a node that became leader starts the redelivery loop."""
        self.task = start_leader_task(self.ctx, self.task, self._revive_loop, "pop-revive")

    async def _revive_loop(self) -> None:
        # Each record is whole: a failed pass is not half done; the next leader looks again.
        interval_s = REVIVE_INTERVAL_MS / 1000
        await run_while_leading(self.ctx, "pop-revive", self._revive_pass, interval_s)

    async def _revive_pass(self) -> float:
        await self.revive_once(int(time.time() * 1000))
        return REVIVE_INTERVAL_MS / 1000

    async def revive_once(self, now_ms: int) -> int:
        """Every in-flight message whose deadline passed by ``now_ms``: visible again with
        attempt + 1, or after the max attempts to ``%DLQ%{group}``. How many were handled."""
        handled = 0
        for key, revive, dead in list(self._expired(now_ms)):
            if revive:
                record = PopRecord(OP_REVIVE, *key, now_ms, items=tuple(revive))
                await self._propose(record)
                self._wake_topic(key[1])
            if dead:
                await self._dead_letter(key, dead)
            handled += len(revive) + len(dead)
        return handled

    def _expired(
        self, now_ms: int
    ) -> Iterator[tuple[PopKey, list[tuple[int, int]], list[tuple[int, InFlight]]]]:
        attempts: dict[str, int] = {}
        for key, q in list(self.ctx.sm.pop.queues.items()):
            revive: list[tuple[int, int]] = []
            dead: list[tuple[int, InFlight]] = []
            for offset, rec in q.inflight.items():
                if not 0 < rec.deadline_ms <= now_ms:
                    continue
                if key[0] not in attempts:
                    attempts[key[0]] = self.group(key[0]).max_attempts
                if rec.attempt >= attempts[key[0]]:
                    dead.append((offset, rec))
                else:
                    revive.append((offset, rec.seq))
                if len(revive) + len(dead) >= MAX_RECORD_ITEMS:
                    break
            if revive or dead:
                yield key, revive, dead

    async def _dead_letter(self, key: PopKey, dead: list[tuple[int, InFlight]]) -> None:
        """Store each message's copy in ``%DLQ%{group}`` (broker.components.retry's dead-letter
        path, whose derived ids make a repeated pass store it once), then take them out of
        flight."""
        group = key[0]
        items = [SendBackItem(rec.position) for _offset, rec in dead]
        try:
            await self.retries.send_back(group, items, delay_level=-1)
        except MessageNotFoundError:
            for item in items:  # one unreadable message (retention): the others still go
                try:
                    await self.retries.send_back(group, [item], delay_level=-1)
                except MessageNotFoundError as exc:
                    logger.warning("pop %s: dead letter of %d dropped: %s", key, item.position, exc)
        drop = tuple((offset, rec.seq) for offset, rec in dead)
        await self._propose(PopRecord(OP_DROP, *key, items=drop))
        logger.info("pop %s: %d messages dead-lettered", key, len(drop))

    # ------------------------------------------------------------------ plumbing

    async def _propose(self, record: PopRecord) -> int:
        """Propose ``record``; its log index, once applied here."""
        _first, last, _term = await self.ctx.node.propose([encode_pop_record(record)], ENTRY_POP)
        return last

    @asynccontextmanager
    async def _lock(self, key: PopKey) -> AsyncIterator[None]:
        """Pops of one queue one at a time (a second would start from the same position and
        be skipped as stale); the lock is forgotten when nobody holds or waits for it."""
        lock, users = self._locks.get(key, (asyncio.Lock(), 0))
        self._locks[key] = (lock, users + 1)
        try:
            async with lock:
                yield
        finally:
            lock, users = self._locks[key]
            if users == 1:
                del self._locks[key]
            else:
                self._locks[key] = (lock, users - 1)

    def _on_dispatch(self, touched: Mapping[QueueKey, set[int]]) -> None:
        for topic in {t for t, _qid in touched}:
            self._wake_topic(topic)

    def _wake_topic(self, topic: str) -> None:
        for f in self._waiters.pop(topic, ()):
            if not f.done():
                f.set_result(None)

    async def _wait(self, q: ReceiveQuery, timeout_s: float) -> None:
        if self._waiting >= MAX_POP_WAITERS:
            raise TooManyLongPollsError(
                f"the node holds {self._waiting} waiting receives, the most it may"
                f" ({MAX_POP_WAITERS}); receive again later"
            )
        per_user = self.ctx.cfg.pop_waiters_per_user
        if q.owner and not q.unbounded and self._waiting_by[q.owner] >= per_user:
            raise PopWaitersQuotaError(
                f"quota popWaitersPerUser: user {q.owner!r} has {per_user} receives waiting "
                "on this node; receive again later"
            )
        topic = q.topic
        future: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        waiters = self._waiters.setdefault(topic, set())
        waiters.add(future)
        self._waiting += 1
        self._waiting_by[q.owner] += 1
        try:
            await asyncio.wait_for(future, timeout_s)
        except TimeoutError:
            pass
        finally:
            self._waiting -= 1
            self._waiting_by[q.owner] -= 1
            if self._waiting_by[q.owner] <= 0:
                del self._waiting_by[q.owner]
            waiters.discard(future)
            if not waiters and self._waiters.get(topic) is waiters:
                del self._waiters[topic]
