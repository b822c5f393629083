"""``SendMessageRequest`` read straight from its wire bytes, each body a view into them.

gRPC hands the servicer the request's bytes; the generated parser (upb) copied every body
into its arena, and reading ``m.body`` copied it again into a Python ``bytes``. Here the
request's messages become :class:`~broker.components.sending.OutgoingMessage` values whose
``body`` is a ``memoryview`` of the received bytes, so the leader's first copy of a body is
the log entry's (docs/PERFORMANCE.md "Steps per message"). A request whose messages are all
smaller than :data:`IN_PLACE_MIN_MESSAGE_BYTES` is still parsed by the runtime: for small
bodies its C parser costs less CPU than the copies it makes.

The parser accepts exactly what the protobuf runtime accepts and gives the same fields
(``tests/unit/test_broker_sendwire.py`` checks it against the runtime for generated valid
encodings and mutations of them): fields in any order and repeated (the last scalar wins;
repeated and map fields accumulate), a known field with another wire type kept as an
unknown one, unknown fields of every wire type skipped (groups nested at most
:data:`DEPTH_LIMIT` deep, counted with the submessages as the runtime does), varints of up to
ten bytes (truncated to the field's width), tags of up to five bytes, strings checked to be
UTF-8. Anything else raises :class:`WireFormatError`, which the front end answers as it
answers the runtime's refusal: ``INVALID_ARGUMENT BAD_REQUEST undecodable
raftmq.broker.v1.SendMessageRequest`` (:mod:`rpckit.decodeguard`).

raftmq/broker/v1/broker.proto is the schema::

    message SendMessageRequest { string topic = 1; repeated Message messages = 2; }
    message Message { string topic = 1; int32 queue_id = 2; string tags = 3;
      repeated string keys = 4; map<string, string> properties = 5; bytes body = 6;
      string born_host = 7; int64 born_timestamp_ms = 8; int64 store_timestamp_ms = 9;
      string producer_group = 10; string msg_id = 11; string offset_msg_id = 12;
      int64 queue_offset = 13; int64 commitlog_position = 14; int32 reconsume_times = 15;
      int32 flag = 16; int32 sys_flag = 17; }

(a send reads no store time, offset msg id, queue offset or commitlog position: they are
checked, as the runtime checks them, and dropped).
"""

from __future__ import annotations

from dataclasses import dataclass

from google.protobuf.message import DecodeError
from raftmq.broker.v1 import broker_pb2 as pb

from broker.components.sending import OutgoingMessage
from broker.frontends.internal.codec import outgoing_of
from broker.state.errors import InvalidRequestError
from mqerrors import codes as E

# Nesting the runtime allows (upb's default depth limit, which the Python runtime keeps):
# each submessage, map entry and group takes one level of it.
DEPTH_LIMIT = 100

# Messages of at least this many bytes are read here, in place; a request without any is
# parsed by the protobuf runtime. Measured (thread CPU per message, 2026-11-29): the runtime's
# C parser plus reading its fields costs ~5.4 us for a 16 KiB message with six fields set,
# this module's Python ~6.7 us, the two copies it saves (upb's arena, Python's bytes) growing
# with the body (at 256 KiB: 17 us against 8.4 us): in CPU the parsers break even at about
# 64 KiB. Set at 16 KiB (issue 36's large body) the leader's memory traffic per body falls
# by two copies for ~1.3 us of CPU; below it, where bodies are small, the runtime's parser.
IN_PLACE_MIN_MESSAGE_BYTES = 16 << 10

# Wire types (protobuf encoding).
_VARINT = 0
_I64 = 1
_LEN = 2
_SGROUP = 3
_EGROUP = 4
_I32 = 5

# The longest varint (10 bytes for 64 bits) and tag (5 bytes, at most 2**32 - 1).
_VARINT_MAX_BYTES = 10
_TAG_MAX_BYTES = 5
_U32 = (1 << 32) - 1
_U64 = (1 << 64) - 1

