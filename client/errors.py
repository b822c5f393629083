"""The client's one exception type, carrying the broker's or NameServer's structured error.

A raftmq server attaches a ``raftmq.common.v1.ErrorInfo`` to every failure it answers (in the
``grpc-status-details-bin`` trailer, inside a ``google.rpc.Status``): the stable code, the
leader's id and address on ``NOT_LEADER``, whether a retry may succeed and after how long, and
whether a failed write's outcome is unknown. :meth:`MQClientError.from_rpc` reads those fields;
only for a server that sends none does it take the code from the start of the text detail.
"""

from __future__ import annotations

from typing import Any

import grpc
from google.rpc import status_pb2
from raftmq.common.v1 import error_pb2

from mqerrors import table
from rpckit.tlsdiag import tls_diagnosis

# gRPC's standard trailer for a google.rpc.Status.
DETAILS_KEY = "grpc-status-details-bin"
# gRPC statuses a call can end with before any server answered (deadline, unreachable node,
# server overloaded): another attempt may succeed, with no hint from a server.
TRANSPORT_RETRYABLE_STATUSES = frozenset(
    {
        grpc.StatusCode.UNAVAILABLE.name,
        grpc.StatusCode.DEADLINE_EXCEEDED.name,
        grpc.StatusCode.RESOURCE_EXHAUSTED.name,
    }
)
# gRPC's own failures (no ErrorInfo) after which the request may still have been carried out:
# it may have reached the server before the deadline passed or the connection broke, and gRPC
# cannot tell. A write so failed has an unknown outcome.
UNKNOWN_OUTCOME_STATUSES = frozenset(
    {
        grpc.StatusCode.DEADLINE_EXCEEDED.name,
        grpc.StatusCode.UNAVAILABLE.name,
        grpc.StatusCode.CANCELLED.name,
        grpc.StatusCode.UNKNOWN.name,
        grpc.StatusCode.INTERNAL.name,
    }
)
# gRPC statuses a call ends with when the node itself is gone or cut off (no ErrorInfo): the
# group may have another leader by now.
UNREACHABLE_STATUSES = frozenset(
    {grpc.StatusCode.UNAVAILABLE.name, grpc.StatusCode.DEADLINE_EXCEEDED.name}
)
# Codes saying that the node answered is not the group's leader, or may no longer be: a
# redirect, no leader known, a transfer or an election under way, a leader cut off from its
# majority (the error table's retry "leader"). Another node of the group may do better. Every
# other retryable answer is a leader speaking of itself (a full disk, back pressure, a full
# table): it is still the leader, and its followers would only redirect back to it.
LEADER_MOVED_CODES = table.codes(retry=table.Retry.LEADER)
# Codes no retry within the same broker group cures soon (the table's retry "other_group"):
# the leader's disk stays above its mark until retention deletes segments or an operator frees
# space (minutes, not the milliseconds of a send timeout). A send so answered fails at once, or
# is retried only on another broker group serving the topic (another disk).
GROUP_REFUSES_WRITES_CODES = table.codes(retry=table.Retry.OTHER_GROUP)


