"""A small asyncio remoting client: one connection, ``request`` and ``oneway`` (the tests and
mqbench use it; a server's requests to it, such as CHECK_TRANSACTION_STATE, go to ``handler``)."""

from __future__ import annotations

import asyncio
import contextlib
import ssl

from remoting.connection import ConnectionStats, Handler, RemotingConnection, ServerLimits
from remoting.protocol import RemotingCommand
from remoting.server import not_supported

# How long connecting (and a TLS handshake) may take.
CONNECT_TIMEOUT_S = 10.0


async def _refuse(request: RemotingCommand, _conn: RemotingConnection) -> RemotingCommand:
    return not_supported(request)


class RemotingClient:
    def __init__(self, conn: RemotingConnection, task: asyncio.Task[None]) -> None:
        self.connection = conn
        self._task = task

    @classmethod
    async def connect(
        cls,
        host: str,
        port: int,
        *,
        ssl_context: ssl.SSLContext | None = None,
        handler: Handler | None = None,
        limits: ServerLimits | None = None,
        timeout_s: float = CONNECT_TIMEOUT_S,
    ) -> RemotingClient:
        reader, writer = await asyncio.wait_for(
            asyncio.open_connection(
                host, port, ssl=ssl_context, server_hostname=host if ssl_context else None
            ),
            timeout_s,
        )
        conn = RemotingConnection(
            reader,
            writer,
            handler if handler is not None else _refuse,
            limits if limits is not None else ServerLimits(),
            ConnectionStats(),
        )
        return cls(conn, asyncio.create_task(conn.serve()))

    @property
    def closed(self) -> bool:
        return self.connection.closed

    async def request(self, cmd: RemotingCommand, timeout_s: float) -> RemotingCommand:
        """The answer to ``cmd`` (sent with the connection's next opaque)."""
        return await self.connection.request(cmd, timeout_s)

    def oneway(self, cmd: RemotingCommand) -> None:
        self.connection.oneway(cmd)

    async def close(self) -> None:
        self.connection.close()
        with contextlib.suppress(asyncio.CancelledError):
            await self._task

    async def __aenter__(self) -> RemotingClient:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.close()
