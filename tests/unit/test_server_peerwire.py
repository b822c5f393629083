"""Peer messages encoded straight to wire bytes (dledger.server.peerwire) parse as the
protobuf runtime's own encoding of the same message does, for every kind, batched or not."""

from __future__ import annotations

from typing import Any

import pytest
from google.protobuf.message import DecodeError
from hypothesis import given, settings
from hypothesis import strategies as st
from raftmq.dledger.v1 import dledger_pb2 as pb
from raftmq.dledger.v1 import dledger_pb2_grpc as pb_grpc

from dledger.core import AppendRequest, Message, TimeoutNow, VoteResponse
from dledger.log import Entry
from dledger.server import peerwire, transport
from dledger.server.convert import fill_pb, from_pb, to_pb

U64 = st.integers(0, (1 << 64) - 1)
IDS = st.text(min_size=0, max_size=8)


@st.composite
def appends(draw: st.DrawFn) -> AppendRequest:
    entries = tuple(
        Entry(draw(U64), draw(U64), draw(st.binary(max_size=300)), draw(st.integers(0, 255)))
        for _ in range(draw(st.integers(0, 4)))
    )
    return AppendRequest(
        draw(IDS),
        draw(IDS),
        draw(U64),
        draw(U64),
        draw(U64),
        entries,
        draw(U64),
        no_reply=draw(st.booleans()),
        prev_log_chain=draw(U64),
    )


@settings(max_examples=300, deadline=None)
@given(appends(), IDS)
def test_an_append_parses_as_the_runtime_encoding_does(m: AppendRequest, group: str) -> None:
    parsed = pb.PeerMessage.FromString(peerwire.encode(m, group))
    assert parsed == to_pb(m, group)
    assert from_pb(parsed) == m


def test_a_large_body_and_a_default_append_keep_their_kind() -> None:
    body = bytes(range(256)) * 257  # a multi-byte length
    big = AppendRequest("n0", "n1", 2, 0, 0, (Entry(2, 1, body, 0), Entry(2, 2, b"", 17)), 1)
    assert from_pb(pb.PeerMessage.FromString(peerwire.encode(big, "g"))) == big
    empty = AppendRequest("", "", 0, 0, 0, (), 0)
    parsed = pb.PeerMessage.FromString(peerwire.encode(empty, ""))
    assert parsed.WhichOneof("kind") == "append_request"
    assert from_pb(parsed) == empty


@pytest.mark.parametrize("n", [1, 2, 5])
def test_a_batch_parses_as_the_runtime_batch(n: int) -> None:
    messages: list[Message] = [
        AppendRequest("n0", "n1", 3, 7, 2, (Entry(3, 8, b"a" * 200, 0),), 6),
        TimeoutNow("n0", "n1", 4),
        VoteResponse("n0", "n1", 4, False, reject_reason="stale_log"),
    ] * 2
    messages = messages[:n]
    expected = pb.PeerMessage()
    for m in messages:
        fill_pb(expected.batch.messages.add(), m, "g")
    wire = peerwire.encode_batch([peerwire.encode(m, "g") for m in messages])
    assert pb.PeerMessage.FromString(wire) == expected


@pytest.mark.parametrize("n", [0, 1, 127, 128, 300, 1 << 35, (1 << 64) - 1])
def test_varint_matches_the_runtime(n: int) -> None:
    # Entry.term is a uint64 (field 1): its encoding is the key byte and the varint.
    assert pb.Entry(term=n).SerializeToString() == (b"\x08" + peerwire.varint(n) if n else b"")


def test_the_stream_method_is_the_generated_stubs() -> None:
    seen: dict[str, Any] = {}

    class Channel:
        def __getattr__(self, kind: str) -> Any:
            def make(path: str, **kw: Any) -> None:
                seen[path] = (kind, kw["request_serializer"])

            return make

    pb_grpc.DLedgerPeerStub(Channel())
    kind, serializer = seen[transport.STREAM_METHOD]
    assert kind == "stream_unary"
    assert serializer == pb.PeerMessage.SerializeToString


# ---------------------------------------------------------------------- shared entries


def _bodies(draw: st.DrawFn) -> bytes:
    # Around ZERO_COPY_MIN_BODY_BYTES: both sides of the part boundary.
    size = draw(st.sampled_from([0, 1, 300, peerwire.ZERO_COPY_MIN_BODY_BYTES - 1]))
    size = draw(st.sampled_from([size, peerwire.ZERO_COPY_MIN_BODY_BYTES, 20_000]))
    return bytes([draw(st.integers(0, 255))]) * size


@st.composite
def entry_runs(draw: st.DrawFn) -> tuple[Entry, ...]:
    return tuple(
        Entry(draw(U64), draw(U64), _bodies(draw), draw(st.integers(0, 255)))
        for _ in range(draw(st.integers(1, 6)))
    )