class MQClientError(Exception):
    """A failed client call: ``code`` is the stable code (``NOT_LEADER``, ``TOPIC_NOT_FOUND``,
    ``NO_ROUTE``, ...), ``status`` the gRPC status name, ``message`` the full text detail.

    ``leader_id`` / ``leader_addr``: the leader a ``NOT_LEADER`` answer named ("" when none);
    ``retryable``: another attempt (same message ids) may succeed; ``retry_after_ms``: wait at
    least this long first (0: no hint); ``outcome_unknown``: a write that may have happened
    (the server said so, gRPC failed on its own with a status in
    :data:`UNKNOWN_OUTCOME_STATUSES`, or an earlier attempt of the same call did either: a
    client that retried raises its last error with this set if any attempt's was).
    ``structured`` tells whether the fields came from the server's ErrorInfo."""

    def __init__(
        self,
        code: str,
        status: str,
        message: str,
        *,
        leader_id: str = "",
        leader_addr: str = "",
        retryable: bool = False,
        retry_after_ms: int = 0,
        outcome_unknown: bool = False,
        structured: bool = False,
    ) -> None:
        super().__init__(f"{code} ({status}): {message}")
        self.code = code
        self.status = status
        self.message = message
        self.leader_id = leader_id
        self.leader_addr = leader_addr
        self.retryable = retryable
        self.retry_after_ms = retry_after_ms
        self.outcome_unknown = outcome_unknown
        self.structured = structured

    def marked_unknown(self, unknown: bool) -> MQClientError:
        """This error, or, when ``unknown`` (an earlier attempt of the same write may have
        been carried out) and it does not say so yet, a copy with ``outcome_unknown`` set. A
        copy, because one error object may be handed to every send of a coalesced call."""
        if not unknown or self.outcome_unknown:
            return self
        twin = MQClientError(
            self.code,
            self.status,
            self.message,
            leader_id=self.leader_id,
            leader_addr=self.leader_addr,
            retryable=self.retryable,
            retry_after_ms=self.retry_after_ms,
            outcome_unknown=True,
            structured=self.structured,
        )
        twin.__cause__ = self
        return twin

    @property
    def leader_moved(self) -> bool:
        """The node answered is not (or may no longer be) its group's leader, or never
        answered: another node of the group may take the call (:data:`LEADER_MOVED_CODES`)."""
        if self.code in LEADER_MOVED_CODES:
            return True
        return not self.structured and self.status in UNREACHABLE_STATUSES

    @property
    def group_refuses_writes(self) -> bool:
        """The group's leader refuses writes for longer than a send waits (a full disk): no
        node of the group and no retry soon will take them (:data:`GROUP_REFUSES_WRITES_CODES`)."""
        return self.code in GROUP_REFUSES_WRITES_CODES

    @classmethod
    def local(cls, code: str, message: str) -> MQClientError:
        """An error the client finds itself (no server answered it), with the gRPC status
        the error table gives ``code``, so that a code means one status wherever it is
        raised."""
        row = table.spec(code)
        assert row is not None, f"{code} is not in mqerrors/errors.json"
        return cls(code, row.grpc_status, message, retryable=row.retryable)

    @classmethod
    def from_rpc(cls, exc: grpc.RpcError) -> MQClientError:
        code_fn = getattr(exc, "code", None)
        status = code_fn() if callable(code_fn) else None
        status_name = status.name if isinstance(status, grpc.StatusCode) else "UNKNOWN"
        details_fn = getattr(exc, "details", None)
        details = (details_fn() if callable(details_fn) else str(exc)) or ""
        info = error_info(exc)
        diagnosis = tls_diagnosis(details) if info is None else None
        if diagnosis is not None:
            code, message = diagnosis
            row = table.spec(code)
            assert row is not None, code
            # The connection never carried the request: its outcome is known (not done).
            return cls(code, status_name, message, retryable=row.retryable)
        if info is None:
            # A server without the structured error, or gRPC's own failure (deadline,
            # unreachable): the code from the text, retryable by the transport status.
            return cls(
                _code_of_text(details) or status_name,
                status_name,
                details,
                retryable=status_name in TRANSPORT_RETRYABLE_STATUSES,
                outcome_unknown=status_name in UNKNOWN_OUTCOME_STATUSES,
            )
        return cls(
            info.code or status_name,
            status_name,
            details,
            leader_id=info.leader_id,
            leader_addr=info.leader_addr,
            retryable=info.retryable,
            retry_after_ms=info.retry_after_ms,
            outcome_unknown=info.outcome_unknown,
            structured=True,
        )


def error_info(exc: grpc.RpcError) -> error_pb2.ErrorInfo | None:
    """The ErrorInfo in a failed call's trailers, or None when it carries none (or a damaged
    one). Works for sync calls (``grpc.Call``) and aio calls (``AioRpcError``) alike."""
    trailing = getattr(exc, "trailing_metadata", None)
    trailers: Any = trailing() if callable(trailing) else None
    for key, value in trailers or ():
        if key != DETAILS_KEY or not isinstance(value, bytes):
            continue
        try:
            status = status_pb2.Status.FromString(value)
        except Exception:  # a damaged trailer is no details, not a crash
            return None
        for detail in status.details:
            info = error_pb2.ErrorInfo()
            if detail.Unpack(info):
                return info
    return None


def _code_of_text(detail: str) -> str:
    """``NOT_LEADER leader=...`` -> ``NOT_LEADER``; "" when the text starts with no code."""
    head = detail.split(" ", 1)[0]
    letters = head.replace("_", "")
    if len(head) < 3 or not letters.isascii() or not letters.isalnum():
        return ""
    return head if head.isupper() else ""
