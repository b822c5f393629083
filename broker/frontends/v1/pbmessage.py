"""A stored message on ``raftmq.broker.v1``'s wire (``pb.Message``) and back.

The one place both directions live: the client port answers with :func:`message_pb`, and
:func:`message_from_pb` reads such an answer back (a forwarded POP receive no longer does: it
carries the stored encoding, ``broker.frontends.internal.codec``). Each copies every field of
:class:`~msgcodec.layout.Message`, so a message read back is the message sent
(``tests/unit/test_broker_pbmessage.py``)."""

from __future__ import annotations

from raftmq.broker.v1 import broker_pb2 as pb

from broker.state.message import Message


def message_pb(msg: Message, offset_msg_id: str, queue_offset: int, position: int) -> pb.Message:
    """``msg`` as stored at commitlog ``position``, entry ``queue_offset`` of its queue."""
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
        offset_msg_id=offset_msg_id,
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


def message_from_pb(m: pb.Message) -> Message:
    """The stored message ``m`` carries (its place, ``queue_offset`` and
    ``commitlog_position``, is the caller's to read)."""
    return Message(
        topic=m.topic,
        queue_id=m.queue_id,
        body=m.body,
        tags=m.tags,
        keys=tuple(m.keys),
        properties=dict(m.properties),
        born_host=m.born_host,
        born_timestamp_ms=m.born_timestamp_ms,
        store_timestamp_ms=m.store_timestamp_ms,
        producer_group=m.producer_group,
        uniq_id=m.msg_id,
        reconsume_times=m.reconsume_times,
        flag=m.flag,
        sys_flag=m.sys_flag,
    )


__all__ = ["message_from_pb", "message_pb"]
