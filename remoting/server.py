"""An asyncio TCP server of remoting connections (plain or TLS, RocketMQ's ``tls.enable``).

Each accepted connection runs a :class:`~remoting.connection.RemotingConnection` with the
server's handler: requests are handled concurrently (bounded per connection), answered with
their opaque in their serialize type; a malformed frame closes that connection only, logged
(rate-limited) and counted in :attr:`RemotingServer.stats`. Connections past
``limits.max_connections`` are closed as they arrive.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import ssl

from remoting.codes import ResponseCode, request_name
from remoting.connection import (
    ConnectionStats,
    Handler,
    RateLimitedLog,
    RemotingConnection,
    ServerLimits,
)
from remoting.protocol import RemotingCommand

logger = logging.getLogger(__name__)

# Connections get this long to end when the server stops.
STOP_GRACE_S = 1.0
# A TLS handshake that has not finished in this long is dropped (a peer holding the slot).
TLS_HANDSHAKE_TIMEOUT_S = 10.0


def not_supported(request: RemotingCommand) -> RemotingCommand:
    """RocketMQ's answer to a request code a server does not serve: REQUEST_CODE_NOT_SUPPORTED
    with a remark naming the code."""
    return request.response(
        ResponseCode.REQUEST_CODE_NOT_SUPPORTED,
        f"request code {request.code} ({request_name(request.code)}) is not supported",
    )


class RemotingServer:
    """``handler(request, connection)`` answers a request (None: no answer; a oneway request's
    answer is never sent). ``start`` binds and returns the port."""

    def __init__(
        self,
        handler: Handler,
        *,
        limits: ServerLimits | None = None,
        ssl_context: ssl.SSLContext | None = None,
        name: str = "remoting",
    ) -> None:
        self._handler = handler
        self.limits = limits if limits is not None else ServerLimits()
        self._ssl = ssl_context
        self.name = name
        self.stats = ConnectionStats()
        self.connections_total = 0
        self.connections_refused = 0
        self._refused_log = RateLimitedLog("connection limit")
        self._connections: set[RemotingConnection] = set()
        self._server: asyncio.Server | None = None
        self.port = 0

    def refusals(self) -> dict[str, int]:
        """What the server refused or cut off, by reason (a fixed vocabulary: metrics label
        values): malformed frames, requests past the in-flight limit, connections past the
        connection limit, idle connections and peers not reading closed, handler failures."""
        s = self.stats
        return {
            "malformed_frame": s.malformed_frames,
            "busy": s.busy_refusals,
            "connection_limit": self.connections_refused,
            "idle": s.idle_closed,
            "slow_reader": s.slow_reader_closed,
            "handler_error": s.handler_errors,
        }

    @property
    def connections(self) -> list[RemotingConnection]:
        """The open connections (a broker notifies a group's consumers over them)."""
        return [c for c in self._connections if not c.closed]

    async def start(self, host: str, port: int) -> int:
        """Bind ``host:port`` (0: any free port) and serve. OSError when the port is taken."""
        assert self._server is None, "started twice"
        self._server = await asyncio.start_server(
            self._accept,
            host,
            port,
            ssl=self._ssl,
            ssl_handshake_timeout=TLS_HANDSHAKE_TIMEOUT_S if self._ssl else None,
            reuse_port=False,
        )
        self.port = self._server.sockets[0].getsockname()[1]
        logger.info("%s serving on %s:%d%s", self.name, host, self.port, " (TLS)" * bool(self._ssl))
        return self.port

    async def _accept(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        if len(self._connections) >= self.limits.max_connections:
            self.connections_refused += 1
            self._refused_log.warn(
                str(writer.get_extra_info("peername")),
                f"{len(self._connections)} connections open: refused",
            )
            writer.close()
            return
        conn = RemotingConnection(reader, writer, self._handler, self.limits, self.stats)
        self.connections_total += 1
        self._connections.add(conn)
        try:
            await conn.serve()
        finally:
            self._connections.discard(conn)

    async def stop(self) -> None:
        """Stop accepting, close every connection, and wait (bounded) for them to end."""
        if self._server is None:
            return
        self._server.close()
        connections = list(self._connections)
        for conn in connections:
            conn.close()
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(
                asyncio.gather(*(c.wait_closed() for c in connections)), STOP_GRACE_S
            )
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(self._server.wait_closed(), STOP_GRACE_S)
        self._server = None
