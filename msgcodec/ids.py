"""Message ids, RocketMQ's two kinds (docs/FORMAT.md, "Broker: Message ids").

- ``uniq_id`` (RocketMQ's ``UNIQ_KEY``, the "msgId" users see): made by the producer, 16 bytes
  shown as 32 uppercase hex characters: client IPv4 (4), pid (2), instance hash (4), ms since
  the start of the month UTC (4), counter (2). :class:`UniqIdGenerator` makes them.
- ``offsetMsgId``: store host IPv4 (4) + port (4) + commitlog position (8), 32 uppercase hex:
  :func:`encode_offset_msg_id` / :func:`decode_offset_msg_id`. The first
  :data:`OFFSET_MSG_ID_PREFIX_CHARS` characters (host and port) are the same for every message
  of one store, so a reader given them appends the position as 16 hex digits.
"""

from __future__ import annotations

import calendar
import datetime as _dt
import functools
import ipaddress
import os
import socket
import struct
import threading
import time
from collections.abc import Callable
from typing import NamedTuple

from msgcodec.encode import uniq_id_to_bytes
from msgcodec.errors import InvalidMessageIdError
from msgcodec.layout import I64_MAX, UNIQ_ID_BYTES

# Host (8 hex) and port (8 hex) of an offsetMsgId; the position's 16 hex follow.
OFFSET_MSG_ID_PREFIX_CHARS = 16


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
    if not isinstance(position, int) or not 0 <= position <= I64_MAX:
        raise InvalidMessageIdError(f"position {position!r} is outside [0, 2^63)")
    return _OFFSET_MSG_ID.pack(_ipv4_bytes(ip), port, position).hex().upper()


def decode_offset_msg_id(msg_id: str) -> OffsetMsgId:
    """Inverse of :func:`encode_offset_msg_id` (accepts lower case hex too)."""
    if not isinstance(msg_id, str):
        raise InvalidMessageIdError(f"offsetMsgId must be a str, not {type(msg_id).__name__}")
    raw = uniq_id_to_bytes(msg_id.upper())
    ip_b, port, position = _OFFSET_MSG_ID.unpack(raw)
    if port > 0xFFFF or position > I64_MAX:
        raise InvalidMessageIdError(f"offsetMsgId {msg_id!r} has a port or position out of range")
    return OffsetMsgId(str(ipaddress.IPv4Address(ip_b)), port, position)
