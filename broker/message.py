"""Messages and message batches as the broker stores them in Raft log entry bodies.

The Raft log (``dledger``) holds entries whose bodies are opaque bytes. The leader puts a
*batch* of encoded messages in one entry body; every member applies committed entries in log
order and builds its ConsumeQueues and key index from them (see ``broker/consumequeue.py`` and
``broker/indexfile.py``). ``docs/FORMAT.md`` documents every byte; this module is the
reference implementation (stdlib + ``crc32c``).

Properties of the format:

- big-endian; every message is self-delimiting (its total size comes first) and independently
  decodable: a reader holding the commitlog position of one message needs nothing else;
- every message carries a CRC32C over every byte after its CRC field, so corruption is
  detected per message and a corrupt message is never served;
- decoding never raises ``IndexError``/``struct.error``: a short or inconsistent buffer raises
  :class:`~broker.errors.CorruptMessageError` naming the field and the offset;
- encoding is canonical (properties sorted by name), so equal messages encode to equal bytes.

A message's *queue offset* is not stored: it is assigned when a committed entry is applied
(the ConsumeQueue's next offset), identically on every member. Its commitlog *position* is the
entry body's position plus the message's offset inside the batch (``encode_batch`` returns the
offsets).

Message ids (RocketMQ's two kinds):

- ``uniq_id`` (RocketMQ's ``UNIQ_KEY``, the "msgId" users see): made by the producer, 16 bytes
  shown as 32 uppercase hex characters: client IPv4 (4), pid (2), instance hash (4), ms since
  the start of the month UTC (4), counter (2). :class:`UniqIdGenerator` makes them.
- ``offsetMsgId``: store host IPv4 (4) + port (4) + commitlog position (8), 32 uppercase hex:
  :func:`encode_offset_msg_id` / :func:`decode_offset_msg_id`.
"""

from __future__ import annotations

import calendar
import datetime as _dt
import functools
import ipaddress
import logging
import os
import re
import socket
import struct
import threading
import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, NamedTuple, Protocol

import crc32c as _crc32c

from broker.errors import (
    CorruptMessageError,
    InvalidMessageError,
    InvalidMessageIdError,
    InvalidTopicError,
    MessageBodyEmptyError,
    MessageTooLargeError,
    PropertiesTooLargeError,
)

logger = logging.getLogger(__name__)

crc32c: Callable[[bytes | bytearray | memoryview], int] = _crc32c.crc32c

# ---------------------------------------------------------------------------------------
# Limits
# ---------------------------------------------------------------------------------------

# RocketMQ's TopicValidator.TOPIC_MAX_LENGTH; it also keeps the topic's length in one byte.
MAX_TOPIC_LENGTH = 127
# RocketMQ's TopicValidator pattern. ASCII only, so a topic's length in characters is its length
# in bytes, and every topic is a safe directory name (ConsumeQueues live in consumequeue/{topic}).
TOPIC_PATTERN = re.compile(r"[%|a-zA-Z0-9_-]+")
# RocketMQ stores the properties length as a Java short (Short.MAX_VALUE) and rejects more.
# Here the budget covers what RocketMQ keeps in properties: user properties, tags, keys and
# producer group (uniq id is fixed size), so a message that fits RocketMQ fits here.
MAX_PROPERTIES_BYTES = 32767
# RocketMQ's maxMessageSize default (4 MiB), the broker.conf key of the same name overrides it.
DEFAULT_MAX_MESSAGE_SIZE_BYTES = 4 * 1024 * 1024
# RocketMQ limits group names to 255 characters (Validators.CHARACTER_MAX_LENGTH); one length
# byte holds it.
MAX_PRODUCER_GROUP_BYTES = 255
# "ip:port": an IPv6 address with brackets, zone and port is well below 255; one length byte.
MAX_BORN_HOST_BYTES = 255
# RocketMQ separates keys with a space in the KEYS property (MessageConst.KEY_SEPARATOR).
KEY_SEPARATOR = " "
# RocketMQ's property separators (MessageDecoder.NAME_VALUE_SEPARATOR / PROPERTY_SEPARATOR).
NAME_VALUE_SEPARATOR = "\x01"
PROPERTY_SEPARATOR = "\x02"

_I32_MIN = -(1 << 31)
_I32_MAX = (1 << 31) - 1
_I64_MAX = (1 << 63) - 1

# ---------------------------------------------------------------------------------------
# Layout (docs/FORMAT.md, "Broker: Message" and "Batch")
# ---------------------------------------------------------------------------------------

MESSAGE_MAGIC = 0x524D5347  # b"RMSG"
MESSAGE_VERSION = 1
# total_size, magic, crc
MESSAGE_HEAD = struct.Struct(">III")
MESSAGE_CRC_END = MESSAGE_HEAD.size  # the CRC covers [12, total_size)
# version, reserved, queue_id, flag, sys_flag, reconsume_times, born_timestamp_ms,
# store_timestamp_ms, tags_hash, uniq_id
MESSAGE_FIXED_AFTER_CRC = struct.Struct(">HHiiiiqqq16s")
MESSAGE_FIXED = struct.Struct(">IIIHHiiiiqqq16s")
MESSAGE_FIXED_SIZE = 72
assert MESSAGE_FIXED.size == MESSAGE_FIXED_SIZE
assert MESSAGE_HEAD.size + MESSAGE_FIXED_AFTER_CRC.size == MESSAGE_FIXED_SIZE
# topic(u8) tags(u16) keys(u16) producer_group(u8) born_host(u8) properties(u16) body(u32)
_VAR_LENGTH_BYTES = 1 + 2 + 2 + 1 + 1 + 2 + 4
# A topic and a body of at least one byte each.
MIN_MESSAGE_SIZE = MESSAGE_FIXED_SIZE + _VAR_LENGTH_BYTES + 2

