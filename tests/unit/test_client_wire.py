"""client/wire.py reads the stored bytes of a raw pull through the shared codec (msgcodec), and
what the broker's send path stores is what the client reads back, byte for byte."""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import msgcodec
from broker.state import message as broker_codec
from broker.state.errors import MessageTooLargeError, PropertiesTooLargeError
from client import MQClientError
from client.message import Message as ClientMessage
from client.message import MessageExt
from client.wire import decode_messages
from msgcodec import Message as StoredMessage

PREFIX = "7F00000100002A9F"

texts = st.text(alphabet=st.characters(codec="utf-8"), max_size=30)
stored = st.builds(
    StoredMessage,
    topic=st.sampled_from(["T", "Topic_1", "%RETRY%cg", "%DLQ%cg"]),
    queue_id=st.integers(min_value=0, max_value=(1 << 31) - 1),
    body=st.binary(min_size=1, max_size=200),
    tags=texts,
    keys=st.lists(
        st.text(alphabet=st.characters(codec="utf-8", exclude_characters=" "), min_size=1),
        max_size=3,
    ).map(tuple),
    properties=st.dictionaries(
        st.text(alphabet=st.characters(codec="utf-8", exclude_characters="\x01\x02"), min_size=1),
        st.text(alphabet=st.characters(codec="utf-8", exclude_characters="\x01\x02")),
        max_size=4,
    ),
    born_host=st.text(max_size=20),
    born_timestamp_ms=st.integers(min_value=0, max_value=(1 << 63) - 1),
    store_timestamp_ms=st.integers(min_value=0, max_value=(1 << 63) - 1),
    producer_group=st.text(alphabet="abc_-", max_size=10),
    uniq_id=st.binary(min_size=16, max_size=16).map(lambda b: b.hex().upper()),
    reconsume_times=st.integers(min_value=0, max_value=16),
)


def expected(msg: StoredMessage, queue_offset: int, position: int) -> MessageExt:
    """What the consumer showed for the same message pulled the protobuf way."""
    return MessageExt.from_pb(
        type(
            "Pb",
            (),
            {
                "topic": msg.topic,
                "msg_id": msg.uniq_id,
                "properties": msg.properties,
                "body": msg.body,
                "tags": msg.tags,
                "keys": list(msg.keys),
                "offset_msg_id": msgcodec.encode_offset_msg_id("127.0.0.1", 10911, position),
                "queue_id": msg.queue_id,
                "queue_offset": queue_offset,
                "commitlog_position": position,
                "born_timestamp_ms": msg.born_timestamp_ms,
                "store_timestamp_ms": msg.store_timestamp_ms,
                "reconsume_times": msg.reconsume_times,
            },
        )(),  # type: ignore[arg-type]
        "broker-a",
    )


@settings(max_examples=150, deadline=None)
@given(st.lists(stored, min_size=1, max_size=6), st.data())
def test_raw_messages_decode_like_the_protobuf_path(
    msgs: list[StoredMessage], data: st.DataObject
) -> None:
    raws = [msgcodec.encode_message(m) for m in msgs]
    offsets = list(range(40, 40 + len(msgs)))
    positions = []
    at = 1000
    for r in raws:
        positions.append(at)
        at += len(r) + data.draw(st.integers(min_value=0, max_value=500))
    prefix = msgcodec.encode_offset_msg_id("127.0.0.1", 10911, 0)[:16]
    got = decode_messages(b"".join(raws), offsets, positions, prefix, "broker-a")
    want = [expected(m, o, p) for m, o, p in zip(msgs, offsets, positions, strict=True)]
    assert got == want
    # Damage: a clear BAD_RESPONSE (or, for a changed byte inside a text or the body, a
    # different message), never another exception.
    blob = bytearray(b"".join(raws))
    cut = data.draw(st.integers(min_value=0, max_value=len(blob) - 1))
    with pytest.raises(MQClientError) as info:
        decode_messages(bytes(blob[:cut]), offsets, positions, prefix, "broker-a")
    assert info.value.code == "BAD_RESPONSE"
    blob[data.draw(st.integers(min_value=0, max_value=len(blob) - 1))] ^= 0xFF
    try:
        decode_messages(bytes(blob), offsets, positions, prefix, "broker-a")
    except MQClientError as exc:
        assert exc.code == "BAD_RESPONSE"


