"""The send path on a real state machine, without gRPC."""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest
from broker_world import outgoing, world

from broker.components.sending import SendPath
from broker.components.settings import ServiceConfig
from broker.state.delayrules import PROPERTY_DELAY
from broker.state.errors import QueueIdOutOfRangeError, SystemTopicError, TopicNotFoundError
from broker.state.names import SCHEDULE_TOPIC


def test_a_send_is_stored_in_its_queues_and_answered_in_order(tmp_path: Path) -> None:
    async def body() -> None:
        _node, _sm, topics, applied = world(tmp_path)
        await topics.upsert("T", 4, 4, 6)
        sender = SendPath(topics.ctx, topics)
        msgs = [outgoing(i % 2, i) for i in range(5)]
        results = await sender.send("T", msgs)
        assert [r.uniq_id for r in results] == [m.msg_id for m in msgs]
        assert [(r.queue_id, r.queue_offset) for r in results] == [
            (0, 0),
            (1, 0),
            (0, 1),
            (1, 1),
            (0, 2),
        ]
        assert not any(r.duplicate for r in results)
        assert [applied.message(r.position).body for r in results] == [m.body for m in msgs]
        again = await sender.send("T", msgs)  # the dedup window answers a resend
        assert all(r.duplicate for r in again)
        assert [r.position for r in again] == [r.position for r in results]

    asyncio.run(body())


def test_a_retry_in_flight_waits_for_the_original_and_proposes_nothing(tmp_path: Path) -> None:
    async def body() -> None:
        node, _sm, topics, _ = world(tmp_path)
        await topics.upsert("T", 4, 4, 6)
        sender = SendPath(topics.ctx, topics)
        msgs = [outgoing(0, i) for i in range(3)]
        node.gate = asyncio.Event()
        before = node.proposals
        original = asyncio.ensure_future(sender.send("T", msgs))
        retry = asyncio.ensure_future(sender.send("T", msgs))
        await asyncio.sleep(0.01)
        assert node.proposals == before + 1  # the retry did not propose
        node.gate.set()
        first, second = await original, await retry
        assert not any(r.duplicate for r in first) and all(r.duplicate for r in second)
        assert [r.position for r in first] == [r.position for r in second]
        assert node.proposals == before + 1

    asyncio.run(body())


def test_a_delayed_message_waits_in_the_schedule_topic_but_answers_its_queue(
    tmp_path: Path,
) -> None:
    async def body() -> None:
        _node, sm, topics, applied = world(tmp_path)
        await topics.upsert("T", 4, 4, 6)
        sender = SendPath(topics.ctx, topics)
        [result] = await sender.send("T", [outgoing(3, 1, **{PROPERTY_DELAY: "2"})])
        assert result.topic == SCHEDULE_TOPIC and result.queue_id == 3
        assert applied.message(result.position).topic == SCHEDULE_TOPIC
        assert sm.cqs.find(SCHEDULE_TOPIC, 1).max_offset == 1  # level 2 is queue 1

    asyncio.run(body())


def test_refused_sends_propose_nothing(tmp_path: Path) -> None:
    async def body() -> None:
        node, sm, topics, _ = world(tmp_path)
        await topics.upsert("T", 4, 4, 6)
        sender = SendPath(topics.ctx, topics)
        before = node.proposals
        with pytest.raises(QueueIdOutOfRangeError):
            await sender.send("T", [outgoing(4, 1)])
        with pytest.raises(SystemTopicError):
            await sender.send(SCHEDULE_TOPIC, [outgoing(0, 1)])
        with pytest.raises(TopicNotFoundError):
            await sender.send("Absent", [outgoing(0, 1)])
        assert node.proposals == before
        topics.ctx.cfg = ServiceConfig("127.0.0.1", 10911, auto_create_topic=True)
        await sender.send("Absent", [outgoing(0, 1)])
        assert sm.topics["Absent"].write_queue_nums == topics.ctx.cfg.default_topic_queue_nums

    asyncio.run(body())
