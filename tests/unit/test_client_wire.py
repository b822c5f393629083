"""client/wire.py reads the stored bytes of a raw pull exactly as the broker's codec does."""

from __future__ import annotations

import dataclasses

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from broker import message as bm
from client import MQClientError
from client.message import MessageExt
from client.wire import decode_messages

PREFIX = "7F00000100002A9F"

texts = st.text(alphabet=st.characters(codec="utf-8"), max_size=30)
stored = st.builds(
    bm.Message,
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


def expected(msg: bm.Message, queue_offset: int, position: int) -> MessageExt:
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
                "offset_msg_id": bm.encode_offset_msg_id("127.0.0.1", 10911, position),
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
    msgs: list[bm.Message], data: st.DataObject
) -> None:
    raws = [bm.encode_message(m) for m in msgs]
    offsets = list(range(40, 40 + len(msgs)))
    positions = []
    at = 1000
    for r in raws:
        positions.append(at)
        at += len(r) + data.draw(st.integers(min_value=0, max_value=500))
    prefix = bm.encode_offset_msg_id("127.0.0.1", 10911, 0)[:16]
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
    base = bm.Message(
        topic="%RETRY%cg",
        queue_id=0,
        body=b"x",
        properties={"RETRY_TOPIC": "Orders", "ORIGIN_MESSAGE_ID": "A" * 32},
        uniq_id="B" * 32,
        reconsume_times=2,
    )
    dlq = dataclasses.replace(base, topic="%DLQ%cg")
    raw = bm.encode_message(base) + bm.encode_message(dlq)
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
