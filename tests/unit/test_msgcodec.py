"""The stored message codec (msgcodec): layout, encoders, the fast and careful decoders, batches,
hashes and message ids (docs/FORMAT.md, "Broker: Message", "Batch", "Message ids")."""

from __future__ import annotations

import dataclasses
import struct
from collections.abc import Callable

import crc32c
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import msgcodec as m
from msgcodec import Message
from msgcodec.decode import _decode_careful, _decode_careful_run, _decode_fast
from msgcodec.errors import (
    CodecError,
    CorruptMessageError,
    InvalidMessageError,
    InvalidMessageIdError,
    InvalidTopicError,
    MessageBodyEmptyError,
    MessageTooLargeError,
    PropertiesTooLargeError,
)

UNIQ = "0A0000010D2B1234ABCD00000000002A"


def make(**changes: object) -> Message:
    base = Message(
        topic="TopicTest",
        queue_id=3,
        body=b"hello world",
        tags="TagA",
        keys=("order-1", "user-7"),
        properties={"a": "1", "b": "two"},
        born_host="10.0.0.7:51234",
        born_timestamp_ms=1_700_000_000_000,
        store_timestamp_ms=1_700_000_000_123,
        producer_group="pg",
        uniq_id=UNIQ,
        reconsume_times=2,
        flag=-5,
        sys_flag=7,
    )
    return dataclasses.replace(base, **changes)  # type: ignore[arg-type]


# -- strategies -------------------------------------------------------------------------------

topics = st.text(
    alphabet="%|abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789_-",
    min_size=1,
    max_size=m.MAX_TOPIC_LENGTH,
)
# Any Unicode but surrogates (not encodable in UTF-8).
texts = st.text(alphabet=st.characters(codec="utf-8"), max_size=40)
keys = st.lists(
    st.text(alphabet=st.characters(codec="utf-8", exclude_characters=" "), min_size=1),
    max_size=5,
).map(tuple)
prop_text = st.text(
    alphabet=st.characters(codec="utf-8", exclude_characters="\x01\x02"), max_size=20
)
properties = st.dictionaries(prop_text.filter(bool), prop_text, max_size=6)
i32 = st.integers(min_value=-(1 << 31), max_value=(1 << 31) - 1)
u31 = st.integers(min_value=0, max_value=(1 << 31) - 1)
ts = st.integers(min_value=0, max_value=(1 << 63) - 1)
uniq_ids = st.binary(min_size=16, max_size=16).map(lambda b: b.hex().upper())

messages = st.builds(
    Message,
    topic=topics,
    queue_id=u31,
    body=st.binary(min_size=1, max_size=300),
    tags=texts,
    keys=keys,
    properties=properties,
    born_host=st.text(max_size=50),
    born_timestamp_ms=ts,
    store_timestamp_ms=ts,
    producer_group=st.text(alphabet="abcXYZ_-%", max_size=30),
    uniq_id=uniq_ids,
    reconsume_times=u31,
    flag=i32,
    sys_flag=i32,
)


# -- round trips ------------------------------------------------------------------------------


@settings(max_examples=200, deadline=None)
@given(messages)
def test_message_round_trip(msg: Message) -> None:
    raw = m.encode_message(msg)
    assert m.decode_message(raw) == msg
    info = m.read_dispatch(raw)
    assert info == m.DispatchInfo(
        0,
        len(raw),
        msg.topic,
        msg.queue_id,
        m.tags_hash(msg.tags),
        msg.keys,
        msg.uniq_id,
        msg.store_timestamp_ms,
    )
    # Canonical: the same message always encodes to the same bytes.
    assert m.encode_message(m.decode_message(raw)) == raw
    # A row is the size, then the message's fields in MESSAGE_ROW_FIELDS' order.
    row = m.decode_row(raw)
    assert len(row) == len(m.MESSAGE_ROW_FIELDS) and row[0] == len(raw)
    assert row[1:] == tuple(getattr(msg, f) for f in m.MESSAGE_ROW_FIELDS[1:])
    assert m.MESSAGE_ROW_FIELDS[m.ROW_UNIQ_ID] == "uniq_id" and row[m.ROW_UNIQ_ID] == msg.uniq_id