def test_retry_and_dead_letters_show_their_origin() -> None:
    base = StoredMessage(
        topic="%RETRY%cg",
        queue_id=0,
        body=b"x",
        properties={"RETRY_TOPIC": "Orders", "ORIGIN_MESSAGE_ID": "A" * 32},
        uniq_id="B" * 32,
        reconsume_times=2,
    )
    dlq = dataclasses.replace(base, topic="%DLQ%cg")
    raw = msgcodec.encode_message(base) + msgcodec.encode_message(dlq)
    got = decode_messages(raw, [0, 1], [0, len(raw) // 2], "0" * 16, "b")
    assert (got[0].topic, got[0].msg_id, got[0].store_topic, got[0].store_msg_id) == (
        "Orders",
        "A" * 32,
        "%RETRY%cg",
        "B" * 32,
    )
    assert (got[1].topic, got[1].msg_id) == ("%DLQ%cg", "A" * 32)
    assert got[1].offset_msg_id == "0" * 16 + f"{len(raw) // 2:016X}"
    with pytest.raises(MQClientError, match="queue offsets"):
        decode_messages(raw, [0], [0, 1], "0" * 16, "b")


# -- the broker's send path and the client's raw pull, end to end ---------------------------

UNIQ_IDS = st.binary(min_size=16, max_size=16).map(lambda b: b.hex().upper())
PROP_TEXT = st.text(alphabet=st.characters(codec="utf-8", exclude_characters="\x01\x02"))
sent = st.builds(
    ClientMessage,
    topic=st.just("T"),
    body=st.binary(min_size=1, max_size=300),
    tags=st.one_of(st.just(""), texts),
    keys=st.lists(
        st.text(alphabet=st.characters(codec="utf-8", exclude_characters=" "), min_size=1),
        max_size=3,
    ).map(tuple),
    properties=st.dictionaries(PROP_TEXT.filter(bool), PROP_TEXT, max_size=4),
    msg_id=st.one_of(
        st.just(""), st.binary(min_size=16, max_size=16).map(lambda b: b.hex().upper())
    ),
    delay_time_level=st.integers(min_value=0, max_value=3),
)


def _stored_and_pulled(
    topic: str, pbs: Sequence[msgcodec.MessageFields], store_ts: int, fresh_id: str = "F" * 32
) -> tuple[bytes, list[str], list[MessageExt]]:
    """What the broker's send path stores for ``pbs`` (the batch's messages back to back, as
    a raw pull sends them), the uniq ids it gave, and what the client reads of those bytes."""
    body, ids = broker_codec.encode_batch_fields(topic, pbs, store_ts, lambda: fresh_id)
    raw = body[msgcodec.BATCH_HEADER_SIZE :]
    positions = [at - msgcodec.BATCH_HEADER_SIZE for at, _, _ in msgcodec.iter_batch(body)]
    pulled = decode_messages(raw, list(range(len(pbs))), positions, PREFIX, "broker-a")
    return raw, ids, pulled


def _reencoded(raw: bytes, count: int) -> bytes:
    """The client's rows of ``raw`` encoded again: every stored field, through the codec."""
    rows = msgcodec.decode_rows(raw, 0, count)
    return b"".join(msgcodec.encode_message(StoredMessage(*row[1:])) for row in rows)


@settings(max_examples=150, deadline=None)
@given(
    st.lists(sent, min_size=1, max_size=5),
    st.integers(min_value=0, max_value=(1 << 63) - 1),
    st.text(max_size=20),
    st.text(alphabet="abc_-%", max_size=20),
)
def test_client_reads_what_the_broker_send_path_stores(
    msgs: list[ClientMessage], store_ts: int, born_host: str, group: str
) -> None:
    pbs = [msg.to_pb(i % 4, group, born_host) for i, msg in enumerate(msgs)]
    raw, ids, pulled = _stored_and_pulled("T", pbs, store_ts)
    assert _reencoded(raw, len(msgs)) == raw
    for pb_msg, uniq_id, got in zip(pbs, ids, pulled, strict=True):
        assert (got.topic, got.body, got.tags, got.keys, got.properties) == (
            "T",
            pb_msg.body,
            pb_msg.tags,
            tuple(pb_msg.keys),
            dict(pb_msg.properties),
        )
        assert (got.msg_id, got.queue_id, got.born_timestamp_ms, got.store_timestamp_ms) == (
            uniq_id,
            pb_msg.queue_id,
            pb_msg.born_timestamp_ms or store_ts,
            store_ts,
        )
        assert uniq_id == (pb_msg.msg_id or "F" * 32)


def test_limits_round_trip_and_one_byte_more_is_refused() -> None:
    """The largest topic, body, producer group and born host and a property budget filled to
    the byte (Unicode, empty tags) survive the trip; one byte more is refused."""
    group = "g" * msgcodec.MAX_PRODUCER_GROUP_BYTES
    born_host = "é" * (msgcodec.MAX_BORN_HOST_BYTES // 2)  # 254 bytes of UTF-8
    # name \x01 value \x02 fills what the group leaves of the budget (no tags, no keys).
    value_bytes = msgcodec.MAX_PROPERTIES_BYTES - len(group) - len("ключ".encode()) - 2
    value = "😀" * (value_bytes // 4) + "a" * (value_bytes % 4)
    big = ClientMessage(
        topic="t" * msgcodec.MAX_TOPIC_LENGTH,
        body=b"\xff" * msgcodec.DEFAULT_MAX_MESSAGE_SIZE_BYTES,
        properties={"ключ": value},
    )
    pb_msg = big.to_pb(7, group, born_host)
    raw, _, (got,) = _stored_and_pulled(big.topic, [pb_msg], 1)
    assert _reencoded(raw, 1) == raw
    assert (got.topic, got.tags, got.keys, got.properties) == (big.topic, "", (), big.properties)
    assert got.body == big.body
    row = msgcodec.decode_row(raw)
    assert (row[7], row[10]) == (born_host, group)
    pb_msg.properties["ключ"] = value + "a"
    with pytest.raises(PropertiesTooLargeError):
        broker_codec.encode_batch_fields(big.topic, [pb_msg], 1, lambda: "F" * 32)
    pb_msg.properties["ключ"] = value
    pb_msg.body += b"\xff"
    with pytest.raises(MessageTooLargeError):
        broker_codec.encode_batch_fields(big.topic, [pb_msg], 1, lambda: "F" * 32)
