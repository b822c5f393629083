"""The Raft core: a pure, deterministic state machine for one member of a DLedger group.

No I/O, no clock, no threads: the driver (``dledger.server`` with real sockets, disks and
timers, or ``dledger.sim`` with simulated ones) feeds inputs and carries out outputs.
Randomness (election timeouts) comes only from the ``random.Random`` the driver passes in.

Driver contract
---------------
Build one :class:`RaftNode` per member::

    node = RaftNode("n0", ["n1", "n2"], log_store, RaftConfig(...), random.Random(seed))

It loads its term and vote from ``log_store.load_hard_state()`` and only *reads* the
:class:`~dledger.log.LogStore`: ``step``/``tick``/``propose`` never write. What they add to
the log waits in an in-memory unstable tail (``dledger.core.raftlog``) until the driver has
persisted it; a follower's conflict cuts that tail (or marks the stored log to be cut) in
memory. Its commit index starts at ``applied_index`` (default 0) and is relearned.

Inputs (call from one thread or task; each returns quickly and never blocks):

* ``tick()`` every tick (the server: every ``tick_ms``; timeouts are counted in ticks).
* ``step(message)`` for every message received from a peer (any order, duplicates and stale
  messages are fine). It never raises: a message no honest member could have sent (unknown
  sender, term above ``MAX_TERM`` or jumping by more than ``MAX_TERM_JUMP``, a second leader
  in a term, an unrequested TimeoutNow, an ack beyond the leader's last index, ...) is
  dropped and counted in ``dropped`` / ``status().dropped`` by reason (``DROP_*``).
* ``propose(bodies, entry_type=NORMAL) -> Proposal`` on the leader; raises
  ``NotLeaderError(leader_id=hint)``, ``TransferInProgressError``, ``BackPressureError`` or
  ``ProposalDroppedError`` and then changes nothing.
* ``transfer_leadership(target_id)`` on the leader.
* ``propose_conf_change(ConfChange(kind, node_id)) -> Proposal`` on the leader: one
  membership change (``dledger.core.membership``; docs/RAFT.md section 9). Raises
  ``ConfChangeError`` (never valid as asked), ``ConfChangePendingError`` (retry later),
  ``TransferInProgressError`` (removing the leader: it hands over first) or
  ``NotLeaderError``. A committed ``EntryType.CONFIG`` entry carries no application data.
  ``conf_state`` / ``conf_state_at(index)`` give the configuration (a frozen ``ConfState``
  a snapshot can carry); ``restore_conf_state`` adopts one from a snapshot; the constructor
  takes the one in force at ``applied_index`` as ``conf_state=``.
* ``propose_feature_level(level) -> Proposal`` on the leader: raise the group's feature
  level (docs/RAFT.md "Feature level"), a CONFIG entry with the same members. Raises
  ``FeatureLevelError`` (a member has not reported support for ``level`` in this term, or
  ``level`` is not above the group's or is above this node's support; the message names the
  member), ``ConfChangePendingError`` or ``NotLeaderError``. ``feature_level`` is the level
  in this member's log.

Outputs: after any input, ``while node.has_ready(): rd = node.ready()`` then, in this order:

1. send ``rd.early_messages`` (optional; they may also wait for 3). They promise nothing about
   this node's disk: a leader's appends and heartbeats (its term was durable before its vote
   requests left; it counts its own entries only once stable) and TimeoutNow.
2. persist, in ONE job (``dledger.log.persist`` does it; the server runs it in its flush
   thread whenever it waits for the disk, and a page-cache-only append under ASYNC_FLUSH
   inline, docs/RAFT.md section 4): save
   ``rd.hard_state`` (term and vote; None: unchanged), cut the stored log from
   ``rd.truncate_from`` on (None: no cut), append ``rd.entries`` (consecutive, the first at
   the stored last index + 1 after the cut), flush. A job refused by a full disk may be run
   again as it is; nothing of 3-5 happens until it succeeds.
3. send ``rd.messages`` (only now: votes, vote requests and append answers promise what 2
   made durable).
4. if ``rd.rewind_to`` is not None, roll the applied state back to that index first (a
   content repair replaced entries this member had applied: docs/RAFT.md section 13; none
   of ``rd.committed`` is then stable ahead of the job). Then apply ``rd.committed`` in
   order (consecutive indices, continuing the previous Ready or ``rd.rewind_to``; each
   is stable or in ``rd.entries``). ``Entry.type`` NOOP entries carry no data; skip them.
   Those below the first index the job of 2 writes are stable already and may be applied
   while that job runs (the server does, so the apply overlaps the fsync); the others only
   after it.
5. ``node.advance(rd)``: what 2 wrote is stable.
6. if ``rd.notices_held``: call ``node.release_notices()`` COMMIT_NOTICE_LINGER_MS later,
   unless such a call is already pending; if not, cancel a pending call (optional: it would
   find nothing held, or release a later hold early, which costs messages, not safety).

``step``/``tick``/``propose`` may be called between ``ready()`` and ``advance()`` (while the
job runs in a thread: the next Ready then writes all they added, a group commit); ``ready()``
may not be called again before ``advance()`` (``has_ready()`` may say True meanwhile: it
reports work for the next Ready). A crash at any point is fine: rebuild the node from the
store; the unstable tail and an unfinished job are lost, and nothing that depended on them was
sent. ``rd.soft_state`` (role, term, leader_id) is not None when it changed: use it for
routing, logging and metrics. The leader counts itself towards a commit majority only for
stable entries; ``commit_index`` counts only what the stored log holds.

Commit notices (an empty no-reply append telling a follower the commit index) are decided at
``ready()``: none to a follower that this Ready sends an append (it carries the commit) or
that has appends in flight; the others' are held and the Ready says ``notices_held`` (step
6) until an append told them (a later Ready says False). At the release only followers that no
append told meanwhile get a notice, with the latest commit; ``tick()`` releases them too
(docs/RAFT.md section 4).

A proposal's bodies are committed iff the committed entries at
``Proposal.first_index..last_index`` have ``Proposal.term``; a committed entry with another
term at one of those indices means the proposal was lost (the client may retry).

Promises (docs/RAFT.md section 11): ``rd.promise`` (None: unchanged) is the highest index
this node vouches for once the job is done; the driver makes it durable in step 2, in a file
apart from the log (``dledger.storage.promise``) with a copy of the hard state, before step
3 (the server writes it beside the entries' flush; docs/RAFT.md section 11). At start it
passes what it read as ``promised=`` (and ``hard_state=`` when it recovered the term and
vote from that copy): a log that ends below the promise makes the node *repairing*
(``repairing``): no campaign, no vote, its acks counted towards no commit, until a leader
brought its log back.

Read-only state: ``role``, ``term``, ``leader_id``, ``commit_index``, ``last_index``,
``last_term``, ``stable_index``, ``voted_for``, ``transfer_target`` and ``status()``
(per-peer match, next, lag, in-flight).
"""

