"""What the Raft core hands its driver: the :class:`Ready` (the work of one round, in the
order the driver contract gives), the role and the volatile state the driver reacts to, where
a proposal went, and the read-only :class:`Status`. Values only; built by
:class:`dledger.core.raft.RaftNode`."""

from __future__ import annotations

import enum
from collections.abc import Mapping
from dataclasses import dataclass

from dledger.core.messages import Message
from dledger.core.snapshot import SnapshotMeta, SnapshotRequest
from dledger.log import Entry, HardState

__all__ = ["PeerStatus", "Proposal", "Ready", "Role", "SoftState", "Status"]


class Role(enum.Enum):
    FOLLOWER = "follower"
    PRE_CANDIDATE = "pre_candidate"
    CANDIDATE = "candidate"
    LEADER = "leader"


@dataclass(frozen=True, slots=True)
class SoftState:
    """Volatile state the driver may want to react to (routing, metrics, logs)."""

    role: Role
    term: int
    leader_id: str | None


@dataclass(frozen=True, slots=True)
class Ready:
    """Everything the driver must do, in this order (the package docstring has the whole
    procedure). Fields that are None or empty ask for nothing.

    1. send ``early_messages`` (optional: they may also go with ``messages``).
    2. persist in ONE job, in this order: ``hard_state`` (term and vote), then cut the stored
       log from ``truncate_from`` on, then append ``entries`` (:func:`dledger.log.persist` does it).
    3. send ``messages`` (only now: they promise what 2 made durable).
    4. apply ``committed`` in order.
    5. ``advance(ready)``: what 2 wrote is stable.
    6. if ``notices_held``: call ``release_notices()`` COMMIT_NOTICE_LINGER_MS later, unless
       such a call is already pending; if not, cancel a pending call (optional).
    """

    # Term and vote to save durably; None when unchanged since the last Ready.
    hard_state: HardState | None
    # Cut the stored log from this index on (every entry >= it goes) before appending
    # ``entries``: a follower's log conflicted with its leader's. None: no cut.
    truncate_from: int | None
    # Entries to append to the stored log, consecutive, the first at its last index + 1 (after
    # the cut). Not counted by this node (as a vote or an ack) before advance().
    entries: tuple[Entry, ...]
    # Messages that promise nothing about this node's disk: a leader's appends and heartbeats
    # (its term was made durable before its vote requests went out; it counts its own entries
    # only once stable) and TimeoutNow. Sending them before the persist overlaps the leader's
    # disk write with the followers' (Raft thesis 10.2.1).
    early_messages: tuple[Message, ...]
    # Messages to send only after the persist: votes, vote requests, append answers.
    messages: tuple[Message, ...]
    # Committed entries to apply, consecutive, continuing the previous Ready. All are stable
    # or in ``entries``: those in ``entries`` are applied only after the persist, the stable
    # ones may be applied while it runs.
    committed: tuple[Entry, ...]
    # Role, term and leader when they changed since the last Ready, else None.
    soft_state: SoftState | None
    # True while the leader holds commit notices for followers that no append told the new
    # commit index: the driver owes one release_notices() call COMMIT_NOTICE_LINGER_MS later
    # (one pending call covers every notice held meanwhile). False once no notice is held
    # (an append carried the commit): a pending call may then be cancelled, so that the
    # next hold lingers in full. tick() releases them too.
    notices_held: bool = False
    # --- snapshots (dledger.core.snapshot) ---
    # Follower: install this snapshot in step 2, after the hard state and before the entries
    # (the log is replaced: it ends at the snapshot's index; so does the applied state).
    snapshot: SnapshotMeta | None = None
    # Leader: send these followers a snapshot (any time), then report_snapshot(peer, ok).
    snapshot_requests: tuple[SnapshotRequest, ...] = ()
    # --- promises (dledger.core.repair, docs/RAFT.md section 11) ---
    # The highest log index this node vouches for once this Ready's job is done (a
    # follower's acks in ``messages``; a leader's own log, which it counts towards commits
    # once stable): make it durable in step 2 with the hard state's copy (after the hard
    # state), before ``messages`` go and before advance(). None: it did not grow.
    promise: int | None = None
    # --- content-verified log matching (docs/RAFT.md section 13) ---
    # Follower: entries this node already applied were replaced by its leader's (its copy
    # differed by content: damaged or forged). Before applying ``committed`` (which continue
    # from it), roll the applied state back to this index. None: nothing to roll back.
    rewind_to: int | None = None

    def must_persist(self) -> bool:
        """Whether step 2 has anything to write."""
        return (
            self.hard_state is not None
            or self.truncate_from is not None
            or bool(self.entries)
            or self.snapshot is not None
            or self.promise is not None
        )

    def is_empty(self) -> bool:
        return (
            not self.must_persist()
            and not self.early_messages
            and not self.messages
            and not self.committed
            and self.soft_state is None
            and not self.notices_held
            and not self.snapshot_requests
            and self.rewind_to is None
        )


@dataclass(frozen=True, slots=True)
class Proposal:
    """Where accepted bodies went. They are committed iff the entries at these indices are
    committed with this ``term``; any other term at those indices means they were lost."""

    term: int
    first_index: int
    last_index: int


@dataclass(frozen=True, slots=True)
class PeerStatus:
    peer_id: str
    match_index: int
    next_index: int
    state: str
    inflight_appends: int
    lag_entries: int
    recent_active: bool
    # The feature level its last answer in this term said it supports (0: none yet), and
    # whether the leader holds entries back from it because that is below the group's level.
    supported_feature_level: int = 0
    withheld: bool = False
    inflight_bytes: int = 0  # bytes of entry bodies in the appends in flight to it


@dataclass(frozen=True, slots=True)
class Status:
    """Read-only snapshot for a status RPC. ``peers`` is filled on the leader only."""

    node_id: str
    role: Role
    term: int
    leader_id: str | None
    voted_for: str | None
    commit_index: int
    applied_index: int
    last_index: int
    flushed_index: int
    transfer_target: str | None
    peers: tuple[PeerStatus, ...]
    # Messages dropped (and events refused) since start, by reason (messages.DROP_*).
    dropped: Mapping[str, int]
    # The configuration in force (the last one in this member's log), sorted ids.
    voters: tuple[str, ...] = ()
    learners: tuple[str, ...] = ()
    # The repair state (docs/RAFT.md section 11): whether this node's log ends below what it
    # promised, the promise, and the repairs it completed since start.
    repairing: bool = False
    promised_index: int = 0
    repairs_completed: int = 0
    # Content mismatches seen since start (a chain that differs at an index both logs hold
    # with the same term), and how many times this follower cut committed entries because
    # its leader's differed by content (docs/RAFT.md section 13).
    chain_mismatches: int = 0
    committed_repairs: int = 0
    # The group's feature level in this member's log, and the highest this member supports.
    feature_level: int = 1
    supported_feature_level: int = 1
