"""Users and permissions on the RocketMQ 5 port: the node's call guard, answered the v2 way.

The v2 port asks the same :class:`rpckit.callguard.CallGuard` as the node's client port
(:class:`broker.frontends.authguard.AuthGuard`: the RocketMQ 5 signature the official clients send,
the replicated user table, the rows of :mod:`broker.frontends.rpcmap` for
``apache.rocketmq.v2.MessagingService``). What differs is the refusal: RocketMQ 5 clients read
the outcome from the body's ``Status``, so a refused call is answered with the method's own
response type carrying ``UNAUTHORIZED`` (unknown caller, bad or missing signature) or
``FORBIDDEN`` (a known user without the permission) and the guard's reason; a streaming call
gets one such message and ends. Every response of the service has a ``Status``, so no refusal
needs a bare gRPC status. The guard counts each refusal in ``REFUSALS``.

An admitted call's signature entries are kept for the call (:func:`caller_signature`): the front end
forwards leader-only work with them (:mod:`broker.frontends.internal.forwarder`), so the leader
checks the original user again (docs/SECURITY.md, "RocketMQ 5 clients"). Its user is kept too
(:func:`current_caller`): the servicer checks each command of a Telemetry stream against the user's
rights (:meth:`Caller.check`), and binds the client records it makes to that user."""

from __future__ import annotations

import contextvars
import inspect
from collections.abc import AsyncIterator, Callable, Mapping
from dataclasses import dataclass
from typing import Any, Protocol, runtime_checkable

import grpc

from broker.frontends.v2 import stubs
from mqerrors import codes as E
from mqerrors.table import v2_code_name
from mqsecurity.signing import AUTHORIZATION_HEADER, DATE_TIME_HEADER
from rpckit.callguard import CallGuard, GuardInterceptor, Refusal, text_metadata

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


@runtime_checkable
class UserGuard(CallGuard, Protocol):
    """A call guard that also names an admitted call's user and decides on actions inside an
    admitted call (:class:`broker.frontends.authguard.AuthGuard`)."""

    def identify(self, metadata: Mapping[str, str]) -> tuple[str, bool]: ...

    def authorize(
        self, username: str, method: str, peer: str, request: object
    ) -> Refusal | None: ...


@dataclass(frozen=True, slots=True)
class Caller:
    """Who makes the v2 call being served: ``user`` "" and ``guard`` None on an unguarded
    port (everyone is one anonymous user there); ``unbounded``: a Super user, bounded by the
    tables' global limits only, not by the per-user quotas."""

    user: str = ""
    peer: str = ""
    guard: UserGuard | None = None
    unbounded: bool = False

    def check(self, method: str, request: object) -> Refusal | None:
        """None when the caller may do ``method`` (a row of broker.frontends.rpcmap) with
        ``request``, else the refusal (counted by the guard)."""
        if self.guard is None:
            return None
        return self.guard.authorize(self.user, method, self.peer, request)


ANONYMOUS = Caller()

_caller: contextvars.ContextVar[tuple[tuple[str, str], ...]] = contextvars.ContextVar(
    "rmq5_caller_signature", default=()
)
_who: contextvars.ContextVar[Caller] = contextvars.ContextVar("rmq5_caller", default=ANONYMOUS)


def caller_signature() -> tuple[tuple[str, str], ...]:
    """The signature entries of the v2 call being served (empty: an unsigned call, or none)."""
    return _caller.get()


def current_caller() -> Caller:
    """The user of the v2 call being served (:data:`ANONYMOUS` on an unguarded port)."""
    return _who.get()


def refusal_response(method: str, refusal: Refusal) -> Any:
    """The method's response with the refusal in its Status."""
    refused_as = E.PERMISSION_DENIED if refusal.authenticated else E.UNAUTHENTICATED
    definition, _, _ = stubs.load()
    text = f"{refusal.code} {refusal.reason}"[:MAX_REASON_CHARS]
    v2_code = definition.Code.Value(v2_code_name(refused_as))  # FORBIDDEN, UNAUTHORIZED
    return RESPONSES[method](status=definition.Status(code=v2_code, message=text))


class V2GuardInterceptor(GuardInterceptor):
    """Asks ``guard`` about every v2 call before the servicer runs, answering a refusal in the
    method's own response (health and reflection are open, as on the node's client port)."""

    def wrap(self, handler: grpc.RpcMethodHandler, method: str) -> grpc.RpcMethodHandler:
        if method not in RESPONSES:  # no v2 method: the error contract's refusal
            return super().wrap(handler, method)
        return _guarded(handler, method, self.guard)


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
    _who.set(_caller_of(guard, metadata, context.peer()))
    return None


def _caller_of(guard: CallGuard, metadata: Mapping[str, str], peer: str) -> Caller:
    if not isinstance(guard, UserGuard):
        # A guard that cannot decide inside a call: every action inside is refused.
        return Caller("", peer, _RefuseAll(), False)
    user, unbounded = guard.identify(metadata)
    return Caller(user, peer, guard, unbounded)


async def _streamed(refused: Any | None, items: Callable[[], AsyncIterator[Any]]) -> Any:
    """The refusal alone, or the servicer's messages."""
    if refused is not None:
        yield refused
        return
    async for item in items():
        yield item


def _guarded(handler: grpc.RpcMethodHandler, method: str, guard: CallGuard) -> Any:
    """The same handler with ``guard`` asked first (unary requests: with the request)."""
    serdes = {
        "request_deserializer": handler.request_deserializer,
        "response_serializer": handler.response_serializer,
    }
    streamed_in = bool(handler.request_streaming)
    if handler.response_streaming:
        inner_s = handler.stream_stream if streamed_in else handler.unary_stream

        async def streaming(arg: Any, context: grpc.aio.ServicerContext) -> Any:
            refused = _admit(guard, method, context, None if streamed_in else arg)
            async for item in _streamed(refused, lambda: inner_s(arg, context)):
                yield item

        if streamed_in:
            return grpc.stream_stream_rpc_method_handler(streaming, **serdes)
        return grpc.unary_stream_rpc_method_handler(streaming, **serdes)
    inner_u = handler.stream_unary if streamed_in else handler.unary_unary

    async def unary(arg: Any, context: grpc.aio.ServicerContext) -> Any:
        refused = _admit(guard, method, context, None if streamed_in else arg)
        if refused is not None:
            return refused
        result = inner_u(arg, context)
        return await result if inspect.isawaitable(result) else result

    if streamed_in:
        return grpc.stream_unary_rpc_method_handler(unary, **serdes)
    return grpc.unary_unary_rpc_method_handler(unary, **serdes)


class _RefuseAll:
    """The stand-in for a guard that cannot decide inside a call: every inner action refused."""

    def check(
        self, method: str, metadata: Mapping[str, str], peer: str, request: object
    ) -> Refusal | None:
        return _NO_INNER

    def identify(self, metadata: Mapping[str, str]) -> tuple[str, bool]:
        return "", False

    def authorize(self, username: str, method: str, peer: str, request: object) -> Refusal:
        return _NO_INNER


_NO_INNER = Refusal(True, E.PERMISSION_DENIED, "this port's guard cannot decide inside a call")


__all__ = [
    "ANONYMOUS",
    "Caller",
    "V2GuardInterceptor",
    "caller_signature",
    "current_caller",
    "refusal_response",
]
