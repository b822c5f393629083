"""The broker's one mapping from exceptions to failed calls (``raftmq.broker.v1`` and any
other front end): a gRPC status, a text detail starting with the error's stable code, and the
structured ``raftmq.common.v1.ErrorInfo`` in the status details (:mod:`rpckit.status`).

dledger's errors (NOT_LEADER with the leader's id and address, BACK_PRESSURE and DISK_FULL with
a retry hint, NO_QUORUM and LEADERSHIP_LOST as outcome unknown, ...) are mapped by dledger's own
table, the same one its log client service uses; the broker's errors by the table below.
"""

from __future__ import annotations

import asyncio
import functools
import logging
from collections.abc import Awaitable, Callable, Mapping
from typing import Any, Protocol, TypeVar

import grpc

from broker.components.authadmin import AclNotFoundError, AlreadyExistsError, UserNotFoundError
from broker.components.raftnode import RaftNode
from broker.components.subscriptions import SubGroupNotFoundError
from broker.state.errors import (
    BrokerError,
    CorruptMessageError,
    CorruptStoreError,
    DerivedStateError,
    FeatureLevelTooLowError,
    InvalidMessageError,
    InvalidMessageIdError,
    InvalidRequestError,
    MessageNotFoundError,
    NoPermissionError,
    OffsetOutOfRangeError,
    ResourceExhaustedError,
    TopicNotFoundError,
)
from dledger.server import errormap
from mqerrors import codes as E
from rpckit import status
from rpckit.status import RpcFailure, bound_detail

logger = logging.getLogger(__name__)

# A full broker table (consumers, locks, long polls, pending offsets) frees as clients leave,
# locks expire or offsets commit: retry after about a second, not at once.
RESOURCE_EXHAUSTED_RETRY_AFTER_MS = 1000

_STATUS_BY_CLASS: Mapping[type[BrokerError], grpc.StatusCode] = {
    TopicNotFoundError: grpc.StatusCode.NOT_FOUND,
    UserNotFoundError: grpc.StatusCode.NOT_FOUND,
    AclNotFoundError: grpc.StatusCode.NOT_FOUND,
    SubGroupNotFoundError: grpc.StatusCode.NOT_FOUND,
    AlreadyExistsError: grpc.StatusCode.ALREADY_EXISTS,
    MessageNotFoundError: grpc.StatusCode.NOT_FOUND,
    NoPermissionError: grpc.StatusCode.PERMISSION_DENIED,
    InvalidMessageError: grpc.StatusCode.INVALID_ARGUMENT,
    InvalidMessageIdError: grpc.StatusCode.INVALID_ARGUMENT,
    InvalidRequestError: grpc.StatusCode.INVALID_ARGUMENT,
    FeatureLevelTooLowError: grpc.StatusCode.FAILED_PRECONDITION,
    OffsetOutOfRangeError: grpc.StatusCode.OUT_OF_RANGE,
    CorruptMessageError: grpc.StatusCode.DATA_LOSS,
    CorruptStoreError: grpc.StatusCode.DATA_LOSS,
}

__all__ = ["bound_detail", "error_failure", "error_status", "rpc"]


def error_failure(exc: BaseException, node: RaftNode) -> RpcFailure:
    """The one place where an exception of a broker call becomes its failure."""
    failure = errormap.dledger_failure(exc, node)
    if failure is not None:
        return failure
    if isinstance(exc, ResourceExhaustedError):
        return RpcFailure(
            grpc.StatusCode.RESOURCE_EXHAUSTED,
            exc.code,
            str(exc),
            retryable=True,
            retry_after_ms=RESOURCE_EXHAUSTED_RETRY_AFTER_MS,
        )
    if isinstance(exc, DerivedStateError):
        return RpcFailure(
            grpc.StatusCode.UNAVAILABLE,
            exc.code,
            str(exc),
            retryable=True,
            retry_after_ms=RESOURCE_EXHAUSTED_RETRY_AFTER_MS,
        )
    if isinstance(exc, BrokerError):
        for cls in type(exc).__mro__:
            code = _STATUS_BY_CLASS.get(cls)
            if code is not None:
                return RpcFailure(code, exc.code, str(exc))
        return RpcFailure(grpc.StatusCode.INTERNAL, exc.code, str(exc))
    return RpcFailure(grpc.StatusCode.INTERNAL, E.INTERNAL, f"{type(exc).__name__}: {exc}")


def error_status(exc: BaseException, node: RaftNode) -> tuple[grpc.StatusCode, str]:
    """The status and text detail (``CODE ...``, at most ``MAX_DETAIL_BYTES`` of UTF-8) of
    :func:`error_failure`, for callers that log or count them."""
    failure = error_failure(exc, node)
    return failure.status, failure.detail


class _Servicer(Protocol):
    node: RaftNode


_Req = TypeVar("_Req")
_Resp = TypeVar("_Resp")
_Handler = Callable[[Any, _Req, grpc.aio.ServicerContext], Awaitable[_Resp]]


def rpc(fn: _Handler[_Req, _Resp]) -> _Handler[_Req, _Resp]:
    """Decorate a servicer method (of an object with a ``node``): every exception it raises
    ends the call through :func:`error_failure`; an INTERNAL one is also logged."""

    @functools.wraps(fn)
    async def wrapper(self: _Servicer, request: _Req, context: grpc.aio.ServicerContext) -> _Resp:
        try:
            return await fn(self, request, context)
        except (asyncio.CancelledError, grpc.aio.AbortError):
            raise
        except Exception as exc:
            failure = error_failure(exc, self.node)
            if failure.status is grpc.StatusCode.INTERNAL:
                logger.exception("rpc=%s failed", fn.__name__)
            await status.abort(context, failure)

    return wrapper