BATCH_MAGIC = 0x524D4254  # b"RMBT"
BATCH_VERSION = 1
# magic, version, reserved (u8), reserved (u16), count
BATCH_HEADER = struct.Struct(">IBBHI")
BATCH_HEADER_SIZE = 12
assert BATCH_HEADER.size == BATCH_HEADER_SIZE

_U8 = struct.Struct(">B")
_U16 = struct.Struct(">H")
_U32 = struct.Struct(">I")

UNIQ_ID_BYTES = 16
_HEX32 = re.compile(r"[0-9A-F]{32}")


# ---------------------------------------------------------------------------------------
# Hashes
# ---------------------------------------------------------------------------------------


def java_string_hash(s: str) -> int:
    """Java's ``String.hashCode()``: ``s[0]*31^(n-1) + ... + s[n-1]`` over UTF-16 code units,
    in wrapping 32-bit two's complement arithmetic; a signed int."""
    if s.isascii():
        units: Sequence[int] = s.encode("ascii")
    else:
        raw = s.encode("utf-16-be", "surrogatepass")
        units = struct.unpack(f">{len(raw) // 2}H", raw)
    h = 0
    for unit in units:
        h = (31 * h + unit) & 0xFFFFFFFF
    return h - (1 << 32) if h & 0x80000000 else h


@functools.lru_cache(maxsize=4096)  # tags repeat a lot; the Python loop above is not free
def tags_hash(tags: str) -> int:
    """The tag hash code of a ConsumeQueue record (RocketMQ's ``tagsString2tagsCode``):
    ``String.hashCode`` of the tags, 0 for no tags."""
    return java_string_hash(tags) if tags else 0


# ---------------------------------------------------------------------------------------
# Message
# ---------------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class Message:
    """One message as stored. ``keys`` are the KEYS property split on spaces; ``properties``
    are the user properties (system ones are fields here). ``uniq_id`` is 32 uppercase hex."""

    topic: str
    queue_id: int
    body: bytes
    tags: str = ""
    keys: tuple[str, ...] = ()
    properties: Mapping[str, str] = field(default_factory=dict)
    born_host: str = ""
    born_timestamp_ms: int = 0
    store_timestamp_ms: int = 0
    producer_group: str = ""
    uniq_id: str = ""
    reconsume_times: int = 0
    flag: int = 0
    sys_flag: int = 0


class DispatchInfo(NamedTuple):
    """What the dispatcher needs of one message, read without decoding the body.

    ``offset``/``size`` are relative to the buffer given to the reader (add the entry body's
    commitlog position to get the message's position).
    """

    offset: int
    size: int
    topic: str
    queue_id: int
    tags_hash: int
    keys: tuple[str, ...]
    uniq_id: str
    store_timestamp_ms: int


def validate_topic(topic: str) -> None:
    """Raise :class:`InvalidTopicError` unless ``topic`` is a valid RocketMQ topic name."""
    if not isinstance(topic, str) or not topic:
        raise InvalidTopicError("topic is empty")
    if len(topic) > MAX_TOPIC_LENGTH:
        raise InvalidTopicError(f"topic is {len(topic)} characters, more than {MAX_TOPIC_LENGTH}")
    if TOPIC_PATTERN.fullmatch(topic) is None:
        raise InvalidTopicError(f"topic {topic!r} has characters outside [%|a-zA-Z0-9_-]")


def _check_int(value: int, low: int, high: int, name: str) -> None:
    if not isinstance(value, int) or isinstance(value, bool) or not low <= value <= high:
        raise InvalidMessageError(f"{name}={value!r} is outside [{low}, {high}]")


def _utf8(value: str, name: str) -> bytes:
    if not isinstance(value, str):
        raise InvalidMessageError(f"{name} must be a str, not {type(value).__name__}")
    try:
        return value.encode("utf-8")
    except UnicodeEncodeError:
        raise InvalidMessageError(f"{name} is not valid Unicode (lone surrogate)") from None


def _encode_properties(properties: Mapping[str, str]) -> bytes:
    parts: list[str] = []
    for name in sorted(properties):
        value = properties[name]
        if not isinstance(name, str) or not isinstance(value, str):
            raise InvalidMessageError("property names and values must be str")
        if not name:
            raise InvalidMessageError("a property name is empty")
        for text in (name, value):
            if NAME_VALUE_SEPARATOR in text or PROPERTY_SEPARATOR in text:
                raise InvalidMessageError(
                    "a property name or value contains a reserved separator (\\x01 or \\x02)"
                )
        parts.append(f"{name}{NAME_VALUE_SEPARATOR}{value}{PROPERTY_SEPARATOR}")
    return _utf8("".join(parts), "properties")


def _encode_keys(keys: tuple[str, ...]) -> bytes:
    if not isinstance(keys, tuple):
        raise InvalidMessageError(f"keys must be a tuple of str, not {type(keys).__name__}")
    for key in keys:
        if not isinstance(key, str) or not key:
            raise InvalidMessageError("a key is empty or not a str")
        if KEY_SEPARATOR in key:
            raise InvalidMessageError("a key contains the key separator (a space)")
    return _utf8(KEY_SEPARATOR.join(keys), "keys")


