"""Messages between members of one group.

Every field is a scalar or a tuple of :class:`~dledger.log.Entry`, so each class maps 1:1 to
a protobuf message. ``term`` is always the sender's current term, except in a granted
pre-vote response, which carries the term the pre-candidate asked about.
"""

from __future__ import annotations

from dataclasses import dataclass

from dledger.log import Entry

# Reject reasons of VoteResponse (stable strings; "" when granted).
REJECT_STALE_LOG = "stale_log"  # the candidate's log is behind the voter's
REJECT_ALREADY_VOTED = "already_voted"  # voted for someone else this term, or follows a leader
REJECT_LEADER_LEASE = "leader_lease"  # check-quorum: the voter heard from a leader recently
REJECT_STALE_TERM = "stale_term"  # the request's term is below the voter's


@dataclass(frozen=True, slots=True)
class VoteRequest:
    """A (pre-)candidate asks for a vote. For a pre-vote, ``term`` is the term it would use."""

    from_id: str
    to_id: str
    term: int
    last_log_index: int
    last_log_term: int
    pre_vote: bool = False
    leadership_transfer: bool = False  # sent after TimeoutNow: overrides the leader lease


@dataclass(frozen=True, slots=True)
class VoteResponse:
    from_id: str
    to_id: str
    term: int
    granted: bool
    pre_vote: bool = False
    reject_reason: str = ""


@dataclass(frozen=True, slots=True)
class AppendRequest:
    """Entries ``prev_log_index+1 ...`` from the leader; no entries makes a heartbeat.

    ``no_reply``: a commit notice (no entries, ``prev`` already known to match): the follower
    answers only if it rejects it; tick heartbeats always get an answer (the leader's quorum
    check counts them)."""

    from_id: str
    to_id: str
    term: int
    prev_log_index: int
    prev_log_term: int
    entries: tuple[Entry, ...]
    leader_commit: int
    no_reply: bool = False


@dataclass(frozen=True, slots=True)
class AppendResponse:
    """On success ``match_index`` is the last index known to match the leader (durable).

    On rejection, ``rejected_index`` is the request's ``prev_log_index``; ``conflict_term`` is
    the follower's term at that index (0 when its log is shorter) and ``conflict_index`` the
    first index the follower holds with that term (or its ``last_log_index + 1``).
    """

    from_id: str
    to_id: str
    term: int
    success: bool
    match_index: int = 0
    conflict_index: int = 0
    conflict_term: int = 0
    last_log_index: int = 0
    rejected_index: int = 0


@dataclass(frozen=True, slots=True)
class TimeoutNow:
    """Leadership transfer: the target campaigns at once (no pre-vote, lease overridden)."""

    from_id: str
    to_id: str
    term: int


Message = VoteRequest | VoteResponse | AppendRequest | AppendResponse | TimeoutNow
