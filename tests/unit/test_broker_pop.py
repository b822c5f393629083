"""POP consumption on a real state machine, without gRPC: receive, ack, change the invisible
time, redelivery with attempt + 1, dead letters after the max attempts, receipt handles, stale
and forged records, limits and the snapshot."""

from __future__ import annotations

import asyncio
import time
from pathlib import Path

import pytest
from broker_world import reopen, world
from raftmq.broker.v1 import broker_pb2 as pb

from broker.components.pop import InvalidInvisibleTimeError, Pops, Received, ReceiveQuery
from broker.components.retry import Retries
from broker.components.sending import SendPath
from broker.state.errors import InvalidRequestError
from broker.state.message import UniqIdGenerator
from broker.state.popstate import (
    OP_ACK,
    OP_CHANGE,
    OP_POP,
    Handle,
    InvalidPopRecordError,
    InvalidReceiptHandleError,
    PopRecord,
    decode_handle,
    decode_pop_record,
    encode_handle,
    encode_pop_record,
)
from broker.state.records import ENTRY_POP

MIN_INVISIBLE_MS = 1000
IDS = UniqIdGenerator(ip="10.0.0.2", pid=8, instance_hash=2)


def outgoing(queue_id: int, n: int) -> pb.Message:
    return pb.Message(queue_id=queue_id, body=f"body-{n}".encode(), msg_id=IDS.next_id(), tags="A")


async def _setup(tmp_path: Path, messages: int = 6, max_attempts: int = 2) -> tuple[Pops, object]:
    node, _sm, topics, applied = world(tmp_path)
    await topics.upsert("T", 2, 2, 6)
    sender = SendPath(topics.ctx, topics)
    await sender.send("T", [outgoing(i % 2, i) for i in range(messages)])
    pops = Pops(topics, applied, Retries(topics, applied, sender), max_attempts, MIN_INVISIBLE_MS)
    return pops, node


def _query(group: str = "G", batch: int = 32, invisible_ms: int = 5000) -> ReceiveQuery:
    return ReceiveQuery(group, "T", -1, batch, invisible_ms)


def test_receive_ack_and_a_second_group_independently(tmp_path: Path) -> None:
    async def body() -> None:
        pops, _node = await _setup(tmp_path)
        got = await pops.receive(_query())
        assert sorted(r.message.body for r in got) == [f"body-{i}".encode() for i in range(6)]
        assert {r.attempt for r in got} == {1}
        assert await pops.receive(_query()) == []  # all in flight
        assert await pops.ack("G", "T", [r.receipt_handle for r in got]) == [None] * 6
        assert pops.ctx.sm.pop.inflight_total == 0
        # A repeated ack changes nothing and is answered OK (idempotent).
        assert await pops.ack("G", "T", [got[0].receipt_handle]) == [None]
        other = await pops.receive(_query("G2"))
        assert len(other) == 6

    asyncio.run(body())


def test_expired_messages_come_again_with_attempt_two_then_go_to_the_dlq(tmp_path: Path) -> None:
    async def body() -> None:
        pops, _node = await _setup(tmp_path, messages=2)
        sm = pops.ctx.sm
        first = await pops.receive(_query())
        deadlines = [r.deadline_ms for q in sm.pop.queues.values() for r in q.inflight.values()]
        assert await pops.revive_once(min(deadlines) - 1) == 0  # not yet due
        assert await pops.revive_once(max(deadlines)) == 2
        again = await pops.receive(_query())
        assert sorted(r.queue_offset for r in again) == sorted(r.queue_offset for r in first)
        assert {r.attempt for r in again} == {2}
        # The first delivery's handles are dead.
        errors = await pops.ack("G", "T", [first[0].receipt_handle])
        assert isinstance(errors[0], InvalidReceiptHandleError)
        deadline = max(r.deadline_ms for q in sm.pop.queues.values() for r in q.inflight.values())
        assert await pops.revive_once(deadline) == 2  # attempt 2 of 2: dead letters
        assert sm.pop.inflight_total == 0
        dlq = [sm.cqs.find("%DLQ%G", 0)]
        assert dlq[0] is not None and dlq[0].max_offset == 2
        assert await pops.receive(_query()) == []

    asyncio.run(body())