def uniq_id_to_bytes(uniq_id: str) -> bytes:
    """The 16 bytes of a uniq id given as 32 uppercase hex characters."""
    if not isinstance(uniq_id, str):
        raise InvalidMessageIdError(f"a message id must be a str, not {type(uniq_id).__name__}")
    if _HEX32.fullmatch(uniq_id) is None:
        # Never echoed: an id can be megabytes long, and a detail is sent as a gRPC header.
        raise InvalidMessageIdError(
            f"a message id of {len(uniq_id)} characters is not 32 uppercase hex characters"
        )
    return bytes.fromhex(uniq_id)


def encode_message(
    msg: Message, max_message_size_bytes: int = DEFAULT_MAX_MESSAGE_SIZE_BYTES
) -> bytes:
    """Validate ``msg`` and encode it (docs/FORMAT.md, "Broker: Message")."""
    validate_topic(msg.topic)
    body = msg.body
    if not isinstance(body, bytes | bytearray | memoryview):
        raise InvalidMessageError(f"body must be bytes, not {type(body).__name__}")
    body_size = len(body)
    if body_size == 0:
        raise MessageBodyEmptyError("message body is empty")
    if body_size > max_message_size_bytes:
        raise MessageTooLargeError(
            f"message body is {body_size} bytes, more than maxMessageSize={max_message_size_bytes}"
        )
    _check_int(msg.queue_id, 0, _I32_MAX, "queue_id")
    _check_int(msg.reconsume_times, 0, _I32_MAX, "reconsume_times")
    _check_int(msg.flag, _I32_MIN, _I32_MAX, "flag")
    _check_int(msg.sys_flag, _I32_MIN, _I32_MAX, "sys_flag")
    _check_int(msg.born_timestamp_ms, 0, _I64_MAX, "born_timestamp_ms")
    _check_int(msg.store_timestamp_ms, 0, _I64_MAX, "store_timestamp_ms")
    topic_b = msg.topic.encode("ascii")
    tags_b = _utf8(msg.tags, "tags")
    keys_b = _encode_keys(msg.keys)
    props_b = _encode_properties(msg.properties)
    group_b = _utf8(msg.producer_group, "producer_group")
    if len(group_b) > MAX_PRODUCER_GROUP_BYTES:
        raise InvalidMessageError(
            f"producer_group is {len(group_b)} bytes, more than {MAX_PRODUCER_GROUP_BYTES}"
        )
    host_b = _utf8(msg.born_host, "born_host")
    if len(host_b) > MAX_BORN_HOST_BYTES:
        raise InvalidMessageError(
            f"born_host is {len(host_b)} bytes, more than {MAX_BORN_HOST_BYTES}"
        )
    props_total = len(tags_b) + len(keys_b) + len(props_b) + len(group_b)
    if props_total > MAX_PROPERTIES_BYTES:
        raise PropertiesTooLargeError(
            f"properties, tags, keys and producer group take {props_total} bytes,"
            f" more than {MAX_PROPERTIES_BYTES}"
        )
    uniq_b = uniq_id_to_bytes(msg.uniq_id)
    payload = b"".join(
        (
            MESSAGE_FIXED_AFTER_CRC.pack(
                MESSAGE_VERSION,
                0,
                msg.queue_id,
                msg.flag,
                msg.sys_flag,
                msg.reconsume_times,
                msg.born_timestamp_ms,
                msg.store_timestamp_ms,
                tags_hash(msg.tags),
                uniq_b,
            ),
            _U8.pack(len(topic_b)),
            topic_b,
            _U16.pack(len(tags_b)),
            tags_b,
            _U16.pack(len(keys_b)),
            keys_b,
            _U8.pack(len(group_b)),
            group_b,
            _U8.pack(len(host_b)),
            host_b,
            _U16.pack(len(props_b)),
            props_b,
            _U32.pack(body_size),
            body,
        )
    )
    total = MESSAGE_HEAD.size + len(payload)
    assert total >= MIN_MESSAGE_SIZE
    return MESSAGE_HEAD.pack(total, MESSAGE_MAGIC, crc32c(payload)) + payload


def encode_batch(
    messages: Sequence[Message], max_message_size_bytes: int = DEFAULT_MAX_MESSAGE_SIZE_BYTES
) -> tuple[bytes, list[int]]:
    """Encode a batch (docs/FORMAT.md, "Broker: Batch").

    Returns the batch bytes and each message's byte offset inside them (the first message is
    at :data:`BATCH_HEADER_SIZE`).
    """
    if not messages:
        raise InvalidMessageError("a batch needs at least one message")
    parts = [BATCH_HEADER.pack(BATCH_MAGIC, BATCH_VERSION, 0, 0, len(messages))]
    offsets: list[int] = []
    at = BATCH_HEADER_SIZE
    for msg in messages:
        encoded = encode_message(msg, max_message_size_bytes)
        offsets.append(at)
        parts.append(encoded)
        at += len(encoded)
    return b"".join(parts), offsets


_Buffer = bytes | bytearray | memoryview


class MessageFields(Protocol):
    """What :func:`encode_batch_fields` reads of each message: the fields of the broker API's
    ``Message`` (a protobuf message satisfies it), topic and store time aside."""

    @property
    def queue_id(self) -> int: ...
    @property
    def body(self) -> bytes: ...
    @property
    def tags(self) -> str: ...
    @property
    def keys(self) -> Sequence[str]: ...
    @property
    def properties(self) -> Mapping[str, str]: ...
    @property
    def born_host(self) -> str: ...
    @property
    def born_timestamp_ms(self) -> int: ...
    @property
    def producer_group(self) -> str: ...
    @property
    def msg_id(self) -> str: ...
    @property
    def reconsume_times(self) -> int: ...
    @property
    def flag(self) -> int: ...
    @property
    def sys_flag(self) -> int: ...


