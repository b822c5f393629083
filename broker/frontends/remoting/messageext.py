"""RocketMQ 4.x's stored-message layout (``MessageExt``), as the remoting protocol carries it in a
pull answer's body and a message lookup's (docs/REMOTING.md, "Broker: messages on the wire").

raftmq stores its own layout (docs/FORMAT.md, "Broker: Message"); a 4.x client decodes
RocketMQ's, so each message of an answer is written here from the stored one. Big-endian:

====  =====  ===================================================================
size  field  notes
====  =====  ===================================================================
4     total  the message's size in bytes, this field included
4     magic  ``0xDAA320A7`` (RocketMQ's ``MESSAGE_MAGIC_CODE``, topic length in 1 byte)
4     crc    CRC-32 (zlib's, as ``java.util.zip.CRC32``) of the body, as a signed int
4     queue  queue id
4     flag   the producer's flag
8     qoff   queue offset
8     phys   physical offset: raftmq's commitlog position of the message
4     sys    sysFlag, without the IPv6 host bits (both hosts are IPv4 here)
8     born   born timestamp (ms)
8     bhost  born host: IPv4 (4) + port (int32); ``0.0.0.0:0`` when not an IPv4 address
8     store  store timestamp (ms)
8     shost  store host: the node's ``storeHost`` IPv4 (4) + its remoting port (int32)
4     recon  reconsume times
8     ptx    prepared transaction offset (0)
4+n   body   length, bytes
1+n   topic  length, UTF-8
2+n   props  length, ``name\\x01value\\x02`` ... (UTF-8)
====  =====  ===================================================================

The properties carry what raftmq stores as fields: ``TAGS``, ``KEYS`` (space separated) and
``UNIQ_KEY`` (the producer's message id), beside the message's own properties.

The message id a 4.x client derives from this (``offsetMsgId``) is the store host's 8 bytes and
the physical offset, in hex: raftmq's own offsetMsgId (docs/FORMAT.md, "Message ids") with the
remoting port in place of the client port, so a 4.x client that views a message by that id
connects to the node's remoting port, where ``VIEW_MESSAGE_BY_ID`` reads the position back.
Positions are the same on every member (one replicated log), so any member answers it.
"""

from __future__ import annotations

import ipaddress
import struct
import zlib
from collections.abc import Mapping

from broker.state.errors import BrokerError
from msgcodec import Message
from msgcodec.layout import KEY_SEPARATOR, NAME_VALUE_SEPARATOR, PROPERTY_SEPARATOR

# RocketMQ's MESSAGE_MAGIC_CODE (the layout whose topic length is 1 byte), as an unsigned int.
MAGIC_CODE = 0xDAA320A7
# The properties a 4.x client reads as fields of its message (MessageConst).
PROPERTY_TAGS = "TAGS"
PROPERTY_KEYS = "KEYS"
PROPERTY_UNIQ_KEY = "UNIQ_KEY"
# A topic's length is one (signed, in Java) byte; the properties' a signed short.
MAX_TOPIC_BYTES = 127
MAX_PROPERTIES_BYTES = 32_767
# RocketMQ's sysFlag bits saying a host is IPv6 (BORNHOST_V6_FLAG, STOREHOSTADDRESS_V6_FLAG):
# cleared, both hosts are written as IPv4.
HOST_V6_FLAGS = 0x10 | 0x20

# total, magic, crc, queue id, flag, queue offset, physical offset, sys flag, born timestamp
_HEAD = struct.Struct(">iIiiiqqiq")
# store timestamp
_I64 = struct.Struct(">q")
# reconsume times, prepared transaction offset, body length
_MIDDLE = struct.Struct(">iqi")
_HOST = struct.Struct(">4si")
_ZERO_HOST = _HOST.pack(b"\0\0\0\0", 0)


class MessageExtError(BrokerError, ValueError):
    """A stored message that RocketMQ's layout cannot carry (its properties, with its tags,
    keys and id added, beyond 32,767 bytes)."""