@settings(max_examples=80, deadline=None)
@given(st.lists(messages, min_size=1, max_size=8))
def test_batch_round_trip(batch: list[Message]) -> None:
    body, offsets = m.encode_batch(batch)
    assert offsets[0] == m.BATCH_HEADER_SIZE
    assert m.batch_count(body) == len(batch)
    assert m.is_batch(body)
    assert m.decode_batch(body) == batch
    seen = list(m.iter_batch(body))
    assert [o for o, _, _ in seen] == offsets
    for (offset, size, view), msg in zip(seen, batch, strict=True):
        assert len(view) == size
        # Each message decodes on its own, from the batch or from a copy of its bytes.
        assert m.decode_message(body, offset) == msg
        assert m.decode_message(bytes(view)) == msg
    dispatch = list(m.iter_dispatch(body))
    assert [d.offset for d in dispatch] == offsets
    assert [d.size for d in dispatch] == [s for _, s, _ in seen]
    assert [(d.topic, d.queue_id, d.keys) for d in dispatch] == [
        (x.topic, x.queue_id, x.keys) for x in batch
    ]


def test_layout_is_documented_bytes() -> None:
    msg = make(properties={"b": "2", "a": "1"}, keys=("k1", "k2"))
    raw = m.encode_message(msg)
    total, _magic, crc = struct.unpack_from(">III", raw, 0)
    assert total == len(raw)
    assert raw[4:8] == b"RMSG"
    assert crc == crc32c.crc32c(raw[12:])
    assert struct.unpack_from(">HH", raw, 12) == (1, 0)
    assert struct.unpack_from(">iiii", raw, 16) == (3, -5, 7, 2)
    assert struct.unpack_from(">qqq", raw, 32) == (
        msg.born_timestamp_ms,
        msg.store_timestamp_ms,
        m.java_string_hash("TagA"),
    )
    assert raw[56:72].hex().upper() == UNIQ
    at = 72
    assert raw[at] == 9 and raw[at + 1 : at + 10] == b"TopicTest"
    at += 10
    assert raw[at : at + 2] == b"\x00\x04" and raw[at + 2 : at + 6] == b"TagA"
    at += 6
    assert raw[at : at + 2] == b"\x00\x05" and raw[at + 2 : at + 7] == b"k1 k2"
    at += 7
    assert raw[at] == 2 and raw[at + 1 : at + 3] == b"pg"
    at += 3
    assert raw[at] == 14 and raw[at + 1 : at + 15] == b"10.0.0.7:51234"
    at += 15
    # Properties sorted by name: canonical bytes.
    assert raw[at : at + 2] == b"\x00\x08" and raw[at + 2 : at + 10] == b"a\x011\x02b\x012\x02"
    at += 10
    assert struct.unpack_from(">I", raw, at)[0] == 11 and raw[at + 4 :] == b"hello world"


def test_batch_header_bytes() -> None:
    body, offsets = m.encode_batch([make(), make(queue_id=4)])
    assert body[:4] == b"RMBT"
    assert body[4] == 1 and body[5:8] == b"\0\0\0"
    assert struct.unpack_from(">I", body, 8)[0] == 2
    assert offsets == [12, 12 + struct.unpack_from(">I", body, 12)[0]]


# -- corruption -------------------------------------------------------------------------------