def encode_batch_fields(
    topic: str,
    items: Sequence[MessageFields],
    store_timestamp_ms: int,
    new_uniq_id: Callable[[], str],
    max_message_size_bytes: int = DEFAULT_MAX_MESSAGE_SIZE_BYTES,
) -> tuple[bytes, list[str]]:
    """The send path's encoder: the batch :func:`encode_batch` makes of the same messages
    (byte for byte, the same checks and errors), read straight from the request's fields
    instead of through a :class:`Message` per message. A missing ``born_timestamp_ms`` is the
    store time, a missing ``msg_id`` a fresh ``new_uniq_id()``. Returns the batch and the uniq
    ids."""
    if not items:
        raise InvalidMessageError("a batch needs at least one message")
    validate_topic(topic)
    _check_int(store_timestamp_ms, 0, _I64_MAX, "store_timestamp_ms")
    topic_part = _U8.pack(len(topic)) + topic.encode("ascii")
    tags_parts: dict[str, tuple[bytes, int, int]] = {}  # tags -> (part, length, hash)
    one_byte: dict[str, bytes] = {}  # producer group / born host -> length-prefixed bytes
    fixed_pack, u16, u32, head_pack = (
        MESSAGE_FIXED_AFTER_CRC.pack,
        _U16.pack,
        _U32.pack,
        MESSAGE_HEAD.pack,
    )
    parts = [BATCH_HEADER.pack(BATCH_MAGIC, BATCH_VERSION, 0, 0, len(items))]
    uniq_ids: list[str] = []
    for m in items:
        body = m.body
        body_size = len(body)
        if not 0 < body_size <= max_message_size_bytes or not isinstance(body, _Buffer):
            # The careful encoder names the problem.
            encode_message(
                message_from_fields(topic, m, store_timestamp_ms), max_message_size_bytes
            )
            raise AssertionError("encode_message accepted what the fast path refused")
        queue_id, reconsume, flag, sys_flag = m.queue_id, m.reconsume_times, m.flag, m.sys_flag
        born = m.born_timestamp_ms or store_timestamp_ms
        if not (
            0 <= queue_id <= _I32_MAX
            and 0 <= reconsume <= _I32_MAX
            and _I32_MIN <= flag <= _I32_MAX
            and _I32_MIN <= sys_flag <= _I32_MAX
            and 0 <= born <= _I64_MAX
        ):
            encode_message(
                message_from_fields(topic, m, store_timestamp_ms), max_message_size_bytes
            )
            raise AssertionError("encode_message accepted what the fast path refused")
        tags = m.tags
        tags_part = tags_parts.get(tags)
        if tags_part is None:
            tags_b = _utf8(tags, "tags")
            if len(tags_b) > MAX_PROPERTIES_BYTES:  # before its u16 length is packed
                raise PropertiesTooLargeError(
                    f"tags take {len(tags_b)} bytes, more than {MAX_PROPERTIES_BYTES}"
                )
            tags_part = tags_parts[tags] = (u16(len(tags_b)) + tags_b, len(tags_b), tags_hash(tags))
        keys = m.keys
        keys_b = _encode_keys(tuple(keys)) if keys else b""
        props = m.properties
        props_b = _encode_properties(props) if props else b""
        group_part = one_byte.get(m.producer_group)
        if group_part is None:
            group_part = one_byte[m.producer_group] = _one_byte_field(
                m.producer_group, "producer_group", MAX_PRODUCER_GROUP_BYTES
            )
        host_part = one_byte.get(m.born_host)
        if host_part is None:
            host_part = one_byte[m.born_host] = _one_byte_field(
                m.born_host, "born_host", MAX_BORN_HOST_BYTES
            )
        props_total = tags_part[1] + len(keys_b) + len(props_b) + len(group_part) - 1
        if props_total > MAX_PROPERTIES_BYTES:
            raise PropertiesTooLargeError(
                f"properties, tags, keys and producer group take {props_total} bytes,"
                f" more than {MAX_PROPERTIES_BYTES}"
            )
        uniq_id = m.msg_id or new_uniq_id()
        uniq_ids.append(uniq_id)
        payload = b"".join(
            (
                fixed_pack(
                    MESSAGE_VERSION,
                    0,
                    queue_id,
                    flag,
                    sys_flag,
                    reconsume,
                    born,
                    store_timestamp_ms,
                    tags_part[2],
                    uniq_id_to_bytes(uniq_id),
                ),
                topic_part,
                tags_part[0],
                u16(len(keys_b)),
                keys_b,
                group_part,
                host_part,
                u16(len(props_b)),
                props_b,
                u32(body_size),
                body,
            )
        )
        parts.append(head_pack(MESSAGE_HEAD.size + len(payload), MESSAGE_MAGIC, crc32c(payload)))
        parts.append(payload)
    return b"".join(parts), uniq_ids


def _one_byte_field(value: str, name: str, limit: int) -> bytes:
    raw = _utf8(value, name)
    if len(raw) > limit:
        raise InvalidMessageError(f"{name} is {len(raw)} bytes, more than {limit}")
    return _U8.pack(len(raw)) + raw


