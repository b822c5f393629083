"""The node's RocketMQ 5 port: one ``grpc.aio`` server serving
``apache.rocketmq.v2.MessagingService`` (with health and reflection) beside the node's own ports.

All of the port's set-up is here (a TLS port, #18, would be added in :meth:`V2Port.start`).
Importing this module loads the generated stubs (:mod:`broker.rmq5.stubs`): ``mqbroker`` imports
it only when ``grpcServerPort`` is set.
"""

from __future__ import annotations

import logging

import grpc

from broker.pop import Pops
from broker.rmq5.leader import LeaderCalls
from broker.rmq5.routes import NameServerRoutes
from broker.rmq5.service import SERVICE_NAME, MessagingServicer, V2Config
from broker.sending import SendPath
from broker.topics import Topics
from dledger.server import StartError
from dledger.server.node import DLedgerNode
from dledger.server.serving import add_health_and_reflection, bind_insecure
from dledger.server.transport import SERVER_OPTIONS

logger = logging.getLogger(__name__)

# Seconds in-flight v2 calls get to finish when the node stops.
STOP_GRACE_S = 0.2


class V2Port:
    """The RocketMQ 5 front end of one node, on ``bind_host:cfg.port``."""

    def __init__(
        self,
        node: DLedgerNode,
        topics: Topics,
        sender: SendPath,
        pops: Pops,
        cfg: V2Config,
        bind_host: str,
        namesrv_addrs: list[str],
    ) -> None:
        self.leader = LeaderCalls(node, sender, pops)
        self.routes = NameServerRoutes(namesrv_addrs) if namesrv_addrs else None
        self.servicer = MessagingServicer(node, topics, self.leader, cfg, self.routes)
        self.addr = f"{bind_host}:{cfg.port}"
        self._server: grpc.aio.Server | None = None

    def bind(self) -> None:
        """Take the port (``StartError`` when it is in use): before the node starts, so a
        busy port stops the process before it touches its store, as the node's own ports do."""
        server = grpc.aio.server(options=SERVER_OPTIONS)
        names = list(self.servicer.register(server))
        add_health_and_reflection(server, names or [SERVICE_NAME])
        bind_insecure(server, self.addr, StartError)
        self._server = server

    async def start(self) -> None:
        """Serve, once the node runs (calls read its role and state)."""
        if self._server is None:
            self.bind()
        assert self._server is not None
        await self._server.start()
        logger.info("rmq5 serving %s on %s", SERVICE_NAME, self.addr)

    async def stop(self) -> None:
        if self._server is not None:
            await self._server.stop(grace=STOP_GRACE_S)
            self._server = None
        await self.leader.close()
        if self.routes is not None:
            await self.routes.close()
