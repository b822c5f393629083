"""Delayed messages, consumer retries and dead letters: the rules, as pure functions.

RocketMQ's model, with one change that makes timers survive a failover:

- A message sent with ``DELAY=level`` (1..18) is stored in ``SCHEDULE_TOPIC_XXXX``, queue
  ``level - 1``, with its real topic and queue in the ``REAL_TOPIC``/``REAL_QID`` properties.
  Within one level every message waits the same delay, so each level's queue is in due order.
- The leader's scheduler watches the head of every level's queue. When messages are due
  (``store_timestamp_ms + delay(level) <= now``), it proposes **one log entry** holding both
  the copies to deliver (topic and queue restored) and the level's new delivered offset
  (``ENTRY_SCHEDULE``, :func:`encode_schedule_header`). Applying that entry appends the copies
  to their ConsumeQueues and advances the level's offset, on every member, atomically; an
  entry whose ``from_offset`` is not the level's current offset (a second proposal of the same
  messages, e.g. by a leader that was deposed and re-elected) is skipped whole. So after any
  failover the new leader resumes at exactly the replicated offset: no due message is lost,
  none is delivered twice, none early (the due time is fixed by the stored timestamp).
- A consumer that fails a message sends it back (``ConsumerSendMsgBack``): the broker stores a
  copy for ``%RETRY%{group}`` with ``reconsume_times + 1``, delayed by level
  ``3 + reconsume_times`` (10 s, 30 s, 1 m, ...), or, past ``max_reconsume_times``, in
  ``%DLQ%{group}`` (one queue). The copy's uniq id is derived from the original's, the group
  and the attempt, so a repeated send-back of the same attempt is deduplicated; the original
  id travels in ``ORIGIN_MESSAGE_ID`` and the client shows it as the message's ``msg_id``.
"""

from __future__ import annotations

import hashlib
import struct
from collections.abc import Sequence
from dataclasses import replace

from broker.state.errors import ConfigError, InvalidRequestError
from broker.state.message import Message

# Re-exported (the names used to live here): broker.state.names is where they are defined.
from broker.state.names import DLQ_PREFIX as DLQ_PREFIX
from broker.state.names import RETRY_PREFIX as RETRY_PREFIX
from broker.state.names import SCHEDULE_TOPIC as SCHEDULE_TOPIC
from broker.state.names import is_system_topic as is_system_topic
from msgcodec import PROPERTY_DELAY as PROPERTY_DELAY
from msgcodec import PROPERTY_DLQ_ORIGIN_TOPIC as PROPERTY_DLQ_ORIGIN_TOPIC
from msgcodec import PROPERTY_ORIGIN_MESSAGE_ID as PROPERTY_ORIGIN_MESSAGE_ID
from msgcodec import PROPERTY_REAL_QID as PROPERTY_REAL_QID
from msgcodec import PROPERTY_REAL_TOPIC as PROPERTY_REAL_TOPIC
from msgcodec import PROPERTY_RETRY_TOPIC as PROPERTY_RETRY_TOPIC

# RocketMQ's messageDelayLevel default.
DEFAULT_DELAY_LEVELS = "1s 5s 10s 30s 1m 2m 3m 4m 5m 6m 7m 8m 9m 10m 20m 30m 1h 2h"
_UNIT_MS = {"s": 1000, "m": 60_000, "h": 3_600_000, "d": 86_400_000}
# RocketMQ: a send-back with delay level 0 is delayed by level 3 + reconsume times.
RETRY_FIRST_LEVEL = 3
# RocketMQ's maxReconsumeTimes default for concurrent consumers.
DEFAULT_MAX_RECONSUME_TIMES = 16
# Bound on a client's max_reconsume_times (RocketMQ caps the retry levels the same way).
MAX_RECONSUME_TIMES_LIMIT = 64
# Retry and dead-letter topics have one queue (RocketMQ's retryQueueNums / DLQ).
RETRY_QUEUE_NUMS = 1
DLQ_QUEUE_NUMS = 1

SCHEDULE_VERSION = 1
# version, level, from offset, to offset (then a message batch)
SCHEDULE_HEADER = struct.Struct(">BBqq")


def parse_delay_levels(spec: str, scale: float = 1.0) -> tuple[int, ...]:
    """``"1s 5s 10s 30s 1m ..."`` -> delays in ms (each times ``scale``, at least 1 ms)."""
    if not scale > 0:
        raise ConfigError(f"delay level scale {scale} must be > 0")
    levels = []
    for part in spec.split():
        unit = part[-1:]
        number = part[:-1]
        if unit not in _UNIT_MS or not number.isdigit() or int(number) <= 0:
            raise ConfigError(f"delay level {part!r}: want a positive number then s, m, h or d")
        levels.append(max(1, round(int(number) * _UNIT_MS[unit] * scale)))
    if not 1 <= len(levels) <= 255:
        raise ConfigError(f"{len(levels)} delay levels; want 1 to 255")
    return tuple(levels)


def retry_topic(group: str) -> str:
    return RETRY_PREFIX + group


def dlq_topic(group: str) -> str:
    return DLQ_PREFIX + group