def message_from_fields(
    topic: str, m: MessageFields, store_timestamp_ms: int, uniq_id: str = ""
) -> Message:
    """``m`` as a :class:`Message` stored now: a missing born time is the store time, a
    missing ``msg_id`` is ``uniq_id`` (the careful encoder's input, and the send path's when
    a message needs more than encoding, e.g. a delay)."""
    return Message(
        topic=topic,
        queue_id=m.queue_id,
        body=m.body,
        tags=m.tags,
        keys=tuple(m.keys),
        properties=dict(m.properties),
        born_host=m.born_host,
        born_timestamp_ms=m.born_timestamp_ms or store_timestamp_ms,
        store_timestamp_ms=store_timestamp_ms,
        producer_group=m.producer_group,
        uniq_id=m.msg_id or uniq_id or "0" * 32,
        reconsume_times=m.reconsume_times,
        flag=m.flag,
        sys_flag=m.sys_flag,
    )


# ---------------------------------------------------------------------------------------
# Decoding
# ---------------------------------------------------------------------------------------


def _check_head(mv: memoryview, offset: int, verify_crc: bool) -> int:
    """Check the message starting at ``offset``; return its total size."""
    available = len(mv) - offset
    if offset < 0 or available < MESSAGE_HEAD.size:
        raise CorruptMessageError(
            f"truncated message header ({max(available, 0)} of {MESSAGE_HEAD.size} bytes)", offset
        )
    total, magic, crc = MESSAGE_HEAD.unpack_from(mv, offset)
    if magic != MESSAGE_MAGIC:
        raise CorruptMessageError(f"bad message magic {magic:#010x}", offset)
    if total < MIN_MESSAGE_SIZE:
        raise CorruptMessageError(f"message size {total} below minimum {MIN_MESSAGE_SIZE}", offset)
    if total > available:
        raise CorruptMessageError(
            f"truncated message: size {total} but {available} bytes left", offset
        )
    if verify_crc:
        actual = crc32c(mv[offset + MESSAGE_CRC_END : offset + total])
        if actual != crc:
            raise CorruptMessageError(
                f"message CRC mismatch (stored {crc:#010x}, computed {actual:#010x})", offset
            )
    return int(total)


def _field(
    mv: memoryview, at: int, end: int, width: int, name: str, start: int
) -> tuple[memoryview, int]:
    """Read a ``width``-byte big-endian length then that many bytes, inside ``[at, end)``."""
    if at + width > end:
        raise CorruptMessageError(f"truncated {name} length", start)
    length = int.from_bytes(mv[at : at + width], "big")
    at += width
    if at + length > end:
        raise CorruptMessageError(f"{name} length {length} overruns the message", start)
    return mv[at : at + length], at + length


def _text(raw: memoryview, name: str, start: int) -> str:
    try:
        return str(raw, "utf-8")
    except UnicodeDecodeError:
        raise CorruptMessageError(f"{name} is not UTF-8", start) from None


def _decode_properties(text: str, start: int) -> dict[str, str]:
    if not text:
        return {}
    items = text.split(PROPERTY_SEPARATOR)
    if items[-1] != "":
        raise CorruptMessageError("properties do not end with a separator", start)
    props: dict[str, str] = {}
    for item in items[:-1]:
        name, sep, value = item.partition(NAME_VALUE_SEPARATOR)
        if not sep or not name:
            raise CorruptMessageError("malformed property", start)
        props[name] = value
    return props


def _split_keys(text: str) -> tuple[str, ...]:
    return tuple(text.split(KEY_SEPARATOR)) if text else ()


def decode_message(buf: _Buffer, offset: int = 0, *, verify_crc: bool = True) -> Message:
    """Decode the message starting at ``buf[offset]``.

    Raises :class:`CorruptMessageError` (never ``IndexError``) on any bad or missing byte.
    """
    mv = buf if isinstance(buf, memoryview) else memoryview(buf)
    try:
        return _decode_fast(mv, offset, verify_crc)
    except (ValueError, IndexError, struct.error, CorruptMessageError):
        # The careful reader decides, and names the bad field.
        return _decode_careful(mv, offset, verify_crc)


def check_message(raw: _Buffer, position: int = 0) -> None:
    """Raise :class:`CorruptMessageError` unless ``raw`` is exactly one message whose head
    and CRC check out (``position``: where it was read, for the error)."""
    mv = raw if isinstance(raw, memoryview) else memoryview(raw)
    try:
        total = _check_head(mv, 0, True)
    except CorruptMessageError as exc:
        raise CorruptMessageError(
            f"{exc.reason} (message at commitlog position {position})", 0
        ) from None
    if total != len(mv):
        raise CorruptMessageError(
            f"message at position {position} is {total} bytes, its record says {len(mv)}", 0
        )


def _assemble(
    fixed: tuple[Any, ...],
    topic: str,
    body: bytes,
    tags: str,
    keys: str,
    properties: dict[str, str],
    born_host: str,
    producer_group: str,
) -> Message:
    """A :class:`Message` from its unpacked fixed part and its decoded variable fields."""
    (
        _total,
        _magic,
        _crc,
        _version,
        _reserved,
        queue_id,
        flag,
        sys_flag,
        reconsume_times,
        born_ts,
        store_ts,
        _tags_hash,
        uniq_b,
    ) = fixed
    return Message(
        topic=topic,
        queue_id=queue_id,
        body=body,
        tags=tags,
        keys=_split_keys(keys),
        properties=properties,
        born_host=born_host,
        born_timestamp_ms=born_ts,
        store_timestamp_ms=store_ts,
        producer_group=producer_group,
        uniq_id=bytes(uniq_b).hex().upper(),
        reconsume_times=reconsume_times,
        flag=flag,
        sys_flag=sys_flag,
    )


