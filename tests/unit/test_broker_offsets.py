"""Consumer offsets (coalesced commits, resets, lag) on a real state machine, without gRPC."""

from __future__ import annotations

import asyncio
from pathlib import Path

from broker_world import world

from broker.components.offsets import ConsumerOffsets, QueueLag
from broker.state.message import Message, UniqIdGenerator, encode_batch
from broker.state.records import ENTRY_MESSAGES

IDS = UniqIdGenerator(ip="10.0.0.1", pid=7, instance_hash=1)


def test_async_commits_coalesce_into_one_entry_and_lag_follows_them(tmp_path: Path) -> None:
    async def body() -> None:
        node, sm, topics, applied = world(tmp_path)
        await topics.upsert("T", 3, 3, 6)
        msgs = [Message("T", i % 2, b"x", uniq_id=IDS.next_id()) for i in range(5)]
        await node.propose([encode_batch(msgs)[0]], ENTRY_MESSAGES)
        offsets = ConsumerOffsets(topics, applied)
        assert offsets.lag("g", "T") == [
            QueueLag(0, 0, 3, -1, 3),
            QueueLag(1, 0, 2, -1, 2),
            QueueLag(2, 0, 0, -1, 0),
        ]
        before = node.proposals
        await offsets.commit("g", "T", 0, 1, sync=False)
        await offsets.commit("g", "T", 0, 2, sync=False)
        await offsets.commit("g", "T", 1, 2, sync=False)
        assert offsets.committed("g", "T", 0) == 2  # the leader's buffer answers at once
        assert [q.lag for q in offsets.lag("g", "T")] == [1, 0, 0]
        assert node.proposals == before
        assert offsets.flush_task is not None
        await offsets.flush_task
        assert node.proposals == before + 1  # one entry for all three commits
        assert sm.offsets == {("g", "T", 0): 2, ("g", "T", 1): 2}
        reset = await offsets.reset("g", "T", -1, queue_offset=99)
        assert reset == {0: 3, 1: 2, 2: 0}  # clamped to each queue
        assert [q.lag for q in offsets.lag("g", "T")] == [0, 0, 0]

    asyncio.run(body())