# What _message does with each of Message's fields (broker.proto), by its whole tag (field
# number << 3 | wire type): a string kept in a slot of its strings (topic, tags, born_host,
# producer_group, msg_id), or only checked (offset_msg_id); the keys, the properties' entries,
# the body; an integer kept in a slot of its integers (queue_id, reconsume_times, flag,
# sys_flag as int32; born_timestamp_ms as int64), or only read (the other int64s). A tag not
# here (another number, or a known number with another wire type) is an unknown field.
_TEXT_SLOTS = 5
_CHECKED_TEXT = 5
_KEYS = 6
_PROPERTIES = 7
_BODY = 8
_INT32 = 10  # _INT32 + slot
_BORN = 14
_CHECKED_INT64 = 15
_ACTIONS = {
    1 << 3 | _LEN: 0,
    3 << 3 | _LEN: 1,
    7 << 3 | _LEN: 2,
    10 << 3 | _LEN: 3,
    11 << 3 | _LEN: 4,
    12 << 3 | _LEN: _CHECKED_TEXT,
    4 << 3 | _LEN: _KEYS,
    5 << 3 | _LEN: _PROPERTIES,
    6 << 3 | _LEN: _BODY,
    2 << 3 | _VARINT: _INT32,
    15 << 3 | _VARINT: _INT32 + 1,
    16 << 3 | _VARINT: _INT32 + 2,
    17 << 3 | _VARINT: _INT32 + 3,
    8 << 3 | _VARINT: _BORN,
    9 << 3 | _VARINT: _CHECKED_INT64,
    13 << 3 | _VARINT: _CHECKED_INT64,
    14 << 3 | _VARINT: _CHECKED_INT64,
}


class WireFormatError(InvalidRequestError, ValueError):
    """The bytes are not an encoding of ``SendMessageRequest`` the runtime would accept."""

    code = E.BAD_REQUEST


@dataclass(frozen=True, slots=True)
class SendWire:
    """A parsed ``SendMessageRequest``: its topic and messages, bodies viewing the request."""

    topic: str
    messages: tuple[OutgoingMessage, ...]


def _varint(data: bytes, pos: int, end: int) -> tuple[int, int]:
    """The varint at ``pos`` (masked to 64 bits, as the runtime does) and the position after."""
    if pos < end:
        b = data[pos]
        if b < 0x80:
            return b, pos + 1
    value = 0
    shift = 0
    stop = min(end, pos + _VARINT_MAX_BYTES)
    while pos < stop:
        b = data[pos]
        pos += 1
        value |= (b & 0x7F) << shift
        if b < 0x80:
            return value & _U64, pos
        shift += 7
    raise WireFormatError("truncated or overlong varint")


def _group_tag(data: bytes, pos: int, end: int) -> tuple[int, int, int]:
    """(field number, wire type, position after) of the tag at ``pos``: any number (the
    runtime lets a group's fields, which it does not interpret, have number 0)."""
    start = pos
    key, pos = _varint(data, pos, end)
    if pos - start > _TAG_MAX_BYTES or key > _U32:
        raise WireFormatError("tag too long")
    return key >> 3, key & 7, pos


def _tag(data: bytes, pos: int, end: int) -> tuple[int, int, int]:
    """(field number, wire type, position after) of a message's field's tag at ``pos``."""
    number, wire, pos = _group_tag(data, pos, end)
    if number == 0:
        raise WireFormatError("field number 0")
    return number, wire, pos


def _length(data: bytes, pos: int, end: int) -> tuple[int, int]:
    """(start, end) of the length-delimited field whose length is at ``pos``."""
    size, pos = _varint(data, pos, end)
    if size > end - pos:
        raise WireFormatError("length past the end")
    return pos, pos + size


def _int32(value: int) -> int:
    value &= _U32
    return value - (1 << 32) if value >> 31 else value


def _int64(value: int) -> int:
    return value - (1 << 64) if value >> 63 else value