def _decode_fast(mv: memoryview, offset: int, verify_crc: bool) -> Message:
    """The read path's decoder (pulls, lookups): the fixed part in one unpack, then the
    variable part from one copy. Raises anything on a bad byte; the caller falls back."""
    fixed = MESSAGE_FIXED.unpack_from(mv, offset)
    total, magic, crc, version, reserved = fixed[:5]
    end = offset + total
    if (
        magic != MESSAGE_MAGIC
        or version != MESSAGE_VERSION
        or reserved
        or total < MIN_MESSAGE_SIZE
        or end > len(mv)
    ):
        raise ValueError
    if verify_crc and crc32c(mv[offset + MESSAGE_CRC_END : end]) != crc:
        raise ValueError
    raw = bytes(mv[offset + MESSAGE_FIXED_SIZE : end])
    p = raw[0] + 1
    topic = raw[1:p].decode()
    n = int.from_bytes(raw[p : p + 2], "big") + p + 2
    tags = raw[p + 2 : n].decode()
    p = int.from_bytes(raw[n : n + 2], "big") + n + 2
    keys = raw[n + 2 : p].decode()
    n = raw[p] + p + 1
    group = raw[p + 1 : n].decode()
    p = raw[n] + n + 1
    host = raw[n + 1 : p].decode()
    n = int.from_bytes(raw[p : p + 2], "big") + p + 2
    props = raw[p + 2 : n].decode()
    p = int.from_bytes(raw[n : n + 4], "big") + n + 4
    if p != len(raw) or n + 4 > p:
        raise ValueError
    properties = _decode_properties(props, offset) if props else {}
    return _assemble(fixed, topic, raw[n + 4 :], tags, keys, properties, host, group)


def _decode_careful(mv: memoryview, offset: int, verify_crc: bool) -> Message:
    total = _check_head(mv, offset, verify_crc)
    end = offset + total
    fixed = MESSAGE_FIXED.unpack_from(mv, offset)
    version, reserved = fixed[3], fixed[4]
    if version != MESSAGE_VERSION:
        raise CorruptMessageError(f"unknown message version {version}", offset)
    if reserved != 0:
        raise CorruptMessageError("reserved message bytes are not zero", offset)
    at = offset + MESSAGE_FIXED_SIZE
    topic_raw, at = _field(mv, at, end, 1, "topic", offset)
    tags_raw, at = _field(mv, at, end, 2, "tags", offset)
    keys_raw, at = _field(mv, at, end, 2, "keys", offset)
    group_raw, at = _field(mv, at, end, 1, "producer_group", offset)
    host_raw, at = _field(mv, at, end, 1, "born_host", offset)
    props_raw, at = _field(mv, at, end, 2, "properties", offset)
    body_raw, at = _field(mv, at, end, 4, "body", offset)
    if at != end:
        raise CorruptMessageError(f"{end - at} unexplained bytes at the end of message", offset)
    return _assemble(
        fixed,
        topic=_text(topic_raw, "topic", offset),
        body=bytes(body_raw),
        tags=_text(tags_raw, "tags", offset),
        keys=_text(keys_raw, "keys", offset),
        properties=_decode_properties(_text(props_raw, "properties", offset), offset),
        born_host=_text(host_raw, "born_host", offset),
        producer_group=_text(group_raw, "producer_group", offset),
    )


def read_dispatch(buf: _Buffer, offset: int = 0, *, verify_crc: bool = True) -> DispatchInfo:
    """The dispatcher's view of the message at ``buf[offset]``: no body, no properties."""
    mv = buf if isinstance(buf, memoryview) else memoryview(buf)
    total = _check_head(mv, offset, verify_crc)
    end = offset + total
    fixed = MESSAGE_FIXED.unpack_from(mv, offset)
    if fixed[3] != MESSAGE_VERSION:
        raise CorruptMessageError(f"unknown message version {fixed[3]}", offset)
    at = offset + MESSAGE_FIXED_SIZE
    topic_raw, at = _field(mv, at, end, 1, "topic", offset)
    _tags_raw, at = _field(mv, at, end, 2, "tags", offset)
    keys_raw, at = _field(mv, at, end, 2, "keys", offset)
    uniq_b: bytes = fixed[12]
    return DispatchInfo(
        offset,
        total,
        _text(topic_raw, "topic", offset),
        fixed[5],
        fixed[11],
        _split_keys(_text(keys_raw, "keys", offset)),
        uniq_b.hex().upper(),
        fixed[10],
    )


def is_batch(body: _Buffer) -> bool:
    """Whether ``body`` starts with a batch header (cheap check; no validation)."""
    return len(body) >= BATCH_HEADER_SIZE and _U32.unpack_from(body, 0)[0] == BATCH_MAGIC


def _batch_count(mv: memoryview) -> int:
    if len(mv) < BATCH_HEADER_SIZE:
        raise CorruptMessageError(
            f"truncated batch header ({len(mv)} of {BATCH_HEADER_SIZE} bytes)", 0
        )
    magic, version, reserved8, reserved16, count = BATCH_HEADER.unpack_from(mv, 0)
    if magic != BATCH_MAGIC:
        raise CorruptMessageError(f"bad batch magic {magic:#010x}", 0)
    if version != BATCH_VERSION:
        raise CorruptMessageError(f"unknown batch version {version}", 0)
    if reserved8 or reserved16:
        raise CorruptMessageError("reserved batch header bytes are not zero", 0)
    if count == 0:
        raise CorruptMessageError("batch holds no message", 0)
    if count * MIN_MESSAGE_SIZE > len(mv) - BATCH_HEADER_SIZE:
        raise CorruptMessageError(f"batch count {count} cannot fit in {len(mv)} bytes", 0)
    return int(count)


