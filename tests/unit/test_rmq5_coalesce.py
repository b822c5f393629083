"""The v2 port's coalescing (broker.frontends.v2.coalesce): concurrent sends (acks) of one user
to one topic share a leader call; each call keeps its own results and its own errors."""

from __future__ import annotations

import asyncio
from collections.abc import Sequence
from dataclasses import replace
from typing import Any

import pytest

from broker.components.leaderops import AckRequest, LeaderRequest, SendRequest
from broker.components.sending import OutgoingMessage
from broker.frontends.internal.forwarder import Failure, Origin
from broker.frontends.v2 import coalesce
from broker.frontends.v2.coalesce import Coalescers
from broker.state.machine import SendResult
from broker.state.transactions import PROPERTY_TRANSACTION_PREPARED

TOPIC = "T"


@pytest.fixture(autouse=True)
def one_call_per_lane(request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch) -> None:
    """One leader call per lane: the rules below shown on the simplest queue (the test of
    two calls in flight keeps the module's own figure)."""
    if "two_calls" not in request.node.name:
        monkeypatch.setattr(coalesce, "MAX_LANE_CALLS", 1)


ALICE = Origin("alice", False, (("authorization", "a"),))
BOB = Origin("bob", False, (("authorization", "b"),))
TOO_BIG = b"x" * 9


class FakeLeader:
    """Answers each call once released; refuses a call holding a body of TOO_BIG (not
    retryable) and any call while ``down`` (retryable)."""

    def __init__(self) -> None:
        self.calls: list[tuple[tuple[str, ...], Origin]] = []
        self.gate = asyncio.Event()
        self.gate.set()
        self.down = False
        self.offset = 0

    async def call(self, request: LeaderRequest[Any], origin: Origin) -> Any:
        if isinstance(request, AckRequest):
            self.calls.append((request.handles, origin))
            await self.gate.wait()
            if self.down:
                raise Failure("NO_LEADER", "no leader yet", retryable=True)
            return ["INVALID_RECEIPT_HANDLE" if h == "bad" else "" for h in request.handles]
        assert isinstance(request, SendRequest)
        self.calls.append((tuple(m.msg_id for m in request.messages), origin))
        await self.gate.wait()
        if self.down:
            raise Failure("NO_LEADER", "no leader yet", retryable=True)
        if any(m.body == TOO_BIG for m in request.messages):
            raise Failure("MESSAGE_TOO_LARGE", "a body is too large")
        out = []
        for m in request.messages:
            out.append(SendResult(m.msg_id, request.topic, m.queue_id, self.offset, 0, 0))
            self.offset += 1
        return out


def _msgs(
    *ids: str, body: bytes = b"b", props: dict[str, str] | None = None
) -> list[OutgoingMessage]:
    return [OutgoingMessage(TOPIC, 0, body, msg_id=i, properties=props or {}) for i in ids]


async def _queued(
    batcher: Coalescers, leader: FakeLeader, sends: Sequence[tuple[list[OutgoingMessage], Origin]]
) -> list[asyncio.Task[list[SendResult]]]:
    """Start the sends, the first holding the (closed) gate, the rest queued behind it."""
    leader.gate.clear()
    tasks = []
    for msgs, origin in sends:
        tasks.append(asyncio.create_task(batcher.send(TOPIC, msgs, origin)))
        await asyncio.sleep(0)  # each send reaches its lane before the next starts
    return tasks


def _ids(results: object) -> list[str]:
    assert isinstance(results, list)
    return [r.uniq_id for r in results]


def test_sends_that_queue_leave_together_each_with_its_own_results() -> None:
    async def run() -> None:
        leader = FakeLeader()
        b = Coalescers(leader.call)
        tasks = await _queued(
            b, leader, [(_msgs("a"), ALICE), (_msgs("b", "c"), ALICE), (_msgs("d"), ALICE)]
        )
        leader.gate.set()
        results = await asyncio.gather(*tasks)
        assert [_ids(r) for r in results] == [["a"], ["b", "c"], ["d"]]
        assert [c[0] for c in leader.calls] == [("a",), ("b", "c", "d")]
        assert b.sends.stats.calls == 2 and b.sends.stats.carried == 3
        assert not b.sends._lanes  # an idle lane is forgotten

    asyncio.run(run())


