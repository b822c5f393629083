"""Delays, retries and dead letters: the pure rules (broker.state.delayrules) and the state
machine's schedule entries (delivery and progress in one entry; a second proposal is skipped
whole)."""

from __future__ import annotations

import pytest

from broker.state.delayrules import (
    DEFAULT_DELAY_LEVELS,
    PROPERTY_DELAY,
    PROPERTY_DLQ_ORIGIN_TOPIC,
    PROPERTY_ORIGIN_MESSAGE_ID,
    PROPERTY_REAL_QID,
    PROPERTY_REAL_TOPIC,
    PROPERTY_RETRY_TOPIC,
    SCHEDULE_TOPIC,
    decode_schedule_header,
    delay_level_of,
    delivered_copy,
    derived_uniq_id,
    due_ms,
    encode_schedule_header,
    parse_delay_levels,
    send_back_copy,
    to_schedule,
)
from broker.state.errors import InvalidRequestError
from broker.state.message import Message

LEVELS = parse_delay_levels(DEFAULT_DELAY_LEVELS)


def msg(queue_id: int, n: int, *, ts: int) -> Message:
    return Message(
        topic="T",
        queue_id=queue_id,
        body=f"body-{n}".encode(),
        store_timestamp_ms=ts,
        uniq_id=f"{n:032X}",
    )


def test_delay_levels_parse_and_scale() -> None:
    assert len(LEVELS) == 18
    assert LEVELS[:5] == (1000, 5000, 10_000, 30_000, 60_000) and LEVELS[-1] == 7_200_000
    assert parse_delay_levels("1s 10m 2h 1d", 0.01) == (10, 6000, 72_000, 864_000)
    assert parse_delay_levels("1s", 1e-6) == (1,)  # never 0 ms
    for bad in ("", "1x", "0s", "-1s", "s", "1.5s"):
        with pytest.raises(ValueError):
            parse_delay_levels(bad)
    with pytest.raises(ValueError):
        parse_delay_levels("1s", 0)


def test_delay_property_rewrites_to_the_schedule_queue_and_back() -> None:
    m = msg(2, 1, ts=5000)
    m = type(m)(**{**{f: getattr(m, f) for f in m.__slots__}, "properties": {PROPERTY_DELAY: "3"}})
    assert delay_level_of(m, 18) == 3
    scheduled = to_schedule(m, 3)
    assert (scheduled.topic, scheduled.queue_id) == (SCHEDULE_TOPIC, 2)
    assert scheduled.properties[PROPERTY_REAL_TOPIC] == "T"
    assert scheduled.properties[PROPERTY_REAL_QID] == "2"
    assert due_ms(scheduled.store_timestamp_ms, 3, LEVELS) == 15_000
    back = delivered_copy(scheduled, now_ms=15_001)
    assert (back.topic, back.queue_id, back.store_timestamp_ms) == ("T", 2, 15_001)
    assert back.uniq_id == m.uniq_id and back.body == m.body
    assert PROPERTY_REAL_TOPIC not in back.properties and PROPERTY_DELAY not in back.properties
    # Above the last level: the last level (RocketMQ); garbage: a clear error.
    big = type(m)(**{**{f: getattr(m, f) for f in m.__slots__}, "properties": {"DELAY": "99"}})
    assert delay_level_of(big, 18) == 18
    for raw in ("x", "-1"):
        bad = type(m)(**{**{f: getattr(m, f) for f in m.__slots__}, "properties": {"DELAY": raw}})
        with pytest.raises(InvalidRequestError):
            delay_level_of(bad, 18)


def test_send_back_goes_to_retry_with_growing_levels_then_to_the_dlq() -> None:
    original = msg(1, 7, ts=1000)
    current = original
    ids = set()
    for attempt in range(1, 4):
        copy = send_back_copy(current, "G", 0, 3, now_ms=2000 * attempt, levels=18)
        assert copy.topic == SCHEDULE_TOPIC
        assert copy.properties[PROPERTY_REAL_TOPIC] == "%RETRY%G"
        assert copy.properties[PROPERTY_DELAY] == str(2 + attempt)  # levels 3, 4, 5
        assert copy.properties[PROPERTY_RETRY_TOPIC] == "T"
        assert copy.properties[PROPERTY_ORIGIN_MESSAGE_ID] == original.uniq_id
        assert copy.reconsume_times == attempt
        assert copy.uniq_id == derived_uniq_id(original.uniq_id, "G", str(attempt))
        ids.add(copy.uniq_id)
        current = delivered_copy(copy, now_ms=2000 * attempt + 1)
        assert current.topic == "%RETRY%G"
    assert len(ids) == 3 and original.uniq_id not in ids
    dead = send_back_copy(current, "G", 0, 3, now_ms=9000, levels=18)
    assert (dead.topic, dead.queue_id, dead.reconsume_times) == ("%DLQ%G", 0, 4)
    assert dead.properties[PROPERTY_DLQ_ORIGIN_TOPIC] == "T"
    assert dead.properties[PROPERTY_ORIGIN_MESSAGE_ID] == original.uniq_id
    # delay_level < 0: straight to the DLQ; explicit level: that level.
    assert send_back_copy(original, "G", -1, 16, 1, 18).topic == "%DLQ%G"
    assert send_back_copy(original, "G", 7, 16, 1, 18).properties[PROPERTY_DELAY] == "7"
    with pytest.raises(InvalidRequestError):
        send_back_copy(dead, "G", 0, 16, 1, 18)
    with pytest.raises(InvalidRequestError):
        send_back_copy(original, "G", 0, 65, 1, 18)


def test_schedule_header_round_trip_and_validation() -> None:
    assert decode_schedule_header(encode_schedule_header(4, 10, 12)) == (4, 10, 12)
    for bad in (b"", b"\x02" + encode_schedule_header(4, 10, 12)[1:]):
        with pytest.raises(ValueError):
            decode_schedule_header(bad)