def delay_level_of(msg: Message, levels: int) -> int:
    """The message's ``DELAY`` level (0: none); above the highest, the highest (RocketMQ)."""
    raw = msg.properties.get(PROPERTY_DELAY)
    if raw is None or raw == "":
        return 0
    try:
        level = int(raw)
    except ValueError:
        raise InvalidRequestError(f"property DELAY={raw!r} is not an integer") from None
    if level < 0:
        raise InvalidRequestError(f"property DELAY={level} is negative")
    return min(level, levels)


def to_schedule(msg: Message, level: int) -> Message:
    """The copy stored in ``SCHEDULE_TOPIC_XXXX`` until ``level``'s delay has passed."""
    assert level >= 1
    props = dict(msg.properties)
    props[PROPERTY_REAL_TOPIC] = msg.topic
    props[PROPERTY_REAL_QID] = str(msg.queue_id)
    props[PROPERTY_DELAY] = str(level)
    return replace(msg, topic=SCHEDULE_TOPIC, queue_id=level - 1, properties=props)


def delivered_copy(msg: Message, now_ms: int) -> Message:
    """The copy of a due scheduled message for its real topic and queue."""
    props = dict(msg.properties)
    topic = props.pop(PROPERTY_REAL_TOPIC, "")
    qid = props.pop(PROPERTY_REAL_QID, "")
    props.pop(PROPERTY_DELAY, None)
    if not topic or not qid.isdigit():
        raise InvalidRequestError(f"scheduled message {msg.uniq_id} has no real topic or queue")
    return replace(msg, topic=topic, queue_id=int(qid), properties=props, store_timestamp_ms=now_ms)


def derived_uniq_id(uniq_id: str, group: str, attempt: str) -> str:
    """A stable uniq id for the copy of ``uniq_id`` made for ``group``'s ``attempt``."""
    digest = hashlib.md5(f"{uniq_id}/{group}/{attempt}".encode(), usedforsecurity=False)
    return digest.hexdigest().upper()


def send_back_copy(
    msg: Message,
    group: str,
    delay_level: int,
    max_reconsume_times: int,
    now_ms: int,
    levels: int,
) -> Message:
    """The message a consumer's send-back stores: for ``%RETRY%{group}`` (delayed, through the
    schedule topic) or, after ``max_reconsume_times`` retries or with ``delay_level < 0``, for
    ``%DLQ%{group}``. ``msg`` is the message as consumed (possibly itself a retry copy)."""
    if not 0 <= max_reconsume_times <= MAX_RECONSUME_TIMES_LIMIT:
        raise InvalidRequestError(
            f"max_reconsume_times {max_reconsume_times} is outside [0, {MAX_RECONSUME_TIMES_LIMIT}]"
        )
    props = dict(msg.properties)
    origin_topic = props.get(PROPERTY_RETRY_TOPIC) or msg.topic
    if msg.topic.startswith(DLQ_PREFIX):
        raise InvalidRequestError("a dead-lettered message is not sent back")
    props[PROPERTY_RETRY_TOPIC] = origin_topic
    props.setdefault(PROPERTY_ORIGIN_MESSAGE_ID, msg.uniq_id)
    props.pop(PROPERTY_DELAY, None)
    props.pop(PROPERTY_REAL_TOPIC, None)
    props.pop(PROPERTY_REAL_QID, None)
    attempt = msg.reconsume_times + 1
    origin_id = props[PROPERTY_ORIGIN_MESSAGE_ID]
    if attempt > max_reconsume_times or delay_level < 0:
        props[PROPERTY_DLQ_ORIGIN_TOPIC] = origin_topic
        return replace(
            msg,
            topic=dlq_topic(group),
            queue_id=0,
            properties=props,
            store_timestamp_ms=now_ms,
            uniq_id=derived_uniq_id(origin_id, group, "DLQ"),
            reconsume_times=attempt,
        )
    level = delay_level if delay_level > 0 else RETRY_FIRST_LEVEL + msg.reconsume_times
    retry = replace(
        msg,
        topic=retry_topic(group),
        queue_id=0,
        properties=props,
        store_timestamp_ms=now_ms,
        uniq_id=derived_uniq_id(origin_id, group, str(attempt)),
        reconsume_times=attempt,
    )
    return to_schedule(retry, min(level, levels))


def encode_schedule_header(level: int, from_offset: int, to_offset: int) -> bytes:
    assert 1 <= level <= 255 and 0 <= from_offset < to_offset
    return SCHEDULE_HEADER.pack(SCHEDULE_VERSION, level, from_offset, to_offset)


def decode_schedule_header(body: bytes | memoryview) -> tuple[int, int, int]:
    """``(level, from_offset, to_offset)``; ValueError when malformed."""
    if len(body) < SCHEDULE_HEADER.size:
        raise ValueError("truncated schedule entry")
    version, level, from_offset, to_offset = SCHEDULE_HEADER.unpack_from(body, 0)
    if version != SCHEDULE_VERSION or level < 1 or not 0 <= from_offset < to_offset:
        raise ValueError(f"schedule entry v{version} level {level} [{from_offset}, {to_offset})")
    return level, from_offset, to_offset


def due_ms(store_timestamp_ms: int, level: int, delays_ms: Sequence[int]) -> int:
    return store_timestamp_ms + delays_ms[min(level, len(delays_ms)) - 1]
