"""Core messages <-> protobuf, one place, field for field."""

from __future__ import annotations

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


def entry_from_pb(e: pb.Entry) -> Entry:
    return Entry(term=e.term, index=e.index, body=e.body, type=e.type)


def to_pb(m: Message, group: str) -> pb.PeerMessage:
    """Wrap a core message for the peer stream."""
    pm = pb.PeerMessage()
    fill_pb(pm, m, group)
    return pm


def fill_pb(pm: pb.PeerMessage, m: Message, group: str) -> None:
    """Write ``m`` into the empty ``pm`` in place. Submessages are never passed to a
    constructor: that merges them, which upb does by serializing and parsing them again (two
    more copies of every entry body; measured 687 vs 319 us for 256 KiB of entries)."""
    if isinstance(m, AppendRequest):
        a = pm.append_request  # set by the first assignment, even of a default value
        a.group = group
        a.from_id = m.from_id
        a.to_id = m.to_id
        a.term = m.term
        a.prev_log_index = m.prev_log_index
        a.prev_log_term = m.prev_log_term
        a.leader_commit = m.leader_commit
        a.no_reply = m.no_reply
        add = a.entries.add
        for e in m.entries:
            add(term=e.term, index=e.index, type=e.type, body=e.body)
    else:
        kind, with_group = _KINDS[type(m)]
        sub = getattr(pm, kind)
        if with_group:
            sub.group = group
        for name in m.__slots__:  # the core's fields are the protobuf's, name for name
            setattr(sub, name, getattr(m, name))


# The oneof field of every kind but AppendRequest (filled by hand: it is the hot one), and
# whether its protobuf carries the group.
_KINDS: dict[type, tuple[str, bool]] = {
    AppendResponse: ("append_response", False),
    VoteRequest: ("vote_request", True),
    VoteResponse: ("vote_response", False),
    TimeoutNow: ("timeout_now", True),
}


def from_pb(pm: pb.PeerMessage) -> Message | None:
    """Unwrap a peer message; None for an empty or unknown kind (a newer peer)."""
    kind = pm.WhichOneof("kind")
    if kind == "append_request":
        a = pm.append_request
        return AppendRequest(
            from_id=a.from_id,
            to_id=a.to_id,
            term=a.term,
            prev_log_index=a.prev_log_index,
            prev_log_term=a.prev_log_term,
            entries=tuple(entry_from_pb(e) for e in a.entries),
            leader_commit=a.leader_commit,
            no_reply=a.no_reply,
        )
    if kind == "append_response":
        r = pm.append_response
        return AppendResponse(
            from_id=r.from_id,
            to_id=r.to_id,
            term=r.term,
            success=r.success,
            match_index=r.match_index,
            conflict_index=r.conflict_index,
            conflict_term=r.conflict_term,
            last_log_index=r.last_log_index,
            rejected_index=r.rejected_index,
        )
    if kind == "vote_request":
        v = pm.vote_request
        return VoteRequest(
            from_id=v.from_id,
            to_id=v.to_id,
            term=v.term,
            last_log_index=v.last_log_index,
            last_log_term=v.last_log_term,
            pre_vote=v.pre_vote,
            leadership_transfer=v.leadership_transfer,
        )
    if kind == "vote_response":
        w = pm.vote_response
        return VoteResponse(
            from_id=w.from_id,
            to_id=w.to_id,
            term=w.term,
            granted=w.granted,
            pre_vote=w.pre_vote,
            reject_reason=w.reject_reason,
        )
    if kind == "timeout_now":
        t = pm.timeout_now
        return TimeoutNow(from_id=t.from_id, to_id=t.to_id, term=t.term)
    return None


def validate(m: Message) -> str | None:
    """Why ``m`` cannot have come from an honest peer, or None.

    The core asserts its invariants; a malformed message must be dropped here, before it can
    trip one of those assertions and take the node down.
    """
    if m.term < 0 or not m.from_id or not m.to_id:
        return "missing term or ids"
    if isinstance(m, AppendRequest):
        if m.prev_log_term > m.term or m.prev_log_index < 0 or m.leader_commit < 0:
            return "prev_log_term above the request term"
        if m.prev_log_index == 0 and m.prev_log_term != 0:
            return "index 0 has term 0"
        expected = m.prev_log_index + 1
        last_term = m.prev_log_term
        for e in m.entries:
            if e.index != expected:
                return f"entries not contiguous at {e.index} (expected {expected})"
            if not last_term <= e.term <= m.term:
                return f"entry {e.index} has term {e.term} outside [{last_term}, {m.term}]"
            if not 0 <= e.type <= 255:
                return f"entry {e.index} has type {e.type}"
            expected += 1
            last_term = e.term
    elif isinstance(m, VoteRequest) and m.last_log_term > m.term:
        return "last_log_term above the request term"
    return None
