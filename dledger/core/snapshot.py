"""Snapshots in the Raft core: the leader asks its driver to send one, a follower accepts one.

The core never holds a snapshot's data and never writes one. What it knows of a snapshot is
its :class:`SnapshotMeta`: the last index and term the snapshot covers, and the membership
configuration at that index (opaque here). The state machine (the application, through the
driver) produces the data; the driver transfers it and installs it.

Leader. A follower whose next entry the leader no longer holds (``next < first_index``:
retention deleted it) cannot be caught up by appends. Its progress enters the ``SNAPSHOT``
state and the next Ready carries a :class:`SnapshotRequest` for it: the driver captures the
state machine at its applied index (which is at least the log's first index - 1, since
retention deletes only applied entries), streams it, and delivers :class:`InstallSnapshot`
(the metadata) to the follower once the data is there. It then calls
``RaftNode.report_snapshot(peer, ok)``. Meanwhile the leader sends that follower no appends
(heartbeats go on, with ``prev = 0`` when its match is below the log). The follower's answer
(an ack of the snapshot's index) moves it back to probing from there. A failed transfer
(``ok=False``) or an answer showing the follower still behind the log asks for a new snapshot
(at most one request in flight per follower).

Follower. An :class:`InstallSnapshot` of this term's leader is accepted only when its index is
beyond the follower's commit index (an older one is answered with the commit index and
otherwise ignored: installing it would roll applied state back). If the log already holds the
snapshot's last entry with its term, the log is kept and only the commit index moves.
Otherwise the log is replaced: the unstable tail is dropped, and the next Ready's ``snapshot``
asks the driver to install the snapshot before anything else of that Ready is persisted. From
then on the log's first index is ``index + 1`` and ``term_at(index)`` is the snapshot's term;
commit and applied become ``index``. The answer (an ack of ``index``) is sent only after the
install.
"""

from __future__ import annotations

import logging
from collections.abc import Hashable
from dataclasses import dataclass
from typing import TYPE_CHECKING

from dledger.chain import CHAIN_MAX, agree
from dledger.core.config import MAX_INDEX
from dledger.core.messages import AppendRequest

if TYPE_CHECKING:
    from dledger.core.raft import RaftNode, _Progress

logger = logging.getLogger(__name__)

__all__ = [
    "InstallSnapshot",
    "SnapshotMeta",
    "SnapshotRequest",
]


@dataclass(frozen=True, slots=True)
class SnapshotMeta:
    """What a snapshot covers: the log up to ``index`` (whose entry has ``term``).

    ``config`` is the group's membership configuration at ``index``, an immutable value the
    core carries without looking into it; None means the static configuration the member was
    started with (the peers list)."""

    index: int
    term: int
    config: Hashable | None = None
    chain: int = 0  # dledger.chain value at ``index`` (0: unknown)


@dataclass(frozen=True, slots=True)
class SnapshotRequest:
    """Leader to its driver: send follower ``to_id`` a snapshot (the leader's term ``term``),
    then call ``report_snapshot(to_id, ok)``."""

    to_id: str
    term: int


@dataclass(frozen=True, slots=True)
class InstallSnapshot:
    """The last piece of a snapshot transfer, stepped into the follower's core by its driver
    once the snapshot's data was received whole and verified (its checksum). Carries the
    metadata of :class:`SnapshotMeta` as scalars."""

    from_id: str
    to_id: str
    term: int
    snapshot_index: int
    snapshot_term: int
    config: Hashable | None = None
    snapshot_chain: int = 0  # dledger.chain value at snapshot_index (0: unknown)

    @property
    def meta(self) -> SnapshotMeta:
        return SnapshotMeta(
            self.snapshot_index, self.snapshot_term, self.config, self.snapshot_chain
        )


def malformed(m: InstallSnapshot) -> bool:
    """An InstallSnapshot no honest leader sends: an index outside [1, MAX_INDEX], or a last
    term outside [1, the message's term]."""
    return not (
        1 <= m.snapshot_index <= MAX_INDEX
        and 1 <= m.snapshot_term <= m.term
        and 0 <= m.snapshot_chain <= CHAIN_MAX
    )


# ---------------------------------------------------------------------- leader side


def needs_snapshot(node: RaftNode, next_index: int) -> bool:
    """Whether a follower whose next entry is ``next_index`` can only be caught up by a
    snapshot: retention deleted that entry (or the term of the one before it)."""
    return next_index < node._log.first_index()