def _follower_append(entries: tuple[Entry, ...], to_id: str, k: int) -> AppendRequest:
    # What differs between two followers' appends of the same entries.
    return AppendRequest("n0", to_id, 9, k, 9, entries, k + 1, prev_log_chain=k // 7)


@settings(max_examples=60, deadline=None)
@given(entry_runs(), IDS)
def test_each_followers_head_and_the_shared_entries_parse_as_its_own_append(
    entries: tuple[Entry, ...], group: str
) -> None:
    cache = peerwire.EntriesCache()
    for to_id, k in (("n1", 3), ("n2", (1 << 64) - 2), ("n3", 300)):
        m = _follower_append(entries, to_id, k)
        shared = cache.get(m.entries)
        wire = peerwire.append_head(m, group, shared.size) + b"".join(shared.parts)
        assert pb.PeerMessage.FromString(wire) == to_pb(m, group)
        assert shared.joined() == b"".join(shared.parts)
        assert peerwire.encode(m, group, cache) == wire  # the gRPC stream's bytes
    assert (cache.encoded, cache.reused) == (1, 5)


def test_large_bodies_are_parts_of_their_own_not_copies() -> None:
    big = bytes(range(256)) * 64
    small = b"s" * 100
    entries = (Entry(1, 1, big, 0), Entry(1, 2, small, 0), Entry(1, 3, big[:-1], 0))
    shared = peerwire.SharedEntries(entries)
    large = [p for p in shared.parts if len(p) >= peerwire.ZERO_COPY_MIN_BODY_BYTES]
    assert len(large) == 2
    assert large[0] is entries[0].body and large[1] is entries[2].body
    # The second entry's headers and body and the third's headers: one small part.
    assert len(shared.parts) == 4


def test_another_run_of_entries_is_encoded_anew() -> None:
    cache = peerwire.EntriesCache()
    a = (Entry(1, 1, b"x" * 3000, 0),)
    b = (Entry(1, 1, b"x" * 3000, 0),)  # equal, not the same objects: not trusted as same
    assert cache.get(a) is cache.get(a)
    assert cache.get(b) is not cache.get(a)
    assert (cache.encoded, cache.reused) == (3, 1)


# ---------------------------------------------------------------------- reading in place


def _runtime(wire: bytes) -> Message | str | None:
    try:
        return from_pb(pb.PeerMessage.FromString(wire))
    except DecodeError:
        return "refused"


@settings(max_examples=300, deadline=None)
@given(appends(), IDS)
def test_an_append_read_in_place_is_the_runtimes(m: AppendRequest, group: str) -> None:
    for wire in (peerwire.encode(m, group), to_pb(m, group).SerializeToString()):
        assert peerwire.decode_append(wire) == from_pb(pb.PeerMessage.FromString(wire)) == m
        assert peerwire.decode_append(memoryview(bytearray(wire))) == m


@st.composite
def mutated(draw: st.DrawFn) -> bytes:
    m = draw(appends())
    wire = bytearray(peerwire.encode(m, "g"))
    for _ in range(draw(st.integers(1, 3))):
        kind = draw(st.sampled_from(["flip", "cut", "insert", "append"]))
        at = draw(st.integers(0, max(0, len(wire) - 1)))
        if kind == "flip" and wire:
            wire[at] ^= 1 << draw(st.integers(0, 7))
        elif kind == "cut":
            del wire[at : at + draw(st.integers(1, 4))]
        elif kind == "insert":
            wire[at:at] = draw(st.binary(min_size=1, max_size=4))
        else:
            # A field after the append's: another append (merged by the runtime), an unknown one.
            wire += draw(st.sampled_from([b"\x1a\x02\x20\x05", b"\x7a\x00", b"\x08\x01"]))
    return bytes(wire)


@settings(max_examples=700, deadline=None)
@given(mutated())
def test_mutated_bytes_are_read_as_the_runtime_reads_them_or_left_to_it(wire: bytes) -> None:
    """Whatever decode_append returns, the runtime agrees; None leaves it to the runtime."""
    got = peerwire.decode_append(wire)
    if got is not None:
        assert _runtime(wire) == got


@pytest.mark.parametrize(
    "wire",
    [
        b"",
        b"\x1a",
        b"\x0a\x00",  # a vote request
        b"\x1a\x02\x20\x05\x1a\x02\x28\x01",  # two append fields: the runtime merges them
        b"\x1a\x02\x78\x01",  # an unknown field
        b"\x1a\x03\x0a\x01\xff",  # a group that is no UTF-8
        b"\x1a\x0c\x20" + b"\xff" * 10 + b"\x01",  # an eleven-byte varint
        b"\x1a\x0b\x20" + b"\xff" * 9 + b"\x7f",  # a varint over 64 bits
        b"\x1a\x06\x3a\x04\x18\x80\x80\x80",  # a truncated entry
        b"\x1a\x08\x3a\x06\x18\x80\x80\x80\x80\x10",  # an entry type over 32 bits
        b"\x1a\x05\x51\x01\x02\x03\x04",  # a fixed64 cut short
    ],
)
def test_what_is_not_the_senders_encoding_is_left_to_the_runtime(wire: bytes) -> None:
    assert peerwire.decode_append(wire) is None


def test_fields_in_any_order_and_repeated_read_as_the_runtime_reads_them() -> None:
    entry = b"\x22\x02hi\x08\x03\x10\x05\x08\x04"  # body first; term twice: the last wins
    inner = b"\x20\x09\x12\x02n0\x3a" + bytes([len(entry)]) + entry + b"\x1a\x02n1\x20\x0a\x48\x02"
    wire = b"\x1a" + bytes([len(inner)]) + inner
    got = peerwire.decode_append(wire)
    assert got is not None and got == _runtime(wire)
    assert got.term == 10 and got.no_reply and got.entries == (Entry(4, 5, b"hi", 0),)
