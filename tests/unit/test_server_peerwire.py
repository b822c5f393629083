"""Peer messages encoded straight to wire bytes (dledger.server.peerwire) parse as the
protobuf runtime's own encoding of the same message does, for every kind, batched or not."""

from __future__ import annotations

from typing import Any

import pytest
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
