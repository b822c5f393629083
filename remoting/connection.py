"""One remoting connection, either end: reads frames, runs the handler on each request (several
at once, bounded), writes answers with the request's opaque, and sends requests of its own to
the peer (a broker asks a producer CHECK_TRANSACTION_STATE) matched to their answers by opaque.

The server (:mod:`remoting.server`) and the client (:mod:`remoting.client`) both run a
:class:`RemotingConnection`; only who connected differs.
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import logging
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field, replace
from typing import Any

from remoting.codes import ResponseCode, request_name
from remoting.protocol import (
    FLAG_ONEWAY,
    FLAG_RESPONSE,
    INT32_MAX,
    FrameDecoder,
    FrameError,
    RemotingCommand,
    encode_frame,
)

logger = logging.getLogger(__name__)

# RocketMQ closes a channel idle (nothing read or written) for 120 s
# (serverChannelMaxIdleTimeSeconds); clients heartbeat every 30 s, so a live one never is.
CHANNEL_IDLE_TIMEOUT_S = 120.0
# Requests handled at once on one connection: a push consumer keeps one long-polling pull per
# queue in flight on its broker connection, so a few hundred is normal; past this the request
# is answered SYSTEM_BUSY at once (RocketMQ's answer to a full request queue).
MAX_IN_FLIGHT_PER_CONNECTION = 1024
# Requests this end sent and awaits answers to, per connection (a broker's check-backs).
MAX_PENDING_REQUESTS_PER_CONNECTION = 1024
# A peer that does not read its answers for this long is dropped (its writes would pile up).
WRITE_TIMEOUT_S = 30.0
# Bytes queued for a peer that is not reading before the connection is closed: room for a few
# of the largest frames (a 16 MiB pull answer at most).
MAX_WRITE_BUFFER_BYTES = 64 << 20
# One read's size.
READ_CHUNK_BYTES = 64 << 10
# At most one log line per this many seconds per kind of refusal (malformed frames, busy
# connections): a client sending junk in a loop must not fill the disk (counts are kept).
LOG_INTERVAL_S = 10.0
# Characters of a FrameError quoted on a log line.
REASON_MAX_CHARS = 200


class RemotingError(Exception):
    """A request this end sent got no answer."""


class ConnectionClosedError(RemotingError, ConnectionError):
    """The connection closed before the answer came (or was closed when the request was made)."""


class RequestTimeoutError(RemotingError, TimeoutError):
    """No answer within the request's timeout."""


class TooManyPendingError(RemotingError):
    """MAX_PENDING_REQUESTS_PER_CONNECTION requests already await answers on this connection."""


Handler = Callable[[RemotingCommand, "RemotingConnection"], Awaitable[RemotingCommand | None]]


@dataclass(frozen=True, slots=True)
class ServerLimits:
    """The bounds of a server's (or a client's) connections; the defaults are RocketMQ's where
    it has one."""

    max_connections: int = 4096
    max_in_flight_per_connection: int = MAX_IN_FLIGHT_PER_CONNECTION
    max_pending_requests_per_connection: int = MAX_PENDING_REQUESTS_PER_CONNECTION
    idle_timeout_s: float = CHANNEL_IDLE_TIMEOUT_S
    write_timeout_s: float = WRITE_TIMEOUT_S
    max_write_buffer_bytes: int = MAX_WRITE_BUFFER_BYTES

    def __post_init__(self) -> None:
        assert self.max_connections > 0 and self.max_in_flight_per_connection > 0
        assert self.max_pending_requests_per_connection > 0
        assert self.idle_timeout_s > 0 and self.write_timeout_s > 0


class RateLimitedLog:
    """One WARNING per LOG_INTERVAL_S for one kind of event, with the count in between."""

    def __init__(self, what: str, interval_s: float = LOG_INTERVAL_S) -> None:
        self.what = what
        self.interval_s = interval_s
        self._last_s = float("-inf")
        self._suppressed = 0

    def warn(self, peer: str, reason: str, exc_info: bool = False) -> None:
        now = time.monotonic()
        if now - self._last_s < self.interval_s:
            self._suppressed += 1
            return
        self._last_s = now
        suppressed, self._suppressed = self._suppressed, 0
        logger.warning(
            "remoting %s peer=%s: %s (more since the last line: %d)",
            self.what,
            peer,
            reason[:REASON_MAX_CHARS],
            suppressed,
            exc_info=exc_info,
        )


