"""Peer messages straight to and from their wire bytes, for the peer socket and stream.

An append's entry bodies are the bulk of what a leader sends, once per follower. Built as
protobuf objects they were copied into each message's upb arena and again by
``SerializeToString``. Here an append's entries are encoded once (:class:`SharedEntries`:
small headers, and the bodies themselves as parts) and shared by every follower whose append
carries the same entries; each follower's own fields are a small head in front
(:func:`append_head`). The peer socket writes head and parts with one ``writelines`` (no
copy in Python); the gRPC stream, which takes one ``bytes`` per message, joins them
(:func:`encode_append`: one copy per follower). docs/PERFORMANCE.md "16 KiB bodies, third
pass".

The bytes are a valid encoding of ``PeerMessage`` (raftmq/dledger/v1/dledger.proto): the
append's scalar fields come first, serialized by the protobuf runtime, then its entries as
repeated field 7; a protobuf parser accepts fields in any order, and receivers of every
release parse them with the generated ``PeerMessage``. Every other kind is serialized by the
runtime as it was.

:func:`decode_append` reads a large append in place on the receiving side (each body copied
once, into its Entry), and leaves everything but the encoding senders write to the runtime.
"""

from __future__ import annotations

from raftmq.dledger.v1 import dledger_pb2 as pb

from dledger.core import AppendRequest, Message
from dledger.log import DLedgerError, Entry
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


# Bodies of at least this many bytes are parts of their own in an append's shared encoding
# (written by the kernel from the body itself, writev); smaller bodies are joined with the
# headers around them: below a few KiB a copy costs less than an iovec and its bookkeeping
# in the event loop's write path, and it bounds the parts of an append of many tiny entries.
ZERO_COPY_MIN_BODY_BYTES = 2048


class SharedEntries:
    """An append's entries as ``AppendRequest.entries`` wire bytes, encoded once and written
    to every follower whose append carries the same entries (each follower's own fields go
    in a small head in front, :func:`append_head`).

    ``parts`` are the encoding in order: each body of ZERO_COPY_MIN_BODY_BYTES or more is
    itself a part (not a copy), the entry headers and smaller bodies between them are joined.
    ``joined()`` is the whole as one ``bytes``, made on first use (for a TLS connection, whose
    records are encrypted from one buffer per write)."""

    __slots__ = ("_joined", "entries", "parts", "size")

    def __init__(self, entries: tuple[Entry, ...]) -> None:
        self.entries = entries
        parts: list[bytes] = []
        small: list[bytes] = []
        size = 0
        for e in entries:
            body_size = len(e.body)
            fields = _entry_fields(e.term, e.index, e.type, body_size)
            entry_size = len(fields) + body_size
            small += (_APPEND_ENTRIES, varint(entry_size), fields)
            if body_size >= ZERO_COPY_MIN_BODY_BYTES:
                parts.append(b"".join(small))
                parts.append(e.body)
                small = []
            elif body_size:
                small.append(e.body)
            size += 1 + len(varint(entry_size)) + entry_size
        if small:
            parts.append(b"".join(small))
        self.parts: tuple[bytes, ...] = tuple(parts)
        self.size = size
        self._joined: bytes | None = None

    def same_entries(self, entries: tuple[Entry, ...]) -> bool:
        """Whether ``entries`` are this encoding's, object for object (the leader's log hands
        every follower's append the same ``Entry`` objects; held here, none can be a new one
        at a recycled address)."""
        mine = self.entries
        if len(mine) != len(entries):
            return False
        return all(a is b for a, b in zip(mine, entries, strict=True))

    def joined(self) -> bytes:
        if self._joined is None:
            self._joined = b"".join(self.parts)
        return self._joined


class EntriesCache:
    """The entries of the last append encoded, for the next append of the same entries: a
    Ready sends the same new entries to every follower in turn, so each is encoded once.
    Holds one append batch (``max_append_batch_bytes``) at most."""

    __slots__ = ("_last", "encoded", "reused")

    def __init__(self) -> None:
        self._last: SharedEntries | None = None
        self.encoded = 0
        self.reused = 0

    def get(self, entries: tuple[Entry, ...]) -> SharedEntries:
        last = self._last
        if last is not None and last.same_entries(entries):
            self.reused += 1
            return last
        self._last = shared = SharedEntries(entries)
        self.encoded += 1
        return shared


