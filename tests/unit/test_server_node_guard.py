"""The node's client and peer services against hostile input (issue 16), in process: one
DLedgerNode on free ports with a small store, driven through real gRPC."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Awaitable, Callable
from pathlib import Path

import grpc
import pytest
from raftmq.dledger.v1 import dledger_pb2 as pb
from raftmq.dledger.v1 import dledger_pb2_grpc as pb_grpc

from dledger.core import MAX_ENTRIES_PER_PROPOSAL, AppendRequest, Role
from dledger.server.convert import to_pb
from dledger.server.node import DLedgerNode, NodeConfig
from dledger.storage import StoreConfig
from mqcluster.cluster import _free_ports
from rpckit.status import DETAILS_KEY, read_error

SEGMENT_BYTES = 1 << 20  # so that the largest body is just under 1 MiB
DEADLINE_S = 10.0
N1_CLIENT_ADDR = "127.0.0.1:7001"  # configured, never contacted


async def _until(cond: Callable[[], bool], what: str) -> None:
    deadline = time.monotonic() + DEADLINE_S
    while not cond():
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        await asyncio.sleep(0.01)


def _run(tmp_path: Path, members: int, body: Callable[[DLedgerNode], Awaitable[None]]) -> None:
    ports = _free_ports(members + 1)
    ids = [f"n{i}" for i in range(members)]
    cfg = NodeConfig(
        group="g",
        self_id="n0",
        peers={i: f"127.0.0.1:{p}" for i, p in zip(ids, ports[:members], strict=True)},
        client_host="127.0.0.1",
        client_port=ports[-1],
        store_dir=str(tmp_path / "store"),
        store=StoreConfig(segment_size_bytes=SEGMENT_BYTES, preallocate=False),
        peer_client_addrs={"n1": N1_CLIENT_ADDR} if members > 1 else {},
    )

    async def go() -> None:
        node = DLedgerNode(cfg, seed=1)
        await node.start()
        try:
            await body(node)
        finally:
            await node.stop()

    asyncio.run(go())


async def _append_error(
    node: DLedgerNode, request: pb.AppendEntriesRequest
) -> grpc.aio.AioRpcError:
    async with grpc.aio.insecure_channel(
        node.cfg.client_addr,
        options=[("grpc.max_send_message_length", 80 << 20)],
    ) as ch:
        with pytest.raises(grpc.aio.AioRpcError) as info:
            await pb_grpc.DLedgerClientStub(ch).Append(request, timeout=DEADLINE_S)
    return info.value


def test_client_append_refuses_internal_types_and_impossible_sizes(tmp_path: Path) -> None:
    async def body(node: DLedgerNode) -> None:
        await _until(lambda: node.core.role is Role.LEADER, "a leader")
        # Old code: type 16 (a broker-internal record type) was appended and committed.
        err = await _append_error(node, pb.AppendEntriesRequest(group="g", bodies=[b"x"], type=16))
        assert err.code() == grpc.StatusCode.INVALID_ARGUMENT
        assert err.details().startswith("ENTRY_TYPE_NOT_ALLOWED"), err.details()
        info = read_error(err)
        assert info is not None and (info.code, info.retryable) == ("ENTRY_TYPE_NOT_ALLOWED", False)
        # Old code: the store's ValueError escaped as UNKNOWN.
        big = b"x" * (SEGMENT_BYTES + 1)
        err = await _append_error(node, pb.AppendEntriesRequest(group="g", bodies=[big]))
        assert err.code() == grpc.StatusCode.INVALID_ARGUMENT
        assert err.details().startswith("ENTRY_TOO_LARGE"), err.details()
        many = [b""] * (MAX_ENTRIES_PER_PROPOSAL + 1)
        err = await _append_error(node, pb.AppendEntriesRequest(group="g", bodies=many))
        assert err.details().startswith("TOO_MANY_ENTRIES"), err.details()
        # Old code: the 100 KB group name was echoed (twice) in the detail.
        err = await _append_error(node, pb.AppendEntriesRequest(group="y" * 100_000, bodies=[b""]))
        assert err.code() == grpc.StatusCode.NOT_FOUND
        assert err.details().startswith("UNKNOWN_GROUP") and len(err.details()) < 1024
        # The structured copy in the trailer is bounded too: the 100 KB name is not in it.
        trailer = dict(err.trailing_metadata() or ())[DETAILS_KEY]
        assert len(trailer) < 1200 and b"y" * 100 not in trailer
        info = read_error(err)
        assert info is not None and info.code == "UNKNOWN_GROUP"
        assert node.core.last_index == 1  # only the leader's NOOP: nothing was appended

    _run(tmp_path, 1, body)


def test_redirect_address_is_configured_not_taken_from_peer_metadata(tmp_path: Path) -> None:
    """Old code: the x-raftmq-client-addr header of any stream claiming n1 became the address
    that NOT_LEADER redirects and Metadata hand to clients."""

    async def body(node: DLedgerNode) -> None:
        evil = "203.0.113.66:1"
        heartbeat = to_pb(AppendRequest("n1", "n0", 1, 0, 0, (), 0), "g")
        metadata = (
            ("x-raftmq-group", "g"),
            ("x-raftmq-from", "n1"),
            ("x-raftmq-client-addr", evil),
        )
        async with grpc.aio.insecure_channel(node.cfg.peers["n0"]) as ch:
            call = pb_grpc.DLedgerPeerStub(ch).Stream(iter([heartbeat]), metadata=metadata)
            await call
        await _until(lambda: node.core.leader_id == "n1", "n0 to follow n1")
        err = await _append_error(node, pb.AppendEntriesRequest(group="g", bodies=[b"x"]))
        assert err.details() == f"NOT_LEADER leader=n1 addr={N1_CLIENT_ADDR}", err.details()
        # The same redirect as fields of the structured error: what clients act on.
        info = read_error(err)
        assert info is not None and info.code == "NOT_LEADER"
        assert (info.leader_id, info.leader_addr, info.retryable) == ("n1", N1_CLIENT_ADDR, True)
        assert node.leader_client_addr() == ("n1", N1_CLIENT_ADDR)

    _run(tmp_path, 3, body)


def test_non_member_stream_is_refused_and_counted(tmp_path: Path) -> None:
    async def body(node: DLedgerNode) -> None:
        heartbeat = to_pb(AppendRequest("n9", "n0", 5, 0, 0, (), 0), "g")
        metadata = (("x-raftmq-group", "g"), ("x-raftmq-from", "n9" * 500))
        async with grpc.aio.insecure_channel(node.cfg.peers["n0"]) as ch:
            with pytest.raises(grpc.aio.AioRpcError) as info:
                await pb_grpc.DLedgerPeerStub(ch).Stream(iter([heartbeat]), metadata=metadata)
        assert info.value.code() == grpc.StatusCode.PERMISSION_DENIED
        assert len(info.value.details()) < 1024
        assert node.core.term == 0
        assert node.dropped()["stream_refused"] == 1

    _run(tmp_path, 3, body)
