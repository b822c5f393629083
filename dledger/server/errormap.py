"""Which RPC failure each of dledger's own errors becomes: the one table both the node's client
service and the broker use, on top of the error contract every server shares
(:mod:`rpckit.status`: the status, the text detail and the structured ``ErrorInfo``)."""

from __future__ import annotations

from typing import Protocol

import grpc

from dledger.core import (
    BackPressureError,
    ConfChangeError,
    ConfChangePendingError,
    FeatureLevelError,
    NotLeaderError,
    ProposalDroppedError,
    TransferInProgressError,
    UnknownPeerError,
)
from dledger.log import CorruptLogError, DLedgerError, LogCompactedError
from dledger.server.errors import ProposalLostError
from dledger.server.membership import IncompatibleStoreError
from dledger.storage import DiskFullError
from mqerrors import codes as E
from rpckit.status import UNAVAILABLE_RETRY_AFTER_MS, RpcFailure, no_quorum, not_leader

# Retry hints (ErrorInfo.retry_after_ms) of dledger's own errors. A leadership transfer lasts
# at most a few election timeouts.
TRANSFER_RETRY_AFTER_MS = 100
# A membership change waits for the one in flight to commit (a round trip), for a new
# leader's first commit, or for a learner to catch up: a few heartbeats.
MEMBERSHIP_RETRY_AFTER_MS = 200
# Uncommitted bytes drain as soon as a majority's fsync returns: a few group commits.
BACK_PRESSURE_RETRY_AFTER_MS = 50
# A full disk frees only when retention deletes segments or an operator acts: do not hammer.
DISK_FULL_RETRY_AFTER_MS = 1000
# A damaged member restarts and repairs from its leader: a few seconds.
DAMAGE_RETRY_AFTER_MS = 1000


class NodeView(Protocol):
    """What the mapping reads of a node (``DLedgerNode``), only for the errors that need it."""

    @property
    def append_timeout_ms(self) -> int: ...

    def leader_client_addr(self) -> tuple[str | None, str]: ...


def dledger_failure(exc: BaseException, node: NodeView) -> RpcFailure | None:
    """The failure for dledger's own errors (None for any other exception): the one table
    both the node's client service and the broker use. A NOT_LEADER names the client address
    of the leader ``node`` knows; a TimeoutError is an append that missed its quorum."""
    if isinstance(exc, NotLeaderError):
        return not_leader(exc.leader_id, node.leader_client_addr()[1])
    if isinstance(exc, TimeoutError):
        return no_quorum(node.append_timeout_ms)
    if not isinstance(exc, DLedgerError):
        return None
    retry = {
        TransferInProgressError: (grpc.StatusCode.UNAVAILABLE, TRANSFER_RETRY_AFTER_MS),
        ConfChangePendingError: (grpc.StatusCode.UNAVAILABLE, MEMBERSHIP_RETRY_AFTER_MS),
        BackPressureError: (grpc.StatusCode.RESOURCE_EXHAUSTED, BACK_PRESSURE_RETRY_AFTER_MS),
        DiskFullError: (grpc.StatusCode.RESOURCE_EXHAUSTED, DISK_FULL_RETRY_AFTER_MS),
    }.get(type(exc))
    if retry is not None:
        return RpcFailure(retry[0], exc.code, str(exc), retryable=True, retry_after_ms=retry[1])
    if isinstance(exc, CorruptLogError):
        return log_damaged(exc)
    if isinstance(exc, ProposalLostError):
        return RpcFailure(
            grpc.StatusCode.UNAVAILABLE,
            E.LEADERSHIP_LOST,
            str(exc),
            retryable=True,
            retry_after_ms=UNAVAILABLE_RETRY_AFTER_MS,
            outcome_unknown=True,
        )
    status = {
        ProposalDroppedError: grpc.StatusCode.INVALID_ARGUMENT,
        UnknownPeerError: grpc.StatusCode.INVALID_ARGUMENT,
        ConfChangeError: grpc.StatusCode.FAILED_PRECONDITION,
        FeatureLevelError: grpc.StatusCode.FAILED_PRECONDITION,
        IncompatibleStoreError: grpc.StatusCode.FAILED_PRECONDITION,
        LogCompactedError: grpc.StatusCode.OUT_OF_RANGE,
    }
    for cls, code in status.items():
        if isinstance(exc, cls):
            return RpcFailure(code, exc.code, str(exc))
    return RpcFailure(grpc.StatusCode.INTERNAL, exc.code, str(exc))


def log_damaged(exc: CorruptLogError) -> RpcFailure:
    """``DATA_LOSS LOG_DAMAGED index=N ...``: this member's copy of entry N failed its check
    (the node repairs it from the group: docs/STORAGE.md "Damage and repair"). Retryable: a
    read from another member, or from this one once repaired, gets the entry."""
    where = f"index={exc.index} " if exc.index else ""
    return RpcFailure(
        grpc.StatusCode.DATA_LOSS,
        E.LOG_DAMAGED,
        f"{where}this member's copy is damaged and being repaired from the group; "
        f"read from another member: {exc}",
        retryable=True,
        retry_after_ms=DAMAGE_RETRY_AFTER_MS,
    )