def batch_count(body: _Buffer) -> int:
    """The number of messages a batch header announces (header checks only)."""
    return _batch_count(body if isinstance(body, memoryview) else memoryview(body))


def iter_batch(body: _Buffer, *, verify_crc: bool = True) -> Iterator[tuple[int, int, memoryview]]:
    """Yield ``(offset, size, view)`` for each message of a batch; ``view`` is a zero-copy
    memoryview of the encoded message (``decode_message(view)`` decodes it).

    Checks every message's head (and CRC when ``verify_crc``), that the count matches and that
    the messages exactly fill ``body``; raises :class:`CorruptMessageError` at the first bad
    byte (messages before it have been yielded already).
    """
    mv = body if isinstance(body, memoryview) else memoryview(body)
    count = _batch_count(mv)
    at = BATCH_HEADER_SIZE
    for _ in range(count):
        size = _check_head(mv, at, verify_crc)
        yield at, size, mv[at : at + size]
        at += size
    if at != len(mv):
        raise CorruptMessageError(f"{len(mv) - at} bytes after the last message of the batch", at)


def iter_dispatch(body: _Buffer, *, verify_crc: bool = True) -> Iterator[DispatchInfo]:
    """:func:`read_dispatch` for every message of a batch, with :func:`iter_batch`'s checks."""
    mv = body if isinstance(body, memoryview) else memoryview(body)
    for at, _size, _view in iter_batch(mv, verify_crc=verify_crc):
        yield read_dispatch(mv, at, verify_crc=False)


# total, magic, (crc), version, (reserved), queue_id, (flag, sys_flag, reconsume_times,
# born_timestamp_ms), store_timestamp_ms, tags_hash, uniq_id, topic length: what the dispatcher
# reads of a message's fixed part, in one unpack.
_DISPATCH_HEAD = struct.Struct(">II4xH2xi12x8xqq16sB")
assert _DISPATCH_HEAD.size == MESSAGE_FIXED_SIZE + 1

DispatchRow = tuple[int, int, str, int, int, tuple[str, ...], str, int]


def scan_dispatch(body: _Buffer) -> list[DispatchRow]:
    """:func:`iter_dispatch` of a whole batch without CRC checks, as plain tuples in
    :class:`DispatchInfo`'s field order: the apply path of every member, per message one
    unpack and a few slices. Any inconsistency falls back to :func:`iter_dispatch`, which
    raises the precise :class:`CorruptMessageError`."""
    mv = body if isinstance(body, memoryview) else memoryview(body)
    count = _batch_count(mv)
    end = len(mv)
    unpack = _DISPATCH_HEAD.unpack_from
    topics: dict[bytes, str] = {}
    rows: list[DispatchRow] = []
    append = rows.append
    at = BATCH_HEADER_SIZE
    try:
        for _ in range(count):
            total, magic, version, queue_id, store_ts, t_hash, uniq_b, topic_len = unpack(mv, at)
            stop = at + total
            p = at + MESSAGE_FIXED_SIZE + 1
            q = p + topic_len
            tags_at = q + 2
            keys_at = tags_at + int.from_bytes(mv[q:tags_at], "big") + 2
            keys_end = keys_at + int.from_bytes(mv[keys_at - 2 : keys_at], "big")
            if (
                magic != MESSAGE_MAGIC
                or version != MESSAGE_VERSION
                or total < MIN_MESSAGE_SIZE
                or stop > end
                or keys_end > stop
            ):
                raise ValueError
            topic_b = bytes(mv[p:q])
            topic = topics.get(topic_b)
            if topic is None:
                topic = topics[topic_b] = topic_b.decode()
            keys: tuple[str, ...] = ()
            if keys_end > keys_at:
                keys = tuple(str(mv[keys_at:keys_end], "utf-8").split(KEY_SEPARATOR))
            append((at, total, topic, queue_id, t_hash, keys, uniq_b.hex().upper(), store_ts))
            at = stop
        if at != end:
            raise ValueError
    except (ValueError, struct.error, UnicodeDecodeError):
        # The careful reader decides: it raises where the batch is bad (or, were the fast
        # checks stricter than it, reads the batch).
        return [tuple(info) for info in iter_dispatch(mv, verify_crc=False)]  # type: ignore[misc]
    return rows


def decode_batch(body: _Buffer, *, verify_crc: bool = True) -> list[Message]:
    """Every message of a batch, decoded."""
    return [
        decode_message(view, verify_crc=False)
        for _, _, view in iter_batch(body, verify_crc=verify_crc)
    ]


# ---------------------------------------------------------------------------------------
# Message ids
# ---------------------------------------------------------------------------------------


class UniqIdInfo(NamedTuple):
    """The parts of a uniq id. ``timestamp_ms`` is reconstructed, hence "near": the id holds
    only ms since the start of a month (UTC), resolved against a reference time."""

    ip: str
    pid: int
    instance_hash: int
    timestamp_ms: int
    counter: int


class OffsetMsgId(NamedTuple):
    """RocketMQ's offsetMsgId: where a message is stored (host, port, commitlog position)."""

    ip: str
    port: int
    position: int


_UNIQ_PREFIX = struct.Struct(">4sHI")  # ip, pid (low 16 bits), instance hash
_UNIQ_SUFFIX = struct.Struct(">IH")  # ms since month start, counter
_OFFSET_MSG_ID = struct.Struct(">4sIQ")
assert _UNIQ_PREFIX.size + _UNIQ_SUFFIX.size == UNIQ_ID_BYTES
assert _OFFSET_MSG_ID.size == UNIQ_ID_BYTES


