"""Timed delivery on a real state machine, without gRPC: the level rules (broker.state.timerrules),
the send path's timer branch, the leader's loop (broker.components.timermoves) under a fake clock,
the move entries' checks on apply, and the state across a snapshot."""

from __future__ import annotations

import asyncio
import random
import time
from pathlib import Path
from typing import Any

import pytest
from broker_world import LeaderNode, world
from raftmq.broker.v1 import broker_pb2 as pb

from broker.components.applied import AppliedMessages, NodeContext, Wakeup
from broker.components.sending import SendPath
from broker.components.settings import ServiceConfig
from broker.components.timermoves import TIMER_EMPTY_WAIT_MS, TIMER_IDLE_MS, Timers
from broker.state.machine import BrokerStateMachine
from broker.state.message import Message, encode_batch
from broker.state.names import TIMER_TOPIC, is_system_topic
from broker.state.records import ENTRY_MESSAGES, ENTRY_TIMER
from broker.state.timerrules import (
    MAX_TIMER_LEVELS,
    PROPERTY_TIMER_DELIVER_MS,
    TIMER_PRECISION_MS,
    InvalidDeliveryTimeError,
    encode_hop,
    encode_timer_header,
    level_of,
    level_wait_ms,
)
from dledger.core import Role

T0_MS = 1_800_000_000_000


class Clock:
    """time.time() for the broker's modules, moved by the test."""

    def __init__(self) -> None:
        self.now_ms = T0_MS

    def __call__(self) -> float:
        return self.now_ms / 1000


@pytest.fixture
def clock(monkeypatch: pytest.MonkeyPatch) -> Clock:
    c = Clock()
    monkeypatch.setattr(time, "time", c)
    return c


def timed(n: int, deliver_ms: int, queue_id: int = 0) -> pb.Message:
    return pb.Message(
        topic="T",
        queue_id=queue_id,
        body=f"body-{n}".encode(),
        msg_id=f"{n:032X}",
        properties={PROPERTY_TIMER_DELIVER_MS: str(deliver_ms), "k": "v"},
    )


async def _timed_world(
    tmp_path: Path, queues: int, cfg: ServiceConfig | None = None
) -> tuple[Any, BrokerStateMachine, AppliedMessages, SendPath]:
    """A one-node leader with topic T of ``queues`` queues, and its send path."""
    node, sm, topics, applied = world(tmp_path, cfg)
    await topics.upsert("T", queues, queues, 6)
    return node, sm, applied, SendPath(topics.ctx, topics)


def delivered(sm: BrokerStateMachine, applied: AppliedMessages) -> list[Message]:
    out = []
    for queue_id in range(2):
        cq = sm.cqs.find("T", queue_id)
        if cq is not None:
            out += [applied.message(r[0]) for r in cq.read(0, 10_000)]
    return out


def test_levels_halve_what_is_left_so_a_record_only_moves_down() -> None:
    rng = random.Random(7)
    assert level_of(0) == 0 and level_of(TIMER_PRECISION_MS - 1) == 0
    assert level_of(TIMER_PRECISION_MS) == 1 and level_of(2 * TIMER_PRECISION_MS) == 2
    assert level_of(10**18) == MAX_TIMER_LEVELS - 1
    for _ in range(2000):
        remaining = rng.randrange(1, 259_200_000)
        hops = 0
        level = level_of(remaining)
        while level > 0:
            # At its look-at time it has less than its level's wait left: strictly lower.
            remaining -= level_wait_ms(level)
            assert remaining >= 0
            lower = level_of(remaining)
            assert lower < level
            level, hops = lower, hops + 1
        assert hops <= 21  # 3 days: at most one record per level


async def _run_until(timers: Timers, clock: Clock, end_ms: int, step_ms: int) -> None:
    while clock.now_ms < end_ms:
        clock.now_ms += step_ms
        await timers.run_pass()


