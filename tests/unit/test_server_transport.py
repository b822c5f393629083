"""The peer link sends what queued during a write as one batch, in order, and alone what
queued alone."""

from __future__ import annotations

import asyncio

from raftmq.dledger.v1 import dledger_pb2 as pb

from dledger.core import TimeoutNow
from dledger.server.transport import PEER_BATCH_MAX_MESSAGES, PeerLink


def _terms(wire: bytes) -> list[int]:
    pm = pb.PeerMessage.FromString(wire)
    if pm.WhichOneof("kind") == "batch":
        assert all(m.WhichOneof("kind") == "timeout_now" for m in pm.batch.messages)
        return [m.timeout_now.term for m in pm.batch.messages]
    assert pm.WhichOneof("kind") == "timeout_now"
    return [pm.timeout_now.term]


def test_link_batches_what_queued_and_keeps_order() -> None:
    async def run() -> list[list[int]]:
        link = PeerLink("g", "n0", "127.0.0.1:1", "n1", "127.0.0.1:2")
        writes = link._messages()
        got = []
        link.send(TimeoutNow("n0", "n1", 1))
        got.append(_terms(await anext(writes)))  # alone in the queue: sent as itself
        for term in range(2, 2 + PEER_BATCH_MAX_MESSAGES + 3):
            link.send(TimeoutNow("n0", "n1", term))
        got.append(_terms(await anext(writes)))  # a full batch
        got.append(_terms(await anext(writes)))  # the rest
        assert link.stats.sent == 1 + PEER_BATCH_MAX_MESSAGES + 3
        assert link.stats.batches == 2
        return got

    got = asyncio.run(run())
    assert got[0] == [1]
    assert got[1] == list(range(2, 2 + PEER_BATCH_MAX_MESSAGES))
    assert got[2] == list(range(2 + PEER_BATCH_MAX_MESSAGES, 2 + PEER_BATCH_MAX_MESSAGES + 3))