def test_change_invisible_gives_a_new_handle_and_kills_the_old(tmp_path: Path) -> None:
    async def body() -> None:
        pops, _node = await _setup(tmp_path, messages=1)
        (got,) = await pops.receive(_query())
        for invisible_ms in (-1, 12 * 3600 * 1000 + 1):  # a nack may be shorter than a receive
            with pytest.raises(InvalidInvisibleTimeError):
                await pops.change_invisible("G", "T", got.receipt_handle, invisible_ms)
        with pytest.raises(InvalidReceiptHandleError):
            await pops.change_invisible("G2", "T", got.receipt_handle, 5000)
        changed = await pops.change_invisible("G", "T", got.receipt_handle, 60_000)
        assert changed.receipt_handle != got.receipt_handle
        assert changed.message.body == got.message.body
        with pytest.raises(InvalidReceiptHandleError):
            await pops.change_invisible("G", "T", got.receipt_handle, 5000)
        (old,) = await pops.ack("G", "T", [got.receipt_handle])
        assert isinstance(old, InvalidReceiptHandleError)
        assert await pops.ack("G", "T", [changed.receipt_handle]) == [None]

    asyncio.run(body())


def test_a_push_nack_waits_the_group_backoff_read_on_the_leader(tmp_path: Path) -> None:
    """A push consumer's nack (``backoff_floor``) stays invisible at least for the group's
    backoff after the delivery's attempt, whatever short time it asks for; a plain change keeps
    its own time. The CI race this pins: the member taking the nack had not applied the
    delivery yet and asked the leader for the client's 2 ms."""

    async def body() -> None:
        pops, _node = await _setup(tmp_path, messages=2)
        first, second = await pops.receive(_query())
        backoff_ms = pops.group("G").backoff.delay_ms(first.attempt)
        assert backoff_ms >= 1000
        before_ms = int(time.time() * 1000)
        floored = await pops.change_invisible("G", "T", first.receipt_handle, 2, backoff_floor=True)
        plain = await pops.change_invisible("G", "T", second.receipt_handle, 2)

        def deadline_ms(r: Received) -> int:
            state = pops.ctx.sm.pop.get(("G", "T", r.queue_id))
            assert state is not None
            return state.inflight[r.queue_offset].deadline_ms

        assert deadline_ms(floored) >= before_ms + backoff_ms
        assert deadline_ms(plain) <= int(time.time() * 1000) + 2

    asyncio.run(body())


def test_bad_receives_are_refused(tmp_path: Path) -> None:
    async def body() -> None:
        pops, _node = await _setup(tmp_path, messages=1)
        for q in (_query(batch=0), _query(batch=33), _query(group="bad group!")):
            with pytest.raises(InvalidRequestError):
                await pops.receive(q)
        for invisible_ms in (MIN_INVISIBLE_MS - 1, 12 * 3600 * 1000 + 1):
            with pytest.raises(InvalidInvisibleTimeError):
                await pops.receive(_query(invisible_ms=invisible_ms))
        assert pops.ctx.sm.pop.queues == {}

    asyncio.run(body())


def test_handles_round_trip_and_malformed_ones_are_refused() -> None:
    h = Handle("G", "T", 3, 17, 99)
    assert decode_handle(encode_handle(h)) == h
    text = encode_handle(h)
    for bad in ("", "x" * 2000, "!!!!", text[:-3], text + "AAAA"):
        with pytest.raises(InvalidReceiptHandleError):
            decode_handle(bad)