def _month_start_ms(now_ms: int) -> int:
    day = _dt.datetime.fromtimestamp(now_ms / 1000, tz=_dt.UTC)
    return calendar.timegm((day.year, day.month, 1, 0, 0, 0)) * 1000


def _previous_month_start_ms(month_start_ms: int) -> int:
    return _month_start_ms(month_start_ms - 1)


def _next_month_start_ms(month_start_ms: int) -> int:
    day = _dt.datetime.fromtimestamp(month_start_ms / 1000, tz=_dt.UTC)
    year, month = (day.year + 1, 1) if day.month == 12 else (day.year, day.month + 1)
    return calendar.timegm((year, month, 1, 0, 0, 0)) * 1000


@functools.lru_cache(maxsize=256)  # one store host per node: parsed once, not per message
def _ipv4_bytes(ip: str) -> bytes:
    try:
        return ipaddress.IPv4Address(ip).packed
    except (ipaddress.AddressValueError, ValueError):
        raise InvalidMessageIdError(f"{ip!r} is not an IPv4 address") from None


def local_ipv4() -> str:
    """This host's outbound IPv4 address (no packet is sent), 127.0.0.1 when there is none."""
    try:
        with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as sock:
            sock.connect(("10.255.255.255", 1))
            address: str = sock.getsockname()[0]
            return address
    except OSError:
        return "127.0.0.1"


class UniqIdGenerator:
    """Makes uniq ids like RocketMQ's ``MessageClientIDSetter``: a fixed 10-byte prefix (IPv4,
    pid, a per-generator hash) then ms since the start of the month UTC (u32) and a 16-bit
    counter. Thread safe. Ids of one generator are unique unless it makes more than 65,536
    ids in one millisecond."""

    def __init__(
        self,
        ip: str | None = None,
        pid: int | None = None,
        instance_hash: int | None = None,
        clock_ms: Callable[[], int] | None = None,
    ) -> None:
        ip_b = _ipv4_bytes(ip if ip is not None else local_ipv4())
        if instance_hash is None:
            instance_hash = int.from_bytes(os.urandom(4), "big")
        self._prefix = _UNIQ_PREFIX.pack(
            ip_b, (os.getpid() if pid is None else pid) & 0xFFFF, instance_hash & 0xFFFFFFFF
        )
        self._clock_ms = clock_ms if clock_ms is not None else time.time_ns
        self._use_ns = clock_ms is None
        self._lock = threading.Lock()
        self._counter = 0
        now = self._now_ms()
        self._month_start_ms = _month_start_ms(now)
        self._next_month_ms = _next_month_start_ms(self._month_start_ms)

    def _now_ms(self) -> int:
        now = self._clock_ms()
        return now // 1_000_000 if self._use_ns else now

    def next_id(self) -> str:
        with self._lock:
            now = self._now_ms()
            if now >= self._next_month_ms or now < self._month_start_ms:
                self._month_start_ms = _month_start_ms(now)
                self._next_month_ms = _next_month_start_ms(self._month_start_ms)
            counter = self._counter
            self._counter = (counter + 1) & 0xFFFF
            since_month_ms = now - self._month_start_ms
        assert 0 <= since_month_ms < 1 << 32  # a month is < 2^32 ms (49.7 days)
        return (self._prefix + _UNIQ_SUFFIX.pack(since_month_ms, counter)).hex().upper()


def parse_uniq_id(uniq_id: str, now_ms: int | None = None) -> UniqIdInfo:
    """Split a uniq id into its parts; its time is resolved against ``now_ms`` (default: now):
    the same month if that is not in the future, else the month before."""
    raw = uniq_id_to_bytes(uniq_id)
    ip_b, pid, instance_hash = _UNIQ_PREFIX.unpack_from(raw, 0)
    since_month_ms, counter = _UNIQ_SUFFIX.unpack_from(raw, _UNIQ_PREFIX.size)
    if now_ms is None:
        now_ms = time.time_ns() // 1_000_000
    start = _month_start_ms(now_ms)
    if start + since_month_ms > now_ms:
        start = _previous_month_start_ms(start)
    return UniqIdInfo(
        str(ipaddress.IPv4Address(ip_b)), pid, instance_hash, start + since_month_ms, counter
    )


def encode_offset_msg_id(ip: str, port: int, position: int) -> str:
    """RocketMQ's offsetMsgId: store IPv4 (4 bytes), port (4), commitlog position (8), as 32
    uppercase hex characters."""
    if not isinstance(port, int) or not 0 <= port <= 0xFFFF:
        raise InvalidMessageIdError(f"port {port!r} is outside [0, 65535]")
    if not isinstance(position, int) or not 0 <= position <= _I64_MAX:
        raise InvalidMessageIdError(f"position {position!r} is outside [0, 2^63)")
    return _OFFSET_MSG_ID.pack(_ipv4_bytes(ip), port, position).hex().upper()


def decode_offset_msg_id(msg_id: str) -> OffsetMsgId:
    """Inverse of :func:`encode_offset_msg_id` (accepts lower case hex too)."""
    if not isinstance(msg_id, str):
        raise InvalidMessageIdError(f"offsetMsgId must be a str, not {type(msg_id).__name__}")
    raw = uniq_id_to_bytes(msg_id.upper())
    ip_b, port, position = _OFFSET_MSG_ID.unpack(raw)
    if port > 0xFFFF or position > _I64_MAX:
        raise InvalidMessageIdError(f"offsetMsgId {msg_id!r} has a port or position out of range")
    return OffsetMsgId(str(ipaddress.IPv4Address(ip_b)), port, position)
