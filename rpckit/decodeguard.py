"""Undecodable requests get ``INVALID_ARGUMENT BAD_REQUEST``, not ``UNKNOWN`` and a traceback.

gRPC calls a method's ``request_deserializer`` before the servicer sees anything; when the bytes
are not a valid protobuf message it raises, and gRPC answers ``UNKNOWN`` and logs an ERROR with a
traceback for every such request (so a client sending junk also floods the log). Registering a
generated servicer through :func:`add_servicer` instead of its ``add_XServicer_to_server`` gives
every method a deserializer that never raises: undecodable bytes become a marker object, and the
servicer's method is wrapped so that the marker is answered ``INVALID_ARGUMENT`` with the detail
``BAD_REQUEST undecodable <message type>`` before the servicer runs. One WARNING line is logged
at most every :data:`LOG_INTERVAL_S` seconds, with the count of refusals since the last one.

All four kinds of method are handled (unary-unary, unary-stream, stream-unary, stream-stream),
for ``grpc.aio`` servicers (coroutines and async generators) and for the threaded server's
plain functions and generators. A streaming request is refused at the first undecodable
message of its stream (when the servicer iterates the request iterator it was given; a servicer
that calls ``context.read()`` itself gets the marker, an :class:`Undecodable`, and must check).

Usage::

    decodeguard.add_servicer(server, pb_grpc.add_FooServicer_to_server, FooServicer())
"""

from __future__ import annotations

import inspect
import logging
import threading
import time
from collections.abc import AsyncIterator, Callable, Iterator, Mapping
from dataclasses import dataclass
from typing import Any

import grpc

from mqerrors import codes as E
from rpckit import status

logger = logging.getLogger(__name__)

# The stable code at the start of the detail of every refusal.
BAD_REQUEST_CODE = E.BAD_REQUEST
# At most one log line per this many seconds about undecodable requests: a client sending
# junk in a loop must not be able to fill the disk with log lines (the count is kept).
LOG_INTERVAL_S = 10.0
# Characters of a decoder's error kept on the log line (the detail sent back has none).
REASON_MAX_CHARS = 200

_Add = Callable[[Any, Any], None]


@dataclass(frozen=True, slots=True)
class Undecodable:
    """What a guarded deserializer returns for bytes it cannot decode."""

    message_type: str
    size_bytes: int
    reason: str


class _RateLimitedLog:
    """One WARNING per :data:`LOG_INTERVAL_S`, counting the refusals in between."""

    def __init__(self, interval_s: float = LOG_INTERVAL_S) -> None:
        self.interval_s = interval_s
        self._lock = threading.Lock()  # threaded servers call from many threads
        self._last_s = float("-inf")
        self._suppressed = 0
        self.total = 0

    def refused(self, bad: Undecodable, method: str, peer: str) -> None:
        now = time.monotonic()
        with self._lock:
            self.total += 1
            if now - self._last_s < self.interval_s:
                self._suppressed += 1
                return
            self._last_s = now
            suppressed, self._suppressed = self._suppressed, 0
        logger.warning(
            "%s undecodable request method=%s type=%s bytes=%d peer=%s reason=%s"
            " (refused since the last line: %d)",
            BAD_REQUEST_CODE,
            method,
            bad.message_type,
            bad.size_bytes,
            peer[:REASON_MAX_CHARS],
            bad.reason,
            suppressed,
        )


REFUSALS = _RateLimitedLog()


def _type_name(deserializer: Callable[[bytes], Any], method: str) -> str:
    """The protobuf type a deserializer makes (``FromString`` is bound to the class)."""
    descriptor = getattr(getattr(deserializer, "__self__", None), "DESCRIPTOR", None)
    name = getattr(descriptor, "full_name", None)
    return name if isinstance(name, str) else method


def guard_deserializer(
    deserializer: Callable[[bytes], Any], message_type: str
) -> Callable[[bytes], Any]:
    """``deserializer`` that returns an :class:`Undecodable` instead of raising."""

    def decode(data: bytes) -> Any:
        try:
            return deserializer(data)
        except Exception as exc:  # any failure to decode client bytes is the client's error
            reason = " ".join(f"{type(exc).__name__}: {exc}".split())[:REASON_MAX_CHARS]
            return Undecodable(message_type, len(data), reason)

    return decode


def _failure(bad: Undecodable) -> status.RpcFailure:
    """``BAD_REQUEST undecodable <type>``: the type is the server's own, never the bytes."""
    return status.RpcFailure(
        grpc.StatusCode.INVALID_ARGUMENT, BAD_REQUEST_CODE, f"undecodable {bad.message_type}"
    )


def _peer(context: Any) -> str:
    try:
        return str(context.peer())
    except Exception:  # a peer address is only for the log line
        return "?"


async def _refuse_async(context: Any, bad: Undecodable, method: str) -> None:
    REFUSALS.refused(bad, method, _peer(context))
    await status.abort(context, _failure(bad))


def _refuse_sync(context: Any, bad: Undecodable, method: str) -> None:
    REFUSALS.refused(bad, method, _peer(context))
    status.abort_sync(context, _failure(bad))