def host_bytes(host: str) -> bytes:
    """``"a.b.c.d:port"`` (or an IPv4 address alone, port 0) as RocketMQ writes a host: 4
    address bytes and a big-endian int32 port; anything else (IPv6, a name, empty) as
    ``0.0.0.0:0``."""
    addr, sep, port_text = host.rpartition(":")
    if not sep:
        addr, port_text = host, "0"
    try:
        packed = ipaddress.IPv4Address(addr).packed
        port = int(port_text)
    except ValueError:
        return _ZERO_HOST
    if not 0 <= port <= 0xFFFF:
        return _ZERO_HOST
    return _HOST.pack(packed, port)


def encode_properties(properties: Mapping[str, str]) -> str:
    """RocketMQ's properties string: ``name\\x01value\\x02`` per property."""
    sep, end = NAME_VALUE_SEPARATOR, PROPERTY_SEPARATOR
    return "".join(f"{k}{sep}{v}{end}" for k, v in properties.items())


def decode_properties(text: str) -> dict[str, str]:
    """A properties string back into a dict: an item without a name/value separator, or with an
    empty name, is skipped (as RocketMQ's ``string2messageProperties`` does)."""
    out: dict[str, str] = {}
    for item in text.split(PROPERTY_SEPARATOR):
        name, sep, value = item.partition(NAME_VALUE_SEPARATOR)
        if sep and name:
            out[name] = value
    return out


def wire_properties(msg: Message) -> dict[str, str]:
    """The properties a 4.x client sees: the message's own, then its tags, keys and id."""
    props = dict(msg.properties)
    if msg.tags:
        props[PROPERTY_TAGS] = msg.tags
    if msg.keys:
        props[PROPERTY_KEYS] = KEY_SEPARATOR.join(msg.keys)
    if msg.uniq_id:
        props[PROPERTY_UNIQ_KEY] = msg.uniq_id
    return props


def encode_message_ext(msg: Message, queue_offset: int, position: int, store_host: bytes) -> bytes:
    """``msg`` (stored at ``position`` with ``queue_offset``) in RocketMQ's layout;
    ``store_host`` is :func:`host_bytes` of the node's remoting address.
    :class:`MessageExtError` when its properties do not fit."""
    assert len(store_host) == _HOST.size, "a store host is 8 bytes"
    topic = msg.topic.encode()
    if len(topic) > MAX_TOPIC_BYTES:  # raftmq's topics are at most 127 characters of ASCII
        raise MessageExtError(f"topic of {len(topic)} bytes, more than {MAX_TOPIC_BYTES}")
    props = encode_properties(wire_properties(msg)).encode()
    if len(props) > MAX_PROPERTIES_BYTES:
        raise MessageExtError(
            f"properties of {len(props)} bytes with TAGS, KEYS and UNIQ_KEY, more than"
            f" {MAX_PROPERTIES_BYTES}"
        )
    body = msg.body
    total = (
        _HEAD.size + 2 * _HOST.size + _I64.size + _MIDDLE.size + len(body) + 1 + len(topic) + 2
    ) + len(props)
    crc = zlib.crc32(body)
    head = _HEAD.pack(
        total,
        MAGIC_CODE,
        crc - (1 << 32) if crc >= 1 << 31 else crc,
        msg.queue_id,
        msg.flag,
        queue_offset,
        position,
        msg.sys_flag & ~HOST_V6_FLAGS,
        msg.born_timestamp_ms,
    )
    out = b"".join(
        (
            head,
            host_bytes(msg.born_host),
            _I64.pack(msg.store_timestamp_ms),
            store_host,
            _MIDDLE.pack(msg.reconsume_times, 0, len(body)),
            body,
            bytes((len(topic),)),
            topic,
            len(props).to_bytes(2, "big"),
            props,
        )
    )
    assert len(out) == total
    return out


def offset_msg_id(store_host: bytes, position: int) -> str:
    """The id a 4.x client derives from a message of this layout: store host and physical
    offset, 32 uppercase hex characters."""
    return (store_host + position.to_bytes(8, "big")).hex().upper()
