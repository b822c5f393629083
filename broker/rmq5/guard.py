"""Users and permissions on the RocketMQ 5 port: the node's call guard, answered the v2 way.

The v2 port asks the same :class:`dledger.server.guard.CallGuard` as the node's client port
(:class:`broker.auth.guard.AuthGuard`: the RocketMQ 5 signature the official clients send, the
replicated user table, the rows of :mod:`broker.auth.rpcmap` for
``apache.rocketmq.v2.MessagingService``). What differs is the refusal: RocketMQ 5 clients read
the outcome from the body's ``Status``, so a refused call is answered with the method's own
response type carrying ``UNAUTHORIZED`` (unknown caller, bad or missing signature) or
``FORBIDDEN`` (a known user without the permission) and the guard's reason; a streaming call
gets one such message and ends. Every response of the service has a ``Status``, so no refusal
needs a bare gRPC status. The guard counts each refusal in ``REFUSALS``.

An admitted call's signature entries are kept for the call (:func:`caller_signature`): the
front end forwards leader-only work with them (:mod:`broker.rmq5.leader`), so the leader checks
the original user again (docs/SECURITY.md, "RocketMQ 5 clients").
"""

from __future__ import annotations

import contextvars
import inspect
from collections.abc import Awaitable, Callable
from typing import Any

import grpc

from broker.rmq5 import stubs
from dledger.server.guard import OPEN_SERVICES, CallGuard, Refusal, service_of, text_metadata
from mqsecurity.signing import AUTHORIZATION_HEADER, DATE_TIME_HEADER

_, v2_service, _ = stubs.load()

SERVICE = v2_service.DESCRIPTOR.services_by_name["MessagingService"]
# method path -> the response type whose ``status`` carries a refusal.
RESPONSES: dict[str, Any] = {
    f"/{SERVICE.full_name}/{m.name}": getattr(v2_service, m.output_type.name)
    for m in SERVICE.methods
}
# The metadata entries that make up a caller's signature (mqsecurity.signing).
SIGNATURE_HEADERS = (DATE_TIME_HEADER, AUTHORIZATION_HEADER)
# Characters of the reason a refusal's Status carries (the guard's reasons are one line).
MAX_REASON_CHARS = 512

_caller: contextvars.ContextVar[tuple[tuple[str, str], ...]] = contextvars.ContextVar(
    "rmq5_caller_signature", default=()
)


def caller_signature() -> tuple[tuple[str, str], ...]:
    """The signature entries of the v2 call being served (empty: an unsigned call, or none)."""
    return _caller.get()


def refusal_response(method: str, refusal: Refusal) -> Any:
    """The method's response with the refusal in its Status."""
    code = "FORBIDDEN" if refusal.authenticated else "UNAUTHORIZED"
    definition, _, _ = stubs.load()
    text = f"{refusal.code} {refusal.reason}"[:MAX_REASON_CHARS]
    return RESPONSES[method](
        status=definition.Status(code=definition.Code.Value(code), message=text)
    )


class V2GuardInterceptor(grpc.aio.ServerInterceptor):  # type: ignore[misc]
    """Asks ``guard`` about every v2 call before the servicer runs (health and reflection are
    open, as on the node's client port)."""

    def __init__(self, guard: CallGuard) -> None:
        self.guard = guard

    async def intercept_service(
        self,
        continuation: Callable[[grpc.HandlerCallDetails], Awaitable[grpc.RpcMethodHandler]],
        details: grpc.HandlerCallDetails,
    ) -> grpc.RpcMethodHandler:
        handler = await continuation(details)
        if handler is None or service_of(details.method) in OPEN_SERVICES:
            return handler
        if details.method not in RESPONSES:
            return handler
        return _guarded(handler, details.method, self.guard)


def _admit(
    guard: CallGuard, method: str, context: grpc.aio.ServicerContext, request: object
) -> Any | None:
    """None when the call may run (its signature then kept for it), else the refusal's
    response."""
    metadata = text_metadata(context.invocation_metadata())
    refusal = guard.check(method, metadata, context.peer(), request)
    if refusal is not None:
        return refusal_response(method, refusal)
    _caller.set(tuple((k, metadata[k]) for k in SIGNATURE_HEADERS if k in metadata))
    return None


def _guarded(handler: grpc.RpcMethodHandler, method: str, guard: CallGuard) -> Any:
    """The same handler with ``guard`` asked first (unary requests: with the request)."""
    serdes = {
        "request_deserializer": handler.request_deserializer,
        "response_serializer": handler.response_serializer,
    }
    if not handler.request_streaming and not handler.response_streaming:
        inner_uu = handler.unary_unary

        async def unary_unary(request: object, context: grpc.aio.ServicerContext) -> Any:
            refused = _admit(guard, method, context, request)
            if refused is not None:
                return refused
            result = inner_uu(request, context)
            return await result if inspect.isawaitable(result) else result

        return grpc.unary_unary_rpc_method_handler(unary_unary, **serdes)
    if not handler.request_streaming:
        inner_us = handler.unary_stream

        async def unary_stream(request: object, context: grpc.aio.ServicerContext) -> Any:
            refused = _admit(guard, method, context, request)
            if refused is not None:
                yield refused
                return
            async for item in inner_us(request, context):
                yield item

        return grpc.unary_stream_rpc_method_handler(unary_stream, **serdes)
    if not handler.response_streaming:
        inner_su = handler.stream_unary

        async def stream_unary(requests: Any, context: grpc.aio.ServicerContext) -> Any:
            refused = _admit(guard, method, context, None)
            return refused if refused is not None else await inner_su(requests, context)

        return grpc.stream_unary_rpc_method_handler(stream_unary, **serdes)
    inner_ss = handler.stream_stream

    async def stream_stream(requests: Any, context: grpc.aio.ServicerContext) -> Any:
        refused = _admit(guard, method, context, None)
        if refused is not None:
            yield refused
            return
        async for item in inner_ss(requests, context):
            yield item

    return grpc.stream_stream_rpc_method_handler(stream_stream, **serdes)


__all__ = ["V2GuardInterceptor", "caller_signature", "refusal_response"]
