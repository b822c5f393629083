"""A 4.x send (``SEND_MESSAGE``, ``SEND_MESSAGE_V2``, ``SEND_BATCH_MESSAGE``) as the send path's
:class:`~broker.components.sending.OutgoingMessage` values.

The header names the topic, queue, flags and the message's properties (``TAGS``, ``KEYS``,
``UNIQ_KEY``, ``DELAY`` ...); ``SEND_MESSAGE_V2`` spells the same fields ``a`` to ``m``. A batch's
body holds its messages back to back in RocketMQ's client encoding (``MessageDecoder
.encodeMessages``): per message a total size (int32), a magic code and a body CRC (both
unused, 0), the flag (int32), the body (int32 length) and the properties (int16 length).

A body the producer compressed (sysFlag bit 0x1, zlib) is stored inflated, so that every
consumer (4.x, RocketMQ 5, raftmq's own) reads the same bytes; inflating stops at the
broker's maximum message size.
"""

from __future__ import annotations

import struct
import zlib
from collections.abc import Mapping
from dataclasses import dataclass

from broker.components.sending import MAX_SEND_BATCH, OutgoingMessage
from broker.frontends.remoting import fields as F
from broker.frontends.remoting.fields import Refused
from broker.frontends.remoting.messageext import (
    PROPERTY_KEYS,
    PROPERTY_TAGS,
    PROPERTY_UNIQ_KEY,
    decode_properties,
)
from remoting.codes import ResponseCode

# SendMessageRequestHeaderV2's one-letter names -> SendMessageRequestHeader's.
V2_NAMES = {
    "a": "producerGroup",
    "b": "topic",
    "c": "defaultTopic",
    "d": "defaultTopicQueueNums",
    "e": "queueId",
    "f": "sysFlag",
    "g": "bornTimestamp",
    "h": "flag",
    "i": "properties",
    "j": "reconsumeTimes",
    "k": "unitMode",
    "l": "maxReconsumeTimes",
    "m": "batch",
    "n": "brokerName",
}
# MessageSysFlag.COMPRESSED_FLAG: the body is zlib-deflated.
COMPRESSED_FLAG = 0x1
# The properties a 4.x client writes that raftmq stores as fields of the message.
_FIELD_PROPERTIES = (PROPERTY_TAGS, PROPERTY_KEYS, PROPERTY_UNIQ_KEY)
# One message of a batch body: total size, magic code, body CRC, flag, body length.
_BATCH_HEAD = struct.Struct(">iiiii")
_U16 = struct.Struct(">H")
# What a batch message needs beyond its body: its head and the properties' length.
_BATCH_MIN_BYTES = _BATCH_HEAD.size + _U16.size


@dataclass(frozen=True, slots=True)
class SendHeader:
    """The fields of a send request raftmq uses."""

    producer_group: str
    topic: str
    queue_id: int
    sys_flag: int
    born_timestamp_ms: int
    flag: int
    properties: str
    reconsume_times: int
    batch: bool


def v1_fields(code_is_v2: bool, ext: Mapping[str, str]) -> dict[str, str]:
    """A V2 header's fields under their V1 names (a V1 header as it is)."""
    if not code_is_v2:
        return dict(ext)
    return {V2_NAMES.get(k, k): v for k, v in ext.items()}


def send_header(ext: Mapping[str, str]) -> SendHeader:
    """The send header of ``ext`` (V1 names), each field checked."""
    return SendHeader(
        producer_group=F.text(ext, "producerGroup", ""),
        topic=F.text(ext, "topic", max_chars=F.MAX_TEXT_CHARS),
        queue_id=F.integer(ext, "queueId", F.INT32_MIN, F.INT32_MAX),
        sys_flag=F.integer(ext, "sysFlag", F.INT32_MIN, F.INT32_MAX, 0),
        born_timestamp_ms=F.integer(ext, "bornTimestamp", 0, F.INT64_MAX, 0),
        flag=F.integer(ext, "flag", F.INT32_MIN, F.INT32_MAX, 0),
        properties=F.text(ext, "properties", "", F.MAX_TEXT_CHARS),
        reconsume_times=F.integer(ext, "reconsumeTimes", 0, F.INT32_MAX, 0),
        batch=F.boolean(ext, "batch"),
    )


