"""The decoders: read the stored layout back (docs/FORMAT.md, "Broker: Message" and "Batch").

Two readers of one message, always in agreement (a differential test holds them to it):

- the *fast* reader (:func:`_decode_fast`): a run of messages in one loop, each with the
  fixed part in one unpack and its fields sliced from the buffer, few checks; it may raise
  anything on a bad byte;
- the *careful* reader (:func:`_decode_careful`): every length checked against the message's
  end before it is used, every text checked as UTF-8; it raises :class:`CorruptMessageError`
  naming the field.

:func:`decode_rows` runs the fast reader and, when it fails, the careful one, which then
either raises the precise error or (were the fast checks stricter than it) reads the message.
Decoding never raises ``IndexError``/``struct.error``.

A decoded message is a :data:`MessageRow`, a plain tuple (cheaper to make than an object, and
what the broker's :class:`Message` and the client's ``MessageExt`` are both built from).
"""

from __future__ import annotations

import struct
from collections.abc import Iterator
from typing import Final, NamedTuple

from msgcodec.errors import CorruptMessageError
from msgcodec.layout import (
    BATCH_HEADER,
    BATCH_HEADER_SIZE,
    BATCH_MAGIC,
    BATCH_VERSION,
    KEY_SEPARATOR,
    MESSAGE_CRC_END,
    MESSAGE_FIXED,
    MESSAGE_FIXED_SIZE,
    MESSAGE_HEAD,
    MESSAGE_MAGIC,
    MESSAGE_VERSION,
    MIN_MESSAGE_SIZE,
    NAME_VALUE_SEPARATOR,
    PROPERTY_SEPARATOR,
    U32,
    Buffer,
    Message,
    crc32c,
)

# One decoded message: its stored size, then :class:`Message`'s fields in their order (topic,
# queue_id, body, tags, keys, properties, born_host, born_timestamp_ms, store_timestamp_ms,
# producer_group, uniq_id, reconsume_times, flag, sys_flag).
MessageRow = tuple[
    int,
    str,
    int,
    bytes,
    str,
    tuple[str, ...],
    dict[str, str],
    str,
    int,
    int,
    str,
    str,
    int,
    int,
    int,
]
# The names of a MessageRow's fields, in order; ``row[ROW_UNIQ_ID]`` instead of a bare index.
MESSAGE_ROW_FIELDS = (
    "size",
    "topic",
    "queue_id",
    "body",
    "tags",
    "keys",
    "properties",
    "born_host",
    "born_timestamp_ms",
    "store_timestamp_ms",
    "producer_group",
    "uniq_id",
    "reconsume_times",
    "flag",
    "sys_flag",
)
ROW_UNIQ_ID: Final = 11  # a literal, so that typing knows row[ROW_UNIQ_ID] is a str


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