@settings(max_examples=150, deadline=None)
@given(messages, st.data())
def test_flipped_bit_is_detected(msg: Message, data: st.DataObject) -> None:
    raw = bytearray(m.encode_message(msg))
    bit = data.draw(st.integers(min_value=0, max_value=len(raw) * 8 - 1))
    raw[bit // 8] ^= 1 << (bit % 8)
    with pytest.raises(CorruptMessageError):
        m.decode_message(bytes(raw))
    with pytest.raises(CorruptMessageError):
        m.read_dispatch(bytes(raw))


def _outcome(read: Callable[[], object]) -> object:
    """What ``read()`` returns, or the corruption it reports (as text, to compare); any other
    error is named too (a fast path may raise anything: its caller falls back)."""
    try:
        return read()
    except CorruptMessageError as exc:
        return f"corrupt: {exc}"
    except Exception as exc:
        return f"fast-only: {type(exc).__name__}"


def _damaged(data: st.DataObject, good: bytes) -> tuple[bytes, bytes, bytes]:
    """``good`` with 1-3 bytes overwritten, cut short, and both."""
    damaged = bytearray(good)
    for _ in range(data.draw(st.integers(min_value=1, max_value=3))):
        at = data.draw(st.integers(min_value=0, max_value=len(good) - 1))
        damaged[at] = data.draw(st.integers(min_value=0, max_value=255))
    cut = data.draw(st.integers(min_value=0, max_value=len(good)))
    return bytes(damaged), good[:cut], bytes(damaged[:cut])


def _dispatch_or_error(body: bytes) -> object:
    return _outcome(lambda: [tuple(d) for d in m.iter_dispatch(body, verify_crc=False)])


def _scan_or_error(body: bytes) -> object:
    return _outcome(lambda: [tuple(r) for r in m.scan_dispatch(body)])


@settings(max_examples=300, deadline=None)
@given(st.lists(messages, min_size=1, max_size=6), st.data())
def test_fast_dispatch_scan_agrees_with_the_careful_reader(
    batch: list[Message], data: st.DataObject
) -> None:
    """The apply path's scan reads exactly what iter_dispatch reads, and fails exactly where
    it fails (same error), on whole batches, flipped bytes and truncations."""
    body, _ = m.encode_batch(batch)
    assert _scan_or_error(body) == _dispatch_or_error(body)
    assert isinstance(_scan_or_error(body), list)
    for variant in _damaged(data, body):
        assert _scan_or_error(variant) == _dispatch_or_error(variant)


@settings(max_examples=100, deadline=None)
@given(st.lists(messages, min_size=1, max_size=3), st.data())
def test_truncated_buffers_raise_clear_errors(batch: list[Message], data: st.DataObject) -> None:
    body, _ = m.encode_batch(batch)
    cut = data.draw(st.integers(min_value=0, max_value=len(body) - 1))
    with pytest.raises(CorruptMessageError):
        list(m.iter_batch(body[:cut]))
    with pytest.raises(CorruptMessageError):
        m.decode_batch(body[:cut])
    with pytest.raises(CorruptMessageError):
        list(m.iter_dispatch(body[:cut]))
    raw = m.encode_message(batch[0])
    cut = data.draw(st.integers(min_value=0, max_value=len(raw) - 1))
    with pytest.raises(CorruptMessageError):
        m.decode_message(raw[:cut])
    # Without the CRC check, field bounds still catch it; never IndexError/struct.error.
    with pytest.raises(CorruptMessageError):
        m.decode_message(raw[:cut], verify_crc=False)


@settings(max_examples=200, deadline=None)
@given(st.binary(max_size=200), st.integers(min_value=0, max_value=50))
def test_garbage_never_escapes_as_other_errors(garbage: bytes, offset: int) -> None:
    with pytest.raises(CorruptMessageError):
        m.decode_message(garbage, offset, verify_crc=False)
    with pytest.raises(CorruptMessageError):
        m.decode_rows(garbage, offset, 2, verify_crc=False)
    with pytest.raises(CorruptMessageError):
        list(m.iter_batch(garbage))


def test_negative_offsets_are_refused_not_read_from_the_end() -> None:
    two = m.encode_message(make()) * 2
    for offset in (-len(two) // 2, -1):
        with pytest.raises(CorruptMessageError, match="negative offset"):
            m.decode_row(two, offset)
        # The fast reader refuses too (struct and slices would count from the end).
        with pytest.raises(ValueError):
            _decode_fast(two, offset, 1, True)


def test_field_overrun_without_crc_names_the_field() -> None:
    raw = bytearray(m.encode_message(make()))
    raw[72] = 200  # topic length beyond the message
    with pytest.raises(CorruptMessageError, match="topic length"):
        m.decode_message(bytes(raw), verify_crc=False)
    with pytest.raises(CorruptMessageError, match="CRC mismatch"):
        m.decode_message(bytes(raw))


def test_batch_with_trailing_bytes_or_wrong_count() -> None:
    body, _ = m.encode_batch([make()])
    with pytest.raises(CorruptMessageError, match="after the last message"):
        list(m.iter_batch(body + m.encode_message(make())))
    bad = bytearray(body)
    bad[11] = 0
    with pytest.raises(CorruptMessageError, match="no message"):
        list(m.iter_batch(bytes(bad)))
    assert not m.is_batch(m.encode_message(make()))


def test_corrupt_error_reports_offset_in_batch() -> None:
    body, offsets = m.encode_batch([make(), make(), make()])
    bad = bytearray(body)
    bad[offsets[2] + 40] ^= 0xFF
    it = m.iter_batch(bytes(bad))
    assert next(it)[0] == offsets[0]
    assert next(it)[0] == offsets[1]
    with pytest.raises(CorruptMessageError) as info:
        next(it)
    assert info.value.offset == offsets[2]
    assert info.value.code == "CORRUPT_MESSAGE"


# -- validation -------------------------------------------------------------------------------


INVALID_CASES: list[tuple[dict[str, object], type[CodecError], str | None]] = [
    ({"topic": ""}, InvalidTopicError, "INVALID_TOPIC"),
    ({"topic": "a" * 128}, InvalidTopicError, "INVALID_TOPIC"),
    ({"topic": "has space"}, InvalidTopicError, "INVALID_TOPIC"),
    ({"topic": "tópico"}, InvalidTopicError, "INVALID_TOPIC"),
    ({"topic": "a/b"}, InvalidTopicError, "INVALID_TOPIC"),
    ({"body": b""}, MessageBodyEmptyError, "MESSAGE_BODY_EMPTY"),
    ({"keys": ("a b",)}, InvalidMessageError, "INVALID_MESSAGE"),
    ({"keys": ("",)}, InvalidMessageError, "INVALID_MESSAGE"),
    ({"keys": ["k"]}, InvalidMessageError, "INVALID_MESSAGE"),
    ({"properties": {"a\x01": "x"}}, InvalidMessageError, "INVALID_MESSAGE"),
    ({"properties": {"a": "x\x02"}}, InvalidMessageError, "INVALID_MESSAGE"),
    ({"properties": {"": "x"}}, InvalidMessageError, "INVALID_MESSAGE"),
    ({"properties": {"p": "x" * 32768}}, PropertiesTooLargeError, "PROPERTIES_TOO_LARGE"),
    ({"tags": "t" * 20000, "keys": ("k" * 13000,)}, PropertiesTooLargeError, None),
    ({"queue_id": -1}, InvalidMessageError, None),
    ({"queue_id": 1 << 31}, InvalidMessageError, None),
    ({"flag": 1 << 31}, InvalidMessageError, None),
    ({"reconsume_times": -1}, InvalidMessageError, None),
    ({"store_timestamp_ms": -1}, InvalidMessageError, None),
    ({"producer_group": "g" * 256}, InvalidMessageError, None),
    ({"born_host": "h" * 256}, InvalidMessageError, None),
    ({"tags": "\ud800"}, InvalidMessageError, None),
    ({"uniq_id": ""}, InvalidMessageIdError, "INVALID_MESSAGE_ID"),
    ({"uniq_id": UNIQ.lower()}, InvalidMessageIdError, "INVALID_MESSAGE_ID"),
]


@pytest.mark.parametrize(("changes", "error", "code"), INVALID_CASES)
def test_invalid_messages_are_rejected(
    changes: dict[str, object], error: type[CodecError], code: str | None
) -> None:
    with pytest.raises(error) as info:
        m.encode_message(make(**changes))
    assert isinstance(info.value, CodecError)
    if code is not None:
        assert info.value.code == code


def test_topic_limits_and_charset() -> None:
    m.validate_topic("a" * m.MAX_TOPIC_LENGTH)
    m.validate_topic("%RETRY%group_1|x-y")
    m.encode_message(make(properties={"p": "x" * (m.MAX_PROPERTIES_BYTES - 100)}, keys=()))


def test_body_size_limit() -> None:
    limit = 1024
    m.encode_message(make(body=b"x" * limit), max_message_size_bytes=limit)
    with pytest.raises(MessageTooLargeError) as info:
        m.encode_message(make(body=b"x" * (limit + 1)), max_message_size_bytes=limit)
    assert info.value.code == "MESSAGE_TOO_LARGE"
    with pytest.raises(MessageTooLargeError):
        m.encode_batch([make(), make(body=b"x" * (limit + 1))], max_message_size_bytes=limit)
    m.encode_message(make(body=b"x" * m.DEFAULT_MAX_MESSAGE_SIZE_BYTES))
    with pytest.raises(MessageTooLargeError):
        m.encode_message(make(body=b"x" * (m.DEFAULT_MAX_MESSAGE_SIZE_BYTES + 1)))
    with pytest.raises(InvalidMessageError):
        m.encode_batch([])


# -- hashes -----------------------------------------------------------------------------------


def java_hash_reference(s: str) -> int:
    """Java's definition, literally: sum of s[i] * 31^(n-1-i) over UTF-16 code units, as int."""
    units = [
        int.from_bytes(s.encode("utf-16-be")[i : i + 2], "big")
        for i in range(0, len(s.encode("utf-16-be")), 2)
    ]
    n = len(units)
    total: int = sum(u * 31 ** (n - 1 - i) for i, u in enumerate(units)) % (1 << 32)
    return total - (1 << 32) if total >= 1 << 31 else total


@pytest.mark.parametrize(
    ("s", "expected"),
    [
        ("", 0),
        ("a", 97),
        ("Aa", 2112),
        ("BB", 2112),
        ("hello", 99162322),
        ("TagA", 2598919),
        ("TagB", 2598920),
        ("polygenelubricants", -(1 << 31)),  # a well-known Integer.MIN_VALUE
        ("é", 233),
        ("😀", 1772899),  # surrogate pair D83D DE00
    ],
)
def test_java_string_hash_known_values(s: str, expected: int) -> None:
    assert m.java_string_hash(s) == expected
    assert java_hash_reference(s) == expected


@given(texts)
def test_java_string_hash_matches_definition(s: str) -> None:
    h = m.java_string_hash(s)
    assert -(1 << 31) <= h < 1 << 31
    assert h == java_hash_reference(s)


def test_tags_hash() -> None:
    assert m.tags_hash("") == 0
    assert m.tags_hash("TagA") == m.java_string_hash("TagA")


# -- message ids ------------------------------------------------------------------------------


@given(
    st.ip_addresses(v=4).map(str),
    st.integers(min_value=0, max_value=65535),
    st.integers(min_value=0, max_value=(1 << 63) - 1),
)
def test_offset_msg_id_round_trip(ip: str, port: int, position: int) -> None:
    msg_id = m.encode_offset_msg_id(ip, port, position)
    assert len(msg_id) == 32 and msg_id == msg_id.upper()
    assert m.decode_offset_msg_id(msg_id) == (ip, port, position)
    assert m.decode_offset_msg_id(msg_id.lower()) == (ip, port, position)


def test_offset_msg_id_layout_and_errors() -> None:
    msg_id = m.encode_offset_msg_id("192.168.0.1", 10911, 0x0102030405060708)
    assert msg_id == "C0A80001" + "00002A9F" + "0102030405060708"
    for bad in ("", "XYZ", "C0A80001" * 3, "G" * 32):
        with pytest.raises(InvalidMessageIdError):
            m.decode_offset_msg_id(bad)
    with pytest.raises(InvalidMessageIdError):
        m.decode_offset_msg_id("C0A80001" + "00010000" + "0000000000000000")  # port 65536
    with pytest.raises(InvalidMessageIdError):
        m.encode_offset_msg_id("::1", 1, 1)
    with pytest.raises(InvalidMessageIdError):
        m.encode_offset_msg_id("1.2.3.4", 70000, 1)
    with pytest.raises(InvalidMessageIdError):
        m.encode_offset_msg_id("1.2.3.4", 1, -1)


def test_uniq_id_generator() -> None:
    now = [1_763_700_000_000]  # 2025-11-21 UTC
    gen = m.UniqIdGenerator(
        ip="10.1.2.3", pid=0x12345, instance_hash=0xCAFEBABE, clock_ms=lambda: now[0]
    )
    ids = [gen.next_id() for _ in range(1000)]
    assert len(set(ids)) == 1000
    assert all(len(i) == 32 and i == i.upper() for i in ids)
    assert ids[0].startswith("0A010203" + "2345" + "CAFEBABE")
    info = m.parse_uniq_id(ids[5], now_ms=now[0] + 10)
    assert info == m.UniqIdInfo("10.1.2.3", 0x2345, 0xCAFEBABE, now[0], 5)
    # Resolved against a reference time in the next month: the id's month is the one before.
    assert m.parse_uniq_id(ids[5], now_ms=now[0] + 20 * 86_400_000).timestamp_ms == now[0]
    # Crossing into the next month resets the time part.
    now[0] = 1_764_547_200_000  # 2025-12-01 00:00:00 UTC
    later = gen.next_id()
    assert later[20:28] == "00000000"
    assert m.parse_uniq_id(later, now_ms=now[0]).timestamp_ms == now[0]
    # The ids are valid message uniq ids.
    m.encode_message(make(uniq_id=later))


def test_uniq_id_generator_defaults() -> None:
    gen = m.UniqIdGenerator()
    a, b = gen.next_id(), gen.next_id()
    assert a != b and a[:20] == b[:20]
    assert abs(m.parse_uniq_id(a).timestamp_ms - m.parse_uniq_id(b).timestamp_ms) < 60_000


# -- the send path's encoder -------------------------------------------------------------------


@dataclasses.dataclass
class Fields:
    """A request message as ``encode_batch_fields`` reads it (the broker API's field names)."""

    queue_id: int
    body: bytes
    tags: str
    keys: tuple[str, ...]
    properties: dict[str, str]
    born_host: str
    born_timestamp_ms: int
    producer_group: str
    msg_id: str
    reconsume_times: int
    flag: int
    sys_flag: int

    @classmethod
    def of(cls, msg: Message) -> Fields:
        return cls(
            msg.queue_id,
            msg.body,
            msg.tags,
            msg.keys,
            msg.properties,
            msg.born_host,
            msg.born_timestamp_ms,
            msg.producer_group,
            msg.uniq_id,
            msg.reconsume_times,
            msg.flag,
            msg.sys_flag,
        )


def _fresh_ids() -> str:
    return "F" * 32


@settings(max_examples=150, deadline=None)
@given(st.lists(messages, min_size=1, max_size=6), ts, topics, st.data())
def test_fields_encoder_is_byte_identical_to_encode_batch(
    batch: list[Message], store_ts: int, topic: str, data: st.DataObject
) -> None:
    missing_born = data.draw(st.lists(st.booleans(), min_size=len(batch), max_size=len(batch)))
    fields = [Fields.of(msg) for msg in batch]
    for f, no_born in zip(fields, missing_born, strict=True):
        if no_born:
            f.born_timestamp_ms = 0  # the store time stands in, as the careful path does
    fields[0].msg_id = ""  # a fresh id is drawn
    expected = [
        dataclasses.replace(
            msg,
            topic=topic,
            store_timestamp_ms=store_ts,
            born_timestamp_ms=f.born_timestamp_ms or store_ts,
            uniq_id=f.msg_id or _fresh_ids(),
        )
        for msg, f in zip(batch, fields, strict=True)
    ]
    body, ids = m.encode_batch_fields(topic, fields, store_ts, _fresh_ids)
    assert body == m.encode_batch(expected)[0]
    assert ids == [x.uniq_id for x in expected]


@pytest.mark.parametrize(("changes", "error", "code"), INVALID_CASES)
def test_fields_encoder_rejects_what_encode_message_rejects(
    changes: dict[str, object], error: type[CodecError], code: str | None
) -> None:
    msg = make(**{k: v for k, v in changes.items() if k not in {"topic", "store_timestamp_ms"}})
    topic = str(changes.get("topic", msg.topic))
    store_ts = int(changes.get("store_timestamp_ms", msg.store_timestamp_ms))  # type: ignore[call-overload]
    if changes.get("uniq_id") == "":
        pytest.skip("an empty msg_id is drawn fresh on the send path")
    if isinstance(changes.get("keys"), list):
        pytest.skip("request keys are any sequence (a protobuf repeated field)")
    with pytest.raises(error) as careful:
        m.encode_message(dataclasses.replace(msg, topic=topic, store_timestamp_ms=store_ts))
    with pytest.raises(error) as fast:
        m.encode_batch_fields(topic, [Fields.of(make()), Fields.of(msg)], store_ts, _fresh_ids)
    assert str(fast.value) == str(careful.value)


def _as_message(row: m.MessageRow) -> Message:
    return Message(*row[1:])


def _fast(raw: bytes, count: int, verify_crc: bool) -> object:
    return _outcome(lambda: _decode_fast(raw, 0, count, verify_crc))


def _careful(raw: bytes, count: int, verify_crc: bool) -> object:
    return _outcome(lambda: _decode_careful_run(memoryview(raw), 0, count, verify_crc))


@settings(max_examples=300, deadline=None)
@given(st.lists(messages, min_size=1, max_size=4), st.data(), st.booleans())
def test_fast_decode_agrees_with_the_careful_decoder(
    msgs: list[Message], data: st.DataObject, verify_crc: bool
) -> None:
    """The differential test: on a run of messages back to back (a raw pull answer), whole,
    with bytes overwritten and cut short, the fast reader either fails or reads exactly what
    the careful reader reads; decode_rows (fast, then careful) always equals the careful one."""
    raws = [m.encode_message(msg) for msg in msgs]
    run = b"".join(raws)
    rows = _decode_fast(run, 0, len(msgs), verify_crc)
    assert [_as_message(r) for r in rows] == msgs
    # Bodies are bytes of their own, from a view too (a body never pins the answer's buffer).
    assert all(type(r[3]) is bytes for r in _decode_fast(memoryview(run), 0, len(msgs), False))
    assert [r[0] for r in rows] == [len(r) for r in raws]
    assert rows == _decode_careful_run(memoryview(run), 0, len(msgs), verify_crc)
    assert m.decode_message(raws[0], verify_crc=verify_crc) == msgs[0]
    for variant in _damaged(data, run):
        careful = _careful(variant, len(msgs), verify_crc)
        fast = _fast(variant, len(msgs), verify_crc)
        # Where the fast path decodes, it reads exactly what the careful one reads: from bytes
        # (fields cut from the buffer) and from a view (fields cut from a copy per message).
        assert isinstance(fast, str) or fast == careful, (fast, careful)
        fast_view = _outcome(
            lambda v=variant: _decode_fast(memoryview(v), 0, len(msgs), verify_crc)
        )
        assert isinstance(fast_view, str) or fast_view == careful, (fast_view, careful)
        got = _outcome(lambda v=variant: m.decode_rows(v, 0, len(msgs), verify_crc=verify_crc))
        assert got == careful
        # A memoryview (a mapped file) reads the same as bytes.
        view = _outcome(
            lambda v=variant: m.decode_rows(memoryview(v), 0, len(msgs), verify_crc=verify_crc)
        )
        assert view == careful


@settings(max_examples=100, deadline=None)
@given(messages, st.data())
def test_careful_decoder_rejects_every_corruption_the_crc_sees(
    msg: Message, data: st.DataObject
) -> None:
    """Any overwritten byte of a message changes it (CRC or head), and the careful decoder
    says so with CorruptMessageError at the message's offset, never another error."""
    raw = bytearray(m.encode_message(msg))
    at = data.draw(st.integers(min_value=0, max_value=len(raw) - 1))
    raw[at] ^= data.draw(st.integers(min_value=1, max_value=255))
    with pytest.raises(CorruptMessageError) as info:
        _decode_careful(memoryview(bytes(raw)), 0, True)
    assert info.value.offset == 0


def test_check_message_guards_what_a_raw_pull_sends() -> None:
    raw = m.encode_message(make())
    m.check_message(raw, 4096)
    flipped = bytearray(raw)
    flipped[-1] ^= 1
    with pytest.raises(CorruptMessageError, match=r"CRC mismatch.*position 4096"):
        m.check_message(bytes(flipped), 4096)
    with pytest.raises(CorruptMessageError, match="record says"):
        m.check_message(raw + b"\0", 4096)  # the ConsumeQueue record's size disagrees
    with pytest.raises(CorruptMessageError):
        m.check_message(raw[:50], 4096)


@settings(max_examples=200, deadline=None)
@given(messages, st.data())
def test_the_dispatch_view_from_a_messages_head_alone(msg: Message, data: st.DataObject) -> None:
    """read_dispatch_head gives read_dispatch's answer from the first dispatch_head_size
    bytes or more (the body need not be read), and refuses fewer."""
    raw = m.encode_message(msg)
    whole = m.read_dispatch(raw, verify_crc=False)
    need = m.dispatch_head_size(raw)
    assert need is not None and need < len(raw)  # the body comes after the keys
    n = data.draw(st.integers(need, len(raw)))
    assert m.read_dispatch_head(raw[:n]) == whole
    short = data.draw(st.integers(m.MESSAGE_HEAD.size, need - 1))
    with pytest.raises(m.CorruptMessageError):
        m.read_dispatch_head(raw[:short])
    assert m.dispatch_head_size(raw[: m.MESSAGE_FIXED_SIZE]) is None
