"""Core messages survive the trip through protobuf; malformed peer messages are caught."""

from __future__ import annotations

import pytest
from raftmq.dledger.v1 import dledger_pb2 as pb

from dledger.core import (
    AppendRequest,
    AppendResponse,
    Message,
    TimeoutNow,
    VoteRequest,
    VoteResponse,
)
from dledger.log import Entry
from dledger.server.convert import from_pb, to_pb, validate

MESSAGES: list[Message] = [
    AppendRequest("n0", "n1", 3, 7, 2, (Entry(3, 8, b"a", 0), Entry(3, 9, b"", 17)), 6),
    AppendRequest("n0", "n1", 3, 0, 0, (), 0),
    AppendResponse("n1", "n0", 3, False, 0, 5, 2, 9, 7),
    AppendResponse("n1", "n0", 3, True, 9, 0, 0, 9, 0),
    AppendResponse("n1", "n0", 3, True, 9, last_log_index=9, readers_waiting=True),
    VoteRequest("n2", "n0", 4, 9, 3, pre_vote=True, leadership_transfer=True),
    VoteResponse("n0", "n2", 4, False, pre_vote=True, reject_reason="stale_log"),
    TimeoutNow("n0", "n2", 4),
]


@pytest.mark.parametrize("message", MESSAGES, ids=lambda m: type(m).__name__)
def test_round_trip(message: Message) -> None:
    wire = to_pb(message, "g").SerializeToString()
    assert from_pb(pb.PeerMessage.FromString(wire)) == message
    assert validate(message) is None


def test_empty_peer_message_is_ignored() -> None:
    assert from_pb(pb.PeerMessage()) is None


@pytest.mark.parametrize(
    ("message", "needle"),
    [
        (AppendRequest("n0", "n1", 3, 7, 2, (Entry(3, 9, b"a"),), 6), "not contiguous"),
        (AppendRequest("n0", "n1", 3, 7, 2, (Entry(4, 8, b"a"),), 6), "outside"),
        (AppendRequest("n0", "n1", 3, 7, 2, (Entry(1, 8, b"a"),), 6), "outside"),
        (AppendRequest("n0", "n1", 3, 7, 5, (), 6), "prev_log_term above"),
        (AppendRequest("n0", "n1", 3, 0, 1, (), 0), "index 0"),
        (AppendRequest("n0", "n1", 3, 7, 2, (Entry(3, 8, b"a", 300),), 6), "type"),
        (VoteRequest("n2", "n0", 4, 9, 5), "last_log_term above"),
        (TimeoutNow("", "n2", 4), "ids"),
    ],
)
def test_validate_rejects_what_an_honest_peer_never_sends(message: Message, needle: str) -> None:
    problem = validate(message)
    assert problem is not None and needle in problem


@pytest.mark.parametrize(
    "message",
    [
        AppendRequest("", "", 0, 0, 0, (), 0),
        AppendResponse("", "", 0, False, 0, 0, 0, 0, 0),
        VoteRequest("", "", 0, 0, 0),
        VoteResponse("", "", 0, False),
        TimeoutNow("", "", 0),
    ],
    ids=lambda m: type(m).__name__,
)
def test_a_message_of_default_values_keeps_its_kind(message: Message) -> None:
    """Filled in place, a submessage whose every field has its default must still be set."""
    wire = to_pb(message, "").SerializeToString()
    assert from_pb(pb.PeerMessage.FromString(wire)) == message
