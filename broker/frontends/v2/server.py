"""The node's RocketMQ 5 port: one ``grpc.aio`` server serving
``apache.rocketmq.v2.MessagingService`` (with health and reflection) beside the node's own ports.

The port follows the node's security (docs/SECURITY.md, "RocketMQ 5 clients"): with
``tlsEnable`` it speaks TLS with the node's member certificate (no client certificate asked,
as on the client port), every call passes the node's call guard answered in the body's Status
(:mod:`broker.frontends.v2.interceptor`), and the forwards to the leader and the NameServer lookups
travel as the node's own calls do. ``grpcServerPlaintextPort`` adds a plaintext port on 127.0.0.1
only, guarded the same way, with its own servicer: its route answers name the endpoints the client
came by and the node's own group only (the other groups' registered v2 addresses speak TLS).
Importing this module loads the generated stubs (:mod:`broker.frontends.v2.stubs`): ``mqbroker``
imports it only when ``grpcServerPort`` is set.
"""

from __future__ import annotations

import dataclasses
import logging
from dataclasses import dataclass
from typing import TYPE_CHECKING

import grpc

from broker.frontends.internal.forwarder import Forwarder
from broker.frontends.v2.interceptor import V2GuardInterceptor
from broker.frontends.v2.routes import NameServerRoutes
from broker.frontends.v2.service import SERVICE_NAME, MessagingServicer, V2Config
from dledger.server import StartError
from dledger.server.transport import SERVER_OPTIONS
from mqsecurity.channels import PLAINTEXT, ClientSecurity
from mqsecurity.tls import TlsFiles
from rpckit.callguard import CallGuard
from rpckit.serving import add_health_and_reflection, bind, bind_insecure

if TYPE_CHECKING:
    from broker.app import Broker

logger = logging.getLogger(__name__)

# Seconds in-flight v2 calls get to finish when the node stops.
STOP_GRACE_S = 0.2
# Where the plaintext v2 port listens: local clients only, as the node's plaintext client port.
PLAINTEXT_HOST = "127.0.0.1"


@dataclass(frozen=True)
class V2Security:
    """The node's security as the v2 port applies it: ``tls`` None serves plaintext;
    ``guard`` None admits every call; ``client`` is how forwards and lookups travel;
    ``plaintext_port`` (with ``tls`` only) the extra local plaintext port, 0 for none."""

    tls: TlsFiles | None = None
    guard: CallGuard | None = None
    client: ClientSecurity = PLAINTEXT
    plaintext_port: int = 0


class V2Port:
    """The RocketMQ 5 front end of one node, on ``bind_host:cfg.port``, over the node's
    broker components (built by the composition root, :mod:`broker.app`)."""

    def __init__(
        self,
        broker: Broker,
        cfg: V2Config,
        bind_host: str,
        namesrv_addrs: list[str],
        security: V2Security | None = None,
    ) -> None:
        self.security = security or V2Security()
        if self.security.plaintext_port and self.security.tls is None:
            raise ValueError("a plaintext v2 port beside a plaintext one: set tls")
        node = broker.node
        self.forwarder = Forwarder(node, broker.leader_ops, self.security.client)
        self.routes = (
            NameServerRoutes(namesrv_addrs, self.security.client) if namesrv_addrs else None
        )
        parts = (node, broker.topics, broker.applied, broker.subgroups, self.forwarder)
        self.servicer = MessagingServicer(*parts, cfg, self.routes, broker.producers)
        self.addr = f"{bind_host}:{cfg.port}"
        self._plain: MessagingServicer | None = None
        if self.security.plaintext_port:
            local = dataclasses.replace(cfg, host=PLAINTEXT_HOST, port=self.security.plaintext_port)
            self._plain = MessagingServicer(*parts, local, None, broker.producers)
        # The consumer listings (mqadmin consumerConnection) show these ports' clients.
        for servicer in (self.servicer, self._plain):
            if servicer is not None:
                broker.consumers.v2_sources.append(servicer.clients)
        self._servers: list[grpc.aio.Server] = []

    def _server(self, servicer: MessagingServicer) -> grpc.aio.Server:
        guard = self.security.guard
        server = grpc.aio.server(
            options=SERVER_OPTIONS,
            interceptors=[V2GuardInterceptor(guard)] if guard is not None else None,
        )
        names = list(servicer.register(server))
        add_health_and_reflection(server, names or [SERVICE_NAME])
        return server

    def bind(self) -> None:
        """Take the port(s) (``StartError`` when one is in use or a certificate file is bad):
        before the node starts, so a busy port stops the process before it touches its store,
        as the node's own ports do."""
        server = self._server(self.servicer)
        bind(server, self.addr, self.security.tls, StartError)
        self._servers = [server]
        if self._plain is not None:
            plain = self._server(self._plain)
            bind_insecure(plain, f"{PLAINTEXT_HOST}:{self.security.plaintext_port}", StartError)
            self._servers.append(plain)

    async def start(self) -> None:
        """Serve, once the node runs (calls read its role and state)."""
        if not self._servers:
            self.bind()
        for server in self._servers:
            await server.start()
        mode = "tls" if self.security.tls is not None else "plaintext"
        if self._plain is not None:
            mode += f" + plaintext {PLAINTEXT_HOST}:{self.security.plaintext_port}"
        guarded = "guarded" if self.security.guard is not None else "open"
        logger.info("rmq5 serving %s on %s (%s, %s)", SERVICE_NAME, self.addr, mode, guarded)

    async def stop(self) -> None:
        for server in self._servers:
            await server.stop(grace=STOP_GRACE_S)
        self._servers = []
        for servicer in (self.servicer, self._plain):
            if servicer is not None:
                await servicer.renewals.close()
                await servicer.coalesce.close()
        await self.forwarder.close()
        if self.routes is not None:
            await self.routes.close()