from dledger.core.config import (
    COMMIT_NOTICE_LINGER_MS,
    MAX_ENTRIES_PER_PROPOSAL,
    MAX_GROUP_SIZE,
    MAX_INDEX,
    MAX_INFLIGHT_APPENDS_LIMIT,
    MAX_READY_COMMITTED_BYTES,
    MAX_TERM,
    MAX_TERM_JUMP,
    MUTATIONS,
    RaftConfig,
)
from dledger.core.errors import (
    BackPressureError,
    ConfigError,
    NotLeaderError,
    ProposalDroppedError,
    ProposalTooLargeError,
    TransferInProgressError,
    UnknownPeerError,
)
from dledger.core.membership import (
    ChangeKind,
    ConfChange,
    ConfChangeError,
    ConfChangePendingError,
    ConfState,
)
from dledger.core.messages import (
    CAMPAIGN_REFUSED_MAX_TERM,
    DROP_ACK_BEYOND_LAST,
    DROP_FEATURE_LEVEL,
    DROP_MALFORMED,
    DROP_NOT_MEMBER,
    DROP_REASONS,
    DROP_SECOND_LEADER,
    DROP_TERM_OUT_OF_RANGE,
    DROP_UNEXPECTED_TIMEOUT_NOW,
    REJECT_ALREADY_VOTED,
    REJECT_CHAIN_MISMATCH,
    REJECT_LEADER_LEASE,
    REJECT_REPAIRING,
    REJECT_STALE_LOG,
    REJECT_STALE_TERM,
    AppendRequest,
    AppendResponse,
    Message,
    TimeoutNow,
    VoteRequest,
    VoteResponse,
)
from dledger.core.progress import ProgressState
from dledger.core.raft import RaftNode
from dledger.core.ready import PeerStatus, Proposal, Ready, Role, SoftState, Status
from dledger.core.repair import Promised, newer_hard_state
from dledger.core.snapshot import InstallSnapshot, SnapshotMeta, SnapshotRequest
from dledger.log import FeatureLevelError

__all__ = [
    "CAMPAIGN_REFUSED_MAX_TERM",
    "COMMIT_NOTICE_LINGER_MS",
    "DROP_ACK_BEYOND_LAST",
    "DROP_FEATURE_LEVEL",
    "DROP_MALFORMED",
    "DROP_NOT_MEMBER",
    "DROP_REASONS",
    "DROP_SECOND_LEADER",
    "DROP_TERM_OUT_OF_RANGE",
    "DROP_UNEXPECTED_TIMEOUT_NOW",
    "MAX_ENTRIES_PER_PROPOSAL",
    "MAX_GROUP_SIZE",
    "MAX_INDEX",
    "MAX_INFLIGHT_APPENDS_LIMIT",
    "MAX_READY_COMMITTED_BYTES",
    "MAX_TERM",
    "MAX_TERM_JUMP",
    "MUTATIONS",
    "REJECT_ALREADY_VOTED",
    "REJECT_CHAIN_MISMATCH",
    "REJECT_LEADER_LEASE",
    "REJECT_REPAIRING",
    "REJECT_STALE_LOG",
    "REJECT_STALE_TERM",
    "AppendRequest",
    "AppendResponse",
    "BackPressureError",
    "ChangeKind",
    "ConfChange",
    "ConfChangeError",
    "ConfChangePendingError",
    "ConfState",
    "ConfigError",
    "FeatureLevelError",
    "InstallSnapshot",
    "Message",
    "NotLeaderError",
    "PeerStatus",
    "ProgressState",
    "Promised",
    "Proposal",
    "ProposalDroppedError",
    "ProposalTooLargeError",
    "RaftConfig",
    "RaftNode",
    "Ready",
    "Role",
    "SnapshotMeta",
    "SnapshotRequest",
    "SoftState",
    "Status",
    "TimeoutNow",
    "TransferInProgressError",
    "UnknownPeerError",
    "VoteRequest",
    "VoteResponse",
    "newer_hard_state",
]