def _skip(data: bytes, number: int, wire: int, pos: int, end: int, depth: int) -> int:
    """The position after an unknown field (its tag read) of wire type ``wire``; groups
    (nested as deep as ``depth`` allows) up to their matching end."""
    if wire == _VARINT:
        return _varint(data, pos, end)[1]
    if wire in (_I64, _I32):
        pos += 8 if wire == _I64 else 4
        if pos > end:
            raise WireFormatError("truncated fixed-width field")
        return pos
    if wire == _LEN:
        return _length(data, pos, end)[1]
    if wire == _SGROUP:
        open_groups = [number]
        while open_groups:
            if len(open_groups) > depth:
                raise WireFormatError("nested too deep")
            if pos >= end:
                raise WireFormatError("unterminated group")
            inner, inner_wire, pos = _group_tag(data, pos, end)
            if inner_wire == _EGROUP:
                if inner != open_groups.pop():
                    raise WireFormatError("group ended by another field's end")
            elif inner_wire == _SGROUP:
                open_groups.append(inner)
            else:
                pos = _skip(data, inner, inner_wire, pos, end, 0)
        return pos
    # An end without its start (_EGROUP), or wire type 6 or 7.
    raise WireFormatError(f"unexpected wire type {wire}")


def _map_entry(data: bytes, pos: int, end: int, depth: int) -> tuple[str, str] | None:
    """One ``properties`` entry (``key = 1``, ``value = 2``; either absent: empty). None
    when it holds any other field: the runtime keeps such an entry among the message's
    unknown fields, out of the map."""
    key = value = ""
    known = True
    while pos < end:
        number, wire, pos = _tag(data, pos, end)
        if wire == _LEN and number in (1, 2):
            start, pos = _length(data, pos, end)
            if number == 1:
                key = data[start:pos].decode()
            else:
                value = data[start:pos].decode()
        else:
            pos = _skip(data, number, wire, pos, end, depth)
            known = False
    return (key, value) if known else None


def _message(data: bytes, view: memoryview, pos: int, end: int, depth: int) -> OutgoingMessage:
    """One ``Message`` (the bytes between ``pos`` and ``end``) as a send's message. The
    common case (one-byte tags, lengths and small integers) is read inline: this runs once per
    message of every send."""
    texts = ["", "", "", "", ""]
    ints = [0, 0, 0, 0, 0]
    keys: list[str] = []
    properties: dict[str, str] = {}
    body = view[0:0]
    actions = _ACTIONS
    while pos < end:
        tag = data[pos]
        if tag < 0x80:
            pos += 1
        else:
            number, wire, pos = _tag(data, pos, end)
            tag = number << 3 | wire
        action = actions.get(tag)
        if action is None:
            if tag < 8:
                raise WireFormatError("field number 0")
            pos = _skip(data, tag >> 3, tag & 7, pos, end, depth)
        elif action < _INT32:  # length-delimited
            if pos < end and data[pos] < 0x80:
                stop = pos + 1 + data[pos]
                pos += 1
            else:
                pos, stop = _length(data, pos, end)
            if stop > end:
                raise WireFormatError("length past the end")
            if action == _BODY:
                body = view[pos:stop]
            elif action == _PROPERTIES:
                # The runtime's own shape inline (key, then value, each under 128 bytes).
                middle = pos + 2 + data[pos + 1] if stop - pos >= 4 else stop
                if (
                    middle + 2 <= stop
                    and data[pos] == 0x0A
                    and data[pos + 1] < 0x80
                    and data[middle] == 0x12
                    and middle + 2 + data[middle + 1] == stop
                ):
                    properties[data[pos + 2 : middle].decode()] = data[middle + 2 : stop].decode()
                else:
                    entry = _map_entry(data, pos, stop, depth - 1)
                    if entry is not None:
                        properties[entry[0]] = entry[1]
            elif action < _TEXT_SLOTS:
                texts[action] = data[pos:stop].decode()  # not UTF-8: parse_send_request
            else:
                text = data[pos:stop].decode()
                if action == _KEYS:
                    keys.append(text)
            pos = stop
        else:  # a varint
            if pos < end and data[pos] < 0x80:
                value = data[pos]
                pos += 1
            else:
                value, pos = _varint(data, pos, end)
            if action < _BORN:
                ints[action - _INT32] = _int32(value) if value >> 31 else value
            elif action == _BORN:
                ints[4] = _int64(value)
    return _outgoing(texts, ints, body, keys, properties)


