"""Which broker groups serve a topic, for the RocketMQ 5 front end's ``QueryRoute``.

The node's own group comes from its applied topic table. Other groups come from the
NameServers (``namesrvAddr``): every node registers its RocketMQ 5 address there (``rmq5_addr``,
:mod:`broker.registration`), and a topic's route lists each group's topic config and the
RocketMQ 5 addresses of its members. A NameServer that is not configured, down or slow leaves
the route to the own group only: a client still reaches the group it asked. The lookups
travel as the node's own security says (TLS with its member certificate on a secure group).

Each member's address becomes an ``Endpoints`` of its own in the route (one per queue and
member, :func:`broker.frontends.v2.service._queues`): the official clients open one channel per
``Endpoints``, whose authority over TLS is that one address (a name the member's certificate
holds), and a client whose member dies sends through another's (docs/RMQ5.md, "Routes and a
dying node").
"""

from __future__ import annotations

import logging
from dataclasses import dataclass

import grpc
from raftmq.nameserver.v1 import nameserver_pb2 as nspb
from raftmq.nameserver.v1 import nameserver_pb2_grpc as nspb_grpc

from broker.state.records import TOPIC_MESSAGE_TYPES
from mqsecurity.channels import PLAINTEXT, ClientSecurity, open_aio_channel

logger = logging.getLogger(__name__)

# Deadline of one route lookup at a NameServer: well inside the clients' 3 s request timeout,
# leaving time to try the next NameServer and answer.
NAMESRV_TIMEOUT_S = 1.0
# Groups of one route and addresses of one group kept from a NameServer's answer (a NameServer
# is another process: its answer is bounded like any input).
MAX_ROUTE_GROUPS = 256
MAX_GROUP_ADDRS = 16


@dataclass(frozen=True, slots=True)
class GroupTopic:
    """One group serving a topic: its name, queue counts, perm, message type and the
    RocketMQ 5 addresses (``host:port``) of its members (leader first)."""

    name: str
    read_queue_nums: int
    write_queue_nums: int
    perm: int
    message_type: str
    addrs: tuple[str, ...]


class NameServerRoutes:
    """Route lookups at the NameServers of ``namesrv_addrs``, tried in order."""

    def __init__(
        self,
        namesrv_addrs: list[str],
        security: ClientSecurity = PLAINTEXT,
    ) -> None:
        self.addrs = list(namesrv_addrs)
        self.security = security
        self._channels: dict[str, grpc.aio.Channel] = {}

    async def close(self) -> None:
        for ch in self._channels.values():
            await ch.close()
        self._channels.clear()

    async def groups(self, topic: str) -> list[GroupTopic] | None:
        """The groups a NameServer routes ``topic`` to ([] when it knows no such topic);
        None when no NameServer is configured or none answered."""
        for addr in self.addrs:
            ch = self._channels.get(addr)
            if ch is None:
                ch = self._channels[addr] = open_aio_channel(addr, self.security)
            try:
                resp = await nspb_grpc.NameServerStub(ch).GetRouteInfoByTopic(
                    nspb.GetRouteInfoByTopicRequest(topic=topic), timeout=NAMESRV_TIMEOUT_S
                )
            except grpc.aio.AioRpcError as exc:
                if exc.code() is grpc.StatusCode.NOT_FOUND:
                    return []
                logger.debug("route of %s at namesrv=%s: %s", topic, addr, exc.code())
                continue
            return [_group(g) for g in resp.groups[:MAX_ROUTE_GROUPS]]
        return None


def _group(g: nspb.GroupRoute) -> GroupTopic:
    kind = g.message_type if g.message_type in TOPIC_MESSAGE_TYPES else TOPIC_MESSAGE_TYPES[0]
    return GroupTopic(
        g.broker_name,
        g.read_queue_nums,
        g.write_queue_nums,
        g.perm,
        kind,
        tuple(g.rmq5_addrs[:MAX_GROUP_ADDRS]),
    )
