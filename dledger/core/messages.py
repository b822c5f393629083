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
# The voter's log ends below what it once acknowledged (its store was rolled back, cut or
# replaced), or its vote was lost: it votes for no one until repaired (docs/RAFT.md 11).
REJECT_REPAIRING = "repairing"
# The voter holds the candidate's last entry with its term but another chain there: one of
# the two logs was damaged or forged (docs/RAFT.md section 13); never elect across that.
REJECT_CHAIN_MISMATCH = "chain_mismatch"

# Why a received message was dropped without effect (keys of ``RaftNode.dropped``; stable
# strings). A peer is an adversary until proven otherwise: what an honest member could not
# have sent is counted here, never raised and never acted upon.
DROP_NOT_MEMBER = "not_member"  # the sender is not a member, or it is addressed to another node
DROP_MALFORMED = "malformed"  # negative index, or entries not starting at prev_log_index + 1
DROP_TERM_OUT_OF_RANGE = "term_out_of_range"  # above MAX_TERM, or a jump beyond MAX_TERM_JUMP
DROP_SECOND_LEADER = "second_leader"  # an append from another "leader" of a term that has one
DROP_UNEXPECTED_TIMEOUT_NOW = "unexpected_timeout_now"  # not from this term's leader
DROP_ACK_BEYOND_LAST = "ack_beyond_last"  # an ack or reject of an index the leader never had
# Not hostile, refused all the same: an append carrying a CONFIG entry whose feature level this
# member's release does not support (it must never persist one; docs/RAFT.md "Feature level").
DROP_FEATURE_LEVEL = "feature_level_unsupported"
# Not a drop but counted with them: this node's term is MAX_TERM, it cannot campaign.
CAMPAIGN_REFUSED_MAX_TERM = "campaign_refused_max_term"
DROP_REASONS = (
    DROP_NOT_MEMBER,
    DROP_MALFORMED,
    DROP_TERM_OUT_OF_RANGE,
    DROP_SECOND_LEADER,
    DROP_UNEXPECTED_TIMEOUT_NOW,
    DROP_ACK_BEYOND_LAST,
    DROP_FEATURE_LEVEL,
    CAMPAIGN_REFUSED_MAX_TERM,
)


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
    last_log_chain: int = 0  # dledger.chain value at last_log_index (0: not carried)


@dataclass(frozen=True, slots=True)
class VoteResponse:
    from_id: str
    to_id: str
    term: int
    granted: bool
    pre_vote: bool = False
    reject_reason: str = ""
    # A granted vote: the voter's term and chain at log_index = min(its last index, the
    # candidate's): the candidate counts the vote only if its own log agrees there.
    log_index: int = 0
    log_term: int = 0
    log_chain: int = 0  # 0: not carried


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
    # dledger.chain value at prev_log_index: the follower accepts only if its own agrees
    # (0: not carried, the term alone is compared there; entries are checked by content).
    prev_log_chain: int = 0


@dataclass(frozen=True, slots=True)
class AppendResponse:
    """On success ``match_index`` is the last index known to match the leader (durable).

    On rejection, ``rejected_index`` is the request's ``prev_log_index``; ``conflict_term`` is
    the follower's term at that index (0 when its log is shorter) and ``conflict_index`` the
    first index the follower holds with that term (or its ``last_log_index + 1``).
    ``repairing``: the follower is in the repair state, its ack counts toward no quorum.

    ``match_chain`` is the follower's chain value at ``match_index`` (success) or at
    ``rejected_index`` (rejection; 0 when it does not hold that index): the leader counts an
    ack only if it agrees with its own chain there.
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
    # The sender is repairing (its log ends below what it once acknowledged): the leader
    # replicates to it but does not count it towards a commit (docs/RAFT.md section 11).
    repairing: bool = False
    match_chain: int = 0
    # The highest group feature level the sender's release supports (0: a release before
    # feature levels, which supports mqrelease.BASELINE_LEVEL): the leader raises the group's
    # level only once every member reported at least that, and sends entries only to members
    # that support the group's level (docs/RAFT.md "Feature level").
    supported_feature_level: int = 0
    # The sender has readers waiting for its next apply (its application said so with
    # set_readers_waiting): the leader sends it each commit notice at once instead of holding
    # it for COMMIT_NOTICE_LINGER_MS (docs/RAFT.md section 4).
    readers_waiting: bool = False


@dataclass(frozen=True, slots=True)
class TimeoutNow:
    """Leadership transfer: the target campaigns at once (no pre-vote, lease overridden)."""

    from_id: str
    to_id: str
    term: int


Message = VoteRequest | VoteResponse | AppendRequest | AppendResponse | TimeoutNow