def _outgoing(
    texts: list[str],
    ints: list[int],
    body: memoryview,
    keys: list[str],
    properties: dict[str, str],
) -> OutgoingMessage:
    topic, tags, born_host, producer_group, msg_id = texts
    queue_id, reconsume_times, flag, sys_flag, born_timestamp_ms = ints
    # Positional: the dataclass's field order (a keyword call costs more, per message).
    return OutgoingMessage(
        topic,
        queue_id,
        body,
        tags,
        tuple(keys),
        properties,
        born_host,
        born_timestamp_ms,
        producer_group,
        msg_id,
        reconsume_times,
        flag,
        sys_flag,
    )


def parse_send_request(
    data: bytes, in_place_min_bytes: int = IN_PLACE_MIN_MESSAGE_BYTES
) -> SendWire:
    """``data``, a ``SendMessageRequest``'s wire bytes, as the send's topic and messages.
    Raises :class:`WireFormatError` where the runtime's parser refuses ``data``. A request
    none of whose messages takes ``in_place_min_bytes`` is parsed by the runtime (its bodies
    copied: small ones cost less to copy than to parse in Python); otherwise every message
    is read here, its body a view of ``data``."""
    if not isinstance(data, bytes):
        raise TypeError(f"expected bytes, got {type(data).__name__}")
    end = len(data)
    if end < in_place_min_bytes:
        # No message of a request this small can take in_place_min_bytes: the runtime's
        # parser, without this module's scan of the top-level fields (~1 us of Python per
        # request, on every small send: docs/PERFORMANCE.md "ASYNC_FLUSH at 256 in flight").
        return _by_runtime(data)
    if _all_small(data, end, in_place_min_bytes):
        return _by_runtime(data)
    pos = 0
    topic = ""
    spans: list[tuple[int, int]] = []
    try:
        while pos < end:
            number, wire, pos = _tag(data, pos, end)
            if wire == _LEN and number == 1:
                start, pos = _length(data, pos, end)
                topic = data[start:pos].decode()
            elif wire == _LEN and number == 2:
                start, pos = _length(data, pos, end)
                spans.append((start, pos))
            else:
                pos = _skip(data, number, wire, pos, end, DEPTH_LIMIT)
        if all(stop - start < in_place_min_bytes for start, stop in spans):
            return _by_runtime(data)
        view = memoryview(data)
        messages = tuple(_message(data, view, a, b, DEPTH_LIMIT - 1) for a, b in spans)
    except UnicodeDecodeError:
        # Every string field is decoded strictly (proto3 strings are UTF-8).
        raise WireFormatError("string field is not UTF-8") from None
    return SendWire(topic, messages)


def _all_small(data: bytes, end: int, in_place_min_bytes: int) -> bool:
    """True when ``data`` is, as a producer's runtime writes it, a topic and messages (tags
    0x0A and 0x12) with lengths of one or two bytes, each under ``in_place_min_bytes``: then
    the runtime parses it (and refuses what it refuses). False for anything else, and the
    full scan decides. A producer batches up to hundreds of small messages in one request of
    more than ``in_place_min_bytes``; this loop costs ~0.16 us per message, the full scan's
    calls ~0.74 us (issue 36, docs/PERFORMANCE.md "ASYNC_FLUSH at 256 in flight")."""
    pos = 0
    last = end - 2  # a tag and a length byte fit at or before this position
    while pos <= last:
        tag = data[pos]
        if tag != 0x12 and tag != 0x0A:
            return False
        size = data[pos + 1]
        if size < 0x80:
            pos += 2
        elif pos + 2 < end and data[pos + 2] < 0x80:
            size = (size & 0x7F) | data[pos + 2] << 7
            pos += 3
        else:
            return False
        if size >= in_place_min_bytes:
            return False
        pos += size
    return pos == end


def _by_runtime(data: bytes) -> SendWire:
    try:
        request = pb.SendMessageRequest.FromString(data)
    except DecodeError as exc:
        raise WireFormatError(str(exc)) from None
    return SendWire(request.topic, tuple(outgoing_of(m) for m in request.messages))
