"""A member's replica health in its Metadata answer (dledger.server.health): the repair state,
the chain at its commit index and at an index the caller names, the damage counters and the
application's derived-state mismatches (mqadmin replicaStatus reads these)."""

from __future__ import annotations

import asyncio
import dataclasses
import time
from collections.abc import Awaitable, Callable
from pathlib import Path

import grpc
from raftmq.dledger.v1 import dledger_pb2 as pb
from raftmq.dledger.v1 import dledger_pb2_grpc as pb_grpc

from dledger.core import AppendRequest
from dledger.log import Entry
from dledger.server.convert import to_pb
from dledger.server.node import DLedgerNode, NodeConfig
from dledger.storage import StoreConfig
from mqcluster.cluster import _free_ports

DEADLINE_S = 10.0


async def _until(cond: Callable[[], bool], what: str) -> None:
    deadline = time.monotonic() + DEADLINE_S
    while not cond():
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        await asyncio.sleep(0.005)


def _run_follower(tmp_path: Path, body: Callable[[DLedgerNode, str], Awaitable[None]]) -> None:
    """n0 of {n0, n1}, a follower of the n1 the test plays; body gets n0's client address."""
    n0_port, n1_port, client_port = _free_ports(3)
    peers = {"n0": f"127.0.0.1:{n0_port}", "n1": f"127.0.0.1:{n1_port}"}
    store = StoreConfig(segment_size_bytes=1 << 20, preallocate=False)
    cfg = NodeConfig("g", "n0", peers, "127.0.0.1", client_port, str(tmp_path / "s"), store)
    cfg = dataclasses.replace(cfg, election_timeout_ms=60_000, heartbeat_interval_ms=100)

    async def run() -> None:
        node = DLedgerNode(cfg, seed=1)
        await node.start()
        try:
            await body(node, f"127.0.0.1:{client_port}")
        finally:
            await node.stop()

    asyncio.run(run())


async def _metadata(addr: str, chain_index: int = 0) -> pb.MetadataResponse:
    async with grpc.aio.insecure_channel(addr) as channel:
        resp: pb.MetadataResponse = await pb_grpc.DLedgerClientStub(channel).Metadata(
            pb.MetadataRequest(chain_index=chain_index), timeout=DEADLINE_S
        )
        return resp


def _append(prev: int, n: int, commit: int) -> AppendRequest:
    entries = tuple(Entry(1, prev + 1 + i, b"e%d" % (prev + 1 + i)) for i in range(n))
    return AppendRequest("n1", "n0", 1, prev, 1 if prev else 0, entries, commit)


def test_metadata_answers_the_chain_at_the_index_asked_and_the_health_counters(
    tmp_path: Path,
) -> None:
    async def body(node: DLedgerNode, addr: str) -> None:
        node.on_peer_message("n1", to_pb(_append(0, 4, 3), "g"))
        await _until(lambda: node.core.commit_index == 3, "entries 1..4 stored, 3 committed")
        node.corruption_found["scrub"] = 2
        node.chain_check_mismatches["n1"] = 1
        node.sm.derived_mismatches = lambda: {"consumequeue": 5, "index": 0}  # type: ignore[attr-defined]
        resp = await _metadata(addr, chain_index=2)
        assert resp.commit_index == 3
        assert resp.commit_chain == node.store.chain_at(3) != 0
        assert (resp.chain_index, resp.chain, resp.chain_known) == (
            2,
            node.store.chain_at(2),
            True,
        )
        assert resp.chain != resp.commit_chain
        assert not resp.repairing and resp.promised_index >= 3
        assert dict(resp.corruption_found) == {"scrub": 2}
        assert resp.chain_check_mismatches == 1
        assert dict(resp.derived_mismatches) == {"consumequeue": 5, "index": 0}
        # An index this member does not hold: no chain, said so.
        missing = await _metadata(addr, chain_index=99)
        assert (missing.chain_index, missing.chain, missing.chain_known) == (99, 0, False)
        # Not asked: nothing answered for it.
        plain = await _metadata(addr)
        assert (plain.chain_index, plain.chain_known) == (0, False)

    _run_follower(tmp_path, body)
