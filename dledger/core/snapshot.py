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

import enum
from collections.abc import Hashable
from dataclasses import dataclass
from typing import TYPE_CHECKING

from dledger.chain import CHAIN_MAX, agree
from dledger.core.config import MAX_INDEX

if TYPE_CHECKING:
    from dledger.core.raftlog import RaftLog

__all__ = [
    "InstallAction",
    "InstallSnapshot",
    "SnapshotMeta",
    "SnapshotRequest",
    "heartbeat_prev",
    "install_action",
    "malformed",
    "needs_snapshot",
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


def needs_snapshot(first_index: int, next_index: int) -> bool:
    """Whether a follower whose next entry is ``next_index`` can only be caught up by a
    snapshot: retention deleted that entry (the log now starts at ``first_index``)."""
    return next_index < first_index


def heartbeat_prev(first_index: int, match: int) -> int:
    """The ``prev_log_index`` of a heartbeat to a follower at ``match``: its match, or 0
    (known to match everywhere) when retention deleted the entry at the match."""
    return match if match >= first_index - 1 else 0


# ---------------------------------------------------------------------- follower side


class InstallAction(enum.Enum):
    """What a follower does with an InstallSnapshot of this term's leader."""

    ANSWER = "answer"  # applied state covers it already: answer with the commit index
    COMMIT = "commit"  # the log holds the snapshot's last entry: only the commit index moves
    RESTORE = "restore"  # the log is replaced by the snapshot


def install_action(
    log: RaftLog, meta: SnapshotMeta, commit: int, applied: int, *, out_of_order: bool
) -> InstallAction:
    """The follower's decision for ``meta`` at commit index ``commit`` and applied index
    ``applied`` (a repairing node's application may have applied beyond its log and commit).
    ``out_of_order``: the test-only mutation ``snapshot_out_of_order`` (a stale snapshot is
    installed, rolling applied state back)."""
    stale = meta.index <= max(commit, applied)
    if stale:
        return InstallAction.RESTORE if out_of_order else InstallAction.ANSWER
    if _log_holds(log, meta):
        return InstallAction.COMMIT
    return InstallAction.RESTORE


def _log_holds(log: RaftLog, meta: SnapshotMeta) -> bool:
    if not log.first_index() - 1 <= meta.index <= log.last_index():
        return False
    return log.term_at(meta.index) == meta.term and agree(log.chain_at(meta.index), meta.chain)
