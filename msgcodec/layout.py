"""The stored message layout: limits, magic numbers, fixed-part structs, the decoded
:class:`Message` and the tag hash (docs/FORMAT.md, "Broker: Message" and "Batch").

Big-endian throughout. A message is self-delimiting (its total size comes first) and carries a
CRC32C over every byte after its CRC field; a batch is a 12-byte header and its messages back
to back.
"""

from __future__ import annotations

import functools
import re
import struct
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field

import crc32c as _crc32c

crc32c: Callable[[bytes | bytearray | memoryview], int] = _crc32c.crc32c
# crc32c_more(data, crc): the CRC of what ``crc`` covered followed by ``data`` (a payload's CRC
# in parts, without joining them first).
crc32c_more: Callable[[bytes | bytearray | memoryview, int], int] = _crc32c.crc32c

# What the codec reads from: bytes, or a view of a mapped file without a copy.
Buffer = bytes | bytearray | memoryview

# ---------------------------------------------------------------------------------------
# Limits
# ---------------------------------------------------------------------------------------

# RocketMQ's TopicValidator.TOPIC_MAX_LENGTH; it also keeps the topic's length in one byte.
MAX_TOPIC_LENGTH = 127
# RocketMQ's TopicValidator characters. ASCII only, so a topic's length in characters is its
# length in bytes, and every topic is a safe directory name (consumequeue/{topic}).
TOPIC_CHARACTERS = "%|a-zA-Z0-9_-"
TOPIC_PATTERN = re.compile(f"[{TOPIC_CHARACTERS}]+")
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

# RocketMQ's system property names (MessageConst) that the broker stores in a message's
# properties and the client reads back: the delay level asked for, where a delayed message
# really goes, and where a retry or dead-letter copy came from.
PROPERTY_DELAY = "DELAY"
PROPERTY_REAL_TOPIC = "REAL_TOPIC"
PROPERTY_REAL_QID = "REAL_QID"
PROPERTY_RETRY_TOPIC = "RETRY_TOPIC"
PROPERTY_ORIGIN_MESSAGE_ID = "ORIGIN_MESSAGE_ID"
PROPERTY_DLQ_ORIGIN_TOPIC = "DLQ_ORIGIN_TOPIC"
# RocketMQ 5's timer messages: the delivery time asked for, ms since the epoch
# (MessageConst.PROPERTY_TIMER_DELIVER_MS).
PROPERTY_TIMER_DELIVER_MS = "TIMER_DELIVER_MS"

I32_MIN = -(1 << 31)
I32_MAX = (1 << 31) - 1
I64_MAX = (1 << 63) - 1

# ---------------------------------------------------------------------------------------
# Layout
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
# Byte offset of store_timestamp_ms inside a message (a reader may patch or peek at it).
STORE_TIMESTAMP_AT = 40
# topic(u8) tags(u16) keys(u16) producer_group(u8) born_host(u8) properties(u16) body(u32)
VAR_LENGTH_BYTES = 1 + 2 + 2 + 1 + 1 + 2 + 4
# A topic and a body of at least one byte each.
MIN_MESSAGE_SIZE = MESSAGE_FIXED_SIZE + VAR_LENGTH_BYTES + 2

BATCH_MAGIC = 0x524D4254  # b"RMBT"
BATCH_VERSION = 1
# magic, version, reserved (u8), reserved (u16), count
BATCH_HEADER = struct.Struct(">IBBHI")
BATCH_HEADER_SIZE = 12
assert BATCH_HEADER.size == BATCH_HEADER_SIZE

U8 = struct.Struct(">B")
U16 = struct.Struct(">H")
U32 = struct.Struct(">I")

UNIQ_ID_BYTES = 16
# A uniq id or offsetMsgId as text: 32 uppercase hex characters.
MSG_ID_HEX_CHARS = 2 * UNIQ_ID_BYTES


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
# Decoded forms
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