def append_head(m: AppendRequest, group: str, entries_size: int) -> bytes:
    """``PeerMessage{append_request: m}``'s bytes up to its entries: the key and length of the
    append (``entries_size`` bytes of entries follow) and ``m``'s other fields."""
    fields = _append_fields(m, group)
    return _PEER_APPEND_REQUEST + varint(len(fields) + entries_size) + fields


def encode_append(m: AppendRequest, group: str, shared: SharedEntries | None = None) -> bytes:
    """``PeerMessage{append_request: m}`` on the wire as one ``bytes`` (the gRPC stream's
    write); each body is copied once, here. ``shared``: ``m.entries`` encoded already."""
    if shared is None:
        shared = SharedEntries(m.entries)
    assert shared.same_entries(m.entries)
    fields = _append_fields(m, group)
    size = varint(len(fields) + shared.size)
    return b"".join((_PEER_APPEND_REQUEST, size, fields, *shared.parts))


def _append_fields(m: AppendRequest, group: str) -> bytes:
    """``m``'s fields but its entries, serialized by the protobuf runtime."""
    return pb.AppendRequest(
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


def _entry_fields(term: int, index: int, type: int, body_size: int) -> bytes:
    """An Entry's fields up to its body's bytes (the body's key and length last)."""
    out = _ENTRY_TERM + varint(term) + _ENTRY_INDEX + varint(index)
    if type:
        out += _ENTRY_TYPE + varint(type)
    return out + _ENTRY_BODY + varint(body_size)


def encode(m: Message, group: str, entries: EntriesCache | None = None) -> bytes:
    """One core message as ``PeerMessage`` wire bytes (an append's entries from ``entries``
    when they were encoded for another follower already)."""
    if isinstance(m, AppendRequest):
        shared = entries.get(m.entries) if entries is not None and m.entries else None
        return encode_append(m, group, shared)
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


# ---------------------------------------------------------------------- reading an append

# Payloads of at least this many bytes that start as an append are read by decode_append;
# smaller ones by the protobuf runtime. Measured (2026-11-29, best of 7 on a loaded machine,
# one append from a memoryview of the read buffer): one entry of 1 KiB costs the runtime and
# from_pb ~5 us, this module ~8 us; from 16 to 64 KiB of body both ~5-9 us; an append of 16
# entries of 64 KiB 1.1 ms against 86 us (the runtime's arena of 1 MiB, then each body's
# bytes). Below 8 KiB bodies are small and the runtime's C parser pays; above it the copies
# the runtime makes are the larger cost (issue 36: a follower copies a body once).
IN_PLACE_MIN_PAYLOAD_BYTES = 8 << 10

_U64 = 1 << 64
_U32 = 1 << 32
# A varint is at most ten bytes (64 bits, seven a byte).
_VARINT_MAX_BYTES = 10
# AppendRequest's and Entry's field keys as one byte each (every field number is below 16).
_APPEND_STRINGS = (0x0A, 0x12, 0x1A)  # group, from_id, to_id
_APPEND_TERM, _APPEND_PREV_INDEX, _APPEND_PREV_TERM = 0x20, 0x28, 0x30
_APPEND_COMMIT, _APPEND_NO_REPLY, _APPEND_CHAIN = 0x40, 0x48, 0x51
_APPEND_ENTRY = 0x3A
_E_TERM, _E_INDEX, _E_TYPE, _E_BODY = 0x08, 0x10, 0x18, 0x22


class _NotCanonical(DLedgerError):
    """Bytes decode_append leaves to the protobuf runtime (which may accept or refuse them);
    never leaves this module (a DLedgerError only as every dledger exception is one)."""


def decode_append(payload: bytes | bytearray | memoryview) -> AppendRequest | None:
    """``payload`` as the core's AppendRequest, read in place: each body is copied once,
    into its Entry's ``bytes``, from the bytes the socket read (the runtime's parse copied it
    into its arena and reading ``entry.body`` copied it again).

    Only the encoding senders write is read here: one ``append_request`` field spanning the
    payload, whose fields are AppendRequest's and Entry's known ones with their own wire types
    (in any order, repeated: the last value wins, entries accumulate), varints of at most ten
    bytes within their field's width, UTF-8 strings. None for anything else (another kind, a
    batch, unknown fields, an invalid or truncated encoding): the caller then parses with the
    runtime, which decides, so what is accepted and what it means stays the runtime's
    (tests/unit/test_server_peerwire.py checks the two agree)."""
    view = memoryview(payload)
    end = len(view)
    try:
        if end < 2 or view[0] != 0x1A:
            return None
        size, at = _varint(view, 1, end)
        if at + size != end:
            return None
        return _append(view, at, end)
    except _NotCanonical:
        return None


def _varint(view: memoryview, at: int, end: int) -> tuple[int, int]:
    """The varint at ``at`` (below 2**64) and the offset after it."""
    value = 0
    shift = 0
    stop = min(end, at + _VARINT_MAX_BYTES)
    while at < stop:
        byte = view[at]
        at += 1
        value |= (byte & 0x7F) << shift
        if byte < 0x80:
            if value >= _U64:
                raise _NotCanonical
            return value, at
        shift += 7
    raise _NotCanonical


def _length(view: memoryview, at: int, end: int) -> tuple[int, int]:
    """A length-delimited field's first offset and end."""
    size, at = _varint(view, at, end)
    if size > end - at:
        raise _NotCanonical
    return at, at + size


def _append(view: memoryview, at: int, end: int) -> AppendRequest:
    strings = ["", "", ""]  # group, from_id, to_id
    ints = {_APPEND_TERM: 0, _APPEND_PREV_INDEX: 0, _APPEND_PREV_TERM: 0, _APPEND_COMMIT: 0}
    no_reply = False
    chain = 0
    entries: list[Entry] = []
    while at < end:
        key = view[at]
        at += 1
        if key == _APPEND_ENTRY:
            start, at = _length(view, at, end)
            entries.append(_entry(view, start, at))
        elif key in ints:
            ints[key], at = _varint(view, at, end)
        elif key in _APPEND_STRINGS:
            start, at = _length(view, at, end)
            try:
                strings[_APPEND_STRINGS.index(key)] = str(view[start:at], "utf-8")
            except UnicodeDecodeError:
                raise _NotCanonical from None
        elif key == _APPEND_NO_REPLY:
            flag, at = _varint(view, at, end)
            no_reply = flag != 0
        elif key == _APPEND_CHAIN:
            if end - at < 8:
                raise _NotCanonical
            chain = int.from_bytes(view[at : at + 8], "little")
            at += 8
        else:
            raise _NotCanonical
    return AppendRequest(
        from_id=strings[1],
        to_id=strings[2],
        term=ints[_APPEND_TERM],
        prev_log_index=ints[_APPEND_PREV_INDEX],
        prev_log_term=ints[_APPEND_PREV_TERM],
        entries=tuple(entries),
        leader_commit=ints[_APPEND_COMMIT],
        no_reply=no_reply,
        prev_log_chain=chain,
    )


def _entry(view: memoryview, at: int, end: int) -> Entry:
    term = index = type = 0
    body_start = body_end = 0
    while at < end:
        key = view[at]
        at += 1
        if key == _E_BODY:
            body_start, at = _length(view, at, end)
            body_end = at
        elif key == _E_TERM:
            term, at = _varint(view, at, end)
        elif key == _E_INDEX:
            index, at = _varint(view, at, end)
        elif key == _E_TYPE:
            type, at = _varint(view, at, end)
            if type >= _U32:
                raise _NotCanonical
        else:
            raise _NotCanonical
    return Entry(term=term, index=index, body=bytes(view[body_start:body_end]), type=type)