def _check_head(mv: memoryview, offset: int, verify_crc: bool) -> int:
    """Check the message starting at ``offset``; return its total size."""
    if offset < 0:
        raise CorruptMessageError("a message cannot start at a negative offset", offset)
    available = len(mv) - offset
    if available < MESSAGE_HEAD.size:
        raise CorruptMessageError(
            f"truncated message header ({max(available, 0)} of {MESSAGE_HEAD.size} bytes)",
            offset,
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


def _decode_fast(buf: Buffer, offset: int, count: int, verify_crc: bool) -> list[MessageRow]:
    """The read path's decoder (pulls, lookups): ``count`` messages back to back from
    ``buf[offset]``, each with its fixed part in one unpack and each variable field sliced
    from the bytes (the body copied once), in one loop (no call per message). Raises
    anything on a bad byte; the caller falls back to the careful reader."""
    if offset < 0:  # unpack_from and slices would count from the end
        raise ValueError
    # Slices of bytes are bytes: fields are cut from ``buf`` itself. Another buffer (a view
    # of a batch, whose slices would be views) gives one copy of each message to cut from.
    whole: bytes | None = buf if isinstance(buf, bytes) else None
    rows: list[MessageRow] = []
    append = rows.append
    unpack = MESSAGE_FIXED.unpack_from
    size = len(buf)
    mv = buf if isinstance(buf, memoryview) else memoryview(buf)  # CRCs without a copy
    for _ in range(count):
        (total, magic, crc, version, reserved, queue_id, flag, sys_flag, reconsume, born,
         store, _, uniq_b) = unpack(buf, offset)  # fmt: skip
        end = offset + total
        if (
            magic != MESSAGE_MAGIC
            or version != MESSAGE_VERSION
            or reserved
            or total < MIN_MESSAGE_SIZE
            or end > size
        ):
            raise ValueError
        if verify_crc and crc32c(mv[offset + MESSAGE_CRC_END : end]) != crc:
            raise ValueError
        data, at = (whole, offset) if whole is not None else (bytes(mv[offset:end]), 0)
        stop = at + total
        # Lengths only add up: a field that overruns the message leaves the sum beyond its
        # end (or reads past the buffer and raises), never at it.
        p = at + MESSAGE_FIXED_SIZE + 1 + data[at + MESSAGE_FIXED_SIZE]
        topic = data[at + MESSAGE_FIXED_SIZE + 1 : p].decode()
        n = p + 2 + (data[p] << 8 | data[p + 1])
        tags = data[p + 2 : n].decode()
        p = n + 2 + (data[n] << 8 | data[n + 1])
        keys = data[n + 2 : p].decode()
        n = p + 1 + data[p]
        group = data[p + 1 : n].decode()
        p = n + 1 + data[n]
        host = data[n + 1 : p].decode()
        n = p + 2 + (data[p] << 8 | data[p + 1])
        props = data[p + 2 : n].decode()
        p = n + 4 + int.from_bytes(data[n : n + 4], "big")
        if p != stop or n + 4 > stop:
            raise ValueError
        append(
            (
                total,
                topic,
                queue_id,
                data[n + 4 : stop],
                tags,
                tuple(keys.split(KEY_SEPARATOR)) if keys else (),
                _decode_properties(props, offset) if props else {},
                host,
                born,
                store,
                group,
                uniq_b.hex().upper(),
                reconsume,
                flag,
                sys_flag,
            )
        )
        offset = end
    return rows


def _decode_careful(mv: memoryview, offset: int, verify_crc: bool) -> MessageRow:
    """The validating decoder: every length checked before it is used; raises
    :class:`CorruptMessageError` naming the field."""
    total = _check_head(mv, offset, verify_crc)
    end = offset + total
    (_, _, _, version, reserved, queue_id, flag, sys_flag, reconsume, born, store, _,
     uniq_b) = MESSAGE_FIXED.unpack_from(mv, offset)  # fmt: skip
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
    return (
        total,
        _text(topic_raw, "topic", offset),
        queue_id,
        bytes(body_raw),
        _text(tags_raw, "tags", offset),
        _split_keys(_text(keys_raw, "keys", offset)),
        _decode_properties(_text(props_raw, "properties", offset), offset),
        _text(host_raw, "born_host", offset),
        born,
        store,
        _text(group_raw, "producer_group", offset),
        bytes(uniq_b).hex().upper(),
        reconsume,
        flag,
        sys_flag,
    )


def _decode_careful_run(
    mv: memoryview, offset: int, count: int, verify_crc: bool
) -> list[MessageRow]:
    rows: list[MessageRow] = []
    for _ in range(count):
        row = _decode_careful(mv, offset, verify_crc)
        rows.append(row)
        offset += row[0]
    return rows


def decode_rows(
    buf: Buffer, offset: int = 0, count: int = 1, *, verify_crc: bool = True
) -> list[MessageRow]:
    """``count`` messages stored back to back from ``buf[offset]`` (a raw pull answer, or the
    messages of a batch), each a :data:`MessageRow` (its size first).

    Raises :class:`CorruptMessageError` (never ``IndexError``) on any bad or missing byte,
    with the offset of the bad message in ``buf``.
    """
    try:
        return _decode_fast(buf, offset, count, verify_crc)
    except (ValueError, IndexError, struct.error, CorruptMessageError):
        # The careful reader decides, and names the bad field.
        mv = buf if isinstance(buf, memoryview) else memoryview(buf)
        return _decode_careful_run(mv, offset, count, verify_crc)


def decode_row(buf: Buffer, offset: int = 0, *, verify_crc: bool = True) -> MessageRow:
    """The message starting at ``buf[offset]`` (:func:`decode_rows` of one)."""
    return decode_rows(buf, offset, 1, verify_crc=verify_crc)[0]


def decode_message(buf: Buffer, offset: int = 0, *, verify_crc: bool = True) -> Message:
    """Decode the message starting at ``buf[offset]`` (:func:`decode_row`'s checks)."""
    return Message(*decode_row(buf, offset, verify_crc=verify_crc)[1:])


def check_message(raw: Buffer, position: int = 0) -> None:
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


def read_dispatch(buf: Buffer, offset: int = 0, *, verify_crc: bool = True) -> DispatchInfo:
    """The dispatcher's view of the message at ``buf[offset]``: no body, no properties."""
    mv = buf if isinstance(buf, memoryview) else memoryview(buf)
    total = _check_head(mv, offset, verify_crc)
    return _dispatch(mv, offset, offset + total, total)


def dispatch_head_size(head: Buffer) -> int | None:
    """How many of a message's first bytes :func:`read_dispatch` reads (its fixed part, topic,
    tags and keys), from ``head``, the message's first bytes; None when ``head`` ends before
    the lengths that tell."""
    at = MESSAGE_FIXED_SIZE
    for width in (1, 2, 2):  # the topic's, the tags' and the keys' lengths
        if at + width > len(head):
            return None
        at += width + int.from_bytes(head[at : at + width], "big")
    return at


def read_dispatch_head(head: Buffer) -> DispatchInfo:
    """:func:`read_dispatch` without the CRC check, of a message of which ``head`` holds the
    first bytes: at least :func:`dispatch_head_size` of them (or the whole message). What
    follows the keys (the body above all) need not be read."""
    mv = head if isinstance(head, memoryview) else memoryview(head)
    if len(mv) < MESSAGE_HEAD.size:
        raise CorruptMessageError(f"truncated message header ({len(mv)} bytes)", 0)
    total, magic, _crc = MESSAGE_HEAD.unpack_from(mv, 0)
    if total <= len(mv):
        return read_dispatch(mv[:total], verify_crc=False)
    if magic != MESSAGE_MAGIC:
        raise CorruptMessageError(f"bad message magic {magic:#010x}", 0)
    need = dispatch_head_size(mv)
    if need is None or need > len(mv):
        raise CorruptMessageError(
            f"{len(mv)} of the message's {total} bytes end before its keys", 0
        )
    return _dispatch(mv, 0, len(mv), total)


def _dispatch(mv: memoryview, offset: int, end: int, total: int) -> DispatchInfo:
    """:func:`read_dispatch`'s fields of the message at ``mv[offset]`` of ``total`` bytes, its
    fields checked to lie before ``end``."""
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


def is_batch(body: Buffer) -> bool:
    """Whether ``body`` starts with a batch header (cheap check; no validation)."""
    return len(body) >= BATCH_HEADER_SIZE and U32.unpack_from(body, 0)[0] == BATCH_MAGIC


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


def batch_count(body: Buffer) -> int:
    """The number of messages a batch header announces (header checks only)."""
    return _batch_count(body if isinstance(body, memoryview) else memoryview(body))


def iter_batch(body: Buffer, *, verify_crc: bool = True) -> Iterator[tuple[int, int, memoryview]]:
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


def iter_dispatch(body: Buffer, *, verify_crc: bool = True) -> Iterator[DispatchInfo]:
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


def scan_dispatch(body: Buffer) -> list[DispatchRow]:
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


def decode_batch(body: Buffer, *, verify_crc: bool = True) -> list[Message]:
    """Every message of a batch, decoded."""
    mv = body if isinstance(body, memoryview) else memoryview(body)
    count = sum(1 for _ in iter_batch(mv, verify_crc=verify_crc))  # framing and CRCs checked
    return [
        Message(*row[1:]) for row in decode_rows(mv, BATCH_HEADER_SIZE, count, verify_crc=False)
    ]
