"""Transactions on a real state machine, without gRPC: half messages, commit and rollback
(idempotent), bad EndTransactions, the leader's check-back and discard, stale and forged
records, limits and the snapshot."""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

import pytest
from broker_world import LogAgain, world
from raftmq.broker.v1 import broker_pb2 as pb

from broker.components import transactions as manager
from broker.components.sending import SendPath
from broker.components.settings import ServiceConfig
from broker.components.transactions import Transactions, TxnSettings, due_halves
from broker.state.errors import SystemTopicError
from broker.state.machine import BrokerStateMachine
from broker.state.message import Message, UniqIdGenerator, encode_batch
from broker.state.records import ENTRY_TXN
from broker.state.transactions import (
    COMMITTED,
    DISCARDED,
    HALF_TOPIC,
    OP_CHECK,
    OP_DISCARD,
    ROLLED_BACK,
    Half,
    InvalidTransactionIdError,
    InvalidTxnRecordError,
    decode_txn_record,
    encode_checks,
    encode_commit,
    encode_prepare,
    encode_rollback,
    transaction_id,
)

IDS = UniqIdGenerator(ip="10.0.0.3", pid=9, instance_hash=3)
CFG = ServiceConfig(
    "127.0.0.1", 10911, txn_timeout_ms=1000, txn_check_interval_ms=1000, txn_check_max=2
)


def half(n: int, msg_id: str = "") -> pb.Message:
    return pb.Message(
        queue_id=1,
        body=f"body-{n}".encode(),
        msg_id=msg_id or IDS.next_id(),
        tags="A",
        properties={"TRAN_MSG": "true", "k": "v"},
    )


async def _setup(tmp_path: Path) -> tuple[Transactions, SendPath, object]:
    node, _sm, topics, applied = world(tmp_path, CFG)
    await topics.upsert("T", 2, 2, 6)
    await topics.upsert("U", 2, 2, 6)
    txns = Transactions(applied)
    sender = SendPath(topics.ctx, topics, halves=txns.prepare)
    return txns, sender, node


def _visible(txns: Transactions, topic: str = "T") -> list[tuple[str, bytes, dict[str, str]]]:
    """Every message stored in ``topic``'s queues, as (uniq id, body, properties)."""
    sm = txns.ctx.sm
    out = []
    for q in range(2):
        cq = sm.cqs.find(topic, q)
        for position, size, _tag in cq.read(0, 100) if cq is not None else ():
            m = txns.applied.message(position, size)
            out.append((m.uniq_id, m.body, dict(m.properties)))
    return out


def test_commit_is_visible_once_and_idempotent(tmp_path: Path) -> None:
    async def body() -> None:
        txns, sender, node = await _setup(tmp_path)
        [r] = await sender.send("T", [half(1)])
        sm = txns.ctx.sm
        assert r.topic == "T" and r.queue_id == 1 and not r.duplicate
        assert _visible(txns) == [] and sm.cqs.find(HALF_TOPIC, 0).max_offset == 1
        tid = transaction_id(r.position)
        assert sm.txn.pending[r.position].uniq_id == r.uniq_id
        assert await txns.end("T", r.uniq_id, tid, commit=True) == COMMITTED
        assert _visible(txns) == [(r.uniq_id, b"body-1", {"k": "v"})]
        proposals = node.proposals  # type: ignore[attr-defined]
        # Retried (a lost answer, a new leader): answered again, nothing stored.
        assert await txns.end("T", r.uniq_id, tid, commit=True) == COMMITTED
        assert node.proposals == proposals  # type: ignore[attr-defined]
        # A commit record proposed twice (two leaders, a retry racing the first): one copy.
        copy = encode_batch([txns.applied.message(r.position)], 1 << 20)[0]
        await node.propose([encode_commit(r.position, copy)], ENTRY_TXN)  # type: ignore[attr-defined]
        assert len(_visible(txns)) == 1
        with pytest.raises(InvalidTransactionIdError, match="already COMMITTED"):
            await txns.end("T", r.uniq_id, tid, commit=False)

    asyncio.run(body())