def _unary_request(behavior: Callable[..., Any], method: str) -> Callable[..., Any]:
    """Wrap a unary-request behavior (unary-unary or unary-stream)."""
    if inspect.isasyncgenfunction(behavior):

        async def agen(request: Any, context: Any) -> AsyncIterator[Any]:
            if isinstance(request, Undecodable):
                await _refuse_async(context, request, method)
            async for item in behavior(request, context):
                yield item

        return agen
    if inspect.iscoroutinefunction(behavior):

        async def coro(request: Any, context: Any) -> Any:
            if isinstance(request, Undecodable):
                await _refuse_async(context, request, method)
            return await behavior(request, context)

        return coro

    def plain(request: Any, context: Any) -> Any:
        if isinstance(request, Undecodable):
            _refuse_sync(context, request, method)
        return behavior(request, context)

    return plain


def _stream_request(behavior: Callable[..., Any], method: str) -> Callable[..., Any]:
    """Wrap a stream-request behavior (stream-unary or stream-stream)."""
    is_agen = inspect.isasyncgenfunction(behavior)
    if is_agen or inspect.iscoroutinefunction(behavior):

        async def checked(requests: AsyncIterator[Any], context: Any) -> AsyncIterator[Any]:
            async for item in requests:
                if isinstance(item, Undecodable):
                    await _refuse_async(context, item, method)
                yield item

        if is_agen:

            async def agen(requests: AsyncIterator[Any], context: Any) -> AsyncIterator[Any]:
                async for item in behavior(checked(requests, context), context):
                    yield item

            return agen

        async def coro(requests: AsyncIterator[Any], context: Any) -> Any:
            return await behavior(checked(requests, context), context)

        return coro

    def checked_sync(requests: Iterator[Any], context: Any) -> Iterator[Any]:
        for item in requests:
            if isinstance(item, Undecodable):
                _refuse_sync(context, item, method)
            yield item

    def plain(requests: Iterator[Any], context: Any) -> Any:
        return behavior(checked_sync(requests, context), context)

    return plain


def guard_handler(
    handler: grpc.RpcMethodHandler,
    method: str,
    parser: Callable[[bytes], Any] | None = None,
    serializer: Callable[[Any], bytes] | None = None,
) -> grpc.RpcMethodHandler:
    """``handler`` with a deserializer that never raises and a behavior that refuses what it
    could not decode. ``method`` names it in log lines (``/package.Service/Method``).
    ``parser``: decodes the request instead of the generated deserializer (a hand parser
    reading the wire bytes; what it refuses is refused under the generated type's name).
    ``serializer``: encodes the response instead of the generated serializer (a response
    the servicer wrote to wire bytes itself)."""
    if serializer is not None:
        handler = handler._replace(response_serializer=serializer)
    deserializer = handler.request_deserializer
    if deserializer is None:  # raw bytes: nothing to decode, nothing to refuse
        return handler
    type_name = _type_name(deserializer, method)
    guarded = guard_deserializer(parser or deserializer, type_name)
    kind = (handler.request_streaming, handler.response_streaming)
    field = {
        (False, False): "unary_unary",
        (False, True): "unary_stream",
        (True, False): "stream_unary",
        (True, True): "stream_stream",
    }[kind]
    behavior = getattr(handler, field)
    wrap = _stream_request if handler.request_streaming else _unary_request
    # RpcMethodHandler is a namedtuple in grpc's implementation: replace two fields.
    replaced: grpc.RpcMethodHandler = handler._replace(
        request_deserializer=guarded, **{field: wrap(behavior, method)}
    )
    return replaced


class _Capture:
    """Stands in for a server while a generated ``add_XServicer_to_server`` runs."""

    def __init__(self) -> None:
        self.services: list[tuple[str, Mapping[str, grpc.RpcMethodHandler]]] = []
        self.generic = 0

    def add_registered_method_handlers(
        self, service: str, handlers: Mapping[str, grpc.RpcMethodHandler]
    ) -> None:
        self.services.append((service, handlers))

    def add_generic_rpc_handlers(self, handlers: Any) -> None:
        self.generic += 1


def add_servicer(
    server: Any,
    add: _Add,
    servicer: Any,
    parsers: Mapping[str, Callable[[bytes], Any]] | None = None,
    *,
    serializers: Mapping[str, Callable[[Any], bytes]] | None = None,
) -> list[str]:
    """Register ``servicer`` on ``server`` as the generated ``add`` function would, every
    method guarded (:func:`guard_handler`). Returns the full service names registered.
    ``parsers``: method name (``SendMessage``) -> its request's parser, used instead of the
    generated deserializer; ``serializers``: method name -> its response's serializer, used
    instead of the generated one."""
    parsers = parsers or {}
    serializers = serializers or {}
    capture = _Capture()
    add(servicer, capture)
    if not capture.services:
        raise TypeError(
            f"{getattr(add, '__name__', add)!r} registered no method handlers"
            " (generated code older than grpcio 1.63?)"
        )
    names = []
    for service, handlers in capture.services:
        guarded = {
            m: guard_handler(h, f"/{service}/{m}", parsers.get(m), serializers.get(m))
            for m, h in handlers.items()
        }
        # Generic dispatch only (a dict look-up by method name per call). Registered methods
        # make grpc.aio's server keep one pending request task per method of the port and
        # run asyncio.wait over all of them for every call it accepts (about 57 on a broker's
        # client port: ~57 callbacks added and removed per call, ~5 % of a leader's event
        # loop at one send in flight; docs/PERFORMANCE.md "Commit notices at one in flight").
        server.add_generic_rpc_handlers((grpc.method_handlers_generic_handler(service, guarded),))
        names.append(service)
    return names