def test_one_send_alone_goes_at_once() -> None:
    async def run() -> None:
        leader = FakeLeader()
        b = Coalescers(leader.call)
        assert _ids(await b.send(TOPIC, _msgs("a"), ALICE)) == ["a"]
        assert _ids(await b.send(TOPIC, _msgs("b"), ALICE)) == ["b"]
        assert [c[0] for c in leader.calls] == [("a",), ("b",)]

    asyncio.run(run())


def test_users_do_not_share_a_call() -> None:
    async def run() -> None:
        leader = FakeLeader()
        b = Coalescers(leader.call)
        tasks = await _queued(
            b,
            leader,
            [(_msgs("a"), ALICE), (_msgs("b"), BOB), (_msgs("c"), ALICE), (_msgs("d"), BOB)],
        )
        leader.gate.set()
        await asyncio.gather(*tasks)
        by_user = {(ids, o.user) for ids, o in leader.calls}
        assert by_user == {(("a",), "alice"), (("b",), "bob"), (("c",), "alice"), (("d",), "bob")}

    asyncio.run(run())


def test_a_bad_message_fails_only_its_own_send() -> None:
    async def run() -> None:
        leader = FakeLeader()
        b = Coalescers(leader.call)
        tasks = await _queued(
            b,
            leader,
            [
                (_msgs("a"), ALICE),
                (_msgs("b"), ALICE),
                (_msgs("c", body=TOO_BIG), ALICE),
                (_msgs("d"), ALICE),
            ],
        )
        leader.gate.set()
        results = await asyncio.gather(*tasks, return_exceptions=True)
        assert _ids(results[0]) == ["a"] and _ids(results[1]) == ["b"] and _ids(results[3]) == ["d"]
        assert isinstance(results[2], Failure) and results[2].code == "MESSAGE_TOO_LARGE"
        assert b.sends.stats.splits == 1
        assert [c[0] for c in leader.calls] == [("a",), ("b", "c", "d"), ("b",), ("c",), ("d",)]

    asyncio.run(run())


def test_a_retryable_failure_is_every_sends_answer_without_a_split() -> None:
    async def run() -> None:
        leader = FakeLeader()
        b = Coalescers(leader.call)
        tasks = await _queued(
            b, leader, [(_msgs("a"), ALICE), (_msgs("b"), ALICE), (_msgs("c"), ALICE)]
        )
        leader.down = True
        leader.gate.set()
        results = await asyncio.gather(*tasks, return_exceptions=True)
        assert all(isinstance(r, Failure) and r.code == "NO_LEADER" for r in results)
        assert [c[0] for c in leader.calls] == [("a",), ("b", "c")]
        assert b.sends.stats.splits == 0

    asyncio.run(run())


def test_a_retry_of_a_send_in_flight_goes_alone_at_once() -> None:
    async def run() -> None:
        leader = FakeLeader()
        b = Coalescers(leader.call)
        tasks = await _queued(
            b, leader, [(_msgs("a"), ALICE), (_msgs("b"), ALICE), (_msgs("a"), ALICE)]
        )
        # The retry of "a" did not queue behind the call holding "a": it went, alone.
        assert [c[0] for c in leader.calls] == [("a",), ("a",)]
        leader.gate.set()
        await asyncio.gather(*tasks)
        assert [c[0] for c in leader.calls] == [("a",), ("a",), ("b",)]

    asyncio.run(run())


def test_a_half_message_goes_alone() -> None:
    async def run() -> None:
        leader = FakeLeader()
        b = Coalescers(leader.call)
        half = _msgs("h", props={PROPERTY_TRANSACTION_PREPARED: "true"})
        tasks = await _queued(b, leader, [(_msgs("a"), ALICE), (half, ALICE), (_msgs("b"), ALICE)])
        assert [c[0] for c in leader.calls] == [("a",), ("h",)]
        leader.gate.set()
        await asyncio.gather(*tasks)
        assert [c[0] for c in leader.calls] == [("a",), ("h",), ("b",)]

    asyncio.run(run())


