"""Errors raised by the Raft core. Every one has a stable, machine-readable ``code``."""

from __future__ import annotations

from dledger.log import ConfigError as ConfigError  # the package's one ConfigError
from dledger.log import DLedgerError
from mqerrors import codes as E


class UnknownPeerError(DLedgerError):
    """A node id that is not a member of this group."""

    code = E.UNKNOWN_PEER


class NotLeaderError(DLedgerError):
    """Only the leader accepts proposals and transfers; ``leader_id`` is a hint (or None)."""

    code = E.NOT_LEADER

    def __init__(self, message: str, *, leader_id: str | None) -> None:
        super().__init__(message)
        self.leader_id = leader_id


class ProposalDroppedError(DLedgerError):
    """The proposal was not appended (empty, too many entries, ...); nothing was changed."""

    code = E.PROPOSAL_DROPPED


class BackPressureError(ProposalDroppedError):
    """Too many uncommitted bytes are pending on the leader; retry after commits catch up."""

    code = E.BACK_PRESSURE


class ProposalTooLargeError(ProposalDroppedError):
    """The proposal can never be accepted, whatever the load: its bytes alone exceed the
    leader's back-pressure limit. Not retryable (unlike :class:`BackPressureError`)."""

    code = E.ENTRY_TOO_LARGE


class TransferInProgressError(DLedgerError):
    """A leadership transfer is under way: the leader takes no proposals until it ends."""

    code = E.TRANSFER_IN_PROGRESS