def test_timed_messages_arrive_at_their_time_never_before(tmp_path: Path, clock: Clock) -> None:
    async def body() -> None:
        node, sm, applied, sender = await _timed_world(tmp_path, 2)
        rng = random.Random(3)
        due = {n: T0_MS + rng.randrange(1, 20_000) for n in range(300)}
        results = await sender.send("T", [timed(n, d, n % 2) for n, d in due.items()])
        assert {r.topic for r in results} == {TIMER_TOPIC}
        assert [r.queue_id for r in results] == [n % 2 for n in due]  # the producer's queue
        assert delivered(sm, applied) == []
        timers = Timers(applied)
        seen: dict[int, int] = {}
        while clock.now_ms < T0_MS + 21_000:
            await _run_until(timers, clock, clock.now_ms + 100, 100)
            for m in delivered(sm, applied):
                n = int(m.uniq_id, 16)
                seen.setdefault(n, clock.now_ms)
        assert sorted(seen) == sorted(due)
        lateness = [seen[n] - due[n] for n in due]
        assert min(lateness) >= 0, "delivered before its time"
        assert max(lateness) <= TIMER_PRECISION_MS + 100
        for m in delivered(sm, applied):
            n = int(m.uniq_id, 16)
            assert m.body == f"body-{n}".encode() and m.queue_id == n % 2
            assert m.properties["k"] == "v" and m.store_timestamp_ms >= due[n]
            assert m.properties[PROPERTY_TIMER_DELIVER_MS] == str(due[n])
        assert len(delivered(sm, applied)) == 300  # each once
        moves = node.proposals
        await _run_until(timers, clock, clock.now_ms + 5000, 500)
        assert node.proposals == moves and len(delivered(sm, applied)) == 300

    asyncio.run(body())


def test_a_time_in_the_past_is_stored_at_once_and_beyond_the_maximum_refused(
    tmp_path: Path, clock: Clock
) -> None:
    async def body() -> None:
        cfg = ServiceConfig("127.0.0.1", 10911, timer_max_delay_ms=60_000)
        node, sm, _applied, sender = await _timed_world(tmp_path, 2, cfg)
        [now] = await sender.send("T", [timed(1, T0_MS - 5)])
        assert now.topic == "T"
        entries = len(node.store.entries)
        bad = [
            [timed(2, T0_MS + 60_001)],  # beyond timerMaxDelaySec
            [timed(3, T0_MS + 1000), timed(4, T0_MS + 61_000)],  # one of a batch
        ]
        for batch in bad:
            with pytest.raises(InvalidDeliveryTimeError, match="timerMaxDelaySec"):
                await sender.send("T", batch)
        for raw in ("soon", "-5", "1" * 19, ""):
            m = timed(5, 0)
            m.properties[PROPERTY_TIMER_DELIVER_MS] = raw
            with pytest.raises(InvalidDeliveryTimeError):
                await sender.send("T", [m])
        both = timed(6, T0_MS + 1000)
        both.properties["DELAY"] = "2"
        with pytest.raises(InvalidDeliveryTimeError, match="one only"):
            await sender.send("T", [both])
        assert len(node.store.entries) == entries  # nothing stored
        assert sm.cqs.find(TIMER_TOPIC, level_of(1000)) is None
        assert is_system_topic(TIMER_TOPIC)

    asyncio.run(body())


def test_a_repeated_or_stale_move_is_skipped_whole(tmp_path: Path, clock: Clock) -> None:
    async def body() -> None:
        node, sm, applied, sender = await _timed_world(tmp_path, 1)
        await sender.send("T", [timed(n, T0_MS + 100) for n in range(3)])
        timers = Timers(applied)
        clock.now_ms += 100
        move = timers._gather(0)
        assert move is not None and (move.start, move.end, len(move.copies)) == (0, 3, 3)
        body_ = encode_timer_header(0, 0, 3, clock.now_ms, 0) + encode_batch(move.copies)[0]
        await node.propose([body_], ENTRY_TIMER)
        await node.propose([body_], ENTRY_TIMER)  # a deposed leader's repeat
        assert sm.timer_offsets[0] == 3 and len(delivered(sm, applied)) == 3
        assert sm.skip_log.skipped == 0  # stale, not invalid

    asyncio.run(body())


def test_forged_move_entries_change_nothing(tmp_path: Path, clock: Clock) -> None:
    async def body() -> None:
        node, sm, applied, sender = await _timed_world(tmp_path, 1)
        [r] = await sender.send("T", [timed(1, T0_MS + 10_000)])
        level = level_of(10_000)
        copy = Message("T", 0, b"x", uniq_id="AB" * 16, store_timestamp_ms=T0_MS)
        into_timer = Message(TIMER_TOPIC, 0, b"x", uniq_id="CD" * 16, store_timestamp_ms=T0_MS)
        hop = encode_hop(0, r.position, 100, T0_MS)
        forged = [
            encode_timer_header(level, 0, 2, T0_MS, 0),  # past the records it holds
            encode_timer_header(level, 0, 1, T0_MS, 0) + encode_batch([copy, copy])[0],
            encode_timer_header(level, 0, 1, T0_MS, 0) + encode_batch([into_timer])[0],
            encode_timer_header(level, 0, 1, T0_MS, 1) + encode_hop(0, 1 << 40, 100, T0_MS),
            encode_timer_header(level, 0, 1, T0_MS, 1) + hop + encode_batch([copy])[0],
            encode_timer_header(level, 0, 1, T0_MS, 1) + encode_hop(MAX_TIMER_LEVELS, 0, 99, 0),
            encode_timer_header(level, 0, 1, T0_MS, 2) + hop,  # truncated
            b"\x09" + encode_timer_header(level, 0, 1, T0_MS, 0)[1:],  # version
        ]
        for raw in forged:
            await node.propose([raw], ENTRY_TIMER)
        assert sm.skip_log.skipped == len(forged)
        assert sm.timer_offsets == {} and delivered(sm, applied) == []
        assert [sm.cqs.find(TIMER_TOPIC, q) for q in range(level)] == [None] * level

    asyncio.run(body())


