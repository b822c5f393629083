"""Messages, queues and send results as the client's callers see them."""

from __future__ import annotations

import itertools
import os
import socket
import threading
import time
import uuid
from dataclasses import dataclass, field

from raftmq.broker.v1 import broker_pb2 as pb

from msgcodec import MSG_ID_HEX_CHARS as MSG_ID_HEX_CHARS
from msgcodec import PROPERTY_DELAY as PROPERTY_DELAY
from msgcodec import PROPERTY_ORIGIN_MESSAGE_ID as PROPERTY_ORIGIN_MESSAGE_ID
from msgcodec import PROPERTY_RETRY_TOPIC as PROPERTY_RETRY_TOPIC
from msgcodec import PROPERTY_TIMER_DELIVER_MS as PROPERTY_TIMER_DELIVER_MS

# RocketMQ's system topic prefixes (see docs/BROKER.md, "Retries").
RETRY_PREFIX = "%RETRY%"
DLQ_PREFIX = "%DLQ%"


class _MsgIds:
    """Uniq ids: 8 random bytes per process, then a 64-bit counter that starts at a random
    value (uuid4 per message cost a getrandom() system call and ~8 us: a fifth of the
    client's CPU per message at 256 in flight). A forked child draws its own prefix."""

    def __init__(self) -> None:
        self.reseed()

    def reseed(self) -> None:
        self.prefix = os.urandom(8).hex().upper()
        self.counter = itertools.count(int.from_bytes(os.urandom(8), "big") >> 1)

    def next(self) -> str:
        return f"{self.prefix}{next(self.counter) & 0xFFFF_FFFF_FFFF_FFFF:016X}"


_ids = _MsgIds()
os.register_at_fork(after_in_child=_ids.reseed)


def new_msg_id() -> str:
    """A fresh uniq message id (32 uppercase hex), made once per message so that retries of
    the same message carry the same id and the broker deduplicates them."""
    return _ids.next()


@dataclass(slots=True)
class Message:
    """A message to send. ``msg_id`` is filled by the producer on first send and kept across
    retries. ``delay_time_level`` (1..18 with the default levels: 1s 5s 10s 30s 1m 2m ... 2h)
    delivers it to consumers only that long after it was stored; ``deliver_time_ms`` (ms since
    the epoch, at most the broker's ``timerMaxDelaySec`` ahead; one of the two) delivers it at
    that time (RocketMQ 5's timer messages, property ``TIMER_DELIVER_MS``)."""

    topic: str
    body: bytes
    tags: str = ""
    keys: tuple[str, ...] = ()
    properties: dict[str, str] = field(default_factory=dict)
    msg_id: str = ""
    delay_time_level: int = 0
    deliver_time_ms: int = 0

    def to_pb(self, queue_id: int, producer_group: str, born_host: str) -> pb.Message:
        if not self.msg_id:
            self.msg_id = new_msg_id()
        m = pb.Message(
            topic=self.topic,
            queue_id=queue_id,
            tags=self.tags,
            body=self.body,
            born_host=born_host,
            born_timestamp_ms=int(time.time() * 1000),
            producer_group=producer_group,
            msg_id=self.msg_id,
        )
        # Only what is there: an empty map or list still costs a copy per message.
        if self.keys:
            m.keys.extend(self.keys)
        if self.properties:
            m.properties.update(self.properties)
        if self.delay_time_level > 0:
            m.properties[PROPERTY_DELAY] = str(self.delay_time_level)
        if self.deliver_time_ms > 0:
            m.properties[PROPERTY_TIMER_DELIVER_MS] = str(self.deliver_time_ms)
        return m


@dataclass(frozen=True, slots=True, order=True)
class MessageQueue:
    """One queue of a topic in one broker group."""

    topic: str
    broker_name: str
    queue_id: int

    def key(self) -> str:
        return f"{self.topic}@{self.broker_name}@{self.queue_id}"


@dataclass(frozen=True, slots=True)
class MessageExt:
    """A consumed message with what the broker filled in.

    A message redelivered from the group's retry topic shows its original ``topic`` and
    ``msg_id`` (as RocketMQ's consumer does), a dead letter its original ``msg_id``;
    ``reconsume_times`` says which retry it is, and ``store_topic``/``store_msg_id`` name the
    stored copy (``%RETRY%{group}``, ``%DLQ%{group}``).
    """

    topic: str
    body: bytes
    tags: str
    keys: tuple[str, ...]
    properties: dict[str, str]
    msg_id: str
    offset_msg_id: str
    broker_name: str
    queue_id: int
    queue_offset: int
    commitlog_position: int
    born_timestamp_ms: int
    store_timestamp_ms: int
    reconsume_times: int
    store_topic: str = ""
    store_msg_id: str = ""

    @classmethod
    def from_pb(cls, m: pb.Message, broker_name: str) -> MessageExt:
        return cls.shown(
            m.topic,
            m.msg_id,
            dict(m.properties) if m.properties else {},
            m.body,
            m.tags,
            tuple(m.keys) if m.keys else (),
            m.offset_msg_id,
            broker_name,
            m.queue_id,
            m.queue_offset,
            m.commitlog_position,
            m.born_timestamp_ms,
            m.store_timestamp_ms,
            m.reconsume_times,
        )

    @classmethod
    def shown(
        cls,
        store_topic: str,
        store_msg_id: str,
        properties: dict[str, str],
        body: bytes,
        tags: str,
        keys: tuple[str, ...],
        offset_msg_id: str,
        broker_name: str,
        queue_id: int,
        queue_offset: int,
        commitlog_position: int,
        born_timestamp_ms: int,
        store_timestamp_ms: int,
        reconsume_times: int,
    ) -> MessageExt:
        """The message as a consumer sees it: a retry shows its original topic and id, a
        dead letter its original id. Positional: called once per message pulled."""
        topic, msg_id = store_topic, store_msg_id
        if topic[:1] == "%":  # both prefixes start so: one test for an ordinary topic
            if topic.startswith(RETRY_PREFIX):
                topic = properties.get(PROPERTY_RETRY_TOPIC, topic)
                msg_id = properties.get(PROPERTY_ORIGIN_MESSAGE_ID, msg_id)
            elif topic.startswith(DLQ_PREFIX):  # a dead letter keeps its topic, shows its id
                msg_id = properties.get(PROPERTY_ORIGIN_MESSAGE_ID, msg_id)
        return cls(
            topic,
            body,
            tags,
            keys,
            properties,
            msg_id,
            offset_msg_id,
            broker_name,
            queue_id,
            queue_offset,
            commitlog_position,
            born_timestamp_ms,
            store_timestamp_ms,
            reconsume_times,
            store_topic,
            store_msg_id,
        )


@dataclass(frozen=True, slots=True)
class SendResult:
    """The broker's answer for one message: only ever made from an OK answer."""

    msg_id: str
    offset_msg_id: str
    message_queue: MessageQueue
    queue_offset: int
    commitlog_position: int
    duplicate: bool


_counter_lock = threading.Lock()
_counter = [0]


def local_host() -> str:
    """This machine's address as its host name resolves ("127.0.0.1" when it does not): the
    born host of a message and the host part of a client id."""
    try:
        return socket.gethostbyname(socket.gethostname())
    except OSError:
        return "127.0.0.1"


def new_client_id(host: str) -> str:
    """Unique per client instance, even several in one process: ``host@pid#n``."""
    with _counter_lock:
        _counter[0] += 1
        n = _counter[0]
    return f"{host}@{os.getpid()}#{n}-{uuid.uuid4().hex[:6]}"