@dataclass(slots=True)
class ConnectionStats:
    """Counters over every connection of a server (or one client): what was refused and why."""

    malformed_frames: int = 0
    busy_refusals: int = 0
    idle_closed: int = 0
    slow_reader_closed: int = 0
    handler_errors: int = 0
    unmatched_responses: int = 0
    malformed_log: RateLimitedLog = field(default_factory=lambda: RateLimitedLog("bad frame"))
    busy_log: RateLimitedLog = field(default_factory=lambda: RateLimitedLog("busy"))
    error_log: RateLimitedLog = field(default_factory=lambda: RateLimitedLog("handler error"))


def _peer_of(writer: asyncio.StreamWriter) -> str:
    addr = writer.get_extra_info("peername")
    if isinstance(addr, tuple) and len(addr) >= 2:
        return f"{addr[0]}:{addr[1]}"
    return str(addr)


class RemotingConnection:
    """``peer`` is the other end's "host:port"; ``attrs`` is the front end's (client id,
    groups...). ``serve`` runs the connection until it closes."""

    def __init__(
        self,
        reader: asyncio.StreamReader,
        writer: asyncio.StreamWriter,
        handler: Handler,
        limits: ServerLimits,
        stats: ConnectionStats | None = None,
    ) -> None:
        self.peer = _peer_of(writer)
        self.attrs: dict[str, Any] = {}
        self._reader = reader
        self._writer = writer
        self._handler = handler
        self._limits = limits
        self.stats = stats if stats is not None else ConnectionStats()
        self._tasks: set[asyncio.Task[None]] = set()
        self._pending: dict[int, asyncio.Future[RemotingCommand]] = {}
        self._opaques = itertools.count(1)
        self._closed = False
        self._done = asyncio.Event()
        self._drain_lock = asyncio.Lock()
        self._last_write_s = time.monotonic()

    @property
    def closed(self) -> bool:
        return self._closed

    @property
    def in_flight(self) -> int:
        return len(self._tasks)

    # ------------------------------------------------------------------- this end's requests

    def _next_opaque(self) -> int:
        opaque = next(self._opaques)
        if opaque > INT32_MAX:  # wrap within the positive int32 range
            self._opaques = itertools.count(2)
            opaque = 1
        return opaque

    async def request(self, cmd: RemotingCommand, timeout_s: float) -> RemotingCommand:
        """Send ``cmd`` (its opaque replaced by this connection's next) and await the answer.
        Raises RequestTimeoutError, ConnectionClosedError, TooManyPendingError, or FrameError
        when ``cmd`` breaks a limit."""
        if self._closed:
            raise ConnectionClosedError(f"connection to {self.peer} is closed")
        if len(self._pending) >= self._limits.max_pending_requests_per_connection:
            raise TooManyPendingError(
                f"{len(self._pending)} requests already await answers from {self.peer}"
            )
        opaque = self._next_opaque()
        frame = encode_frame(replace(cmd, opaque=opaque, flag=cmd.flag & ~FLAG_ONEWAY))
        future: asyncio.Future[RemotingCommand] = asyncio.get_running_loop().create_future()
        self._pending[opaque] = future
        try:
            self._write(frame)
            return await asyncio.wait_for(future, timeout_s)
        except TimeoutError:
            raise RequestTimeoutError(
                f"no answer from {self.peer} to {request_name(cmd.code)} in {timeout_s} s"
            ) from None
        finally:
            self._pending.pop(opaque, None)

    def oneway(self, cmd: RemotingCommand) -> None:
        """Send ``cmd`` as a oneway request (no answer). Raises ConnectionClosedError when
        closed, FrameError when ``cmd`` breaks a limit."""
        if self._closed:
            raise ConnectionClosedError(f"connection to {self.peer} is closed")
        self._write(encode_frame(replace(cmd, opaque=self._next_opaque(), flag=FLAG_ONEWAY)))

    # ----------------------------------------------------------------------------- writing

    def _write(self, frame: bytes) -> None:
        """Queue ``frame``; a peer not reading what is already queued is dropped."""
        if self._closed:
            raise ConnectionClosedError(f"connection to {self.peer} is closed")
        self._writer.write(frame)
        self._last_write_s = time.monotonic()
        if self._writer.transport.get_write_buffer_size() > self._limits.max_write_buffer_bytes:
            self.stats.slow_reader_closed += 1
            logger.warning("remoting peer=%s reads too slowly: closing", self.peer)
            self.close()
            raise ConnectionClosedError(f"{self.peer} is not reading its answers")

    async def _send(self, frame: bytes) -> None:
        """Write ``frame`` and wait, bounded, until the peer has taken it."""
        self._write(frame)
        async with self._drain_lock:
            try:
                await asyncio.wait_for(self._writer.drain(), self._limits.write_timeout_s)
            except TimeoutError:
                self.stats.slow_reader_closed += 1
                self.close()
            except ConnectionError:
                self.close()

    # ----------------------------------------------------------------------------- reading

    async def serve(self) -> None:
        """Read and dispatch until the peer closes, a frame is malformed, or the connection is
        idle; then close it, cancel its handlers and fail its pending requests."""
        decoder = FrameDecoder()
        try:
            while not self._closed:
                data = await self._read()
                if not data:
                    break
                try:
                    commands = decoder.feed(data)
                except FrameError as exc:
                    self.stats.malformed_frames += 1
                    self.stats.malformed_log.warn(self.peer, f"closing: {exc}")
                    break
                for cmd in commands:
                    self._dispatch(cmd)
        except (ConnectionError, OSError):
            pass
        finally:
            await self._shutdown()

    async def _read(self) -> bytes:
        """The next bytes, b"" at the end or once the connection was idle too long (nothing
        read, nothing written, nothing in flight)."""
        while True:
            try:
                return await asyncio.wait_for(
                    self._reader.read(READ_CHUNK_BYTES), self._limits.idle_timeout_s
                )
            except TimeoutError:
                quiet_s = time.monotonic() - self._last_write_s
                if self._tasks or self._pending or quiet_s < self._limits.idle_timeout_s:
                    continue
                self.stats.idle_closed += 1
                logger.info("remoting peer=%s idle for %.0f s: closing", self.peer, quiet_s)
                return b""

    def _dispatch(self, cmd: RemotingCommand) -> None:
        if cmd.is_response:
            future = self._pending.pop(cmd.opaque, None)
            if future is None or future.done():
                self.stats.unmatched_responses += 1  # answered after its timeout
            else:
                future.set_result(cmd)
            return
        if len(self._tasks) >= self._limits.max_in_flight_per_connection:
            self._refuse_busy(cmd)
            return
        task = asyncio.create_task(self._handle(cmd))
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    def _refuse_busy(self, cmd: RemotingCommand) -> None:
        self.stats.busy_refusals += 1
        reason = f"{len(self._tasks)} requests in flight on this connection"
        self.stats.busy_log.warn(self.peer, f"refused {request_name(cmd.code)}: {reason}")
        if not cmd.is_oneway:
            answer = cmd.response(ResponseCode.SYSTEM_BUSY, f"[OVERLOAD] system busy: {reason}")
            with contextlib.suppress(ConnectionClosedError):
                self._write(encode_frame(answer))

    async def _handle(self, cmd: RemotingCommand) -> None:
        try:
            answer = await self._handler(cmd, self)
        except Exception as exc:  # answered SYSTEM_ERROR, logged (rate-limited), counted
            self.stats.handler_errors += 1
            self.stats.error_log.warn(
                self.peer, f"handler failed on {request_name(cmd.code)}: {exc!r}", exc_info=True
            )
            answer = cmd.response(
                ResponseCode.SYSTEM_ERROR,
                f"internal error handling {request_name(cmd.code)}: {type(exc).__name__}",
            )
        if answer is None or cmd.is_oneway or self._closed:
            return
        answer = replace(
            answer,
            opaque=cmd.opaque,
            flag=(answer.flag | FLAG_RESPONSE) & ~FLAG_ONEWAY,
            serialize_type=cmd.serialize_type,
        )
        try:
            frame = encode_frame(answer)
        except FrameError as exc:
            logger.error("remoting answer to %s breaks a limit: %s", request_name(cmd.code), exc)
            frame = encode_frame(
                cmd.response(ResponseCode.SYSTEM_ERROR, f"the answer breaks a limit: {exc}")
            )
        with contextlib.suppress(ConnectionClosedError):
            await self._send(frame)

    # ----------------------------------------------------------------------------- closing

    def close(self) -> None:
        """Close the connection; ``serve`` then cancels the handlers and fails the requests."""
        if self._closed:
            return
        self._closed = True
        self._writer.close()

    async def _shutdown(self) -> None:
        self.close()
        for task in list(self._tasks):
            task.cancel()
        for future in self._pending.values():
            if not future.done():
                future.set_exception(ConnectionClosedError(f"connection to {self.peer} closed"))
        self._pending.clear()
        with contextlib.suppress(Exception):
            await asyncio.wait_for(self._writer.wait_closed(), self._limits.write_timeout_s)
        self._done.set()

    async def wait_closed(self) -> None:
        await self._done.wait()
