"""The peer link sends what queued during a write as one batch, in order, and alone what
queued alone."""

from __future__ import annotations

import asyncio

from raftmq.dledger.v1 import dledger_pb2 as pb

from dledger.core import AppendRequest, TimeoutNow
from dledger.log import Entry
from dledger.server.transport import NOTICE_LINGER_MS, PEER_BATCH_MAX_MESSAGES, PeerLink


def _terms(pm: pb.PeerMessage) -> list[int]:
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


def _notice(commit: int, term: int = 2) -> AppendRequest:
    return AppendRequest("n0", "n1", term, commit, term, (), commit, no_reply=True)


def _append(commit: int, term: int = 2) -> AppendRequest:
    return AppendRequest("n0", "n1", term, 9, term, (Entry(term, 10, b"x"),), commit)


def _sent(pm: pb.PeerMessage) -> list[tuple[str, int]]:
    """(kind, commit or term) of each message in one write."""
    msgs = pm.batch.messages if pm.WhichOneof("kind") == "batch" else [pm]
    out = []
    for m in msgs:
        kind = m.WhichOneof("kind")
        if kind == "append_request":
            a = m.append_request
            out.append(("notice" if a.no_reply else "append", a.leader_commit))
        else:
            out.append((kind, m.timeout_now.term))
    return out


def test_commit_notice_waits_and_is_dropped_when_a_later_message_carries_it() -> None:
    async def run() -> list[list[tuple[str, int]]]:
        link = PeerLink("g", "n0", "127.0.0.1:1", "n1", "127.0.0.1:2")
        writes = link._messages()
        got = []
        # An append that carries the commit: the notice is never written.
        link.send(_notice(5))
        link.send(_notice(6))  # a newer notice replaces the older one
        link.send(_append(6))
        got.append(_sent(await anext(writes)))
        # Nothing follows: the notice goes out by itself after the linger.
        link.send(_notice(7))
        t0 = asyncio.get_running_loop().time()
        got.append(_sent(await anext(writes)))
        waited_ms = (asyncio.get_running_loop().time() - t0) * 1000
        assert NOTICE_LINGER_MS * 0.8 <= waited_ms < 5000  # it goes out by itself
        # A message that does not carry the commit (an append of a later term with a lower
        # commit, a TimeoutNow): the notice goes first, in order.
        link.send(_notice(8))
        link.send(_append(3, term=3))
        link.send(_notice(9, term=3))
        link.send(TimeoutNow("n0", "n1", 3))
        got.append(_sent(await anext(writes)))
        assert link.stats.superseded == 2
        await link.stop()
        return got

    got = asyncio.run(run())
    assert got[0] == [("append", 6)]
    assert got[1] == [("notice", 7)]
    assert got[2] == [("notice", 8), ("append", 3), ("notice", 9), ("timeout_now", 3)]