def request_snapshot(node: RaftNode, peer: str, pr: _Progress) -> None:
    """Put ``pr`` in the SNAPSHOT state and ask the driver for a snapshot (once in flight)."""
    from dledger.core.raft import ProgressState

    if pr.state is not ProgressState.SNAPSHOT:
        pr.state = ProgressState.SNAPSHOT
        pr.inflight.clear()
        pr.probe_sent = False
    if not pr.snapshot_inflight:
        pr.snapshot_inflight = True
        node._snapshot_requests.append(SnapshotRequest(peer, node._term))


def on_ack_in_snapshot(node: RaftNode, peer: str, pr: _Progress) -> None:
    """An answer from a follower in the SNAPSHOT state (its match is up to date): back to
    probing once it can continue from what the log holds, else ask for a snapshot again when
    none is in flight."""
    if pr.match + 1 >= node._log.first_index():
        pr.become_probe(pr.match + 1)
        pr.snapshot_inflight = False
        node._send_append(peer)
    elif not pr.snapshot_inflight:
        request_snapshot(node, peer, pr)


def report_snapshot(node: RaftNode, peer: str, ok: bool, index: int) -> None:
    """The driver's transfer to ``peer`` of a snapshot at ``index`` ended: ``ok`` when the
    follower got the data and its InstallSnapshot. Then probe from the snapshot on (as etcd
    does): the follower's answer says where it really is. A failure lets its next answer ask
    for a snapshot again."""
    from dledger.core.raft import ProgressState, Role

    if node._role is not Role.LEADER:
        return
    pr = node._progress.get(peer)
    if pr is None or pr.state is not ProgressState.SNAPSHOT:
        return
    pr.snapshot_inflight = False
    if ok and 0 < index <= node._log.last_index():
        node._snapshots_sent += 1
        pr.become_probe(max(pr.match, index) + 1)
        node._send_append(peer)


def heartbeat_prev(node: RaftNode, pr: _Progress) -> int:
    """The ``prev_log_index`` of a heartbeat: the follower's match, or 0 (known to match
    everywhere) when retention deleted the entry at the match."""
    return pr.match if pr.match >= node._log.first_index() - 1 else 0


# ---------------------------------------------------------------------- follower side


def handle_install(node: RaftNode, m: InstallSnapshot) -> None:
    """A snapshot transferred by this term's leader (step() checked sender and term)."""
    node._become_follower_of(m.from_id)
    meta = m.meta
    # A repairing node's application may have applied beyond its log (and its commit).
    stale = meta.index <= max(node._commit, node._applied)
    if stale and "snapshot_out_of_order" not in node._mut:
        # Applied state already covers it (or more): installing it would roll back.
        node._reply_append_ok(m.from_id, node._commit)
        return
    if not stale and _log_holds(node, meta):
        # The entries are here: commit up to them, apply them as usual.
        node._commit = meta.index
        node._reply_append_ok(m.from_id, meta.index)
        return
    logger.info(
        "node=%s term=%d accept_snapshot from=%s index=%d snapshot_term=%d",
        node.id,
        node._term,
        m.from_id,
        meta.index,
        meta.term,
    )
    node._log.restore(meta)
    node._adopt_snapshot_conf(meta.config)
    if stale:
        # MUTATION snapshot_out_of_order: an older snapshot replaces newer applied state.
        node._applied = min(node._applied, meta.index)
    node._commit = meta.index
    node._handed = meta.index
    node._reply_append_ok(m.from_id, meta.index)


def _log_holds(node: RaftNode, meta: SnapshotMeta) -> bool:
    log = node._log
    if not log.first_index() - 1 <= meta.index <= log.last_index():
        return False
    return log.term_at(meta.index) == meta.term and agree(log.chain_at(meta.index), meta.chain)


def heartbeat(node: RaftNode, peer: str, pr: _Progress, *, no_reply: bool) -> AppendRequest:
    """A heartbeat for ``peer``: an empty append whose prev is known to match."""
    prev = heartbeat_prev(node, pr)
    return AppendRequest(
        node.id,
        peer,
        node._term,
        prev_log_index=prev,
        prev_log_term=node._log.term_at(prev),
        entries=(),
        leader_commit=node._commit,
        no_reply=no_reply,
        prev_log_chain=node._log.chain_at(prev),
    )
