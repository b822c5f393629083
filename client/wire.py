"""Stored messages as a raw pull answer carries them (docs/FORMAT.md, "Broker: Message").

The client depends only on the gRPC API, so it reads the documented bytes itself rather
than through the broker's codec: the fixed part with one unpack, then the length-prefixed
fields. The broker checked every message's CRC before sending it; this checks the structure
and raises ``MQClientError("BAD_RESPONSE")`` on anything inconsistent.
"""

from __future__ import annotations

import struct
from collections.abc import Sequence

from client.errors import MQClientError
from client.message import MessageExt

MESSAGE_MAGIC = 0x524D5347  # b"RMSG"
MESSAGE_VERSION = 1
# total size, magic, crc, version, reserved, queue id, flag, sys flag, reconsume times,
# born and store timestamps (ms), tags hash, uniq id
_FIXED = struct.Struct(">III HH iiii qqq 16s")
_FIXED_SIZE = 72
assert _FIXED.size == _FIXED_SIZE
_MIN_SIZE = _FIXED_SIZE + 13 + 2  # the length fields, a topic byte and a body byte
_NAME_VALUE = "\x01"
_PROPERTY_END = "\x02"


def _bad(why: str) -> MQClientError:
    return MQClientError("BAD_RESPONSE", "INTERNAL", f"raw pull answer: {why}")


def _properties(text: str) -> dict[str, str]:
    if not text:
        return {}
    items = text.split(_PROPERTY_END)
    if items[-1]:
        raise _bad("properties do not end with a separator")
    out = {}
    for item in items[:-1]:
        name, sep, value = item.partition(_NAME_VALUE)
        if not sep or not name:
            raise _bad("malformed property")
        out[name] = value
    return out


def decode_messages(
    raw: bytes,
    queue_offsets: Sequence[int],
    positions: Sequence[int],
    offset_msg_id_prefix: str,
    broker_name: str,
) -> list[MessageExt]:
    """Every message of ``raw`` (stored messages back to back), with its queue offset and
    commitlog position."""
    if len(queue_offsets) != len(positions):
        raise _bad(f"{len(queue_offsets)} queue offsets for {len(positions)} positions")
    if len(offset_msg_id_prefix) != 16:
        raise _bad(f"offset_msg_id_prefix {offset_msg_id_prefix!r} is not 16 characters")
    out: list[MessageExt] = []
    end = len(raw)
    at = 0
    unpack = _FIXED.unpack_from
    for queue_offset, position in zip(queue_offsets, positions, strict=True):
        if at + _MIN_SIZE > end:
            raise _bad(f"message {len(out)} is cut short")
        (
            total,
            magic,
            _crc,
            version,
            _reserved,
            queue_id,
            _flag,
            _sys_flag,
            reconsume_times,
            born_ts,
            store_ts,
            _tags_hash,
            uniq_b,
        ) = unpack(raw, at)
        stop = at + total
        if magic != MESSAGE_MAGIC or version != MESSAGE_VERSION or total < _MIN_SIZE or stop > end:
            raise _bad(f"message {len(out)} has a bad head")
        v = raw[at + _FIXED_SIZE : stop]
        try:
            p = v[0] + 1
            topic = v[1:p].decode()
            n = int.from_bytes(v[p : p + 2], "big") + p + 2
            tags = v[p + 2 : n].decode()
            p = int.from_bytes(v[n : n + 2], "big") + n + 2
            keys = v[n + 2 : p].decode()
            n = v[p] + p + 1  # producer group
            p = v[n] + n + 1  # born host
            n = int.from_bytes(v[p : p + 2], "big") + p + 2
            props = v[p + 2 : n].decode()
            p = int.from_bytes(v[n : n + 4], "big") + n + 4
        except (IndexError, UnicodeDecodeError):
            raise _bad(f"message {len(out)} has a bad field") from None
        if p != len(v):
            raise _bad(f"message {len(out)}'s fields do not add up to its size")
        out.append(
            MessageExt.shown(
                store_topic=topic,
                store_msg_id=uniq_b.hex().upper(),
                properties=_properties(props),
                body=v[n + 4 :],
                tags=tags,
                keys=tuple(keys.split(" ")) if keys else (),
                offset_msg_id=f"{offset_msg_id_prefix}{position:016X}",
                broker_name=broker_name,
                queue_id=queue_id,
                queue_offset=queue_offset,
                commitlog_position=position,
                born_timestamp_ms=born_ts,
                store_timestamp_ms=store_ts,
                reconsume_times=reconsume_times,
            )
        )
        at = stop
    if at != end:
        raise _bad(f"{end - at} bytes after the last message")
    return out
