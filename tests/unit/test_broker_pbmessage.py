"""A stored message on raftmq.broker.v1's wire and back is the message: every field of
msgcodec's Message crosses (broker/frontends/v1/pbmessage.py). Before, a POP receive forwarded to
the leader (broker/frontends/v2/leader.py) rebuilt the message by hand and dropped ``flag`` and
``sys_flag``."""

from __future__ import annotations

import dataclasses

from hypothesis import given
from hypothesis import strategies as st

from broker.frontends.v1.pbmessage import message_from_pb, message_pb
from broker.state.message import Message

INT32 = st.integers(-(1 << 31), (1 << 31) - 1)
INT64 = st.integers(-(1 << 63), (1 << 63) - 1)
TEXT = st.text(max_size=20)

messages = st.builds(
    Message,
    topic=TEXT,
    queue_id=INT32,
    body=st.binary(max_size=64),
    tags=TEXT,
    keys=st.lists(TEXT, max_size=3).map(tuple),
    properties=st.dictionaries(TEXT, TEXT, max_size=3),
    born_host=TEXT,
    born_timestamp_ms=INT64,
    store_timestamp_ms=INT64,
    producer_group=TEXT,
    uniq_id=TEXT,
    reconsume_times=INT32,
    flag=INT32,
    sys_flag=INT32,
)


@given(messages, INT64, INT64)
def test_a_message_read_back_is_the_message_sent(msg: Message, offset: int, pos: int) -> None:
    wire = message_pb(msg, "OFFSETID", offset, pos)
    assert (wire.queue_offset, wire.commitlog_position, wire.offset_msg_id) == (
        offset,
        pos,
        "OFFSETID",
    )
    back = message_from_pb(wire)
    assert back == msg


def test_every_field_of_message_is_carried() -> None:
    """A field added to Message and not to both directions fails here by name."""
    distinct = Message(
        topic="t",
        queue_id=1,
        body=b"b",
        tags="tg",
        keys=("k",),
        properties={"p": "v"},
        born_host="h:1",
        born_timestamp_ms=2,
        store_timestamp_ms=3,
        producer_group="pg",
        uniq_id="U" * 32,
        reconsume_times=4,
        flag=5,
        sys_flag=6,
    )
    back = message_from_pb(message_pb(distinct, "", 0, 0))
    for f in dataclasses.fields(Message):
        assert getattr(back, f.name) == getattr(distinct, f.name), f.name
