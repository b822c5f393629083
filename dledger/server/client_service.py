"""The log client service (DLedgerClient) of one member: append, read, metadata, membership
changes and leadership transfer over gRPC. Requests are checked here (group, entry types,
sizes); the work is the node's (:class:`dledger.server.node.DLedgerNode`), and its errors
become statuses through :mod:`rpckit.status`."""

from __future__ import annotations

import asyncio
import os
import time
from typing import TYPE_CHECKING, NoReturn

import grpc
from raftmq.dledger.v1 import dledger_pb2 as pb
from raftmq.dledger.v1 import dledger_pb2_grpc as pb_grpc

from dledger.core import MAX_ENTRIES_PER_PROPOSAL, ChangeKind, ConfChange
from dledger.core.membership import MAX_FEATURE_LEVEL
from dledger.log import CorruptLogError, DLedgerError, IndexOutOfRangeError, LogCompactedError
from dledger.server import errormap
from dledger.server.convert import echo
from dledger.server.health import health_fields
from mqerrors import codes as E
from mqrelease import RELEASE
from mqsecurity.refusals import REFUSALS
from rpckit import status

if TYPE_CHECKING:
    from dledger.server.node import DLedgerNode

__all__ = ["GET_MAX_BYTES", "GET_MAX_COUNT", "ClientServicer", "disk_space"]

# Bytes of entry bodies one Get returns at most (a client pages through larger ranges).
GET_MAX_BYTES = 4 << 20
# Entries one Get returns at most.
GET_MAX_COUNT = 10_000
# A Get that met a damaged entry answers DATA_LOSS before the node restarts to repair: time
# for the answer to leave.
DAMAGE_ANSWER_GRACE_S = 0.2


def disk_space(path: os.PathLike[str] | str) -> tuple[int, int]:
    """``Metadata``'s disk fields: the store's file system, total and free bytes (one
    ``statvfs``, about a microsecond); zeros when it cannot be read."""
    try:
        st = os.statvfs(path)
    except OSError:
        return 0, 0
    return st.f_blocks * st.f_frsize, st.f_bavail * st.f_frsize


# ChangeMemberRequest.kind -> the core's change.
_CHANGE_KINDS = {k.name: k for k in ChangeKind}


