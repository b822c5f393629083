"""The Raft core: a pure, deterministic state machine for one member of a DLedger group.

No I/O, no clock, no threads: the driver (``dledger.server`` with real sockets, disks and
timers, or ``dledger.sim`` with simulated ones) feeds inputs and carries out outputs.
Randomness (election timeouts) comes only from the ``random.Random`` the driver passes in.

Driver contract
---------------
Build one :class:`RaftNode` per member::

    node = RaftNode("n0", ["n1", "n2"], log_store, RaftConfig(...), random.Random(seed))

It loads its term and vote from ``log_store.load_hard_state()`` and reads/appends its log
through the :class:`~dledger.log.LogStore` protocol. Its commit index starts at
``applied_index`` (default 0) and is relearned from the leader.

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

Outputs: after any input, ``if node.has_ready(): rd = node.ready()`` then, in this order:

1. ``rd.hard_state`` is not None -> ``log_store.save_hard_state(rd.hard_state)`` (durable).
2. ``rd.must_flush_log`` -> ``log_store.flush()`` (the core already appended or truncated
   the log through the LogStore; appends are not durable until this flush).
3. send every message of ``rd.messages`` (only after 1 and 2: a vote or an append
   acknowledgement promises that what it depends on is durable).
4. apply ``rd.committed`` in order (consecutive indices, continuing the previous Ready).
   ``Entry.type`` NOOP entries carry no data; skip them in the application.
5. ``node.advance(rd, log_store.flushed_index())``.

``step``/``tick``/``propose`` may be called between ``ready()`` and ``advance()`` (for example
while a flush is in progress); ``ready()`` may not be called again before ``advance()``
(``has_ready()`` may say True meanwhile: it reports work for the next Ready). A
crash at any point is fine: rebuild the node from the store, which holds what was saved.
``rd.soft_state`` (role, term, leader_id) is not None when it changed: use it for routing,
logging and metrics. The leader counts itself towards a commit majority only for entries at
or below the ``flushed_index`` given to ``advance``.

A proposal's bodies are committed iff the committed entries at
``Proposal.first_index..last_index`` have ``Proposal.term``; a committed entry with another
term at one of those indices means the proposal was lost (the client may retry).

Read-only state: ``role``, ``term``, ``leader_id``, ``commit_index``, ``last_index``,
``voted_for``, ``transfer_target`` and ``status()`` (per-peer match, next, lag, in-flight).
"""

from dledger.core.config import (
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
from dledger.core.messages import (
    CAMPAIGN_REFUSED_MAX_TERM,
    DROP_ACK_BEYOND_LAST,
    DROP_COMMITTED_CONFLICT,
    DROP_MALFORMED,
    DROP_NOT_MEMBER,
    DROP_REASONS,
    DROP_SECOND_LEADER,
    DROP_TERM_OUT_OF_RANGE,
    DROP_UNEXPECTED_TIMEOUT_NOW,
    REJECT_ALREADY_VOTED,
    REJECT_LEADER_LEASE,
    REJECT_STALE_LOG,
    REJECT_STALE_TERM,
    AppendRequest,
    AppendResponse,
    Message,
    TimeoutNow,
    VoteRequest,
    VoteResponse,
)
from dledger.core.raft import (
    PeerStatus,
    ProgressState,
    Proposal,
    RaftNode,
    Ready,
    Role,
    SoftState,
    Status,
)

__all__ = [
    "CAMPAIGN_REFUSED_MAX_TERM",
    "DROP_ACK_BEYOND_LAST",
    "DROP_COMMITTED_CONFLICT",
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
    "REJECT_LEADER_LEASE",
    "REJECT_STALE_LOG",
    "REJECT_STALE_TERM",
    "AppendRequest",
    "AppendResponse",
    "BackPressureError",
    "ConfigError",
    "Message",
    "NotLeaderError",
    "PeerStatus",
    "ProgressState",
    "Proposal",
    "ProposalDroppedError",
    "ProposalTooLargeError",
    "RaftConfig",
    "RaftNode",
    "Ready",
    "Role",
    "SoftState",
    "Status",
    "TimeoutNow",
    "TransferInProgressError",
    "UnknownPeerError",
    "VoteRequest",
    "VoteResponse",
]
