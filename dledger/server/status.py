"""The error contract of every raftmq gRPC server: a failure is a gRPC status, a text detail
starting with a stable code, and a structured ``raftmq.common.v1.ErrorInfo``.

The ``ErrorInfo`` travels the standard way, so any gRPC client in any language can read it:
the trailer ``grpc-status-details-bin`` holds a ``google.rpc.Status`` whose ``details`` hold
the ``ErrorInfo`` (packed in an ``Any``). The text detail (``CODE ...``) stays for grpcurl
users and for clients of servers older than the contract.

Servers build an :class:`RpcFailure` in one place each (this module maps dledger's own errors:
:func:`dledger_failure`; the broker and NameServer map theirs on top) and end the call with
:func:`abort`. Details never echo a request beyond the callers' own bounded ``_echo``s, and
are cut to :data:`MAX_DETAIL_BYTES` whatever they hold. :func:`read_error` is the reading side
for the Python callers inside this repository that speak to a node (dledger's own client,
the broker demo, tests).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import NoReturn, Protocol

import grpc
from google.protobuf.message import DecodeError
from google.rpc import status_pb2
from grpc_status import rpc_status
from raftmq.common.v1 import error_pb2

from dledger.core import (
    BackPressureError,
    ConfChangeError,
    ConfChangePendingError,
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

# Bytes of a text detail at most: gRPC carries it in a header (twice: as grpc-message and in
# the status details), and clients choke on large ones. Every detail is built far below this;
# the cut is the last line of defence.
MAX_DETAIL_BYTES = 1000
# Retry hints (ErrorInfo.retry_after_ms). No leader known: about one heartbeat, by which an
# election under way has usually produced one (and what the clients waited before the hint).
NO_LEADER_RETRY_AFTER_MS = 100
# A leadership transfer lasts at most a few election timeouts; a lost proposal or one that
# missed its quorum waits for the next leader or the partition to heal.
TRANSFER_RETRY_AFTER_MS = 100
UNAVAILABLE_RETRY_AFTER_MS = 100
# A membership change waits for the one in flight to commit (a round trip), for a new
# leader's first commit, or for a learner to catch up: a few heartbeats.
MEMBERSHIP_RETRY_AFTER_MS = 200
# Uncommitted bytes drain as soon as a majority's fsync returns: a few group commits.
BACK_PRESSURE_RETRY_AFTER_MS = 50
# A full disk frees only when retention deletes segments or an operator acts: do not hammer.
DISK_FULL_RETRY_AFTER_MS = 1000
# A damaged member restarts and repairs from its leader: a few seconds.
DAMAGE_RETRY_AFTER_MS = 1000
# Where the ErrorInfo travels (gRPC's standard trailer for google.rpc.Status).
DETAILS_KEY = "grpc-status-details-bin"


@dataclass(frozen=True, slots=True)
class RpcFailure:
    """What a failed call answers: ``status`` and the fields of ``ErrorInfo``; ``text`` is
    the human part of the detail after ``code``."""

    status: grpc.StatusCode
    code: str
    text: str = ""
    leader_id: str = ""
    leader_addr: str = ""
    retryable: bool = False
    retry_after_ms: int = 0
    outcome_unknown: bool = False

    @property
    def detail(self) -> str:
        """``CODE text``, at most :data:`MAX_DETAIL_BYTES` of UTF-8."""
        return bound_detail(f"{self.code} {self.text}" if self.text else self.code)

    def info(self) -> error_pb2.ErrorInfo:
        return error_pb2.ErrorInfo(
            code=self.code,
            leader_id=self.leader_id,
            leader_addr=self.leader_addr,
            retryable=self.retryable,
            retry_after_ms=self.retry_after_ms,
            outcome_unknown=self.outcome_unknown,
        )

    def grpc_status(self) -> grpc.Status:
        """The status with its details trailer, as ``context.abort`` takes it."""
        status = status_pb2.Status(code=self.status.value[0], message=self.detail)
        status.details.add().Pack(self.info())
        converted: grpc.Status = rpc_status.to_status(status)
        return converted


def bound_detail(detail: str) -> str:
    """``detail`` cut to :data:`MAX_DETAIL_BYTES` bytes of UTF-8 (the code at its start stays)."""
    if len(detail) * 4 <= MAX_DETAIL_BYTES:  # nearly always: no encoding needed
        return detail
    raw = detail.encode("utf-8", "replace")
    if len(raw) <= MAX_DETAIL_BYTES:
        return raw.decode("utf-8")
    return raw[: MAX_DETAIL_BYTES - 3].decode("utf-8", "ignore") + "..."


async def abort(context: grpc.aio.ServicerContext, failure: RpcFailure) -> NoReturn:
    """End a grpc.aio call with ``failure`` (status, text detail and ErrorInfo)."""
    status = failure.grpc_status()
    await context.abort(status.code, status.details, status.trailing_metadata)
    raise AssertionError("context.abort returned")  # pragma: no cover - abort raises


def abort_sync(context: grpc.ServicerContext, failure: RpcFailure) -> NoReturn:
    """End a threaded server's call with ``failure`` (what ``abort_with_status`` does)."""
    status = failure.grpc_status()
    context.set_trailing_metadata(status.trailing_metadata)
    context.abort(status.code, status.details)
    raise AssertionError("context.abort returned")  # pragma: no cover - abort raises


def not_leader(leader_id: str | None, leader_addr: str) -> RpcFailure:
    """``NOT_LEADER leader=ID addr=HOST:PORT``: the redirect every node and broker sends."""
    return RpcFailure(
        grpc.StatusCode.FAILED_PRECONDITION,
        E.NOT_LEADER,
        f"leader={leader_id or ''} addr={leader_addr}",
        leader_id=leader_id or "",
        leader_addr=leader_addr,
        retryable=True,
        retry_after_ms=0 if leader_addr else NO_LEADER_RETRY_AFTER_MS,
    )


def no_quorum(append_timeout_ms: int) -> RpcFailure:
    return RpcFailure(
        grpc.StatusCode.UNAVAILABLE,
        E.NO_QUORUM,
        f"not committed within {append_timeout_ms} ms; outcome unknown",
        retryable=True,
        retry_after_ms=UNAVAILABLE_RETRY_AFTER_MS,
        outcome_unknown=True,
    )


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


def code_of_text(detail: str) -> str:
    """The code at the start of a text detail (``NOT_LEADER leader=...`` -> ``NOT_LEADER``), or
    "" when it starts with none: only for servers that send no structured details."""
    head = detail.split(" ", 1)[0]
    plain = head.replace("_", "")
    return head if len(head) >= 3 and plain.isalnum() and plain.isascii() and head.isupper() else ""


def read_error(exc: grpc.RpcError) -> error_pb2.ErrorInfo | None:
    """The ErrorInfo a raftmq server attached to a failed call, or None: a server without the
    contract, a failure gRPC itself made (deadline, unreachable node), or a status trailer that
    does not match the call's status and text (damaged on the way). For the tools inside this
    repository; applications read it with ``client.errors.MQClientError.from_rpc``."""
    try:
        rich = rpc_status.from_call(exc)  # aio errors have the same three methods as a Call
    except (ValueError, DecodeError):
        return None
    info = error_pb2.ErrorInfo()
    if rich is None or not any(d.Unpack(info) for d in rich.details):
        return None
    return info
