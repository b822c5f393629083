"""Live broker.conf overrides as replicated state: the keys ``UpdateBrokerConfig`` (mqadmin
updateBrokerConfig) changed while the group runs, each with its value as broker.conf spells it.

Every change is one :data:`broker.state.records.ENTRY_BROKER_CONFIG` record, proposed by the
leader only once the group's feature level allows it (broker/state/features.py) and applied the
same on every member; the table is kept in the broker snapshot (``config``). The leader decides
what may be set (a live key of broker.configkeys, a value its parser and the cross-key checks
take: broker.liveconfig); apply checks the record's own rules only (sizes, a key's spelling, the
table's bound), so it depends on the record and the table alone. Each member lays the table over
its own broker.conf (an override wins until it is cleared).

A record (docs/FORMAT.md, "Broker config (type 25)"): ``version`` u8 (1), ``op`` u8 (1 set,
2 clear), ``key`` (u8 length, ASCII), ``value`` (u16 length, UTF-8; empty for a clear).
"""

from __future__ import annotations

import re
import struct
from collections.abc import Mapping
from typing import Any

from broker.state.errors import BrokerError
from mqerrors import codes as E

BROKER_CONFIG_RECORD_VERSION = 1
OP_SET = 1
OP_CLEAR = 2
_OPS = frozenset({OP_SET, OP_CLEAR})
# A broker.conf key's spelling: RocketMQ's and ours are camelCase ASCII, the longest (a
# RocketMQ key) well under 64 characters.
MAX_KEY_CHARS = 64
_KEY = re.compile(r"[A-Za-z][A-Za-z0-9]{0,63}")
# A value's bytes: the live keys take numbers and booleans; 1 KiB leaves room for any value a
# broker.conf line holds while bounding what a hostile record may make every member keep.
MAX_VALUE_BYTES = 1024
# Overrides a group holds at most: more than the live keys of any release (broker.configkeys
# LIVE_KEYS), so a later release's keys fit, and the table stays small in every snapshot.
MAX_OVERRIDES = 64
_HEAD = struct.Struct(">BBB")  # version, op, key length
_U16 = struct.Struct(">H")


class InvalidConfigRecordError(BrokerError):
    """A broker config record breaks a rule: every member skips it, nothing changes."""

    code = E.INVALID_RECORD


def check_entry(key: str, value: str) -> None:
    """Raise unless ``key`` and ``value`` fit a record: a key of ``[A-Za-z][A-Za-z0-9]*`` of at
    most :data:`MAX_KEY_CHARS`, a value of at most :data:`MAX_VALUE_BYTES` bytes of UTF-8
    without line breaks (broker.conf holds one value per line)."""
    if not isinstance(key, str) or not _KEY.fullmatch(key):
        raise InvalidConfigRecordError(f"broker config key {key!r:.80} is not a key's spelling")
    if not isinstance(value, str) or len(value.encode("utf-8", "replace")) > MAX_VALUE_BYTES:
        raise InvalidConfigRecordError(f"broker config value of {key} over {MAX_VALUE_BYTES} bytes")
    if "\n" in value or "\r" in value:
        raise InvalidConfigRecordError(f"broker config value of {key} holds a line break")


def encode_record(op: int, key: str, value: str = "") -> bytes:
    """The record of one change (``value`` empty for a clear)."""
    assert op in _OPS, op
    assert op == OP_SET or not value, "a clear carries no value"
    check_entry(key, value)
    k, v = key.encode("ascii"), value.encode("utf-8")
    return _HEAD.pack(BROKER_CONFIG_RECORD_VERSION, op, len(k)) + k + _U16.pack(len(v)) + v


def decode_record(body: bytes) -> tuple[int, str, str]:
    """``(op, key, value)`` of a record whose every rule holds (InvalidConfigRecordError
    otherwise)."""
    if len(body) < _HEAD.size:
        raise InvalidConfigRecordError("truncated broker config record")
    version, op, n = _HEAD.unpack_from(body, 0)
    if version != BROKER_CONFIG_RECORD_VERSION or op not in _OPS:
        raise InvalidConfigRecordError(f"broker config record version {version} op {op}")
    at = _HEAD.size + n
    if len(body) < at + _U16.size:
        raise InvalidConfigRecordError("truncated broker config record")
    (m,) = _U16.unpack_from(body, at)
    if len(body) != at + _U16.size + m:
        raise InvalidConfigRecordError("broker config record size mismatch")
    try:
        key = body[_HEAD.size : at].decode("ascii")
        value = body[at + _U16.size :].decode("utf-8")
    except UnicodeDecodeError:
        raise InvalidConfigRecordError("broker config record is not ASCII/UTF-8") from None
    check_entry(key, value)
    if op == OP_CLEAR and value:
        raise InvalidConfigRecordError(f"broker config clear of {key} carries a value")
    return op, key, value


def applied(overrides: Mapping[str, str], body: bytes) -> dict[str, str]:
    """The table after the record ``body``: a new dict (the old one is never changed, so a
    reader holding it sees one consistent table). Raises before anything changed when the
    record breaks a rule or would hold more than :data:`MAX_OVERRIDES` keys."""
    op, key, value = decode_record(body)
    out = dict(overrides)
    if op == OP_CLEAR:
        out.pop(key, None)
        return out
    if key not in out and len(out) >= MAX_OVERRIDES:
        raise InvalidConfigRecordError(f"broker config {key}: the group holds {MAX_OVERRIDES}")
    out[key] = value
    return out


def capture(overrides: Mapping[str, str]) -> dict[str, str]:
    """The snapshot's ``config``: key -> value, sorted by key."""
    return dict(sorted(overrides.items()))


def load(doc: Any) -> tuple[dict[str, str], list[str]]:
    """A snapshot's ``config`` (absent: none) -> the table and the keys left out for breaking
    a record's rules (the file is as hostile as a record)."""
    rows = doc if isinstance(doc, dict) else {}
    out: dict[str, str] = {}
    bad: list[str] = []
    for key, value in sorted(rows.items(), key=lambda kv: str(kv[0])):
        try:
            check_entry(key, value)
        except InvalidConfigRecordError:
            bad.append(str(key)[:80])
            continue
        if len(out) >= MAX_OVERRIDES:
            bad.append(str(key)[:80])
            continue
        out[key] = value
    return out, bad