class ClientServicer(pb_grpc.DLedgerClientServicer):
    """The log client service. Errors become statuses through :mod:`rpckit.status`
    (:meth:`_fail` for dledger's errors, :func:`_invalid` for refused requests)."""

    def __init__(self, node: DLedgerNode) -> None:
        self.node = node

    async def _check_group(self, group: str, context: grpc.aio.ServicerContext) -> None:
        if group and group != self.node.cfg.group:
            await status.abort(
                context,
                status.RpcFailure(
                    grpc.StatusCode.NOT_FOUND,
                    E.UNKNOWN_GROUP,
                    f"this node serves group {echo(self.node.cfg.group)}, not {echo(group)}",
                ),
            )

    async def _fail(self, context: grpc.aio.ServicerContext, exc: BaseException) -> NoReturn:
        """End the call with the status of ``exc``, one of dledger's errors or a quorum
        timeout (anything else is raised again: gRPC answers UNKNOWN and logs it)."""
        failure = errormap.dledger_failure(exc, self.node)
        if failure is None:
            raise exc
        await status.abort(context, failure)

    async def Append(
        self, request: pb.AppendEntriesRequest, context: grpc.aio.ServicerContext
    ) -> pb.AppendEntriesResponse:
        node = self.node
        await self._check_group(request.group, context)
        entry_type = request.type
        if entry_type not in node.cfg.client_entry_types:
            await status.abort(
                context,
                _invalid(
                    E.ENTRY_TYPE_NOT_ALLOWED,
                    f"type {entry_type} cannot be appended by clients "
                    f"(allowed: {sorted(node.cfg.client_entry_types)})",
                ),
            )
        bodies = request.bodies
        if len(bodies) > MAX_ENTRIES_PER_PROPOSAL:
            await status.abort(
                context,
                _invalid(
                    E.TOO_MANY_ENTRIES, f"{len(bodies)} bodies exceed {MAX_ENTRIES_PER_PROPOSAL}"
                ),
            )
        max_body = node.store.config.max_body_bytes
        for i, b in enumerate(bodies):
            if len(b) > max_body:
                # No retry can ever store it: distinct from the retryable BACK_PRESSURE.
                await status.abort(
                    context,
                    _invalid(
                        E.ENTRY_TOO_LARGE, f"body {i} has {len(b)} bytes, the limit is {max_body}"
                    ),
                )
        try:
            first, last, term = await node.propose(list(bodies), entry_type)
        except (DLedgerError, TimeoutError) as exc:
            await self._fail(context, exc)
        return pb.AppendEntriesResponse(first_index=first, last_index=last, term=term)

    async def Get(
        self, request: pb.GetRequest, context: grpc.aio.ServicerContext
    ) -> pb.GetResponse:
        node = self.node
        await self._check_group(request.group, context)
        commit = node.core.commit_index
        if request.index < 1:
            await status.abort(context, _invalid(E.INVALID_INDEX, "index must be >= 1"))
        if request.index > commit:
            return pb.GetResponse(commit_index=commit)
        count = min(max(1, request.max_count), GET_MAX_COUNT, commit - request.index + 1)
        max_bytes = min(request.max_bytes or GET_MAX_BYTES, GET_MAX_BYTES)
        try:
            entries = node.store.read_range(request.index, max_bytes, max_count=count)
        except LogCompactedError as exc:
            await self._fail(context, exc)
        except CorruptLogError as exc:
            # Answer first (DATA_LOSS LOG_DAMAGED index=...), then repair.
            asyncio.get_running_loop().call_later(DAMAGE_ANSWER_GRACE_S, node.on_damage, exc, "get")
            await self._fail(context, exc)
        except IndexOutOfRangeError:
            entries = []
        resp = pb.GetResponse(commit_index=commit)
        add = resp.entries.add  # in place: a list of Entry messages would be merged (copied)
        for e in entries:
            add(term=e.term, index=e.index, type=e.type, body=e.body)
        return resp

    async def Metadata(
        self, request: pb.MetadataRequest, context: grpc.aio.ServicerContext
    ) -> pb.MetadataResponse:
        node = self.node
        await self._check_group(request.group, context)
        st = node.core.status()
        leader, addr = node.leader_client_addr()
        disk_total, disk_free = disk_space(node.store.root)
        resp = pb.MetadataResponse(
            group=node.cfg.group,
            self_id=node.cfg.self_id,
            role=st.role.name,
            term=st.term,
            leader_id=leader or "",
            leader_client_addr=addr,
            commit_index=st.commit_index,
            applied_index=st.applied_index,
            first_index=node.store.first_index(),
            last_index=st.last_index,
            flushed_index=node.store.flushed_index(),
            peers=[
                pb.PeerProgress(id=p.peer_id, match_index=p.match_index, next_index=p.next_index)
                for p in st.peers
            ],
            store_path=str(node.store.root),
            refusals=REFUSALS.snapshot(),
            disk_total_bytes=disk_total,
            disk_free_bytes=disk_free,
            release=RELEASE,
            feature_level=node.feature_level(),
            supported_feature_level=node.cfg.supported_feature_level,
        )
        resp.MergeFrom(health_fields(node, request.chain_index))
        return resp

    async def ListMembers(
        self, request: pb.ListMembersRequest, context: grpc.aio.ServicerContext
    ) -> pb.ListMembersResponse:
        await self._check_group(request.group, context)
        return _list_members(self.node)

    async def ChangeMember(
        self, request: pb.ChangeMemberRequest, context: grpc.aio.ServicerContext
    ) -> pb.ChangeMemberResponse:
        node = self.node
        await self._check_group(request.group, context)
        kind = _CHANGE_KINDS.get(request.kind)
        if kind is None:
            await status.abort(
                context,
                _invalid(
                    E.UNKNOWN_CHANGE,
                    f"kind {echo(request.kind)} is not one of {sorted(_CHANGE_KINDS)}",
                ),
            )
        adding = kind in (ChangeKind.ADD_LEARNER, ChangeKind.ADD_VOTER)
        if adding and not request.peer_addr:
            await status.abort(
                context, _invalid(E.PEER_ADDR_REQUIRED, "a new member needs its peer_addr")
            )
        change = ConfChange(kind, request.node_id, request.peer_addr, request.client_addr)
        try:
            proposal = await node.change_member(change)
        except (DLedgerError, TimeoutError) as exc:
            await self._fail(context, exc)
        return pb.ChangeMemberResponse(
            members=node.members(), index=proposal.last_index, term=proposal.term
        )

    async def SetFeatureLevel(
        self, request: pb.SetFeatureLevelRequest, context: grpc.aio.ServicerContext
    ) -> pb.SetFeatureLevelResponse:
        node = self.node
        await self._check_group(request.group, context)
        if request.level > MAX_FEATURE_LEVEL:
            await status.abort(
                context,
                _invalid(E.INVALID_ARGUMENT, f"level {request.level} > {MAX_FEATURE_LEVEL}"),
            )
        try:
            level, index = await node.set_feature_level(request.level)
        except (DLedgerError, TimeoutError) as exc:
            await self._fail(context, exc)
        return pb.SetFeatureLevelResponse(level=level, index=index)

    async def TransferLeadership(
        self, request: pb.TransferLeadershipRequest, context: grpc.aio.ServicerContext
    ) -> pb.TransferLeadershipResponse:
        node = self.node
        await self._check_group(request.group, context)
        try:
            node.core.transfer_leadership(request.target_id)
        except DLedgerError as exc:
            await self._fail(context, exc)
        node.wake()
        deadline = time.monotonic() + node.cfg.election_timeout_ms * 4 / 1000
        while node.core.leader_id != request.target_id and time.monotonic() < deadline:
            await node.wait_leader_change(deadline - time.monotonic())
        if node.core.leader_id != request.target_id:
            await status.abort(
                context,
                status.RpcFailure(
                    grpc.StatusCode.DEADLINE_EXCEEDED,
                    E.TRANSFER_TIMEOUT,
                    f"leader is still {node.core.leader_id}",
                    leader_id=node.core.leader_id or "",
                    leader_addr=node.leader_client_addr()[1],
                    retryable=True,
                ),
            )
        return pb.TransferLeadershipResponse(
            leader_id=node.core.leader_id or "", term=node.core.term
        )


def _list_members(node: DLedgerNode) -> pb.ListMembersResponse:
    conf = node.core.conf_state
    return pb.ListMembersResponse(
        members=node.members(),
        leader_id=node.core.leader_id or "",
        config_index=conf.index,
        config_committed=conf.index <= node.core.commit_index,
        term=node.core.term,
        feature_level=conf.features,
    )


def _invalid(code: str, text: str) -> status.RpcFailure:
    """A request this node refuses whatever its state: not retryable."""
    return status.RpcFailure(grpc.StatusCode.INVALID_ARGUMENT, code, text)
