"""A hook that lets the application admit or refuse each call on a node's client port.

dledger knows nothing of users or permissions: the application (the broker) gives the node a
:class:`CallGuard`, and :class:`GuardInterceptor` asks it about every call before the servicer
runs, with the full method name (``/raftmq.broker.v1.Broker/SendMessage``), the call's text
metadata, the peer (``ipv4:127.0.0.1:53412``) and the decoded request (None for a streaming
request). A refusal ends the call with the one error contract's status
(:mod:`rpckit.status`): ``UNAUTHENTICATED`` or ``PERMISSION_DENIED``, the refusal's
stable code first in the detail, then its reason. The guard writes the reason; it must never
hold a secret.

Health checking and server reflection (:data:`OPEN_SERVICES`) are never guarded: load
balancers and ``grpcurl list`` reach them without credentials, and they reveal nothing but
service names.
"""

from __future__ import annotations

import inspect
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass
from typing import Any, Protocol

import grpc

from rpckit import status

# Services every caller may reach (their full names, as in a method path's first part).
OPEN_SERVICES = frozenset(
    {
        "grpc.health.v1.Health",
        "grpc.reflection.v1alpha.ServerReflection",
        "grpc.reflection.v1.ServerReflection",
    }
)


@dataclass(frozen=True, slots=True)
class Refusal:
    """Why a call is refused. ``authenticated`` False: the caller is unknown or its proof is
    wrong (``UNAUTHENTICATED``); True: a known caller lacks the permission
    (``PERMISSION_DENIED``). ``code`` is the stable code, ``reason`` the human part."""

    authenticated: bool
    code: str
    reason: str

    def failure(self) -> status.RpcFailure:
        grpc_code = (
            grpc.StatusCode.PERMISSION_DENIED
            if self.authenticated
            else grpc.StatusCode.UNAUTHENTICATED
        )
        return status.RpcFailure(grpc_code, self.code, self.reason)


class CallGuard(Protocol):
    """What the application plugs into a node's client port."""

    def check(
        self, method: str, metadata: Mapping[str, str], peer: str, request: object
    ) -> Refusal | None:
        """None to let the call through, or why it is refused. Must not block: it runs on
        the event loop for every call."""
        ...


def service_of(method: str) -> str:
    """``/pkg.Service/Method`` -> ``pkg.Service``."""
    return method.lstrip("/").partition("/")[0]


def text_metadata(metadata: Any) -> dict[str, str]:
    """The text entries of a call's metadata (binary ``-bin`` entries are left out)."""
    return {k: v for k, v in (metadata or ()) if isinstance(v, str)}


class GuardInterceptor(grpc.aio.ServerInterceptor):  # type: ignore[misc]
    """Wraps every method handler of a ``grpc.aio`` server (but :data:`OPEN_SERVICES`) so that
    ``guard.check`` runs first. Pass it in ``grpc.aio.server(interceptors=[...])``."""

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
        return self.wrap(handler, details.method)

    def wrap(self, handler: grpc.RpcMethodHandler, method: str) -> grpc.RpcMethodHandler:
        """``handler`` with the guard asked first; a refusal ends the call with the error
        contract's status. A front end whose protocol answers refusals otherwise overrides
        this."""
        return _guarded(handler, method, self.guard)


async def _admit(
    guard: CallGuard, method: str, context: grpc.aio.ServicerContext, request: object
) -> None:
    refusal = guard.check(
        method, text_metadata(context.invocation_metadata()), context.peer(), request
    )
    if refusal is not None:
        await status.abort(context, refusal.failure())


def _guarded(handler: grpc.RpcMethodHandler, method: str, guard: CallGuard) -> Any:
    """The same handler with ``guard`` asked first (unary requests: with the request)."""
    kind = (handler.request_streaming, handler.response_streaming)
    serdes = {
        "request_deserializer": handler.request_deserializer,
        "response_serializer": handler.response_serializer,
    }
    if kind == (False, False):
        inner_uu = handler.unary_unary

        async def unary_unary(request: object, context: grpc.aio.ServicerContext) -> Any:
            await _admit(guard, method, context, request)
            result = inner_uu(request, context)
            return await result if inspect.isawaitable(result) else result

        return grpc.unary_unary_rpc_method_handler(unary_unary, **serdes)
    if kind == (False, True):
        inner_us = handler.unary_stream

        async def unary_stream(request: object, context: grpc.aio.ServicerContext) -> Any:
            await _admit(guard, method, context, request)
            async for item in inner_us(request, context):
                yield item

        return grpc.unary_stream_rpc_method_handler(unary_stream, **serdes)
    if kind == (True, False):
        inner_su = handler.stream_unary

        async def stream_unary(requests: Any, context: grpc.aio.ServicerContext) -> Any:
            await _admit(guard, method, context, None)
            return await inner_su(requests, context)

        return grpc.stream_unary_rpc_method_handler(stream_unary, **serdes)
    inner_ss = handler.stream_stream

    async def stream_stream(requests: Any, context: grpc.aio.ServicerContext) -> Any:
        await _admit(guard, method, context, None)
        async for item in inner_ss(requests, context):
            yield item

    return grpc.stream_stream_rpc_method_handler(stream_stream, **serdes)
