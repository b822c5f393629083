"""A pull's answer straight to its wire bytes (``raftmq.broker.v1.PullMessageResponse``).

The answer's bulk is its messages, exactly as stored, in one ``bytes`` field. Built as a
protobuf object they were copied into its upb arena and again by ``SerializeToString``; here
the answer is one ``bytes.join`` of the fields before them (written by hand), the messages
themselves and the fields after them (the two packed lists of numbers serialized by the
runtime), so the messages are copied once on their way to gRPC (docs/PERFORMANCE.md, "The
read path (issue 36)"). The bytes are the runtime's own encoding of the same answer, byte
for byte (fields in number order, defaults left out): tests/unit/test_broker_pullwire.py.

In the process (tests, callers of the servicer's methods) a :class:`PullAnswer` reads as the
``PullMessageResponse`` it encodes: its fields are parsed from the bytes on first use.
"""

from __future__ import annotations

from typing import Any

from raftmq.broker.v1 import broker_pb2 as pb

from broker.components.pulling import PullResult, PullStatus
from rpckit.varint import varint

# The wire values of PullStatus (broker.proto's PullStatus).
PULL_STATUS_WIRE = {
    PullStatus.FOUND: pb.FOUND,
    PullStatus.NO_NEW_MSG: pb.NO_NEW_MSG,
    PullStatus.NO_MATCHED_MSG: pb.NO_MATCHED_MSG,
    PullStatus.OFFSET_ILLEGAL: pb.OFFSET_ILLEGAL,
}

# Field keys (field number << 3 | wire type) of PullMessageResponse, written by hand below.
_STATUS = b"\x08"  # 1, varint
_NEXT_BEGIN_OFFSET = b"\x18"  # 3, varint
_MIN_OFFSET = b"\x20"  # 4, varint
_MAX_OFFSET = b"\x28"  # 5, varint
_SUGGEST_FOLLOWER = b"\x30"  # 6, varint
_NODE_ID = b"\x3a"  # 7, length-delimited
_RAW_MESSAGES = b"\x42"  # 8, length-delimited
_OFFSET_MSG_ID_PREFIX = b"\x5a"  # 11, length-delimited


def _text(key: bytes, value: str) -> bytes:
    """A string field, left out when empty (proto3's default)."""
    if not value:
        return b""
    data = value.encode()
    return key + varint(len(data)) + data


def _number(key: bytes, value: int) -> bytes:
    """An integer (int64, enum, bool) field, left out when 0 (proto3's default)."""
    return key + varint(value) if value else b""


def encode_pull_response(r: PullResult, node_id: str, offset_msg_id_prefix: str) -> bytes:
    """``PullMessageResponse`` for ``r`` answered by ``node_id`` on the wire (the prefix is
    sent only with messages), the runtime's bytes exactly; the messages copied once, here."""
    head = b"".join(
        (
            _number(_STATUS, PULL_STATUS_WIRE[r.status]),
            _number(_NEXT_BEGIN_OFFSET, r.next_begin_offset),
            _number(_MIN_OFFSET, r.min_offset),
            _number(_MAX_OFFSET, r.max_offset),
            _number(_SUGGEST_FOLLOWER, int(r.suggest_pull_from_follower)),
            _text(_NODE_ID, node_id),
        )
    )
    if r.raw:
        head += _RAW_MESSAGES + varint(len(r.raw))
    tail = b""
    if r.queue_offsets or r.positions:
        tail = pb.PullMessageResponse(
            raw_queue_offsets=r.queue_offsets, raw_positions=r.positions
        ).SerializeToString()
    if r.positions:
        tail += _text(_OFFSET_MSG_ID_PREFIX, offset_msg_id_prefix)
    return b"".join((head, r.raw, tail))


class PullAnswer:
    """A ``PullMessageResponse`` as its wire bytes (``wire``), sent as they are
    (:func:`serialize_response`). Reading any other attribute reads the parsed response."""

    __slots__ = ("_parsed", "wire")

    def __init__(self, wire: bytes) -> None:
        self.wire = wire
        self._parsed: pb.PullMessageResponse | None = None

    def __getattr__(self, name: str) -> Any:
        if self._parsed is None:
            self._parsed = pb.PullMessageResponse.FromString(self.wire)
        return getattr(self._parsed, name)


def serialize_response(response: PullAnswer | pb.PullMessageResponse) -> bytes:
    """The PullMessage method's response serializer: an answer's bytes as they are."""
    if isinstance(response, PullAnswer):
        return response.wire
    return response.SerializeToString()
