"""The send path: check a send, build its batch, deduplicate retries in flight, propose it.

A send is one log entry (all its messages stored or none), proposed on the leader and
answered once applied. A producer's retry that arrives while the original is still being
proposed waits for the original instead of proposing again; every other duplicate is caught
by the dedup window inside apply (:mod:`broker.state.machine`).
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import Awaitable, Callable, Mapping, Sequence
from types import MappingProxyType
from typing import NamedTuple

from broker.components.applied import NodeContext, require_leader
from broker.components.disk import DiskGuard
from broker.components.stats import BrokerStats
from broker.components.topics import Topics
from broker.state.delayrules import PROPERTY_DELAY, delay_level_of, to_schedule
from broker.state.errors import InvalidRequestError, QueueIdOutOfRangeError
from broker.state.machine import SendResult
from broker.state.message import (
    Message,
    UniqIdGenerator,
    encode_batch,
    encode_batch_fields,
    message_from_fields,
)
from broker.state.names import SCHEDULE_TOPIC, TIMER_TOPIC
from broker.state.records import ENTRY_MESSAGES, TopicConfig
from broker.state.timerrules import (
    PROPERTY_TIMER_DELIVER_MS,
    check_deliver_ms,
    deliver_ms_of,
    to_timer,
)
from broker.state.transactions import PROPERTY_TRANSACTION_PREPARED
from dledger.server.errors import ProposalLostError

# Messages per send: one entry per send; bounded like dledger's Append.
MAX_SEND_BATCH = 10_000
# Message ids of sends in flight, for the dedup of a retry that arrives while the original is
# still being proposed: beyond this, new ids are not tracked (the dedup window applied with
# the entry still catches the duplicate; the retry just proposes once more).
MAX_INFLIGHT_IDS = 200_000
# Log room a send must leave beyond dledger's Raft reserve (docs/STORAGE.md "Disk full"): what
# the broker still writes while sends are refused (POP receive and ack records, offset
# commits, transactions, timers; records of about 100 bytes: 4 MiB is ~40,000 of them). The
# store caps it at a quarter of a segment.
SEND_HEADROOM_BYTES = 4 << 20


# The properties of a message that has none: one shared, read-only mapping.
NO_PROPERTIES: Mapping[str, str] = MappingProxyType({})


class OutgoingMessage(NamedTuple):
    """One message of a send, as every front end hands it over: the neutral form that the
    ``raftmq.broker.v1`` port, the RocketMQ 5 port and a forwarded send
    (``raftmq.broker.internal.v1``) each convert their wire message into. What the producer
    fills; ``topic`` empty or the send's topic; ``msg_id`` empty: the broker makes one (without
    idempotence). It satisfies :class:`msgcodec.MessageFields`, so the send path encodes it
    straight into the batch. The codec checks the sizes (body, properties, host) when it
    encodes. ``body`` may be a view into the request's bytes (the v1 port's parser,
    :mod:`broker.frontends.v1.sendwire`): the log entry's encoding is its first copy.

    A named tuple, not a frozen dataclass: one is made per message of every send, and a frozen
    dataclass's ``__init__`` (an ``object.__setattr__`` per field) cost ~1.0 us of the leader's
    CPU more per message (issue 36, docs/PERFORMANCE.md "ASYNC_FLUSH at 256 in flight")."""

    topic: str
    queue_id: int
    body: bytes | memoryview
    tags: str = ""
    keys: tuple[str, ...] = ()
    properties: Mapping[str, str] = NO_PROPERTIES
    born_host: str = ""
    born_timestamp_ms: int = 0
    producer_group: str = ""
    msg_id: str = ""
    reconsume_times: int = 0
    flag: int = 0
    sys_flag: int = 0


_Call = asyncio.Future[list[SendResult]]
# Stores a send of half messages (``TRAN_MSG=true``): broker.components.transactions.
HalfSink = Callable[[TopicConfig, Sequence[OutgoingMessage]], Awaitable[list[SendResult]]]


class SendPath:
    """Stores messages: a client's sends, and the broker's own copies (retries)."""

    def __init__(
        self,
        ctx: NodeContext,
        topics: Topics,
        disk_guard: DiskGuard | None = None,
        stats: BrokerStats | None = None,
        halves: HalfSink | None = None,
    ) -> None:
        """``stats`` is counted into when the process serves metrics (None: nothing is);
        ``halves`` stores a transactional send's half message
        (``broker.components.transactions.Transactions.prepare``; None: such sends are stored as
        plain messages)."""
        self.ctx = ctx
        self.topics = topics
        # Refuses sends above the disk watermark (broker.components.disk).
        self.disk_guard = disk_guard
        host = ctx.cfg.store_host
        self._ids = UniqIdGenerator(ip=host if _is_ipv4(host) else None)
        self._inflight: dict[str, tuple[_Call, int]] = {}
        self.halves = halves
        self.stats = stats

    def check_writable(self) -> None:
        """Raise unless this node may store messages now (leader, disk below its mark)."""
        require_leader(self.ctx.node)
        if self.disk_guard is not None:
            self.disk_guard.check()

    async def send(
        self,
        topic_name: str,
        messages: Sequence[OutgoingMessage],
        owner: tuple[str, bool] = ("", False),
    ) -> list[SendResult]:
        """Store ``messages`` in ``topic_name`` as one entry: one result per message, in
        order. A delayed message (stored in the schedule topic until due) is answered with
        the queue the producer chose, as RocketMQ does. ``owner``: the user sending (name,
        Super user), who creates the topic when it is auto-created."""
        stats = self.stats
        if stats is None:
            return await self._send(topic_name, messages, owner)
        started = time.perf_counter()
        results = await self._send(topic_name, messages, owner)
        stats.send_s.observe(time.perf_counter() - started)
        return results

    async def _send(
        self,
        topic_name: str,
        messages: Sequence[OutgoingMessage],
        owner: tuple[str, bool] = ("", False),
    ) -> list[SendResult]:
        self.check_writable()
        if not messages:
            raise InvalidRequestError("a send needs at least one message")
        if len(messages) > MAX_SEND_BATCH:
            raise InvalidRequestError(
                f"{len(messages)} messages in one send, more than {MAX_SEND_BATCH}"
            )
        topic = await self.topics.writable(topic_name, owner)
        delayed = _check_queues(topic, messages)
        if self.halves is not None and _is_half(messages[0]):
            return await self.halves(topic, messages)
        results = await self._wait_inflight(messages)
        if results is None and delayed:
            now_ms = int(time.time() * 1000)
            results = await self.store(self._build(topic.name, messages, now_ms), topic.name)
        if results is not None:
            return [
                r._replace(queue_id=m.queue_id) if r.topic in (SCHEDULE_TOPIC, TIMER_TOPIC) else r
                for r, m in zip(results, messages, strict=True)
            ]
        now_ms = int(time.time() * 1000)
        # The common case: encoded straight from the sent messages, no Message per message.
        body, uniq_ids = encode_batch_fields(
            topic.name, messages, now_ms, self._ids.next_id, self.ctx.cfg.max_message_size_bytes
        )
        return await self._store_body(body, uniq_ids, topic.name)

    async def _wait_inflight(self, messages: Sequence[OutgoingMessage]) -> list[SendResult] | None:
        """A retry of a send still in flight here: the original's results (marked
        duplicate) once it is applied; None when it is not one, or the original failed."""
        inflight = self._inflight
        if messages[0].msg_id not in inflight:  # nearly always: one lookup
            return None
        waits = [inflight.get(m.msg_id) for m in messages]
        if not all(waits):
            return None
        calls = {id(w[0]): w[0] for w in waits if w is not None}
        with contextlib.suppress(Exception):
            await asyncio.gather(*(asyncio.shield(c) for c in calls.values()))
            if self.stats is not None:
                self.stats.inflight_dedup_hits += len(waits)
            return [
                c.result()[at]._replace(duplicate=True)
                for c, at in (w for w in waits if w is not None)
            ]
        return None

    def _build(self, topic: str, messages: Sequence[OutgoingMessage], now_ms: int) -> list[Message]:
        """The messages of a send, delayed ones as schedule copies, timed ones (a delivery time
        still ahead) as timer copies; a delivery time beyond the maximum refuses the send."""
        out = [
            message_from_fields(topic, m, now_ms, m.msg_id or self._ids.next_id()) for m in messages
        ]
        levels = len(self.ctx.cfg.delay_levels_ms)
        for i, msg in enumerate(out):
            deliver_ms = deliver_ms_of(msg)
            if deliver_ms is not None:
                check_deliver_ms(deliver_ms, now_ms, self.ctx.cfg.timer_max_delay_ms)
                if deliver_ms > now_ms:
                    out[i] = to_timer(msg, deliver_ms)
                continue
            level = delay_level_of(msg, levels)
            if level:
                out[i] = to_schedule(msg, level)
        return out

    async def store(self, messages: list[Message], sent_to: str = "") -> list[SendResult]:
        """Propose ``messages`` as one entry; their results once it is applied. ``sent_to``:
        the topic a client's send named, counted as sent there (the broker's own copies,
        retries, are not)."""
        body, _ = encode_batch(messages, self.ctx.cfg.max_message_size_bytes)
        return await self._store_body(body, [m.uniq_id for m in messages], sent_to)

    async def _store_body(
        self, body: bytes, uniq_ids: list[str], sent_to: str = ""
    ) -> list[SendResult]:
        """Propose an encoded batch as one entry; its results once it is applied."""
        max_body = self.ctx.node.max_body_bytes
        if len(body) > max_body:
            raise InvalidRequestError(
                f"batch of {len(body)} bytes is larger than one log entry ({max_body} bytes)"
            )
        # One future per proposal; each uniq id not already in flight points at it and at
        # its place in the batch (a retry that arrives meanwhile waits for it).
        call: _Call = asyncio.get_running_loop().create_future()
        inflight = self._inflight
        mine = []
        if len(inflight) + len(uniq_ids) <= MAX_INFLIGHT_IDS:
            for at, uid in enumerate(uniq_ids):
                if uid not in inflight:
                    inflight[uid] = (call, at)
                    mine.append(uid)
        try:
            first, _last, _term = await self.ctx.node.propose(
                [body], ENTRY_MESSAGES, headroom_bytes=SEND_HEADROOM_BYTES
            )
            results = self.ctx.sm.take_results(first)
            assert results is not None and len(results) == len(uniq_ids), (
                f"no results for entry {first}"
            )
            call.set_result(results)
            if sent_to and self.stats is not None:
                self.stats.sent.add(sent_to, len(uniq_ids), len(body))
        except BaseException as exc:
            call.set_exception(exc if isinstance(exc, Exception) else ProposalLostError())
            call.exception()  # retrieved: nobody else may be waiting
            raise
        finally:
            for uid in mine:
                del inflight[uid]
        return results


def _check_queues(topic: TopicConfig, messages: Sequence[OutgoingMessage]) -> bool:
    """Check every message's queue and topic; whether any is delayed."""
    delayed = False
    queues = topic.write_queue_nums
    for m in messages:
        if not 0 <= m.queue_id < queues:
            raise QueueIdOutOfRangeError(
                f"queue id {m.queue_id} is outside [0, {queues}) of {topic.name!r}"
            )
        if m.topic and m.topic != topic.name:
            raise InvalidRequestError("a message's topic differs from the request's topic")
        if PROPERTY_DELAY in m.properties or PROPERTY_TIMER_DELIVER_MS in m.properties:
            delayed = True
    return delayed


def _is_half(m: OutgoingMessage) -> bool:
    """A half message of a transaction: RocketMQ's ``TRAN_MSG=true``."""
    return m.properties.get(PROPERTY_TRANSACTION_PREPARED, "").lower() == "true"


def _is_ipv4(host: str) -> bool:
    parts = host.split(".")
    return len(parts) == 4 and all(p.isdigit() and int(p) < 256 for p in parts)
