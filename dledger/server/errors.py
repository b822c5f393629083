"""Errors of the node runtime (``dledger.server``); like every dledger error, each is a
:class:`~dledger.log.DLedgerError` with a stable ``code``."""

from __future__ import annotations

from dledger.log import DLedgerError
from mqerrors import codes as E


class StartError(DLedgerError):
    """The node cannot start (port in use, store locked or corrupt). One line, for the CLI."""

    code = E.START_FAILED


class ProposalLostError(DLedgerError):
    """A proposal's entries were replaced by a newer leader's, or leadership was lost before
    they committed: the outcome is unknown to this node (they may still commit elsewhere)."""

    code = E.PROPOSAL_LOST
