"""The error contract of every raftmq gRPC server: a failure is a gRPC status, a text detail
starting with a stable code, and a structured ``raftmq.common.v1.ErrorInfo``.

The ``ErrorInfo`` travels the standard way, so any gRPC client in any language can read it:
the trailer ``grpc-status-details-bin`` holds a ``google.rpc.Status`` whose ``details`` hold
the ``ErrorInfo`` (packed in an ``Any``). The text detail (``CODE ...``) stays for grpcurl
users and for clients of servers older than the contract.

Servers build an :class:`RpcFailure` in one place each (``dledger.server.errormap`` maps
dledger's own errors; the broker and NameServer map theirs on top) and end the call with
:func:`abort`. Details never echo a request beyond the callers' own bounded ``_echo``s, and
are cut to :data:`MAX_DETAIL_BYTES` whatever they hold. :func:`read_error` is the reading side
for the Python callers inside this repository that speak to a node (dledger's own client,
the broker demo, tests).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import NoReturn

import grpc
from google.protobuf.message import DecodeError
from google.rpc import status_pb2
from grpc_status import rpc_status
from raftmq.common.v1 import error_pb2

from mqerrors import codes as E

# Bytes of a text detail at most: gRPC carries it in a header (twice: as grpc-message and in
# the status details), and clients choke on large ones. Every detail is built far below this;
# the cut is the last line of defence.
MAX_DETAIL_BYTES = 1000
# Retry hints (ErrorInfo.retry_after_ms). No leader known: about one heartbeat, by which an
# election under way has usually produced one (and what the clients waited before the hint).
NO_LEADER_RETRY_AFTER_MS = 100
# A lost proposal or one that missed its quorum waits for the next leader or the partition to
# heal.
UNAVAILABLE_RETRY_AFTER_MS = 100
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
