"""``raftmq.broker.v1.Broker``: the broker's gRPC service on a node's client port.

Writes (sends, offset commits, topic admin) are proposed to the Raft log on the leader and
answered once committed and applied; reads (pulls, lookups, offsets, topics) are answered from
this node's applied state, so a follower serves exactly what it has applied (only committed
entries ever are). Errors map to gRPC status codes in :func:`error_status` and only there.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import struct
import time
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, replace

import grpc
from raftmq.broker.v1 import broker_pb2 as pb
from raftmq.broker.v1 import broker_pb2_grpc as pb_grpc

from broker.disk import DiskGuard
from broker.errors import (
    BrokerError,
    CorruptMessageError,
    InvalidRequestError,
    MessageNotFoundError,
    NoPermissionError,
    QueueIdOutOfRangeError,
    SystemTopicError,
    TooManyLongPollsError,
    TooManyPendingOffsetsError,
    TopicNotFoundError,
)
from broker.locks import ConsumerTable, QueueLockTable
from broker.message import (
    MESSAGE_HEAD,
    Message,
    UniqIdGenerator,
    check_message,
    decode_message,
    decode_offset_msg_id,
    encode_batch,
    encode_batch_fields,
    encode_offset_msg_id,
    message_from_fields,
    tags_hash,
    uniq_id_to_bytes,
    validate_topic,
)
from broker.names import (
    SCHEDULE_TOPIC,
    is_system_topic,
    is_valid_topic_name,
    validate_group_name,
)
from broker.rpcerrors import error_status as error_status  # re-exported: the broker's mapping
from broker.rpcerrors import rpc as _rpc
from broker.schedule import (
    DEFAULT_DELAY_LEVELS,
    DEFAULT_MAX_RECONSUME_TIMES,
    DLQ_QUEUE_NUMS,
    PROPERTY_DELAY,
    RETRY_QUEUE_NUMS,
    delay_level_of,
    delivered_copy,
    dlq_topic,
    due_ms,
    encode_schedule_header,
    parse_delay_levels,
    retry_topic,
    send_back_copy,
    to_schedule,
)
from broker.state import (
    ENTRY_MESSAGES,
    ENTRY_OFFSETS,
    ENTRY_SCHEDULE,
    ENTRY_TOPIC,
    PERM_READ,
    PERM_RW,
    PERM_WRITE,
    TOPIC_CREATE_IF_ABSENT,
    TOPIC_DELETE,
    TOPIC_UPSERT,
    BrokerStateMachine,
    OffsetKey,
    QueueKey,
    SendResult,
    TopicConfig,
    encode_offsets_record,
    encode_topic_record,
)
from dledger.core import (
    NotLeaderError,
    Role,
)
from dledger.fatal import supervise
from dledger.log import DLedgerError, IndexOutOfRangeError
from dledger.server import rpcguard
from dledger.server.errors import ProposalLostError
from dledger.server.node import DLedgerNode

logger = logging.getLogger(__name__)

SERVICE_NAME = "raftmq.broker.v1.Broker"

# Long polling: RocketMQ's default hold (brokerSuspendMaxTimeMillis is 15 s on the client
# side); a request may ask for more, up to 60 s, so a hung consumer never pins a handler longer.
DEFAULT_SUSPEND_TIMEOUT_MS = 15_000
MAX_SUSPEND_TIMEOUT_MS = 60_000
# Pull sizes: RocketMQ's default pull batch is 32; 1024 bounds one response (and its memory).
DEFAULT_PULL_MAX_MSGS = 32
MAX_PULL_MSGS = 1024
# Serialized bytes of one pull, key query or other growing answer at most (it always holds at
# least one message): gRPC's default receive limit (4 MiB), so a stock client with default
# channel options can read every answer. A single message bigger than this (maxMessageSize
# allows up to 64 MiB; its default, 4 MiB of body, plus a few hundred bytes of fields) is
# still answered alone: reading it needs a client whose receive limit is raised.
MAX_RESPONSE_BYTES = 4 << 20
# Room kept in MAX_RESPONSE_BYTES for an answer's own fields (status, offsets, node id,
# offset_msg_id prefix): well above what they take.
RESPONSE_HEAD_BYTES = 1024
# Upper bound of the serialized size of a Message in an answer beyond its stored size (which
# already holds every byte of its topic, tags, keys, group, host, properties and body): the two
# ids (34 bytes each), the other scalar fields (at most 11 bytes each with their tags), a tag
# and length prefix for each string field and for the message itself in the answer.
MESSAGE_PB_OVERHEAD_BYTES = 384
# ... plus per key (tag and length prefix) and per property (a map entry: three tags and three
# length prefixes), on top of the separators the stored form has.
KEY_PB_OVERHEAD_BYTES = 4
PROPERTY_PB_OVERHEAD_BYTES = 16
# Per message of a raw answer beyond its stored bytes: its queue offset and position, packed
# varints of at most 10 bytes each.
RAW_PB_OVERHEAD_BYTES = 20
# ConsumeQueue records one pull scans for tag matches (RocketMQ scans 16,000 bytes = 800).
PULL_MAX_SCAN_RECORDS = 800
# Messages per SendMessage: one entry per request; bounded like dledger's Append.
MAX_SEND_BATCH = 10_000
# QueryMessageByKey results (RocketMQ's defaultQueryMaxNum is 32).
DEFAULT_QUERY_MAX_NUM = 32
MAX_QUERY_MAX_NUM = 1024
# A client id (RocketMQ's "ip@instance[@unit]", well below this) is kept per consumer and lock.
MAX_CLIENT_ID_CHARS = 255
# Subscriptions in one heartbeat: one per topic the consumer reads (plus its retry topic);
# checked, not kept.
MAX_SUBSCRIPTIONS = 1024
# A subscription expression ("TagA || TagB || ..."): RocketMQ's are short tag lists.
MAX_SUBSCRIPTION_CHARS = 4096
# A key asked for by QueryMessageByKey: a stored message's keys take at most the properties
# budget (32,767 bytes), so no longer key can match.
MAX_QUERY_KEY_CHARS = 32_767
# Long polls held at once by a node, and per connection (gRPC peer): a consumer holds at most
# one per queue it was allocated; each costs a handler and a future until it is answered.
MAX_LONG_POLLS = 10_000
MAX_LONG_POLLS_PER_PEER = 1024
# Consumer offsets the leader buffers between flushes (group x topic x queue): far above what
# consumers commit in one offsetCommitInterval; beyond it new keys are refused until the flush.
MAX_PENDING_OFFSETS = 100_000
# Message ids of sends in flight, for the dedup of a retry that arrives while the original is
# still being proposed: beyond this, new ids are not tracked (the dedup window applied with
# the entry still catches the duplicate; the retry just proposes once more).
MAX_INFLIGHT_IDS = 200_000
# An error detail sent to a client: at most this many UTF-8 bytes (gRPC sends it as a header;
# its metadata limit is 8 KiB, and no detail needs more than a line).
MAX_DETAIL_BYTES = 1000
# The scheduler sleeps until the next due message, at most this long (a new delayed message
# is due one delay after it is stored, so this only bounds lateness for the shortest levels)
# and at least this long between passes.
SCHEDULE_IDLE_MS = 100
SCHEDULE_MIN_WAIT_MS = 5
# One delivery entry holds at most this many messages / bytes of copies.
SCHEDULE_BATCH_MESSAGES = 512
SCHEDULE_BATCH_BYTES = 1 << 20
# Messages in one ConsumerSendMsgBack (a consumer sends back one failed batch at a time).
MAX_SEND_BACK_BATCH = 1024
# Queues in one LockBatchMQ/UnlockBatchMQ or one heartbeat's locked list (RocketMQ locks per
# broker group, at most a few hundred queues per consumer).
MAX_LOCK_BATCH = 4096
# RocketMQ's accessMessageInMemoryMaxRatio default: a pull reading further behind the write
# position than this share of RAM is probably not in page cache: suggest a follower.
DEFAULT_MEMORY_RATIO_PERCENT = 40
# Leader: coalesced consumer offsets are proposed this often (one entry for all of them).
DEFAULT_OFFSET_COMMIT_INTERVAL_MS = 100

_STORE_TS = struct.Struct(">q")
_STORE_TS_AT = 40  # docs/FORMAT.md "Broker: Message": store_timestamp_ms
_I64_MAX = (1 << 63) - 1


def parse_subscription(expression: str) -> frozenset[str] | None:
    """``"*"`` or empty: every message (None); ``"TagA || TagB"``: those tags."""
    if len(expression) > MAX_SUBSCRIPTION_CHARS:
        raise InvalidRequestError(
            f"subscription is {len(expression)} characters, more than {MAX_SUBSCRIPTION_CHARS}"
        )
    text = expression.strip()
    if not text or text == "*":
        return None
    tags = frozenset(t.strip() for t in text.split("||") if t.strip())
    if not tags:
        raise InvalidRequestError("the subscription names no tag")
    return tags


def validate_client_id(client_id: str) -> None:
    if not client_id:
        raise InvalidRequestError("client_id is empty")
    if len(client_id) > MAX_CLIENT_ID_CHARS:
        raise InvalidRequestError(
            f"client_id is {len(client_id)} characters, more than {MAX_CLIENT_ID_CHARS}"
        )


@dataclass(slots=True, eq=False)  # compared and hashed by identity: a key of its queue's dict
class _PullWaiter:
    hashes: frozenset[int] | None
    future: asyncio.Future[None]
    peer: str


@dataclass(frozen=True, slots=True)
class ServiceConfig:
    store_host: str
    store_port: int
    auto_create_topic: bool = False
    default_topic_queue_nums: int = 8
    max_message_size_bytes: int = 4 << 20
    slave_read_enable: bool = False
    memory_ratio_percent: int = DEFAULT_MEMORY_RATIO_PERCENT
    offset_commit_interval_ms: int = DEFAULT_OFFSET_COMMIT_INTERVAL_MS
    delay_levels_ms: tuple[int, ...] = parse_delay_levels(DEFAULT_DELAY_LEVELS)


def _total_memory_bytes() -> int:
    try:
        return os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    except (ValueError, OSError):
        return 8 << 30


class BrokerServicer(pb_grpc.BrokerServicer):
    """Serves one node. :meth:`register` adds it to the node's client port."""

    def __init__(
        self,
        node: DLedgerNode,
        sm: BrokerStateMachine,
        cfg: ServiceConfig,
        disk_guard: DiskGuard | None = None,
    ) -> None:
        self.node = node
        self.sm = sm
        self.cfg = cfg
        self.disk_guard = disk_guard  # refuses sends above the disk watermark (broker.disk)
        self._ids = UniqIdGenerator(ip=cfg.store_host if _is_ipv4(cfg.store_host) else None)
        # offsetMsgId = this prefix (store IPv4 and port) + the position as 16 hex characters.
        self._offset_msg_id_prefix = self._offset_msg_id(0)[:16]
        self._waiters: dict[QueueKey, dict[_PullWaiter, None]] = {}
        self._long_polls = 0
        self._long_polls_by_peer: dict[str, int] = {}
        self._pending_offsets: dict[OffsetKey, int] = {}
        self._offset_flush: asyncio.Task[None] | None = None
        self._inflight: dict[str, tuple[asyncio.Future[list[SendResult]], int]] = {}
        self._consumers = ConsumerTable()
        self._locks = QueueLockTable()
        self._scheduler: asyncio.Task[None] | None = None
        sm.add_change_listener(self._maybe_start_scheduler)
        self._memory_limit_bytes = _total_memory_bytes() * cfg.memory_ratio_percent // 100
        sm.add_listener(self._on_dispatch)

    def register(self, server: grpc.aio.Server) -> Sequence[str]:
        """Add the service to ``server``: undecodable requests are refused with
        ``INVALID_ARGUMENT BAD_REQUEST`` (:mod:`dledger.server.rpcguard`)."""
        return rpcguard.add_servicer(server, pb_grpc.add_BrokerServicer_to_server, self)

    # ------------------------------------------------------------------ helpers

    def _require_leader(self) -> None:
        if self.node.core.role is not Role.LEADER:
            raise NotLeaderError("not the leader", leader_id=self.node.core.leader_id)

    def _topic(self, name: str) -> TopicConfig:
        validate_topic(name)
        topic = self.sm.topics.get(name)
        if topic is None:
            raise TopicNotFoundError(f"topic {name!r} does not exist")
        return topic

    def _readable_queue(self, name: str, queue_id: int) -> TopicConfig:
        topic = self._topic(name)
        if not topic.perm & PERM_READ:
            raise NoPermissionError(f"topic {name!r} is not readable (perm={topic.perm})")
        if not 0 <= queue_id < topic.read_queue_nums:
            raise QueueIdOutOfRangeError(
                f"queue id {queue_id} is outside [0, {topic.read_queue_nums}) of {name!r}"
            )
        return topic

    def _queue_offset(self, topic: str, queue_id: int, position: int) -> int:
        """The queue offset of the message at ``position`` (-1 when its queue no longer has
        it, e.g. its topic was deleted and created again)."""
        cq = self.sm.cqs.find(topic, queue_id)
        offset = None if cq is None else cq.offset_of(position)
        return -1 if offset is None else offset

    def _offset_msg_id(self, position: int) -> str:
        return encode_offset_msg_id(self.cfg.store_host, self.cfg.store_port, position)

    def _read_message(
        self, position: int, size: int | None = None, queue_offset: int | None = None
    ) -> pb.Message:
        """The stored message at ``position`` (CRC checked), only if its entry was applied,
        with its queue offset (looked up by a binary search of its ConsumeQueue unless given)."""
        msg = self._stored(position, size)
        if queue_offset is None:
            queue_offset = self._queue_offset(msg.topic, msg.queue_id, position)
        return self._to_pb(msg, position, queue_offset)

    def _to_pb(self, msg: Message, position: int, queue_offset: int = -1) -> pb.Message:
        out = pb.Message(
            topic=msg.topic,
            queue_id=msg.queue_id,
            tags=msg.tags,
            body=msg.body,
            born_host=msg.born_host,
            born_timestamp_ms=msg.born_timestamp_ms,
            store_timestamp_ms=msg.store_timestamp_ms,
            producer_group=msg.producer_group,
            msg_id=msg.uniq_id,
            offset_msg_id=self._offset_msg_id(position),
            queue_offset=queue_offset,
            commitlog_position=position,
            reconsume_times=msg.reconsume_times,
            flag=msg.flag,
            sys_flag=msg.sys_flag,
        )
        # Only what is there: an empty list or map still costs a copy per message.
        if msg.keys:
            out.keys.extend(msg.keys)
        if msg.properties:
            out.properties.update(msg.properties)
        return out

    def _result_pb(self, r: SendResult, queue_id: int | None = None) -> pb.SendResult:
        return pb.SendResult(
            msg_id=r.uniq_id,
            offset_msg_id=self._offset_msg_id(r.position),
            queue_id=r.queue_id if queue_id is None else queue_id,
            queue_offset=r.queue_offset,
            commitlog_position=r.position,
            duplicate=r.duplicate,
        )

    # ------------------------------------------------------------------ send

    async def _auto_create(self, name: str) -> TopicConfig:
        n = self.cfg.default_topic_queue_nums
        topic = TopicConfig(name, n, n, PERM_RW)
        topic.validate()
        await self.node.propose([encode_topic_record(TOPIC_CREATE_IF_ABSENT, topic)], ENTRY_TOPIC)
        logger.info("topic auto-created topic=%s queues=%d", name, n)
        return self.sm.topics[name]

    def _build(self, request: pb.SendMessageRequest, now_ms: int) -> list[Message]:
        """The request's messages (checked by SendMessage), delayed ones as schedule copies."""
        out = [
            message_from_fields(request.topic, m, now_ms, m.msg_id or self._ids.next_id())
            for m in request.messages
        ]
        levels = len(self.cfg.delay_levels_ms)
        for i, msg in enumerate(out):
            level = delay_level_of(msg, levels)
            if level:
                out[i] = to_schedule(msg, level)
        return out

    @_rpc
    async def SendMessage(
        self, request: pb.SendMessageRequest, context: grpc.aio.ServicerContext
    ) -> pb.SendMessageResponse:
        self._require_leader()
        if self.disk_guard is not None:
            self.disk_guard.check()
        if not request.messages:
            raise InvalidRequestError("a send needs at least one message")
        if len(request.messages) > MAX_SEND_BATCH:
            raise InvalidRequestError(
                f"{len(request.messages)} messages in one send, more than {MAX_SEND_BATCH}"
            )
        validate_topic(request.topic)
        if is_system_topic(request.topic):
            raise SystemTopicError(
                f"topic {request.topic!r} is a system topic: only the broker writes it"
                " (failed messages go back with ConsumerSendMsgBack)"
            )
        topic = self.sm.topics.get(request.topic)
        if topic is None:
            if not self.cfg.auto_create_topic:
                raise TopicNotFoundError(
                    f"topic {request.topic!r} does not exist (autoCreateTopicEnable=false)"
                )
            topic = await self._auto_create(request.topic)
        if not topic.perm & PERM_WRITE:
            raise NoPermissionError(f"topic {topic.name!r} is not writable (perm={topic.perm})")
        delayed = False
        queues = topic.write_queue_nums
        for m in request.messages:
            if not 0 <= m.queue_id < queues:
                raise QueueIdOutOfRangeError(
                    f"queue id {m.queue_id} is outside [0, {queues}) of {topic.name!r}"
                )
            if m.topic and m.topic != request.topic:
                raise InvalidRequestError("a message's topic differs from the request's topic")
            if PROPERTY_DELAY in m.properties:
                delayed = True
        # A retry of a send still in flight here waits for the original instead of proposing
        # again (the dedup window inside apply covers every other case).
        inflight = self._inflight
        waits = (
            [inflight.get(m.msg_id) for m in request.messages]
            if request.messages[0].msg_id in inflight  # nearly always not: one lookup
            else [None]
        )
        if all(waits):
            calls = {id(w[0]): w[0] for w in waits if w is not None}
            with contextlib.suppress(Exception):
                await asyncio.gather(*(asyncio.shield(c) for c in calls.values()))
                return self._send_answer(
                    request,
                    [
                        c.result()[at]._replace(duplicate=True)
                        for c, at in (w for w in waits if w is not None)
                    ],
                    schedule_queue_ids=False,
                )
        now_ms = int(time.time() * 1000)
        if delayed:
            results = await self._store(self._build(request, now_ms))
        else:
            # The common case: encoded straight from the request, no Message per message.
            body, uniq_ids = encode_batch_fields(
                request.topic,
                request.messages,
                now_ms,
                self._ids.next_id,
                self.cfg.max_message_size_bytes,
            )
            results = await self._store_body(body, uniq_ids)
        return self._send_answer(request, results, schedule_queue_ids=True)

    def _send_answer(
        self,
        request: pb.SendMessageRequest,
        results: list[SendResult],
        *,
        schedule_queue_ids: bool,
    ) -> pb.SendMessageResponse:
        """The answer to ``request``: one SendResult per message, or packed columns when the
        request asks for them. With ``schedule_queue_ids``, a delayed message (stored in the
        schedule topic until due) is answered with the queue the producer chose, as RocketMQ
        does."""
        assert len(results) == len(request.messages)
        queue_ids = [r.queue_id for r in results]
        if schedule_queue_ids:
            for i, r in enumerate(results):
                if r.topic == SCHEDULE_TOPIC:
                    queue_ids[i] = request.messages[i].queue_id
        if not request.packed_results:
            return pb.SendMessageResponse(
                results=[self._result_pb(r, q) for r, q in zip(results, queue_ids, strict=True)]
            )
        return pb.SendMessageResponse(
            packed_msg_ids=[r.uniq_id for r in results],
            packed_queue_ids=queue_ids,
            packed_queue_offsets=[r.queue_offset for r in results],
            packed_positions=[r.position for r in results],
            packed_duplicates=[r.duplicate for r in results],
            offset_msg_id_prefix=self._offset_msg_id_prefix,
        )

    async def _store(self, messages: list[Message]) -> list[SendResult]:
        """Propose ``messages`` as one entry; their results once it is applied."""
        body, _ = encode_batch(messages, self.cfg.max_message_size_bytes)
        return await self._store_body(body, [m.uniq_id for m in messages])

    async def _store_body(self, body: bytes, uniq_ids: list[str]) -> list[SendResult]:
        """Propose an encoded batch as one entry; its results once it is applied."""
        max_body = self.node.cfg.store.max_body_bytes
        if len(body) > max_body:
            raise InvalidRequestError(
                f"batch of {len(body)} bytes is larger than one log entry ({max_body} bytes)"
            )
        # One future per proposal; each uniq id not already in flight points at it and at
        # its place in the batch (a retry that arrives meanwhile waits for it).
        call: asyncio.Future[list[SendResult]] = asyncio.get_running_loop().create_future()
        inflight = self._inflight
        mine = []
        if len(inflight) + len(uniq_ids) <= MAX_INFLIGHT_IDS:
            for at, uid in enumerate(uniq_ids):
                if uid not in inflight:
                    inflight[uid] = (call, at)
                    mine.append(uid)
        try:
            first, _last, _term = await self.node.propose([body], ENTRY_MESSAGES)
            results = self.sm.take_results(first)
            assert results is not None and len(results) == len(uniq_ids), (
                f"no results for entry {first}"
            )
            call.set_result(results)
        except BaseException as exc:
            call.set_exception(exc if isinstance(exc, Exception) else ProposalLostError())
            call.exception()  # retrieved: nobody else may be waiting
            raise
        finally:
            for uid in mine:
                del inflight[uid]
        return results

    # ------------------------------------------------------------------ pull

    def _on_dispatch(self, touched: Mapping[QueueKey, set[int]]) -> None:
        """Called by apply: wake the long polls of the queues that just got messages."""
        for key, hashes in touched.items():
            waiters = self._waiters.get(key)
            if not waiters:
                continue
            # Woken waiters leave the dict themselves (PullMessage's finally), so a waiter
            # whose pull timed out never lingers here.
            for w in waiters:
                if not w.future.done() and (w.hashes is None or not w.hashes.isdisjoint(hashes)):
                    w.future.set_result(None)

    def _suggest_follower(self, position: int) -> bool:
        if not self.cfg.slave_read_enable or self.node.core.role is not Role.LEADER:
            return False
        behind = self.node.store.write_position - position
        return behind > self._memory_limit_bytes

    def _pull_once(
        self,
        request: pb.PullMessageRequest,
        hashes: frozenset[int] | None,
        tags: frozenset[str] | None,
    ) -> pb.PullMessageResponse:
        key = (request.topic, request.queue_id)
        cq = self.sm.cqs.find(*key)
        low, high = (0, 0) if cq is None else (cq.min_offset, cq.max_offset)
        resp = pb.PullMessageResponse(
            min_offset=low, max_offset=high, node_id=self.node.cfg.self_id
        )
        offset = request.queue_offset
        if offset < low or offset > high:
            resp.status = pb.OFFSET_ILLEGAL
            resp.next_begin_offset = low if offset < low else high
            return resp
        if offset == high or cq is None:
            resp.status = pb.NO_NEW_MSG
            resp.next_begin_offset = offset
            return resp
        max_msgs = min(request.max_msgs or DEFAULT_PULL_MAX_MSGS, MAX_PULL_MSGS)
        scan = max(max_msgs, PULL_MAX_SCAN_RECORDS) if hashes is not None else max_msgs
        records = cq.read(offset, scan)
        if request.raw:
            return self._pull_raw(resp, records, offset, max_msgs, hashes)
        next_offset = offset
        last_position = -1
        budget = MAX_RESPONSE_BYTES - RESPONSE_HEAD_BYTES
        for i, (position, size, tag_hash) in enumerate(records):
            if hashes is not None and tag_hash not in hashes:
                next_offset = offset + i + 1
                continue
            if resp.messages and size + MESSAGE_PB_OVERHEAD_BYTES > budget:
                break  # would not fit: the next pull starts with it
            next_offset = offset + i + 1
            m = self._read_message(position, size, offset + i)
            last_position = position
            if tags is not None and m.tags not in tags:
                continue  # a hash collision: the exact check (RocketMQ does it client side)
            cost = message_pb_bytes(size, m)
            if resp.messages and cost > budget:
                next_offset -= 1  # keys or properties made it larger than estimated
                break
            resp.messages.append(m)
            budget -= cost
            if len(resp.messages) >= max_msgs:
                break
        resp.next_begin_offset = next_offset
        resp.status = pb.FOUND if resp.messages else pb.NO_MATCHED_MSG
        if last_position >= 0:
            resp.suggest_pull_from_follower = self._suggest_follower(last_position)
        return resp

    def _pull_raw(
        self,
        resp: pb.PullMessageResponse,
        records: Iterable[tuple[int, int, int]],
        offset: int,
        max_msgs: int,
        hashes: frozenset[int] | None,
    ) -> pb.PullMessageResponse:
        """The raw answer: stored bytes (CRC checked), queue offsets and positions; the tag
        filter by hash only (the consumer checks tags exactly, as RocketMQ's does)."""
        parts: list[bytes] = []
        offsets: list[int] = []
        positions: list[int] = []
        next_offset = offset
        budget = MAX_RESPONSE_BYTES - RESPONSE_HEAD_BYTES
        for i, (position, size, tag_hash) in enumerate(records):
            if hashes is not None and tag_hash not in hashes:
                next_offset = offset + i + 1
                continue
            cost = size + RAW_PB_OVERHEAD_BYTES
            if parts and cost > budget:
                break  # would not fit: the next pull starts with it
            next_offset = offset + i + 1
            parts.append(self._stored_raw(position, size))
            offsets.append(offset + i)
            positions.append(position)
            budget -= cost
            if len(parts) >= max_msgs:
                break
        resp.next_begin_offset = next_offset
        if not parts:
            resp.status = pb.NO_MATCHED_MSG
            return resp
        resp.status = pb.FOUND
        resp.raw_messages = b"".join(parts)
        resp.raw_queue_offsets.extend(offsets)
        resp.raw_positions.extend(positions)
        resp.offset_msg_id_prefix = self._offset_msg_id_prefix
        resp.suggest_pull_from_follower = self._suggest_follower(positions[-1])
        return resp

    def _stored_raw(self, position: int, size: int) -> bytes:
        """The applied message at ``position`` as stored, its head and CRC checked."""
        raw = self._read_applied(position, size)
        check_message(raw, position)
        return raw

    @_rpc
    async def PullMessage(
        self, request: pb.PullMessageRequest, context: grpc.aio.ServicerContext
    ) -> pb.PullMessageResponse:
        self._readable_queue(request.topic, request.queue_id)
        if request.max_msgs < 0 or request.suspend_timeout_ms < 0:
            raise InvalidRequestError("max_msgs and suspend_timeout_ms must not be negative")
        tags = parse_subscription(request.subscription)
        hashes = None if tags is None else frozenset(tags_hash(t) for t in tags)
        timeout_ms = min(
            request.suspend_timeout_ms or DEFAULT_SUSPEND_TIMEOUT_MS, MAX_SUSPEND_TIMEOUT_MS
        )
        loop = asyncio.get_running_loop()
        deadline = loop.time() + timeout_ms / 1000
        key = (request.topic, request.queue_id)
        while True:
            resp = self._pull_once(request, hashes, tags)
            if resp.status != pb.NO_NEW_MSG or request.no_suspend:
                return resp
            remaining = deadline - loop.time()
            if remaining <= 0:
                return resp
            waiter = self._add_waiter(key, hashes, context.peer())
            try:
                await asyncio.wait_for(waiter.future, remaining)
            except TimeoutError:
                return self._pull_once(request, hashes, tags)
            finally:
                self._remove_waiter(key, waiter)

    def _add_waiter(self, key: QueueKey, hashes: frozenset[int] | None, peer: str) -> _PullWaiter:
        """A long poll of ``key`` waits; refused when the node or the connection holds the
        most it may (:data:`MAX_LONG_POLLS`, :data:`MAX_LONG_POLLS_PER_PEER`)."""
        held = self._long_polls_by_peer.get(peer, 0)
        if held >= MAX_LONG_POLLS_PER_PEER:
            raise TooManyLongPollsError(
                f"this connection holds {held} long polls, the most it may"
                f" ({MAX_LONG_POLLS_PER_PEER}); pull again later"
            )
        if self._long_polls >= MAX_LONG_POLLS:
            raise TooManyLongPollsError(
                f"the node holds {self._long_polls} long polls, the most it may"
                f" ({MAX_LONG_POLLS}); pull again later"
            )
        waiter = _PullWaiter(hashes, asyncio.get_running_loop().create_future(), peer)
        self._waiters.setdefault(key, {})[waiter] = None
        self._long_polls += 1
        self._long_polls_by_peer[peer] = held + 1
        return waiter

    def _remove_waiter(self, key: QueueKey, waiter: _PullWaiter) -> None:
        if not waiter.future.done():
            waiter.future.cancel()
        waiters = self._waiters.get(key)
        if waiters is None or waiters.pop(waiter, False) is False:
            return
        if not waiters:
            del self._waiters[key]
        self._long_polls -= 1
        left = self._long_polls_by_peer[waiter.peer] - 1
        if left:
            self._long_polls_by_peer[waiter.peer] = left
        else:
            del self._long_polls_by_peer[waiter.peer]

    # ------------------------------------------------------------------ offsets

    def _schedule_offset_flush(self) -> None:
        if self._offset_flush is None or self._offset_flush.done():
            # Supervised: an unexpected exception ends the process (dledger.fatal).
            self._offset_flush = supervise(
                asyncio.get_running_loop().create_task(self._delayed_flush(), name="offset-flush"),
                "offset-flush",
            )

    async def _delayed_flush(self) -> None:
        await asyncio.sleep(self.cfg.offset_commit_interval_ms / 1000)
        try:
            await self._flush_offsets()
        except (DLedgerError, BrokerError, TimeoutError) as exc:
            # Not the leader, no quorum, back pressure, refused: committed by the next flush or lost
            # with leadership (consumers commit again).
            logger.warning("offset commit failed pending=%d: %s", len(self._pending_offsets), exc)

    async def _flush_offsets(self) -> None:
        """Propose every pending offset in one entry and wait until it is applied."""
        if not self._pending_offsets:
            return
        pending, self._pending_offsets = self._pending_offsets, {}
        record = offsets_record(pending)
        if record is None:
            return
        try:
            await self.node.propose([record], ENTRY_OFFSETS)
        except NotLeaderError:
            raise  # a follower's buffer is meaningless: drop it
        except Exception:
            # Keep them for the next flush unless superseded (and while there is room).
            buffer = self._pending_offsets
            for k, v in pending.items():
                if len(buffer) >= MAX_PENDING_OFFSETS:
                    break
                buffer.setdefault(k, v)
            raise

    @_rpc
    async def UpdateConsumerOffset(
        self, request: pb.UpdateConsumerOffsetRequest, context: grpc.aio.ServicerContext
    ) -> pb.UpdateConsumerOffsetResponse:
        self._require_leader()
        validate_group_name(request.consumer_group)
        self._readable_queue(request.topic, request.queue_id)
        if request.queue_offset < 0:
            raise InvalidRequestError(f"offset {request.queue_offset} is negative")
        key = (request.consumer_group, request.topic, request.queue_id)
        pending = self._pending_offsets
        if len(pending) >= MAX_PENDING_OFFSETS and key not in pending:
            self._schedule_offset_flush()
            raise TooManyPendingOffsetsError(
                f"{len(pending)} consumer offsets wait for the next flush, the most the leader"
                f" buffers ({MAX_PENDING_OFFSETS}); commit again after it"
            )
        pending[key] = request.queue_offset
        if request.sync:
            await self._flush_offsets()
        else:
            self._schedule_offset_flush()
        return pb.UpdateConsumerOffsetResponse()

    @_rpc
    async def QueryConsumerOffset(
        self, request: pb.QueryConsumerOffsetRequest, context: grpc.aio.ServicerContext
    ) -> pb.QueryConsumerOffsetResponse:
        key = (request.consumer_group, request.topic, request.queue_id)
        offset = self._pending_offsets.get(key, self.sm.offsets.get(key, -1))
        return pb.QueryConsumerOffsetResponse(queue_offset=offset)

    def _search_offset(self, topic: str, queue_id: int, timestamp_ms: int) -> int:
        """The first queue offset whose message was stored at or after ``timestamp_ms``."""
        cq = self.sm.cqs.find(topic, queue_id)
        if cq is None:
            return 0
        low, high = cq.min_offset, cq.max_offset
        store = self.node.store
        while low < high:
            mid = (low + high) // 2
            position = cq.get(mid)[0]
            ts = _STORE_TS.unpack(store.read_at(position + _STORE_TS_AT, 8))[0]
            if ts < timestamp_ms:
                low = mid + 1
            else:
                high = mid
        return low

    @_rpc
    async def ResetConsumerOffset(
        self, request: pb.ResetConsumerOffsetRequest, context: grpc.aio.ServicerContext
    ) -> pb.ResetConsumerOffsetResponse:
        self._require_leader()
        validate_group_name(request.consumer_group)
        topic = self._topic(request.topic)
        if request.queue_id == -1:
            queue_ids = list(range(topic.read_queue_nums))
        else:
            self._readable_queue(request.topic, request.queue_id)
            queue_ids = [request.queue_id]
        target = request.WhichOneof("target")
        if target is None:
            raise InvalidRequestError("give queue_offset or timestamp_ms")
        offsets: dict[OffsetKey, int] = {}
        for q in queue_ids:
            low, high = self.sm.queue_offsets(request.topic, q)
            if target == "queue_offset":
                value = min(max(request.queue_offset, low), high)
            else:
                value = self._search_offset(request.topic, q, request.timestamp_ms)
            offsets[(request.consumer_group, request.topic, q)] = value
        for k in offsets:
            self._pending_offsets.pop(k, None)
        await self.node.propose([encode_offsets_record(offsets)], ENTRY_OFFSETS)
        return pb.ResetConsumerOffsetResponse(
            offsets=[pb.QueueOffset(queue_id=k[2], queue_offset=v) for k, v in offsets.items()]
        )

    @_rpc
    async def SearchOffset(
        self, request: pb.SearchOffsetRequest, context: grpc.aio.ServicerContext
    ) -> pb.SearchOffsetResponse:
        self._readable_queue(request.topic, request.queue_id)
        offset = self._search_offset(request.topic, request.queue_id, request.timestamp_ms)
        return pb.SearchOffsetResponse(queue_offset=offset)

    @_rpc
    async def GetQueueOffsets(
        self, request: pb.GetQueueOffsetsRequest, context: grpc.aio.ServicerContext
    ) -> pb.GetQueueOffsetsResponse:
        self._readable_queue(request.topic, request.queue_id)
        low, high = self.sm.queue_offsets(request.topic, request.queue_id)
        return pb.GetQueueOffsetsResponse(min_offset=low, max_offset=high)

    # ------------------------------------------------------------------ topics

    @staticmethod
    def _topic_pb(t: TopicConfig) -> pb.TopicConfig:
        return pb.TopicConfig(
            topic_name=t.name,
            read_queue_nums=t.read_queue_nums,
            write_queue_nums=t.write_queue_nums,
            perm=t.perm,
        )

    @staticmethod
    def _refuse_system_topic(name: str, what: str) -> None:
        if is_system_topic(name):
            raise SystemTopicError(
                f"topic {name!r} is a system topic: the broker creates it, it cannot be {what}"
                " through the API"
            )

    @_rpc
    async def CreateTopic(
        self, request: pb.CreateTopicRequest, context: grpc.aio.ServicerContext
    ) -> pb.CreateTopicResponse:
        self._require_leader()
        t = request.topic
        n = self.cfg.default_topic_queue_nums
        topic = TopicConfig(
            t.topic_name, t.read_queue_nums or n, t.write_queue_nums or n, t.perm or PERM_RW
        )
        topic.validate()
        self._refuse_system_topic(topic.name, "created or updated")
        await self.node.propose([encode_topic_record(TOPIC_UPSERT, topic)], ENTRY_TOPIC)
        return pb.CreateTopicResponse(topic=self._topic_pb(self.sm.topics[topic.name]))

    @_rpc
    async def DeleteTopic(
        self, request: pb.DeleteTopicRequest, context: grpc.aio.ServicerContext
    ) -> pb.DeleteTopicResponse:
        self._require_leader()
        validate_topic(request.topic)
        self._refuse_system_topic(request.topic, "deleted")
        topic = self._topic(request.topic)
        await self.node.propose([encode_topic_record(TOPIC_DELETE, topic)], ENTRY_TOPIC)
        return pb.DeleteTopicResponse()

    @_rpc
    async def GetTopic(
        self, request: pb.GetTopicRequest, context: grpc.aio.ServicerContext
    ) -> pb.GetTopicResponse:
        return pb.GetTopicResponse(topic=self._topic_pb(self._topic(request.topic)))

    @_rpc
    async def ListTopics(
        self, request: pb.ListTopicsRequest, context: grpc.aio.ServicerContext
    ) -> pb.ListTopicsResponse:
        return pb.ListTopicsResponse(
            topics=[self._topic_pb(t) for _, t in sorted(self.sm.topics.items())]
        )

    # ------------------------------------------------------------------ lookups

    @_rpc
    async def QueryMessageByKey(
        self, request: pb.QueryMessageByKeyRequest, context: grpc.aio.ServicerContext
    ) -> pb.QueryMessageByKeyResponse:
        validate_topic(request.topic)
        if not request.key:
            raise InvalidRequestError("key is empty")
        if len(request.key) > MAX_QUERY_KEY_CHARS:
            raise InvalidRequestError(
                f"key is {len(request.key)} characters, more than {MAX_QUERY_KEY_CHARS}"
            )
        max_num = min(request.max_num or DEFAULT_QUERY_MAX_NUM, MAX_QUERY_MAX_NUM)
        end = request.end_timestamp_ms or _I64_MAX
        # Candidates: different keys may share a hash; check the messages' keys.
        positions = self.sm.index.query_key(
            request.topic, request.key, max_num * 2, request.begin_timestamp_ms, end
        )
        resp = pb.QueryMessageByKeyResponse()
        budget = MAX_RESPONSE_BYTES - RESPONSE_HEAD_BYTES
        for position in positions:
            if position >= self.sm.dispatch_end:
                continue
            size = MESSAGE_HEAD.unpack(self._read_applied(position, MESSAGE_HEAD.size))[0]
            if resp.messages and size + MESSAGE_PB_OVERHEAD_BYTES > budget:
                break
            m = self._read_message(position, size)
            if m.topic == request.topic and request.key in m.keys:
                cost = message_pb_bytes(size, m)
                if resp.messages and cost > budget:
                    break
                resp.messages.append(m)
                budget -= cost
                if len(resp.messages) >= max_num:
                    break
        return resp

    @_rpc
    async def ViewMessage(
        self, request: pb.ViewMessageRequest, context: grpc.aio.ServicerContext
    ) -> pb.ViewMessageResponse:
        which = request.WhichOneof("id")
        if which == "offset_msg_id":
            position = decode_offset_msg_id(request.offset_msg_id).position
            try:
                return pb.ViewMessageResponse(message=self._read_message(position))
            except CorruptMessageError:
                raise MessageNotFoundError(f"no message starts at position {position}") from None
        if which != "msg_id":
            raise InvalidRequestError("give offset_msg_id or msg_id")
        uniq = request.msg_id.upper()
        uniq_id_to_bytes(uniq)  # 32 hex characters, or INVALID_MESSAGE_ID (never echoed)
        recent = self.sm.find_uniq(uniq)
        if recent is not None and (not request.topic or recent.topic == request.topic):
            return pb.ViewMessageResponse(message=self._read_message(recent.position))
        if not request.topic:
            raise InvalidRequestError(
                "msg_id outside the dedup window: give the topic to search the key index"
            )
        validate_topic(request.topic)
        for position in self.sm.index.query_key(request.topic, uniq, 16):
            if position >= self.sm.dispatch_end:
                continue
            m = self._read_message(position)
            if m.msg_id == uniq and m.topic == request.topic:
                return pb.ViewMessageResponse(message=m)
        raise MessageNotFoundError(f"no message {uniq} in topic {request.topic!r}")

    # ------------------------------------------------------------------ consumers

    @_rpc
    async def Heartbeat(
        self, request: pb.HeartbeatRequest, context: grpc.aio.ServicerContext
    ) -> pb.HeartbeatResponse:
        group, client_id = request.consumer_group, request.client_id
        validate_group_name(group)
        validate_client_id(client_id)
        if len(request.subscriptions) > MAX_SUBSCRIPTIONS:
            raise InvalidRequestError(
                f"{len(request.subscriptions)} subscriptions in a heartbeat,"
                f" more than {MAX_SUBSCRIPTIONS}"
            )
        for sub in request.subscriptions:
            validate_topic(sub.topic)
            parse_subscription(sub.expression)
        if len(request.locked_queues) > MAX_LOCK_BATCH:
            raise InvalidRequestError(f"more than {MAX_LOCK_BATCH} locked queues in a heartbeat")
        now_ms = _monotonic_ms()
        self._expire_consumers(now_ms)
        self._consumers.heartbeat(group, client_id, now_ms)
        self._locks.claim(
            group,
            client_id,
            [
                (q.topic, q.queue_id)
                for q in request.locked_queues
                if self._lockable(q.topic, q.queue_id)
            ],
            now_ms,
        )
        return pb.HeartbeatResponse()

    def _expire_consumers(self, now_ms: int) -> None:
        """Drop consumers silent for CONSUMER_EXPIRE_MS and free their locks (amortized O(1))."""
        for group, client_id in self._consumers.expire(now_ms):
            self._locks.release_client(group, client_id)

    def _lockable(self, topic: str, queue_id: int) -> bool:
        """Only a queue that exists can be locked: junk queues never take room in the table."""
        t = self.sm.topics.get(topic) if is_valid_topic_name(topic) else None
        return t is not None and 0 <= queue_id < t.read_queue_nums

    @_rpc
    async def UnregisterConsumer(
        self, request: pb.UnregisterConsumerRequest, context: grpc.aio.ServicerContext
    ) -> pb.UnregisterConsumerResponse:
        validate_group_name(request.consumer_group)
        validate_client_id(request.client_id)
        removed = self._consumers.remove(request.consumer_group, request.client_id)
        self._locks.release_client(request.consumer_group, request.client_id)
        return pb.UnregisterConsumerResponse(removed=removed)

    @staticmethod
    def _lock_request(
        request: pb.LockBatchRequest | pb.UnlockBatchRequest,
    ) -> list[tuple[str, int]]:
        validate_group_name(request.consumer_group)
        validate_client_id(request.client_id)
        if len(request.queues) > MAX_LOCK_BATCH:
            raise InvalidRequestError(f"more than {MAX_LOCK_BATCH} queues in one lock request")
        for q in request.queues:
            validate_topic(q.topic)
        return [(q.topic, q.queue_id) for q in request.queues]

    @_rpc
    async def LockBatchMQ(
        self, request: pb.LockBatchRequest, context: grpc.aio.ServicerContext
    ) -> pb.LockBatchResponse:
        # Only the leader grants locks, so two consumers never each get one from another node.
        self._require_leader()
        queues = [q for q in self._lock_request(request) if self._lockable(*q)]
        now_ms = _monotonic_ms()
        self._expire_consumers(now_ms)
        locked = self._locks.lock(request.consumer_group, request.client_id, queues, now_ms)
        return pb.LockBatchResponse(locked=[pb.QueueRef(topic=t, queue_id=q) for t, q in locked])

    @_rpc
    async def UnlockBatchMQ(
        self, request: pb.UnlockBatchRequest, context: grpc.aio.ServicerContext
    ) -> pb.UnlockBatchResponse:
        # Any node: a release must reach the node that will lead next, too.
        queues = self._lock_request(request)
        released = self._locks.unlock(request.consumer_group, request.client_id, queues)
        return pb.UnlockBatchResponse(
            unlocked=[pb.QueueRef(topic=t, queue_id=q) for t, q in released]
        )

    @_rpc
    async def GetConsumerList(
        self, request: pb.GetConsumerListRequest, context: grpc.aio.ServicerContext
    ) -> pb.GetConsumerListResponse:
        validate_group_name(request.consumer_group)
        self._expire_consumers(_monotonic_ms())
        return pb.GetConsumerListResponse(
            client_ids=self._consumers.clients(request.consumer_group)
        )

    # ------------------------------------------------------------------ retries and DLQ

    async def _ensure_system_topic(self, name: str, queues: int) -> None:
        if name not in self.sm.topics:
            topic = TopicConfig(name, queues, queues, PERM_RW)
            topic.validate()
            record = encode_topic_record(TOPIC_CREATE_IF_ABSENT, topic)
            await self.node.propose([record], ENTRY_TOPIC)
            logger.info("system topic created topic=%s queues=%d", name, queues)

    def _stored(self, position: int, size: int | None = None) -> Message:
        """The applied message at ``position`` (``size`` bytes, read from its head when not
        given), decoded with its CRC checked."""
        return decode_message(self._read_applied(position, size))

    def _read_applied(self, position: int, size: int | None) -> bytes:
        """The bytes of the applied message at ``position`` (``size`` bytes, read from its
        head when not given), unchecked: the one place that reads stored messages."""
        if not 0 <= position < self.sm.dispatch_end:
            raise MessageNotFoundError(f"no applied message at position {position}")
        store = self.node.store
        try:
            if size is None:
                size = MESSAGE_HEAD.unpack(store.read_at(position, MESSAGE_HEAD.size))[0]
            return store.read_at(position, size)
        except IndexOutOfRangeError as exc:
            raise MessageNotFoundError(f"no message at position {position}: {exc}") from None

    @_rpc
    async def ConsumerSendMsgBack(
        self, request: pb.ConsumerSendMsgBackRequest, context: grpc.aio.ServicerContext
    ) -> pb.ConsumerSendMsgBackResponse:
        self._require_leader()
        if self.disk_guard is not None:
            self.disk_guard.check()
        group = request.consumer_group
        validate_group_name(group)
        if not 1 <= len(request.messages) <= MAX_SEND_BACK_BATCH:
            raise InvalidRequestError(f"send back 1 to {MAX_SEND_BACK_BATCH} messages")
        validate_topic(retry_topic(group))
        max_times = (
            request.max_reconsume_times
            if request.HasField("max_reconsume_times")
            else DEFAULT_MAX_RECONSUME_TIMES
        )
        now_ms = int(time.time() * 1000)
        levels = self.cfg.delay_levels_ms
        copies: list[Message] = []
        for item in request.messages:
            if item.msg_id:
                uniq_id_to_bytes(item.msg_id.upper())  # or INVALID_MESSAGE_ID, never echoed
            stored = self._stored(item.commitlog_position)
            if item.msg_id and stored.uniq_id != item.msg_id.upper():
                raise MessageNotFoundError(
                    f"the message at position {item.commitlog_position} is {stored.uniq_id},"
                    f" not {item.msg_id}"
                )
            copies.append(
                send_back_copy(stored, group, request.delay_level, max_times, now_ms, len(levels))
            )
        dlq = dlq_topic(group)
        if any(c.topic == dlq for c in copies):
            await self._ensure_system_topic(dlq, DLQ_QUEUE_NUMS)
        if any(c.topic != dlq for c in copies):
            await self._ensure_system_topic(retry_topic(group), RETRY_QUEUE_NUMS)
        results = await self._store(copies)  # one entry for the whole batch
        out = []
        for copy, result in zip(copies, results, strict=True):
            dead = copy.topic == dlq
            level = int(copy.properties.get(PROPERTY_DELAY, "0") or 0)
            out.append(
                pb.SendBackResult(
                    topic=dlq if dead else retry_topic(group),
                    dead_lettered=dead,
                    result=self._result_pb(result),
                    deliver_at_ms=0 if dead else due_ms(result.store_timestamp_ms, level, levels),
                )
            )
        logger.debug(
            "send back group=%s messages=%d dead_lettered=%d",
            group,
            len(out),
            sum(r.dead_lettered for r in out),
        )
        return pb.ConsumerSendMsgBackResponse(results=out)

    # ------------------------------------------------------------------ the scheduler

    def _maybe_start_scheduler(self) -> None:
        """A change listener: a node that became leader starts delivering due messages."""
        if self.sm.role is not Role.LEADER:
            return
        if self._scheduler is not None and not self._scheduler.done():
            return
        try:
            loop = asyncio.get_running_loop()
        except RuntimeError:  # applied outside the event loop (tests): nothing to schedule
            return
        # Supervised: an unexpected exception ends the process (dledger.fatal), rather than
        # leaving a leader whose delayed messages are never delivered.
        self._scheduler = supervise(
            loop.create_task(self._schedule_loop(), name="scheduler"), "scheduler"
        )

    async def _schedule_loop(self) -> None:
        """While this node leads: deliver every due scheduled message, level by level."""
        term = self.node.core.term
        logger.info("scheduler started node=%s term=%d", self.node.cfg.self_id, term)
        while self.node.core.role is Role.LEADER and self.node.core.term == term:
            next_due: int | None = None
            try:
                for level in range(1, len(self.cfg.delay_levels_ms) + 1):
                    due = await self._deliver_level(level)
                    if due is not None and (next_due is None or due < next_due):
                        next_due = due
            except (DLedgerError, BrokerError, TimeoutError) as exc:
                # Lost leadership or quorum mid-proposal (NOT_LEADER, LEADERSHIP_LOST,
                # NO_QUORUM, BACK_PRESSURE): nothing was half done (one entry holds the copies
                # and the offset); the next leader resumes from the log.
                logger.info("scheduler pass failed: %s", exc)
                next_due = None
            now_ms = time.time() * 1000
            wait_ms = SCHEDULE_IDLE_MS if next_due is None else next_due - now_ms
            await asyncio.sleep(min(max(wait_ms, SCHEDULE_MIN_WAIT_MS), SCHEDULE_IDLE_MS) / 1000)
        logger.info("scheduler stopped node=%s term=%d", self.node.cfg.self_id, term)

    async def _deliver_level(self, level: int) -> int | None:
        """Deliver the due head of ``level``'s queue; the next due time (ms), or None."""
        delays = self.cfg.delay_levels_ms
        while True:
            cq = self.sm.cqs.find(SCHEDULE_TOPIC, level - 1)
            if cq is None:
                return None
            start = self.sm.schedule_offsets.get(level, 0)
            if start >= cq.max_offset:
                return None
            start = max(start, cq.min_offset)
            now_ms = int(time.time() * 1000)
            copies: list[Message] = []
            end = start
            size = 0
            next_due: int | None = None
            for position, msg_size, store_ts in cq.read(start, SCHEDULE_BATCH_MESSAGES):
                due = due_ms(store_ts, level, delays)
                if due > now_ms:
                    next_due = due
                    break
                if size + msg_size > SCHEDULE_BATCH_BYTES and copies:
                    break
                end += 1
                size += msg_size
                copy = self._delivery(position, now_ms)
                if copy is not None:
                    copies.append(copy)
            if end == start:
                return next_due
            current = self.sm.schedule_offsets.get(level, 0)
            body = encode_schedule_header(level, current, end)
            if copies:
                batch, _ = encode_batch(copies, self.cfg.max_message_size_bytes)
                body += batch
            await self.node.propose([body], ENTRY_SCHEDULE)
            if self.sm.schedule_offsets.get(level, 0) != end:
                # Skipped when applied (another pass delivered them first, or the entry was
                # bad): look again at the next pass rather than spin here.
                logger.warning("schedule entry level=%d [%d, %d) not applied", level, current, end)
                return None
            logger.debug(
                "delivered level=%d offsets [%d, %d) copies=%d", level, start, end, len(copies)
            )
            if end - start < SCHEDULE_BATCH_MESSAGES and next_due is not None:
                return next_due

    def _delivery(self, position: int, now_ms: int) -> Message | None:
        """The copy of the scheduled message at ``position`` for its real queue; None when it
        cannot be delivered (unreadable, or its topic was deleted): it is skipped."""
        try:
            copy = delivered_copy(self._stored(position), now_ms)
        except BrokerError as exc:
            logger.error("scheduled message at %d skipped: %s", position, exc)
            return None
        topic = self.sm.topics.get(copy.topic)
        if topic is None:
            logger.warning(
                "scheduled message %s dropped: topic %s is gone", copy.uniq_id, copy.topic
            )
            return None
        if copy.queue_id >= topic.write_queue_nums:
            copy = replace(copy, queue_id=copy.queue_id % topic.write_queue_nums)
        return copy