def test_rollback_discards_and_a_retried_half_is_stored_once(tmp_path: Path) -> None:
    async def body() -> None:
        txns, sender, _node = await _setup(tmp_path)
        msg = half(2)
        [r] = await sender.send("T", [msg])
        [again] = await sender.send("T", [msg])  # the producer's retry of the same send
        assert again.duplicate and again.position == r.position
        assert len(txns.ctx.sm.txn.pending) == 1
        tid = transaction_id(r.position)
        assert await txns.end("T", r.uniq_id, tid, commit=False) == ROLLED_BACK
        assert await txns.end("T", r.uniq_id, tid, commit=False) == ROLLED_BACK
        with pytest.raises(InvalidTransactionIdError, match="already ROLLED_BACK"):
            await txns.end("T", r.uniq_id, tid, commit=True)
        assert _visible(txns) == [] and not txns.ctx.sm.txn.pending

    asyncio.run(body())


def test_unknown_foreign_and_malformed_transactions_change_nothing(tmp_path: Path) -> None:
    async def body() -> None:
        txns, sender, node = await _setup(tmp_path)
        [r] = await sender.send("T", [half(3)])
        [other] = await sender.send("U", [half(4)])
        sm = txns.ctx.sm
        before, proposals = sm.txn.capture(), node.proposals  # type: ignore[attr-defined]
        tid = transaction_id(r.position)
        for topic, uniq, txn, match in (
            ("T", r.uniq_id, transaction_id(r.position + 1), "no transaction"),
            ("T", other.uniq_id, tid, "another message"),  # another message's id
            ("U", r.uniq_id, tid, "another message"),  # the right id, another topic
            ("U", other.uniq_id, tid, "another message"),  # a foreign transaction id
            ("T", r.uniq_id, "not-hex", "16 upper-case hex"),
            ("T", r.uniq_id, tid.lower(), "16 upper-case hex"),
        ):
            with pytest.raises(InvalidTransactionIdError, match=match):
                await txns.end(topic, uniq, txn, commit=True)
        assert sm.txn.capture() == before and _visible(txns) == _visible(txns, "U") == []
        assert node.proposals == proposals  # type: ignore[attr-defined]

    asyncio.run(body())


def test_half_sends_are_checked(tmp_path: Path) -> None:
    async def body() -> None:
        txns, sender, _node = await _setup(tmp_path)
        with pytest.raises(SystemTopicError):
            await sender.send(HALF_TOPIC, [half(5)])
        with pytest.raises(Exception, match="exactly one message"):
            await sender.send("T", [half(6), half(7)])
        delayed = half(8)
        delayed.properties["DELAY"] = "2"
        with pytest.raises(Exception, match="cannot be delayed"):
            await sender.send("T", [delayed])
        assert not txns.ctx.sm.txn.pending

    asyncio.run(body())


def test_check_back_then_discard_after_the_last_check(tmp_path: Path) -> None:
    async def body() -> None:
        txns, sender, _node = await _setup(tmp_path)
        sm = txns.ctx.sm
        asked: list[list[tuple[int, int]]] = []
        sm.txn.add_check_listener(lambda hs: asked.append([(h.position, h.checks) for h in hs]))
        [r] = await sender.send("T", [half(9)])
        stored = sm.txn.pending[r.position].stored_ms
        assert await txns.check_pass(stored + 999) == stored + 1000  # immune until then
        await txns.check_pass(stored + 1000)
        assert asked == [[(r.position, 1)]]
        assert await txns.check_pass(stored + 1500) == stored + 2000  # the interval
        await txns.check_pass(stored + 2000)
        assert asked[-1] == [(r.position, 2)] and sm.txn.pending[r.position].checks == 2
        assert sm.txn.discarded == 0
        await txns.check_pass(stored + 3000)  # checked twice (the max): discarded
        assert r.position not in sm.txn.pending and sm.txn.discarded == 1
        assert sm.txn.verdict(r.position).outcome == DISCARDED  # type: ignore[union-attr]
        assert len(asked) == 2 and _visible(txns) == []
        with pytest.raises(InvalidTransactionIdError, match="already DISCARDED"):
            await txns.end("T", r.uniq_id, transaction_id(r.position), commit=True)
        # A rollback of a discarded transaction: what it asked for is true.
        assert await txns.end("T", r.uniq_id, transaction_id(r.position), False) == ROLLED_BACK

    asyncio.run(body())


