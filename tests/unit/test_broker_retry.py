"""Retries, dead letters and the scheduler's delivery on a real state machine, without gRPC."""

from __future__ import annotations

import asyncio
from pathlib import Path

from broker_world import world

from broker.components.delaydelivery import SCHEDULE_EMPTY_WAIT_MS, SCHEDULE_IDLE_MS, Scheduler
from broker.components.retry import Retries, SendBackItem
from broker.components.sending import SendPath
from broker.components.settings import ServiceConfig
from broker.state.message import Message, UniqIdGenerator, encode_batch
from broker.state.names import SCHEDULE_TOPIC
from broker.state.records import ENTRY_MESSAGES

IDS = UniqIdGenerator(ip="10.0.0.1", pid=7, instance_hash=1)


def test_a_failed_message_is_retried_after_its_delay_then_dead_lettered(tmp_path: Path) -> None:
    async def body() -> None:
        cfg = ServiceConfig("127.0.0.1", 10911, delay_levels_ms=(0,) * 18)  # due at once
        node, sm, topics, applied = world(tmp_path, cfg)
        await topics.upsert("T", 1, 1, 6)
        original = Message("T", 0, b"payload", uniq_id=IDS.next_id())
        await node.propose([encode_batch([original])[0]], ENTRY_MESSAGES)
        position = sm.cqs.find("T", 0).get(0)[0]
        sender = SendPath(topics.ctx, topics)
        retries = Retries(topics, applied, sender)
        [back] = await retries.send_back("g", [SendBackItem(position, original.uniq_id)])
        assert back.topic == "%RETRY%g" and not back.dead_lettered
        assert back.stored.topic == SCHEDULE_TOPIC  # waiting for its delay
        assert "%RETRY%g" in sm.topics and "%DLQ%g" not in sm.topics
        scheduler = Scheduler(applied)
        level = 3  # the first retry's level
        assert await scheduler.deliver_level(level) is None
        cq = sm.cqs.find("%RETRY%g", 0)
        assert cq is not None and cq.max_offset == 1
        delivered = applied.message(cq.get(0)[0])
        assert delivered.body == b"payload" and delivered.reconsume_times == 1
        assert await scheduler.deliver_level(level) is None  # nothing delivered twice
        assert sm.cqs.find("%RETRY%g", 0).max_offset == 1
        [dead] = await retries.send_back("g", [SendBackItem(position)], max_reconsume_times=0)
        assert dead.dead_lettered and dead.topic == "%DLQ%g" and dead.deliver_at_ms == 0
        assert applied.message(dead.stored.position).topic == "%DLQ%g"

    asyncio.run(body())


def test_an_empty_scheduler_sleeps_until_a_scheduled_message_is_stored(tmp_path: Path) -> None:
    async def body() -> None:
        cfg = ServiceConfig("127.0.0.1", 10911)
        node, sm, topics, applied = world(tmp_path, cfg)
        await topics.upsert("T", 1, 1, 6)
        original = Message("T", 0, b"payload", uniq_id=IDS.next_id())
        await node.propose([encode_batch([original])[0]], ENTRY_MESSAGES)
        scheduler = Scheduler(applied)
        assert await scheduler._pass() == SCHEDULE_EMPTY_WAIT_MS / 1000
        sleeping = asyncio.ensure_future(scheduler.wakeup.sleep(30))
        for _ in range(5):
            await asyncio.sleep(0)
        assert not sleeping.done()
        position = sm.cqs.find("T", 0).get(0)[0]
        retries = Retries(topics, applied, SendPath(topics.ctx, topics))
        [back] = await retries.send_back("g", [SendBackItem(position, original.uniq_id)])
        assert back.stored.topic == SCHEDULE_TOPIC
        await asyncio.wait_for(sleeping, 5)
        assert await scheduler._pass() <= SCHEDULE_IDLE_MS / 1000  # due later: it polls

    asyncio.run(body())