def inflate(body: bytes, max_bytes: int) -> bytes:
    """A compressed body inflated, refused when it is not zlib or inflates past
    ``max_bytes``."""
    inflater = zlib.decompressobj()
    try:
        out = inflater.decompress(body, max_bytes + 1)
    except zlib.error:
        raise Refused(ResponseCode.MESSAGE_ILLEGAL, "the compressed body is not zlib") from None
    if len(out) > max_bytes or inflater.unconsumed_tail:
        raise Refused(
            ResponseCode.MESSAGE_ILLEGAL, f"the body inflates to more than {max_bytes} bytes"
        )
    if not inflater.eof:
        raise Refused(ResponseCode.MESSAGE_ILLEGAL, "the compressed body is truncated")
    return out


def outgoing(
    h: SendHeader, body: bytes, props_text: str, flag: int, born_host: str, max_bytes: int
) -> OutgoingMessage:
    """One message of a send as the send path takes it."""
    props = decode_properties(props_text)
    tags = props.pop(PROPERTY_TAGS, "")
    keys = tuple(k for k in props.pop(PROPERTY_KEYS, "").split(" ") if k)
    msg_id = props.pop(PROPERTY_UNIQ_KEY, "")
    sys_flag = h.sys_flag
    if sys_flag & COMPRESSED_FLAG:
        body = inflate(body, max_bytes)
        sys_flag &= ~COMPRESSED_FLAG
    return OutgoingMessage(
        topic=h.topic,
        queue_id=h.queue_id,
        body=body,
        tags=tags,
        keys=keys,
        properties=props,
        born_host=born_host,
        born_timestamp_ms=h.born_timestamp_ms,
        producer_group=h.producer_group,
        msg_id=msg_id.upper() if msg_id else "",
        reconsume_times=h.reconsume_times,
        flag=flag,
        sys_flag=sys_flag,
    )


def batch_messages(
    h: SendHeader, body: bytes, born_host: str, max_bytes: int
) -> tuple[OutgoingMessage, ...]:
    """The messages of a batch body, each framed and bounded; refused when one overruns."""
    out: list[OutgoingMessage] = []
    at = 0
    while at < len(body):
        if len(out) >= MAX_SEND_BATCH:
            raise Refused(ResponseCode.MESSAGE_ILLEGAL, f"more than {MAX_SEND_BATCH} in a batch")
        if len(body) - at < _BATCH_MIN_BYTES:
            raise Refused(ResponseCode.MESSAGE_ILLEGAL, f"batch message at byte {at} is cut")
        total, _magic, _crc, flag, body_len = _BATCH_HEAD.unpack_from(body, at)
        end = at + total
        if total < _BATCH_MIN_BYTES or end > len(body) or not 0 <= body_len <= total:
            raise Refused(ResponseCode.MESSAGE_ILLEGAL, f"batch message at byte {at} is malformed")
        start = at + _BATCH_HEAD.size
        if start + body_len + _U16.size > end:
            raise Refused(ResponseCode.MESSAGE_ILLEGAL, f"batch message at byte {at} is malformed")
        (props_len,) = _U16.unpack_from(body, start + body_len)
        props_at = start + body_len + _U16.size
        if props_at + props_len != end:
            raise Refused(ResponseCode.MESSAGE_ILLEGAL, f"batch message at byte {at} is malformed")
        try:
            props_text = body[props_at:end].decode("utf-8")
        except UnicodeDecodeError:
            raise Refused(ResponseCode.MESSAGE_ILLEGAL, "batch properties are not UTF-8") from None
        out.append(
            outgoing(h, body[start : start + body_len], props_text, flag, born_host, max_bytes)
        )
        at = end
    if not out:
        raise Refused(ResponseCode.MESSAGE_ILLEGAL, "a batch send holds no message")
    return tuple(out)


def encode_batch_message(body: bytes, properties: Mapping[str, str], flag: int = 0) -> bytes:
    """One message of a batch body as a 4.x client writes it (tests and the bench)."""
    from broker.frontends.remoting.messageext import encode_properties

    props = encode_properties(properties).encode()
    total = _BATCH_HEAD.size + len(body) + _U16.size + len(props)
    return _BATCH_HEAD.pack(total, 0, 0, flag, len(body)) + body + _U16.pack(len(props)) + props