def test_a_check_answered_with_commit_delivers(tmp_path: Path) -> None:
    async def body() -> None:
        txns, sender, _node = await _setup(tmp_path)
        [r] = await sender.send("T", [half(10)])
        stored = txns.ctx.sm.txn.pending[r.position].stored_ms
        await txns.check_pass(stored + 1000)
        assert txns.ctx.sm.txn.pending[r.position].checks == 1
        assert await txns.end("T", r.uniq_id, transaction_id(r.position), True) == COMMITTED
        assert [b for _, b, _ in _visible(txns)] == [b"body-10"]
        await txns.check_pass(stored + 10_000)  # resolved: never checked again
        assert not txns.ctx.sm.txn.pending and txns.ctx.sm.txn.discarded == 0

    asyncio.run(body())


def test_due_halves() -> None:
    cfg = TxnSettings(timeout_ms=100, check_interval_ms=50, check_max=2)
    halves = [
        Half(1, 10, "A" * 32, "T", 0, 1000),  # due at 1100
        Half(2, 10, "B" * 32, "T", 0, 900, checks=1, last_check_ms=1040),  # due at 1090
        Half(3, 10, "C" * 32, "T", 0, 900, checks=2, last_check_ms=1000),  # discard at 1050
    ]
    assert due_halves(halves, 1049, cfg) == ([], [], 1050)
    assert due_halves(halves, 1090, cfg) == ([(2, 1)], [(3, 2)], 1100)
    assert due_halves(halves, 1100, cfg) == ([(1, 0), (2, 1)], [(3, 2)], None)


def test_stale_and_forged_records_change_nothing(tmp_path: Path) -> None:
    async def body() -> None:
        txns, sender, node = await _setup(tmp_path)
        [r] = await sender.send("T", [half(11)])
        sm = txns.ctx.sm
        before = sm.txn.capture()
        pos = r.position
        # Stale: a check counted from another number of checks, a verdict for no half.
        await node.propose([encode_checks(OP_CHECK, 5, [(pos, 1)])], ENTRY_TXN)  # type: ignore[attr-defined]
        await node.propose([encode_checks(OP_DISCARD, 5, [(pos, 3)])], ENTRY_TXN)  # type: ignore[attr-defined]
        await node.propose([encode_rollback(pos + 7)], ENTRY_TXN)  # type: ignore[attr-defined]
        assert sm.txn.capture() == before
        skipped = sm.skip_log.skipped
        normal = encode_batch([txns.applied.message(pos)], 1 << 20)[0]
        other_batch = encode_batch([Message("T", 0, b"x", uniq_id=IDS.next_id())], 1 << 20)[0]
        for forged in (
            b"\x01",
            b"\x02\x01",  # version 2
            b"\x01\x09" + bytes(8),  # unknown op
            encode_prepare("T", 0, other_batch),  # a prepare whose message is not a half
            encode_prepare("bad topic!", 0, normal),
            encode_prepare("T", 5000, normal),
            encode_commit(pos, other_batch),  # a commit storing another message
            encode_rollback(pos) + b"\x00",
            encode_checks(OP_CHECK, 5, [(pos, 0)])[:-1],  # truncated
            encode_checks(OP_CHECK, -1 & ((1 << 63) - 1), [(pos, 0)]),  # time out of range
        ):
            await node.propose([forged], ENTRY_TXN)  # type: ignore[attr-defined]
        assert sm.skip_log.skipped == skipped + 10
        assert sm.txn.capture() == before and _visible(txns) == []
        with pytest.raises(InvalidTxnRecordError):
            decode_txn_record(b"\x01\x04" + bytes(8) + b"\x00\x00")  # a check of no halves

    asyncio.run(body())


