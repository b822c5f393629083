"""The encoders: validate a message and write the stored layout (docs/FORMAT.md, "Broker:
Message" and "Batch").

Encoding is canonical (properties sorted by name), so equal messages encode to equal bytes.
:func:`encode_message` / :func:`encode_batch` are the careful encoders, one check per field,
each error naming the field; :func:`encode_batch_fields` is the send path's encoder, reading a
request's fields directly, byte for byte the same output and the same errors.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Mapping, Sequence
from typing import NoReturn, Protocol

from msgcodec.errors import (
    InvalidMessageError,
    InvalidMessageIdError,
    InvalidTopicError,
    MessageBodyEmptyError,
    MessageTooLargeError,
    PropertiesTooLargeError,
)
from msgcodec.layout import (
    BATCH_HEADER,
    BATCH_HEADER_SIZE,
    BATCH_MAGIC,
    BATCH_VERSION,
    DEFAULT_MAX_MESSAGE_SIZE_BYTES,
    I32_MAX,
    I32_MIN,
    I64_MAX,
    KEY_SEPARATOR,
    MAX_BORN_HOST_BYTES,
    MAX_PRODUCER_GROUP_BYTES,
    MAX_PROPERTIES_BYTES,
    MAX_TOPIC_LENGTH,
    MESSAGE_FIXED_AFTER_CRC,
    MESSAGE_HEAD,
    MESSAGE_MAGIC,
    MESSAGE_VERSION,
    MIN_MESSAGE_SIZE,
    NAME_VALUE_SEPARATOR,
    PROPERTY_SEPARATOR,
    TOPIC_CHARACTERS,
    TOPIC_PATTERN,
    U8,
    U16,
    U32,
    Buffer,
    Message,
    crc32c,
    crc32c_more,
    tags_hash,
)

_HEX32 = re.compile(r"[0-9A-F]{32}")


def validate_topic(topic: str) -> None:
    """Raise :class:`InvalidTopicError` unless ``topic`` is a valid RocketMQ topic name."""
    if not isinstance(topic, str) or not topic:
        raise InvalidTopicError("topic is empty")
    if len(topic) > MAX_TOPIC_LENGTH:
        raise InvalidTopicError(f"topic is {len(topic)} characters, more than {MAX_TOPIC_LENGTH}")
    if TOPIC_PATTERN.fullmatch(topic) is None:
        raise InvalidTopicError(f"topic {topic!r} has characters outside [{TOPIC_CHARACTERS}]")


def _check_int(value: int, low: int, high: int, name: str) -> None:
    if not isinstance(value, int) or isinstance(value, bool) or not low <= value <= high:
        raise InvalidMessageError(f"{name}={value!r} is outside [{low}, {high}]")


def _check_ints(msg: Message) -> None:
    _check_int(msg.queue_id, 0, I32_MAX, "queue_id")
    _check_int(msg.reconsume_times, 0, I32_MAX, "reconsume_times")
    _check_int(msg.flag, I32_MIN, I32_MAX, "flag")
    _check_int(msg.sys_flag, I32_MIN, I32_MAX, "sys_flag")
    _check_int(msg.born_timestamp_ms, 0, I64_MAX, "born_timestamp_ms")
    _check_int(msg.store_timestamp_ms, 0, I64_MAX, "store_timestamp_ms")


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
    _check_ints(msg)
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
            U8.pack(len(topic_b)),
            topic_b,
            U16.pack(len(tags_b)),
            tags_b,
            U16.pack(len(keys_b)),
            keys_b,
            U8.pack(len(group_b)),
            group_b,
            U8.pack(len(host_b)),
            host_b,
            U16.pack(len(props_b)),
            props_b,
            U32.pack(body_size),
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


class MessageFields(Protocol):
    """What :func:`encode_batch_fields` reads of each message: the fields of the broker API's
    ``Message`` (a protobuf message satisfies it), topic and store time aside."""

    @property
    def queue_id(self) -> int: ...
    @property
    def body(self) -> bytes | memoryview: ...
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
    _check_int(store_timestamp_ms, 0, I64_MAX, "store_timestamp_ms")
    topic_part = U8.pack(len(topic)) + topic.encode("ascii")
    tags_parts: dict[str, tuple[bytes, int, int]] = {}  # tags -> (part, length, hash)
    one_byte: dict[str, bytes] = {}  # producer group / born host -> length-prefixed bytes
    fixed_pack, u16, u32, head_pack = (
        MESSAGE_FIXED_AFTER_CRC.pack,
        U16.pack,
        U32.pack,
        MESSAGE_HEAD.pack,
    )
    parts: list[Buffer] = [BATCH_HEADER.pack(BATCH_MAGIC, BATCH_VERSION, 0, 0, len(items))]
    uniq_ids: list[str] = []
    for m in items:
        body = m.body
        body_size = len(body)
        queue_id, reconsume, flag, sys_flag = m.queue_id, m.reconsume_times, m.flag, m.sys_flag
        born = m.born_timestamp_ms or store_timestamp_ms
        if not (
            0 < body_size <= max_message_size_bytes
            and isinstance(body, Buffer)
            and 0 <= queue_id <= I32_MAX
            and 0 <= reconsume <= I32_MAX
            and I32_MIN <= flag <= I32_MAX
            and I32_MIN <= sys_flag <= I32_MAX
            and 0 <= born <= I64_MAX
        ):
            _refuse(topic, m, store_timestamp_ms, max_message_size_bytes)
        # Parts that repeat across a batch (tags, group, host) are encoded once: `or` falls
        # through only on a miss (a cached part is never empty).
        tags_part = tags_parts.get(m.tags) or tags_parts.setdefault(m.tags, _tags_part(m.tags))
        keys = m.keys
        keys_b = _encode_keys(tuple(keys)) if keys else b""
        props = m.properties
        props_b = _encode_properties(props) if props else b""
        group, host = m.producer_group, m.born_host
        group_part = one_byte.get(group) or one_byte.setdefault(
            group, _one_byte_field(group, "producer_group", MAX_PRODUCER_GROUP_BYTES)
        )
        host_part = one_byte.get(host) or one_byte.setdefault(
            host, _one_byte_field(host, "born_host", MAX_BORN_HOST_BYTES)
        )
        props_total = tags_part[1] + len(keys_b) + len(props_b) + len(group_part) - 1
        if props_total > MAX_PROPERTIES_BYTES:
            raise PropertiesTooLargeError(
                f"properties, tags, keys and producer group take {props_total} bytes,"
                f" more than {MAX_PROPERTIES_BYTES}"
            )
        uniq_id = m.msg_id or new_uniq_id()
        uniq_ids.append(uniq_id)
        fields = b"".join(
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
            )
        )
        crc = crc32c_more(body, crc32c(fields))  # the body's one copy is the batch's join
        parts.append(head_pack(MESSAGE_HEAD.size + len(fields) + body_size, MESSAGE_MAGIC, crc))
        parts += (fields, body)
    return b"".join(parts), uniq_ids


def _refuse(topic: str, m: MessageFields, store_timestamp_ms: int, max_size_bytes: int) -> NoReturn:
    """Raise the careful encoder's error for a message the fast path refused (it names the
    field)."""
    encode_message(message_from_fields(topic, m, store_timestamp_ms), max_size_bytes)
    raise AssertionError("encode_message accepted what the fast path refused")


def _tags_part(tags: str) -> tuple[bytes, int, int]:
    """Tags as the fast encoder caches them: (length-prefixed bytes, length, hash)."""
    tags_b = _utf8(tags, "tags")
    if len(tags_b) > MAX_PROPERTIES_BYTES:  # before its u16 length is packed
        raise PropertiesTooLargeError(
            f"tags take {len(tags_b)} bytes, more than {MAX_PROPERTIES_BYTES}"
        )
    return U16.pack(len(tags_b)) + tags_b, len(tags_b), tags_hash(tags)


def _one_byte_field(value: str, name: str, limit: int) -> bytes:
    raw = _utf8(value, name)
    if len(raw) > limit:
        raise InvalidMessageError(f"{name} is {len(raw)} bytes, more than {limit}")
    return U8.pack(len(raw)) + raw


def message_from_fields(
    topic: str, m: MessageFields, store_timestamp_ms: int, uniq_id: str = ""
) -> Message:
    """``m`` as a :class:`Message` stored now: a missing born time is the store time, a
    missing ``msg_id`` is ``uniq_id`` (the careful encoder's input, and the send path's when
    a message needs more than encoding, e.g. a delay)."""
    return Message(
        topic=topic,
        queue_id=m.queue_id,
        # A Message holds bytes: a body viewing a request (OutgoingMessage) is copied here,
        # on the careful path only (delays, timers, half messages).
        body=m.body if isinstance(m.body, bytes) else bytes(m.body),
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
