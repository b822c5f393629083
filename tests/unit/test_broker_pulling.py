"""Pulls and long polls on a real state machine, without gRPC."""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from pathlib import Path

import pytest
from broker_world import world

from broker.components.pulling import PullPath, PullQuery, PullStatus
from broker.state.errors import TooManyLongPollsError
from broker.state.message import Message, UniqIdGenerator, decode_message, encode_batch
from broker.state.records import ENTRY_MESSAGES

IDS = UniqIdGenerator(ip="10.0.0.1", pid=7, instance_hash=1)


async def store(node: object, tags: list[str], queue_id: int = 0) -> None:
    msgs = [
        Message("T", queue_id, f"b{i}".encode(), tags=t, uniq_id=IDS.next_id())
        for i, t in enumerate(tags)
    ]
    await node.propose([encode_batch(msgs)[0]], ENTRY_MESSAGES)  # type: ignore[attr-defined]


def decoded(raw: bytes, positions: list[int]) -> list[Message]:
    """Split a pull answer's stored bytes by the sizes in each message's head."""
    out, at = [], 0
    for _ in positions:
        size = int.from_bytes(raw[at : at + 4], "big")
        out.append(decode_message(raw[at : at + size]))
        at += size
    assert at == len(raw)
    return out


def test_a_pull_answers_stored_bytes_filtered_by_tag(tmp_path: Path) -> None:
    async def body() -> None:
        node, _sm, topics, applied = world(tmp_path)
        await topics.upsert("T", 2, 2, 6)
        puller = PullPath(topics, applied)
        await store(node, ["A", "B", "A", "C"])
        got = await puller.pull(PullQuery("T", 0, 0, subscription="A || C"), "peer")
        assert got.status is PullStatus.FOUND
        assert got.queue_offsets == [0, 2, 3] and got.next_begin_offset == 4
        msgs = decoded(got.raw, got.positions)
        assert [m.tags for m in msgs] == ["A", "A", "C"]
        assert [m.body for m in msgs] == [b"b0", b"b2", b"b3"]
        assert [applied.message(p).body for p in got.positions] == [m.body for m in msgs]
        two = await puller.pull(PullQuery("T", 0, 1, max_msgs=2), "peer")
        assert two.queue_offsets == [1, 2] and two.next_begin_offset == 3
        none = await puller.pull(PullQuery("T", 0, 0, subscription="Z"), "peer")
        assert none.status is PullStatus.NO_MATCHED_MSG and none.next_begin_offset == 4
        bad = await puller.pull(PullQuery("T", 0, 9), "peer")
        assert bad.status is PullStatus.OFFSET_ILLEGAL and bad.next_begin_offset == 4
        empty = await puller.pull(PullQuery("T", 1, 0, no_suspend=True), "peer")
        assert empty.status is PullStatus.NO_NEW_MSG and empty.raw == b""

    asyncio.run(body())


def test_a_long_poll_wakes_for_its_tag_only_and_leaves_no_waiter(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    async def body() -> None:
        node, _sm, topics, applied = world(tmp_path)
        await topics.upsert("T", 2, 2, 6)
        puller = PullPath(topics, applied)
        query = PullQuery("T", 0, 0, subscription="B", suspend_timeout_ms=5000)
        held = asyncio.ensure_future(puller.pull(query, "p1"))
        await asyncio.sleep(0.01)
        assert len(puller.polls) == 1
        await store(node, ["A"])  # another tag: the poll keeps waiting
        await asyncio.sleep(0.01)
        assert not held.done()
        await store(node, ["B"])
        got = await asyncio.wait_for(held, 1)
        assert got.status is PullStatus.FOUND and got.queue_offsets == [1]
        assert len(puller.polls) == 0 and puller.polls.queues() == 0
        monkeypatch.setattr("broker.components.pulling.MAX_LONG_POLLS_PER_PEER", 1)
        waiting = PullQuery("T", 1, 0, suspend_timeout_ms=5000)
        first = asyncio.ensure_future(puller.pull(waiting, "p1"))
        await asyncio.sleep(0.01)
        with pytest.raises(TooManyLongPollsError):
            await puller.pull(waiting, "p1")
        first.cancel()
        await asyncio.gather(first, return_exceptions=True)
        assert len(puller.polls) == 0 and puller.polls.held_by("p1") == 0

    asyncio.run(body())


async def _until(cond: Callable[[], bool], what: str) -> None:
    """Let the loop run until ``cond`` holds: at most 1,000 turns (no clock involved)."""
    for _ in range(1000):
        if cond():
            return
        await asyncio.sleep(0)
    raise AssertionError(f"never: {what}")


def test_held_polls_tell_the_raft_member_readers_wait(tmp_path: Path) -> None:
    """The first poll held says readers wait (a follower then asks its leader for commits
    without the notice linger); the last one leaving says they no longer do, whichever way it
    leaves (a message, its timeout, a cancel). Polls held in between say nothing more."""

    async def body() -> None:
        node, _sm, topics, applied = world(tmp_path)
        await topics.upsert("T", 2, 2, 6)
        puller = PullPath(topics, applied)
        held = [
            asyncio.ensure_future(
                puller.pull(PullQuery("T", q, 0, suspend_timeout_ms=5000), f"p{q}")
            )
            for q in (0, 1)
        ]
        await _until(lambda: len(puller.polls) == 2, "two polls held")
        assert node.readers_waiting and node.readers_waiting_calls == 1
        await store(node, ["A"])  # wakes queue 0's poll only
        await _until(lambda: held[0].done(), "queue 0's poll answered")
        assert node.readers_waiting and node.readers_waiting_calls == 1
        held[1].cancel()
        await asyncio.gather(held[1], return_exceptions=True)
        assert not node.readers_waiting and node.readers_waiting_calls == 2
        quick = PullQuery("T", 1, 0, suspend_timeout_ms=1)
        assert (await puller.pull(quick, "p1")).status is PullStatus.NO_NEW_MSG
        assert not node.readers_waiting and node.readers_waiting_calls == 4

    asyncio.run(body())
