"""What a remoting request's failure is answered with: the one mapping from the broker's
exceptions to RocketMQ's response codes (docs/REMOTING.md, "Broker: errors").

The remark starts with the error contract's stable code (as every front end's error text does),
so a 4.x client's exception names it. The mapping goes through the broker's own
(:func:`broker.frontends.v1.rpcerrors.error_failure`): the same exception is the same failure on
every front end, only spelled in RocketMQ's numbers here.
"""

from __future__ import annotations

import grpc

from broker.components.raftnode import RaftNode
from broker.frontends.internal.forwarder import Failure
from broker.frontends.v1.rpcerrors import error_failure
from broker.state.errors import TopicNotFoundError
from mqerrors import codes as E
from remoting.codes import ResponseCode

# gRPC status of a failure -> RocketMQ's response code. A 4.x producer retries a send on
# SYSTEM_BUSY, SERVICE_NOT_AVAILABLE and SYSTEM_ERROR (another queue, maybe another broker);
# MESSAGE_ILLEGAL and NO_PERMISSION are final.
_BY_STATUS = {
    grpc.StatusCode.NOT_FOUND: ResponseCode.QUERY_NOT_FOUND,
    grpc.StatusCode.PERMISSION_DENIED: ResponseCode.NO_PERMISSION,
    grpc.StatusCode.UNAUTHENTICATED: ResponseCode.NO_PERMISSION,
    grpc.StatusCode.INVALID_ARGUMENT: ResponseCode.SYSTEM_ERROR,
    grpc.StatusCode.OUT_OF_RANGE: ResponseCode.SYSTEM_ERROR,
    grpc.StatusCode.RESOURCE_EXHAUSTED: ResponseCode.SYSTEM_BUSY,
    grpc.StatusCode.UNAVAILABLE: ResponseCode.SERVICE_NOT_AVAILABLE,
    grpc.StatusCode.FAILED_PRECONDITION: ResponseCode.SERVICE_NOT_AVAILABLE,
}
# The stable codes of a forwarded failure (which carries no status) that are not SYSTEM_ERROR.
_BY_CODE = {
    E.NOT_LEADER: ResponseCode.SERVICE_NOT_AVAILABLE,
    E.NO_LEADER: ResponseCode.SERVICE_NOT_AVAILABLE,
    E.UNAVAILABLE: ResponseCode.SERVICE_NOT_AVAILABLE,
    E.UNAUTHENTICATED: ResponseCode.NO_PERMISSION,
    E.PERMISSION_DENIED: ResponseCode.NO_PERMISSION,
}
# A send's invalid message is MESSAGE_ILLEGAL (final: the producer does not retry it).
SEND_INVALID = ResponseCode.MESSAGE_ILLEGAL


def failure_answer(exc: Exception, node: RaftNode, sending: bool = False) -> tuple[int, str]:
    """The response code and remark of ``exc``; ``sending``: the request was a send."""
    if isinstance(exc, Failure):  # a leader operation's, possibly forwarded
        code = _BY_CODE.get(exc.code, ResponseCode.SYSTEM_ERROR)
        if exc.retryable and code == ResponseCode.SYSTEM_ERROR:
            code = ResponseCode.SYSTEM_BUSY
        if sending and exc.code.startswith(("INVALID", "MESSAGE_", "PROPERTIES_")):
            code = SEND_INVALID
        if exc.code == E.TOPIC_NOT_FOUND:
            code = ResponseCode.TOPIC_NOT_EXIST
        return code, str(exc)
    failure = error_failure(exc, node)
    if isinstance(exc, TopicNotFoundError):
        return ResponseCode.TOPIC_NOT_EXIST, failure.detail
    code = _BY_STATUS.get(failure.status, ResponseCode.SYSTEM_ERROR)
    if sending and failure.status is grpc.StatusCode.INVALID_ARGUMENT:
        code = SEND_INVALID
    return code, failure.detail
