"""``raftmq.broker.internal.v1.LeaderOps``: the leader's side of a forwarded leader operation.

Served on every node's client port beside ``raftmq.broker.v1.Broker``. A call carries one typed
request (:mod:`broker.frontends.internal.codec` decodes and bounds it) and the original caller's
proof (a RocketMQ 5 signature in its metadata, or a remoting caller's proof inside it): the
node's call guard has checked that user's rights for the one operation inside
(:data:`broker.frontends.rpcmap.RPC_NEEDS`, the ``LeaderOps/`` rows) before this runs, and the
operation runs for that user (:func:`broker.frontends.authguard.owner_of`), through the same
:meth:`broker.components.leaderops.LeaderOps.run` as a call the leader serves itself. A node that
does not lead answers NOT_LEADER with the leader's address (the forwarder retries there).
"""

from __future__ import annotations

from collections.abc import Sequence

import grpc
from raftmq.broker.internal.v1 import leaderops_pb2 as ipb
from raftmq.broker.internal.v1 import leaderops_pb2_grpc as ipb_grpc

from broker.components.leaderops import LeaderOps
from broker.components.raftnode import RaftNode
from broker.frontends.authguard import AuthGuard, owner_of
from broker.frontends.internal.codec import answer_pb, request_of
from broker.frontends.v1.rpcerrors import rpc
from rpckit import decodeguard

SERVICE_NAME = "raftmq.broker.internal.v1.LeaderOps"


class LeaderOpsServicer(ipb_grpc.LeaderOpsServicer):
    """Runs forwarded leader operations on this node (when it leads)."""

    def __init__(self, node: RaftNode, ops: LeaderOps, guard: AuthGuard | None = None) -> None:
        self.node = node
        self.ops = ops
        self.guard = guard

    def register(self, server: grpc.aio.Server) -> Sequence[str]:
        """Add the service to ``server`` (undecodable calls refused, as on the v1 port)."""
        return decodeguard.add_servicer(server, ipb_grpc.add_LeaderOpsServicer_to_server, self)

    @rpc
    async def Call(
        self, request: ipb.LeaderCall, context: grpc.aio.ServicerContext
    ) -> ipb.LeaderAnswer:
        op = request_of(request)
        answer = await self.ops.run(op, owner_of(self.guard, context, request))
        return answer_pb(op, answer, self.node.max_body_bytes)


__all__ = ["SERVICE_NAME", "LeaderOpsServicer"]