def test_transactions_survive_a_restart(tmp_path: Path) -> None:
    async def body() -> dict[str, Any]:
        txns, sender, _node = await _setup(tmp_path)
        [a] = await sender.send("T", [half(12)])
        [b] = await sender.send("T", [half(13)])
        await txns.end("T", b.uniq_id, transaction_id(b.position), commit=True)
        await txns.check_pass(txns.ctx.sm.txn.pending[a.position].stored_ms + 1000)
        captured = txns.ctx.sm.txn.capture()
        assert len(captured["pending"]) == 1 and len(captured["resolved"]) == 1
        txns.ctx.sm.close()
        return captured

    captured = asyncio.run(body())
    sm = BrokerStateMachine(tmp_path, hash_slots=1000, max_index_records=5000)
    sm.attach(LogAgain())
    sm.applied_index()
    assert sm.txn.capture() == captured
    # A hostile snapshot: bad rows are left out, the good ones kept.
    bad = dict(captured)
    bad["pending"] = [*captured["pending"], [1, 2, "x", "T", 0, 0, 0, 0]]
    bad["resolved"] = [*captured["resolved"], [5, "A" * 32, "T", "MAYBE"]]
    assert len(sm.txn.load(bad)) == 2 and sm.txn.capture() == captured
    sm.close()


def test_a_new_leader_answers_after_it_applied_its_first_entry(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A half stored under an older leader may not be applied yet on a new one: an
    EndTransaction waits for the new leader's own first entry instead of answering "unknown"."""
    monkeypatch.setattr(manager, "CATCH_UP_WAIT_MS", 200)

    async def body() -> None:
        txns, sender, node = await _setup(tmp_path)
        [r] = await sender.send("T", [half(14)])
        tid = transaction_id(r.position)
        node.term, node.last_index = 2, txns.ctx.sm.last_applied + 1  # elected, no-op unapplied
        with pytest.raises(manager.CatchingUpError):
            await txns.end("T", r.uniq_id, tid, commit=True)
        assert r.position in txns.ctx.sm.txn.pending

        async def first_entry_later() -> None:  # any entry: the new leader's no-op
            await asyncio.sleep(0.05)
            await sender.send("U", [pb.Message(queue_id=0, body=b"x", msg_id=IDS.next_id())])

        waited = asyncio.get_running_loop().time()
        _, verdict = await asyncio.gather(
            first_entry_later(), txns.end("T", r.uniq_id, tid, commit=True)
        )
        assert verdict == COMMITTED
        assert asyncio.get_running_loop().time() - waited >= 0.04
        assert [b for _, b, _ in _visible(txns)] == [b"body-14"]

    asyncio.run(body())


def test_deleting_a_topic_rolls_back_its_halves(tmp_path: Path) -> None:
    async def body() -> None:
        txns, sender, _node = await _setup(tmp_path)
        [t] = await sender.send("T", [half(15)])
        [u] = await sender.send("U", [half(16)])
        await sender.topics.delete("U")
        assert list(txns.ctx.sm.txn.pending) == [t.position]
        assert txns.ctx.sm.txn.verdict(u.position).outcome == ROLLED_BACK  # type: ignore[union-attr]
        with pytest.raises(InvalidTransactionIdError, match="already ROLLED_BACK"):
            await txns.end("U", u.uniq_id, transaction_id(u.position), commit=True)

    asyncio.run(body())
