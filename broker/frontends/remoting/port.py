"""The node's remoting port: RocketMQ 4.x clients over TCP (docs/REMOTING.md, "Broker"), served
when ``remotingListenPort`` is set.

One :class:`remoting.server.RemotingServer` with the node's
:class:`~broker.frontends.remoting.service.RemotingBrokerService` as its handler, beside the node's
other ports: plain, or TLS with the node's certificate when ``tlsEnable`` is on (RocketMQ's
``tls.enable``; no client certificate asked, as on the RocketMQ 5 port). Sends reach the leader
through the one forwarder, which travels as the node's own calls do.
"""

from __future__ import annotations

import logging
import socket
import ssl
from typing import TYPE_CHECKING

from broker.frontends.internal.forwarder import Forwarder
from broker.frontends.remoting.service import RemotingBrokerService
from dledger.server import StartError
from mqsecurity.channels import PLAINTEXT, ClientSecurity
from mqsecurity.errors import CertificateError
from mqsecurity.tls import TlsFiles, https_server_context
from remoting.server import RemotingServer

if TYPE_CHECKING:
    from broker.app import Broker

logger = logging.getLogger(__name__)


class RemotingPort:
    """The remoting front end of one node on ``host:port``; ``store_host`` is the node's
    ``storeHost`` (the address in its messages' offsetMsgIds, with ``port``)."""

    def __init__(
        self,
        broker: Broker,
        host: str,
        port: int,
        store_host: str,
        tls: TlsFiles | None = None,
        client: ClientSecurity = PLAINTEXT,
    ) -> None:
        assert 0 < port < 65536, "the remoting port is configured"
        self.host = host
        self.port = port
        self.forwarder = Forwarder(broker.node, broker.leader_ops, client)
        self.service = RemotingBrokerService(broker, self.forwarder, f"{store_host}:{port}")
        self._ssl: ssl.SSLContext | None = None
        if tls is not None:
            try:
                self._ssl = https_server_context(tls)
            except CertificateError as exc:
                raise StartError(f"remotingListenPort over TLS: {exc}") from None
        self.server = RemotingServer(
            self.service.handle, ssl_context=self._ssl, name="broker remoting"
        )

    def bind(self) -> None:
        """Check that the port can be taken (``StartError`` when it is in use), before the
        node starts, so a busy port stops the process before it touches its store."""
        family = socket.AF_INET6 if ":" in self.host else socket.AF_INET
        with socket.socket(family, socket.SOCK_STREAM) as probe:
            probe.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            try:
                probe.bind((self.host, self.port))
            except OSError as exc:
                raise StartError(f"remotingListenPort {self.host}:{self.port}: {exc}") from None

    async def start(self) -> None:
        try:
            await self.server.start(self.host, self.port)
        except OSError as exc:
            raise StartError(f"remotingListenPort {self.host}:{self.port}: {exc}") from None

    async def stop(self) -> None:
        await self.server.stop()
        await self.forwarder.close()
