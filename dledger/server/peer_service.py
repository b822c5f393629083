"""The peer service (DLedgerPeer) of one member: the Raft message stream, joins, snapshot
transfers and the holdings a repairing member asks about. Every call first establishes which
member is calling (its certificate under mutual TLS, its headers in plaintext) and is refused
when that is no member of this group; the work itself is the node's
(:class:`dledger.server.node.DLedgerNode`)."""

from __future__ import annotations

from collections.abc import AsyncIterator
from typing import TYPE_CHECKING

import grpc
from raftmq.dledger.v1 import dledger_pb2 as pb
from raftmq.dledger.v1 import dledger_pb2_grpc as pb_grpc

from dledger.log import DLedgerError
from dledger.server import errormap
from dledger.server.convert import echo
from dledger.server.goodcopy import holdings_of, to_response
from dledger.server.health import chain_or_none
from dledger.server.members import (
    DROP_STREAM_REFUSED,
    AcceptedPeers,
    Refused,
    claimed_sender_refusal,
    stream_sender,
)
from dledger.server.snapshots import SnapshotRefused, refused_status
from mqerrors import codes as E
from mqsecurity.refusals import REFUSALS
from rpckit import status

if TYPE_CHECKING:
    from dledger.server.node import DLedgerNode

__all__ = [
    "DROP_STREAM_REFUSED",
    "AcceptedPeers",
    "PeerServicer",
    "claimed_sender_refusal",
]


class PeerServicer(pb_grpc.DLedgerPeerServicer):
    def __init__(self, node: DLedgerNode) -> None:
        self.node = node

    async def Stream(
        self, request_iterator: AsyncIterator[pb.PeerMessage], context: grpc.aio.ServicerContext
    ) -> pb.PeerAck:
        sender = await self._sender(context)
        received = 0
        async for pm in request_iterator:
            received += 1
            self.node.on_peer_message(sender, pm)
        return pb.PeerAck(received=received)

    async def Join(
        self, request: pb.JoinRequest, context: grpc.aio.ServicerContext
    ) -> pb.JoinResponse:
        node = self.node
        if node.cfg.tls is None:
            sender = await self._claimed_sender(context)
        else:
            sender = await self._certified_sender(context)
        if request.group != node.cfg.group or request.node_id != sender:
            await status.abort(
                context,
                status.RpcFailure(
                    grpc.StatusCode.PERMISSION_DENIED,
                    E.PEER_IDENTITY,
                    f"{echo(sender)} cannot join as {echo(request.node_id)} of group "
                    f"{echo(request.group)}",
                ),
            )
        try:
            return await node.join(request)
        except (DLedgerError, TimeoutError) as exc:
            failure = errormap.dledger_failure(exc, node)
            if failure is None:
                raise
            await status.abort(context, failure)

    async def InstallSnapshot(
        self, request_iterator: AsyncIterator[pb.SnapshotChunk], context: grpc.aio.ServicerContext
    ) -> pb.SnapshotReply:
        sender = await self._sender(context)
        try:
            return await self.node.snapshots_in.receive(sender, request_iterator)
        except SnapshotRefused as exc:
            await status.abort(context, refused_status(exc))
            raise  # unreachable: abort raises

    async def Holdings(
        self, request: pb.HoldingsRequest, context: grpc.aio.ServicerContext
    ) -> pb.HoldingsResponse:
        """What this member's log holds, for a repairing member (dledger.server.goodcopy);
        authenticated like Stream."""
        await self._member_of_this_group(request.group, context)
        node = self.node
        h = holdings_of(node)
        resp = to_response(h, chain_or_none(node, h.last_index) or 0)
        # Its committed configuration, for a member whose membership.json was damaged
        # (dledger.server.confrepair).
        commit = node.core.commit_index
        conf = node.core.conf_state_at(commit)
        resp.config, resp.config_index, resp.commit_index = conf.encode(), conf.index, commit
        return resp

    async def PeerSocket(
        self, request: pb.PeerSocketRequest, context: grpc.aio.ServicerContext
    ) -> pb.PeerSocketInfo:
        """Whether and where this member offers the peer socket (dledger.server.peersock);
        authenticated like Stream."""
        await self._member_of_this_group(request.group, context)
        node = self.node
        port, max_version = node.peer_socket_offer()
        return pb.PeerSocketInfo(port=port, max_version=max_version)

    async def _member_of_this_group(self, group: str, context: grpc.aio.ServicerContext) -> None:
        """The caller is a member (as for Stream) asking about this member's group; the call
        is refused otherwise."""
        await self._sender(context)
        node = self.node
        if group != node.cfg.group:
            await status.abort(
                context,
                status.RpcFailure(
                    grpc.StatusCode.PERMISSION_DENIED,
                    E.NOT_A_MEMBER,
                    f"this member is of group {echo(node.cfg.group)}, not {echo(group)}",
                ),
            )

    async def _sender(self, context: grpc.aio.ServicerContext) -> str:
        """The member calling (the call is refused when it is none)."""
        if self.node.cfg.tls is None:
            return await self._claimed_sender(context)
        return await self._certified_sender(context)

    async def _certified_sender(self, context: grpc.aio.ServicerContext) -> str:
        """Mutual TLS: the member its certificate names (dledger.server.members)."""
        cfg = self.node.cfg
        sender = stream_sender(
            context.auth_context(),
            context.invocation_metadata() or (),
            cfg.group,
            cfg.self_id,
            AcceptedPeers(self.node),
        )
        if isinstance(sender, Refused):
            REFUSALS.count(
                sender.reason, f"node={cfg.self_id} peer={context.peer()} {sender.failure.detail}"
            )
            await status.abort(context, sender.failure)
        return sender

    async def _claimed_sender(self, context: grpc.aio.ServicerContext) -> str:
        """Plaintext: the member the stream's headers name (anyone who can reach the peer port
        can claim to be a member; tlsEnable closes that)."""
        md = dict(context.invocation_metadata() or ())
        group, sender = md.get("x-raftmq-group", ""), md.get("x-raftmq-from", "")
        # x-raftmq-client-addr is ignored: redirects use configured addresses only.
        refused = claimed_sender_refusal(self.node, str(group), str(sender))
        if refused is not None:
            await status.abort(context, refused.failure)
        return str(sender)