def test_a_send_whose_call_ended_while_queued_is_left_out() -> None:
    async def run() -> None:
        leader = FakeLeader()
        b = Coalescers(leader.call)
        tasks = await _queued(
            b, leader, [(_msgs("a"), ALICE), (_msgs("b"), ALICE), (_msgs("c"), ALICE)]
        )
        tasks[1].cancel()
        leader.gate.set()
        results = await asyncio.gather(*tasks, return_exceptions=True)
        assert isinstance(results[1], asyncio.CancelledError)
        assert _ids(results[2]) == ["c"]
        assert [c[0] for c in leader.calls] == [("a",), ("c",)]

    asyncio.run(run())


def test_a_batch_stays_within_its_bounds(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(coalesce, "SEND_SHAPE", replace(coalesce.SEND_SHAPE, max_items=3))

    async def run() -> None:
        leader = FakeLeader()
        b = Coalescers(leader.call)
        sends = [(_msgs(f"m{i}"), ALICE) for i in range(8)]
        tasks = await _queued(b, leader, sends)
        leader.gate.set()
        results = await asyncio.gather(*tasks)
        assert [_ids(r) for r in results] == [[f"m{i}"] for i in range(8)]
        assert [len(c[0]) for c in leader.calls] == [1, 3, 3, 1]

    asyncio.run(run())


def test_close_cancels_the_queued_sends() -> None:
    async def run() -> None:
        leader = FakeLeader()
        b = Coalescers(leader.call)
        tasks = await _queued(b, leader, [(_msgs("a"), ALICE), (_msgs("b"), ALICE)])
        await b.close()
        with pytest.raises(asyncio.CancelledError):
            await tasks[1]
        leader.gate.set()
        assert _ids(await tasks[0]) == ["a"]  # the call in flight still answers
        assert [c[0] for c in leader.calls] == [("a",)]
        assert not b.sends._lanes and not b.sends._pumps

    asyncio.run(run())


def test_acks_that_queue_leave_together_each_with_its_own_codes() -> None:
    async def run() -> None:
        leader = FakeLeader()
        b = Coalescers(leader.call)
        leader.gate.clear()
        calls = [
            ("G", "T", ("h1",)),
            ("G", "T", ("h2", "bad")),
            ("G2", "T", ("h3",)),
            ("G", "T", ("h4",)),
        ]
        tasks = []
        for group, topic, handles in calls:
            tasks.append(asyncio.create_task(b.ack(group, topic, handles, ALICE)))
            await asyncio.sleep(0)
        leader.gate.set()
        results = await asyncio.gather(*tasks)
        assert results == [[""], ["", "INVALID_RECEIPT_HANDLE"], [""], [""]]
        # G's first ack alone, G2's alone (its own lane), then G's two queued ones together.
        assert [c[0] for c in leader.calls] == [("h1",), ("h3",), ("h2", "bad", "h4")]

    asyncio.run(run())


def test_a_failed_ack_batch_is_every_calls_answer() -> None:
    async def run() -> None:
        leader = FakeLeader()
        b = Coalescers(leader.call)
        leader.gate.clear()
        tasks = []
        for h in ("h1", "h2", "h3"):
            tasks.append(asyncio.create_task(b.ack("G", "T", (h,), ALICE)))
            await asyncio.sleep(0)
        leader.down = True
        leader.gate.set()
        results = await asyncio.gather(*tasks, return_exceptions=True)
        assert all(isinstance(r, Failure) for r in results)
        assert [c[0] for c in leader.calls] == [("h1",), ("h2", "h3")]

    asyncio.run(run())


def test_two_calls_go_at_once_and_the_rest_queue_behind_them() -> None:
    async def run() -> None:
        leader = FakeLeader()
        b = Coalescers(leader.call)
        tasks = await _queued(b, leader, [(_msgs(f"m{i}"), ALICE) for i in range(5)])
        assert [c[0] for c in leader.calls] == [("m0",), ("m1",)]  # two out, three queued
        leader.gate.set()
        results = await asyncio.gather(*tasks)
        assert [_ids(r) for r in results] == [[f"m{i}"] for i in range(5)]
        assert [c[0] for c in leader.calls] == [("m0",), ("m1",), ("m2", "m3", "m4")]
        assert not b.sends._lanes and not b.sends._pumps

    asyncio.run(run())
