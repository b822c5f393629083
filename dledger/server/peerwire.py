"""Peer messages straight to their wire bytes, for the peer stream's writes.

An append's entry bodies are the bulk of what a leader sends, twice (one stream per
follower). Built as protobuf objects they were copied into each message's upb arena
(``entries.add(body=...)``) and again by ``SerializeToString``; here each follower's write is
one ``bytes.join`` over small headers and the bodies themselves, so a body is copied once per
follower on its way to gRPC (docs/PERFORMANCE.md "Steps per message").

The bytes are a valid encoding of ``PeerMessage`` (raftmq/dledger/v1/dledger.proto): the
append's scalar fields come first, serialized by the protobuf runtime, then its entries as
repeated field 7; a protobuf parser accepts fields in any order, and the receiver parses
these bytes with the generated ``PeerMessage`` as before. Every other kind is serialized by
the runtime as it was.
"""

from __future__ import annotations

from raftmq.dledger.v1 import dledger_pb2 as pb

from dledger.core import AppendRequest, Message
from dledger.server.convert import to_pb
from rpckit.varint import varint

# Field keys (field number << 3 | wire type) of dledger.proto, written by hand below.
_PEER_APPEND_REQUEST = b"\x1a"  # PeerMessage.append_request = 3, length-delimited
_PEER_BATCH = b"\x32"  # PeerMessage.batch = 6, length-delimited
_BATCH_MESSAGES = b"\x0a"  # PeerBatch.messages = 1, length-delimited
_APPEND_ENTRIES = b"\x3a"  # AppendRequest.entries = 7, length-delimited
_ENTRY_TERM = b"\x08"  # Entry.term = 1, varint
_ENTRY_INDEX = b"\x10"  # Entry.index = 2, varint
_ENTRY_TYPE = b"\x18"  # Entry.type = 3, varint
_ENTRY_BODY = b"\x22"  # Entry.body = 4, length-delimited


def encode_append(m: AppendRequest, group: str) -> bytes:
    """``PeerMessage{append_request: m}`` on the wire; each body is copied once, here."""
    head = pb.AppendRequest(
        group=group,
        from_id=m.from_id,
        to_id=m.to_id,
        term=m.term,
        prev_log_index=m.prev_log_index,
        prev_log_term=m.prev_log_term,
        leader_commit=m.leader_commit,
        no_reply=m.no_reply,
        prev_log_chain=m.prev_log_chain,
    ).SerializeToString()
    parts = [_PEER_APPEND_REQUEST, b"", head]
    size = len(head)
    for e in m.entries:
        body_size = len(e.body)
        fields = _entry_fields(e.term, e.index, e.type, body_size)
        entry_size = len(fields) + body_size
        entry_key = _APPEND_ENTRIES + varint(entry_size)
        parts += (entry_key, fields, e.body)
        size += len(entry_key) + entry_size
    parts[1] = varint(size)
    return b"".join(parts)


def _entry_fields(term: int, index: int, type: int, body_size: int) -> bytes:
    """An Entry's fields up to its body's bytes (the body's key and length last)."""
    out = _ENTRY_TERM + varint(term) + _ENTRY_INDEX + varint(index)
    if type:
        out += _ENTRY_TYPE + varint(type)
    return out + _ENTRY_BODY + varint(body_size)


def encode(m: Message, group: str) -> bytes:
    """One core message as ``PeerMessage`` wire bytes."""
    if isinstance(m, AppendRequest):
        return encode_append(m, group)
    return to_pb(m, group).SerializeToString()


def encode_batch(wires: list[bytes]) -> bytes:
    """``PeerMessage{batch: PeerBatch{messages: wires}}`` from messages already encoded."""
    parts: list[bytes] = [_PEER_BATCH, b""]
    size = 0
    for w in wires:
        key = _BATCH_MESSAGES + varint(len(w))
        parts += (key, w)
        size += len(key) + len(w)
    parts[1] = varint(size)
    return b"".join(parts)