def test_pending_timers_survive_a_restart(tmp_path: Path, clock: Clock) -> None:
    async def body() -> None:
        node, sm, applied, sender = await _timed_world(tmp_path, 1)
        await sender.send("T", [timed(n, T0_MS + 1000 * (n + 1)) for n in range(20)])
        timers = Timers(applied)
        await _run_until(timers, clock, T0_MS + 10_500, 100)
        assert len(delivered(sm, applied)) == 10
        offsets = dict(sm.timer_offsets)
        sm.close()
        # Restarted from the snapshot, and rebuilt from the whole log: the same levels, and
        # a new leader delivers exactly the other ten, on time.
        for rebuild in (False, True):
            if rebuild:
                (tmp_path / "config" / "snapshot.json").unlink()
            again = BrokerStateMachine(tmp_path, hash_slots=1000, max_index_records=5000)
            again.attach(node.store)
            assert again.applied_index() == (0 if rebuild else len(node.store.entries))
            again.apply(node.store.entries[again.last_applied :])
            assert again.timer_offsets == offsets
            again.close()
        again = BrokerStateMachine(tmp_path, hash_slots=1000, max_index_records=5000)
        again.attach(node.store)
        again.applied_index()
        again.on_role_change(Role.LEADER, 2, "n0")
        leader = LeaderNode(again, node.store)
        new = AppliedMessages(NodeContext(leader, again, ServiceConfig("127.0.0.1", 10911)))  # type: ignore[arg-type]
        await _run_until(Timers(new), clock, T0_MS + 21_000, 100)
        got = {int(m.uniq_id, 16): m.store_timestamp_ms for m in delivered(again, new)}
        assert sorted(got) == list(range(20))
        assert all(T0_MS + 1000 * (n + 1) <= ts for n, ts in got.items())
        again.close()

    asyncio.run(body())


def test_a_raftmq_message_carries_its_delivery_time() -> None:
    from client.message import Message as ClientMessage

    m = ClientMessage("T", b"x", deliver_time_ms=T0_MS).to_pb(0, "g", "h")
    assert m.properties[PROPERTY_TIMER_DELIVER_MS] == str(T0_MS)
    assert ENTRY_MESSAGES != ENTRY_TIMER


def test_an_empty_timer_loop_sleeps_until_a_timed_message_is_stored(
    tmp_path: Path, clock: Clock
) -> None:
    """Every level empty: the pass asks for the long wait, and storing a timed message ends
    it (a dispatch listener); a message of another topic does not."""

    async def body() -> None:
        _node, _sm, _applied, sender = await _timed_world(tmp_path, 1)
        timers = Timers(_applied)
        assert await timers._pass() == TIMER_EMPTY_WAIT_MS / 1000
        sleeping = asyncio.ensure_future(timers.wakeup.sleep(30))
        await sender.send("T", [pb.Message(topic="T", queue_id=0, body=b"plain")])
        for _ in range(5):
            await asyncio.sleep(0)
        assert not sleeping.done()
        await sender.send("T", [timed(1, T0_MS + 5_000)])
        await asyncio.wait_for(sleeping, 5)
        # Records pending: the pass polls at its own pace again.
        assert await timers._pass() <= TIMER_IDLE_MS / 1000

    asyncio.run(body())


def test_a_wakeup_cuts_only_long_sleeps_and_remembers_a_wake_during_the_pass() -> None:
    async def body() -> None:
        w = Wakeup(poll_s=0.05)
        w.wake()  # during the pass: the next long sleep returns at once
        await asyncio.wait_for(w.sleep(30), 5)
        start = time.monotonic()
        short = asyncio.ensure_future(w.sleep(0.05))
        await asyncio.sleep(0)
        w.wake()  # a job with work pending keeps its pace
        await short
        assert time.monotonic() - start >= 0.045
        long = asyncio.ensure_future(w.sleep(30))
        await asyncio.sleep(0)
        w.wake()
        await asyncio.wait_for(long, 5)

    asyncio.run(body())