def offsets_record(pending: Mapping[OffsetKey, int]) -> bytes | None:
    """The offsets record of ``pending``; an entry that cannot be encoded (the API checks
    every group and topic first, so none should be) is dropped with one log line rather than
    blocking every other group's offsets. None when nothing is left."""
    try:
        return encode_offsets_record(pending)
    except BrokerError:
        pass
    good: dict[OffsetKey, int] = {}
    bad = 0
    for (group, topic, queue_id), offset in pending.items():
        try:
            validate_group_name(group)
            validate_topic(topic)
            encode_offsets_record({(group, topic, queue_id): offset})
        except BrokerError:
            bad += 1
            continue
        good[(group, topic, queue_id)] = offset
    logger.error("offset commit dropped %d offsets that cannot be encoded", bad)
    try:
        return encode_offsets_record(good) if good else None
    except BrokerError as exc:  # e.g. more queues of one group and topic than a record holds
        logger.error("offset commit dropped %d offsets: %s", len(good), exc)
        return None


def message_pb_bytes(stored_size: int, m: pb.Message) -> int:
    """An upper bound of the bytes ``m`` (stored in ``stored_size`` bytes) adds to an answer,
    in O(1): no serialization, no copy of the body."""
    return (
        stored_size
        + MESSAGE_PB_OVERHEAD_BYTES
        + KEY_PB_OVERHEAD_BYTES * len(m.keys)
        + PROPERTY_PB_OVERHEAD_BYTES * len(m.properties)
    )


def _monotonic_ms() -> int:
    return int(time.monotonic() * 1000)


def _is_ipv4(host: str) -> bool:
    parts = host.split(".")
    return len(parts) == 4 and all(p.isdigit() and int(p) < 256 for p in parts)
