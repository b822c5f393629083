"""What the broker needs of its Raft member: the one interface between ``broker`` and ``dledger``.

Every broker module that talks to the node (the components, the front ends, the error mapping,
the process wiring) takes a :class:`RaftNode` and uses only the members below; none of them
imports ``dledger.server.node.DLedgerNode``, which only the composition root
(:mod:`broker.app`) names and builds (``tests/unit/test_broker_raftnode.py`` checks both
rules; mypy checks that ``DLedgerNode`` has every member with the right type). A test or a
tool may stand in for the node with any object of these members (``tests/broker_world.py``).

This is the broker's view of a running member, the way nats-server's ``RaftNode`` interface is
its streams' view of their Raft group. It is not ``dledger.core.raft.RaftNode``, the pure Raft
core the node drives.

Reads (role, term, leader, last index) are the node's current values: they change as the
group elects, so a caller reads them again rather than keeping them. ``store`` may be replaced
by a snapshot install: read it on each use too.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any, Protocol

from dledger.core import Role
from dledger.log import Entry

__all__ = ["LogStore", "RaftNode"]


class LogStore(Protocol):
    """What the broker reads of the member's log store (``dledger.storage.SegmentedLogStore``).
    Positions are byte offsets into the concatenated entry bodies (a message's commitlog
    position); indexes are Raft log indexes."""

    @property
    def write_position(self) -> int:
        """The position one past the last body byte stored (how far a reader is behind the
        writer: the pull path's follower hint)."""
        ...

    def first_index(self) -> int:
        """The oldest index still stored (retention deletes older segments)."""
        ...

    def last_index(self) -> int:
        """The newest index stored."""
        ...

    def body_position(self, index: int) -> int:
        """The position of the first body byte of entry ``index``."""
        ...

    def read(self, index: int) -> Entry:
        """Entry ``index``, checked (``IndexOutOfRangeError`` outside the stored range)."""
        ...

    def read_at(self, position: int, size: int) -> bytes:
        """``size`` body bytes from ``position`` (``IndexOutOfRangeError`` outside the stored
        bodies)."""
        ...


class RaftNode(Protocol):
    """The broker's contract with its Raft member (``dledger.server.node.DLedgerNode``)."""

    # ------------------------------------------------------------------ identity and role

    @property
    def self_id(self) -> str:
        """This member's id in its group (``dLegerSelfId``): logs and pull answers name it."""
        ...

    @property
    def role(self) -> Role:
        """LEADER, CANDIDATE or FOLLOWER now. Writes are proposed on the leader only; the
        leader-only jobs run while it is LEADER in the term they started in."""
        ...

    @property
    def term(self) -> int:
        """The current Raft term (a leader's jobs stop when it changes)."""
        ...

    @property
    def leader_id(self) -> str | None:
        """The leader this member knows of in the current term (None: none known)."""
        ...

    def leader_client_addr(self) -> tuple[str | None, str]:
        """(leader id, its client-port address ``host:port``; "" when no leader is known or
        it has no address): where a NOT_LEADER answer and a forward send the caller."""
        ...

    @property
    def last_index(self) -> int:
        """The last index of this member's log, stored or not yet stored: a new leader's first
        entry of its term (its no-op) is at or before the value read right after it won."""
        ...

    def feature_level(self) -> int:
        """The group's committed feature level as this member applied it (docs/RAFT.md
        "Feature level"): a record type or version, or a file format, that
        broker/state/features.py gates is proposed or written only at or above its level."""
        ...

    # ------------------------------------------------------------------ limits

    @property
    def max_body_bytes(self) -> int:
        """The largest entry body the log stores (``maxBodyBytes`` of the store): a proposal
        with a bigger body is refused, so callers check before they encode."""
        ...

    @property
    def append_timeout_ms(self) -> int:
        """How long :meth:`propose` waits for commit and apply before TimeoutError (the
        NO_QUORUM answer's retry hint)."""
        ...

    # ------------------------------------------------------------------ writes and reads

    async def propose(
        self, bodies: Sequence[bytes], entry_type: int, *, headroom_bytes: int = 0
    ) -> tuple[int, int, int]:
        """Append ``bodies`` as entries of ``entry_type`` on the leader and wait until they
        are committed and applied here; returns (first index, last index, term). Raises
        ``NotLeaderError`` off the leader, ``DiskFullError`` when the log has no room for them
        beyond its Raft reserve and ``headroom_bytes`` more, ``BackPressureError``,
        ``ProposalLostError`` (leadership lost: outcome unknown) or TimeoutError after
        :attr:`append_timeout_ms`."""
        ...

    def set_readers_waiting(self, waiting: bool) -> None:
        """Whether readers (long polls) wait for this member's next apply: while they do, a
        follower asks its leader for each commit notice without the linger, so a poll it holds
        is answered soon after the send's acknowledgement (docs/RAFT.md section 4). Only the
        timing of commit notices changes."""
        ...

    @property
    def store(self) -> LogStore:
        """The log store, once :meth:`start` opened it (replaced when a snapshot is
        installed: read it on each use)."""
        ...

    def suspect_damage(self, position: int, found_by: str = "read") -> None:
        """The broker read bad bytes at body ``position`` (a message whose CRC failed): the
        member checks the entry holding it in the background and repairs or restarts."""
        ...

    def retune(self, **changes: Any) -> None:
        """Change the member's live settings (``retention_early_used_percent``,
        ``scrub_bytes_per_s``) while it runs: the broker's live config, applied on every
        member at the same index; a ConfigError (dledger.log) leaves them as they were."""
        ...

    # ------------------------------------------------------------------ process lifecycle

    async def start(self) -> None:
        """Open the store, bind the peer and client ports and run (``StartError`` when it
        cannot): the process wiring only (``broker.__main__``)."""
        ...

    async def stop(self) -> None:
        """Stop serving and close the store cleanly; nothing is applied after it returns."""
        ...

    @property
    def removed_listeners(self) -> list[Callable[[], None]]:
        """Called once when a committed configuration removes this member from its group
        (append a listener before :meth:`start`)."""
        ...
