"""Timed delivery (RocketMQ 5's timer messages): the rules, as pure functions.

A message with ``TIMER_DELIVER_MS`` (a delivery time in ms since the epoch, at most
``timerMaxDelaySec`` ahead) waits in ``rmq_sys_wheel_timer`` until that time, then a copy goes
to its real topic and queue. The payload is stored once, in the commitlog; what moves is a
21-byte *hop record*. The design is a hierarchy of FIFO queues, one per **timer level**:

- level 0 holds what is due within :data:`TIMER_PRECISION_MS` of being filed;
- level ``k >= 1`` holds what had ``[P * 2**(k-1), P * 2**k)`` ms to go when filed, and is
  looked at again exactly ``P * 2**(k-1)`` ms after being filed (:func:`look_ms`).

Every record of a level waits the same time, so each level's queue is in look-at order (as
each delay level's queue is): the leader's timer loop (:mod:`broker.components.timermoves`) reads
only the head of each level, never a whole level. At a record's look-at time it has less than
``P * 2**(k-1)`` ms to go, so it moves to a lower level (a hop record, pointing at the stored
message) or, once due, is delivered. A message waits through at most one record per level
(about ``log2(delay / P)`` of them, 20 for 3 days), each filed in its level's ConsumeQueue.

Failover: each move is **one log entry** (:data:`broker.state.records.ENTRY_TIMER`,
:func:`encode_timer_header`) holding the level's records ``[from, to)`` it consumed, the hop
records for lower levels and the copies to deliver; applying it advances the level's offset,
files the hops and stores the copies on every member at once, and an entry not starting at the
level's current offset (a deposed leader's, or a repeat) is skipped whole. So a new leader
resumes exactly where the committed log says: nothing delivered twice by the broker, nothing
lost, nothing early.
"""

from __future__ import annotations

import struct
from dataclasses import replace

from broker.state.errors import InvalidRequestError
from broker.state.message import Message
from broker.state.names import TIMER_TOPIC
from mqerrors import codes as E
from msgcodec import PROPERTY_DELAY, PROPERTY_REAL_QID, PROPERTY_REAL_TOPIC
from msgcodec import PROPERTY_TIMER_DELIVER_MS as PROPERTY_TIMER_DELIVER_MS

# Level 0 holds what is due within this much of being filed: the loop waits at its head for
# the head's due time, so a record behind it is at most this late (plus the loop's wake-up and
# one commit). RocketMQ 5's timerPrecisionMs defaults to 1 s; 250 ms keeps deliveries well
# within 1 s of their time. A constant, not a key: the records already filed in each level
# were filed for this precision.
TIMER_PRECISION_MS = 250
# Levels 0..31: the top one waits P * 2**30 ms (8.5 years), beyond any configurable maximum.
MAX_TIMER_LEVELS = 32
# RocketMQ 5's timerMaxDelaySec default (3 days), and the most it may be set to (a year: the
# commitlog's retention must keep a message until it is delivered).
DEFAULT_TIMER_MAX_DELAY_S = 259_200
MAX_TIMER_MAX_DELAY_S = 366 * 86_400

TIMER_VERSION = 1
# version, level, from offset, to offset, the leader's clock (ms), number of hop records
TIMER_HEADER = struct.Struct(">BBqqqI")
# target level, the timed message's commitlog position and size, its delivery time (ms)
HOP_RECORD = struct.Struct(">BQIq")
HOP_RECORD_SIZE = HOP_RECORD.size  # 21; a stored message is at least 72 bytes
_I64_MAX = (1 << 63) - 1


class InvalidDeliveryTimeError(InvalidRequestError):
    """``TIMER_DELIVER_MS`` is not a time in ms, lies beyond the broker's ``timerMaxDelaySec``,
    or comes with a ``DELAY`` level too. Nothing of the send is stored."""

    code = E.INVALID_DELIVERY_TIME