def test_stale_and_forged_records_change_nothing(tmp_path: Path) -> None:
    async def body() -> None:
        pops, node = await _setup(tmp_path, messages=2)
        sm = pops.ctx.sm
        await pops.receive(_query(batch=1))
        before = sm.pop.capture()
        key = next(iter(sm.pop.queues))
        # A deposed leader's pop from an old position, an ack with a wrong sequence.
        stale = PopRecord(OP_POP, *key, 1, 10, 0, 1, ((0, 0),))
        await node.propose([encode_pop_record(stale)], ENTRY_POP)
        await node.propose([encode_pop_record(PopRecord(OP_ACK, *key, items=((0, 1),)))], ENTRY_POP)
        assert sm.pop.capture() == before
        skipped = sm.skip_log.skipped
        for forged in (
            b"\x01",
            encode_pop_record(PopRecord(OP_POP, "bad group!", "T", 0, 1, 10, 0, 1)),
            encode_pop_record(PopRecord(OP_POP, *key, 10, 5, 1, 2)),  # deadline before now
            encode_pop_record(PopRecord(OP_CHANGE, *key, 10, 0, items=((0, 2),))),  # ditto
            encode_pop_record(PopRecord(OP_POP, *key, 1, 10, 1, 2, ((5, 0),))),  # out of range
        ):
            await node.propose([forged], ENTRY_POP)
        assert sm.skip_log.skipped == skipped + 5
        assert sm.pop.capture() == before
        with pytest.raises(InvalidPopRecordError):
            decode_pop_record(b"\x01\x01")

    asyncio.run(body())


def test_pop_state_survives_a_restart(tmp_path: Path) -> None:
    async def body() -> list[object]:
        pops, _node = await _setup(tmp_path, messages=3)
        await pops.receive(_query(batch=2))
        captured = pops.ctx.sm.pop.capture()
        pops.ctx.sm.close()
        return captured

    captured = asyncio.run(body())
    sm = reopen(tmp_path)
    assert sm.pop.capture() == captured and sm.pop.inflight_total == 2
    sm.close()


def test_a_receive_pops_its_queues_at_once_so_their_records_commit_together(
    tmp_path: Path,
) -> None:
    """Before, a receive over several queues proposed one queue's record, waited for its
    commit, then the next's: under load one receive cost a replication round per queue."""

    async def body() -> None:
        pops, node = await _setup(tmp_path)  # 3 messages in each of 2 queues
        node.gate = asyncio.Event()  # proposals wait: the first commits only when opened
        receive = asyncio.create_task(pops.receive(_query()))
        for _ in range(100):
            await asyncio.sleep(0)
            if node.proposals == 2:
                break
        assert node.proposals == 2  # both queues' records proposed before either committed
        node.gate.set()
        got = await receive
        assert sorted(r.message.body for r in got) == [f"body-{i}".encode() for i in range(6)]

    asyncio.run(body())


def test_a_round_takes_no_more_than_the_batch_and_skips_what_the_filter_leaves(
    tmp_path: Path,
) -> None:
    async def body() -> None:
        _node, _sm, topics, applied = world(tmp_path)
        await topics.upsert("T", 3, 3, 6)
        sender = SendPath(topics.ctx, topics)
        tagged = [
            pb.Message(queue_id=q, body=f"{tag}{i}".encode(), msg_id=IDS.next_id(), tags=tag)
            for i in range(4)
            for q, tag in ((0, "B"), (1, "A"), (2, "A"))
        ]
        await sender.send("T", tagged)
        retries = Retries(topics, applied, sender)
        pops = Pops(topics, applied, retries, 2, MIN_INVISIBLE_MS)
        # Only A: whichever queue a round starts at, queue 0's B messages give nothing and
        # the receive goes on to the others in the same call, without waiting.
        got = await pops.receive(ReceiveQuery("G", "T", -1, 5, 5000, "A"))
        assert len(got) == 5 and {r.message.tags for r in got} == {"A"}
        rest = await pops.receive(ReceiveQuery("G", "T", -1, 32, 5000, "A"))
        assert len(rest) == 3
        assert sorted(r.message.body for r in got + rest) == sorted(
            m.body for m in tagged if m.tags == "A"
        )
        assert await pops.receive(ReceiveQuery("G", "T", -1, 32, 5000, "A")) == []

    asyncio.run(body())