def level_of(remaining_ms: int) -> int:
    """The timer level for a record with ``remaining_ms`` to go: 0 below the precision, else
    ``k`` with ``P * 2**(k-1) <= remaining < P * 2**k`` (the top level for anything beyond)."""
    if remaining_ms < TIMER_PRECISION_MS:
        return 0
    return min((remaining_ms // TIMER_PRECISION_MS).bit_length(), MAX_TIMER_LEVELS - 1)


def level_wait_ms(level: int) -> int:
    """How long a record waits in ``level`` before it is looked at again (0 for level 0,
    whose records are looked at by their due time)."""
    return 0 if level == 0 else TIMER_PRECISION_MS << (level - 1)


def look_ms(level: int, filed_ms: int) -> int:
    """When the leader looks at a record of ``level`` filed at ``filed_ms`` (for level 0 the
    filing time: the record's own due time decides)."""
    return filed_ms + level_wait_ms(level)


def deliver_ms_of(msg: Message) -> int | None:
    """The delivery time a message asks for (``TIMER_DELIVER_MS``), None when it asks none."""
    raw = msg.properties.get(PROPERTY_TIMER_DELIVER_MS)
    if raw is None:
        return None
    if not raw.isascii() or not raw.isdigit() or len(raw) > 18:
        raise InvalidDeliveryTimeError(
            f"{PROPERTY_TIMER_DELIVER_MS}={raw[:32]!r} is not a time in ms since the epoch"
        )
    if PROPERTY_DELAY in msg.properties:
        raise InvalidDeliveryTimeError(
            f"a message asks for {PROPERTY_TIMER_DELIVER_MS} and a {PROPERTY_DELAY} level: one only"
        )
    return int(raw)


def check_deliver_ms(deliver_ms: int, now_ms: int, max_delay_ms: int) -> None:
    """Raise :class:`InvalidDeliveryTimeError` for a delivery time further than
    ``max_delay_ms`` after ``now_ms`` (RocketMQ 5: ``timerMaxDelaySec``)."""
    if deliver_ms - now_ms > max_delay_ms:
        raise InvalidDeliveryTimeError(
            f"delivery time {deliver_ms} is {deliver_ms - now_ms} ms ahead, more than the"
            f" broker's maximum of {max_delay_ms} ms (timerMaxDelaySec)"
        )


def to_timer(msg: Message, deliver_ms: int) -> Message:
    """The copy stored in the timer topic until ``deliver_ms`` (its store time is now), in
    the level for the time it has to go."""
    props = dict(msg.properties)
    props[PROPERTY_REAL_TOPIC] = msg.topic
    props[PROPERTY_REAL_QID] = str(msg.queue_id)
    level = level_of(deliver_ms - msg.store_timestamp_ms)
    return replace(msg, topic=TIMER_TOPIC, queue_id=level, properties=props)


def encode_timer_header(
    level: int, from_offset: int, to_offset: int, now_ms: int, hops: int
) -> bytes:
    assert 0 <= level < MAX_TIMER_LEVELS and 0 <= from_offset < to_offset and hops >= 0
    return TIMER_HEADER.pack(TIMER_VERSION, level, from_offset, to_offset, now_ms, hops)


def decode_timer_header(body: bytes | memoryview) -> tuple[int, int, int, int, int]:
    """``(level, from_offset, to_offset, now_ms, hops)``; ValueError when malformed."""
    if len(body) < TIMER_HEADER.size:
        raise ValueError("truncated timer entry")
    version, level, from_offset, to_offset, now_ms, hops = TIMER_HEADER.unpack_from(body, 0)
    if (
        version != TIMER_VERSION
        or level >= MAX_TIMER_LEVELS
        or not 0 <= from_offset < to_offset
        or not 0 <= now_ms <= _I64_MAX
        or hops > to_offset - from_offset
        or len(body) < TIMER_HEADER.size + hops * HOP_RECORD_SIZE
    ):
        raise ValueError(
            f"timer entry v{version} level {level} [{from_offset}, {to_offset}) hops {hops}"
        )
    return level, from_offset, to_offset, now_ms, hops


def encode_hop(level: int, position: int, size: int, deliver_ms: int) -> bytes:
    return HOP_RECORD.pack(level, position, size, deliver_ms)


def decode_hop(raw: bytes | memoryview, at: int = 0) -> tuple[int, int, int, int]:
    """``(target level, position, size, deliver_ms)``; ValueError when out of range."""
    level, position, size, deliver_ms = HOP_RECORD.unpack_from(raw, at)
    if level >= MAX_TIMER_LEVELS or size <= HOP_RECORD_SIZE or not 0 <= deliver_ms <= _I64_MAX:
        raise ValueError(f"hop record level {level} size {size} deliver at {deliver_ms}")
    return level, position, size, deliver_ms
