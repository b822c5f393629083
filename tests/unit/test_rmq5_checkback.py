"""The v2 front end's side of transactions, without gRPC servers: the check-back command put on a
live producer's Telemetry stream (the right topic, a full outbox, no producer, a replayed
record), and the merge of a stream's incoming and outgoing commands."""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

from broker_world import world
from raftmq.broker.v1 import broker_pb2 as pb

from broker.components.sending import SendPath
from broker.components.settings import ServiceConfig
from broker.components.transactions import Transactions
from broker.frontends.v2 import stubs
from broker.frontends.v2.txn import MAX_OUTBOX_COMMANDS, ProducerStreams, Stream, merged
from broker.state.message import UniqIdGenerator
from broker.state.transactions import transaction_id

v2, v2_service, _ = stubs.load()

IDS = UniqIdGenerator(ip="10.0.0.4", pid=10, instance_hash=4)
CFG = ServiceConfig("127.0.0.1", 10911, txn_timeout_ms=1000)


def _half(n: int) -> pb.Message:
    return pb.Message(
        queue_id=1,
        body=f"body-{n}".encode(),
        msg_id=IDS.next_id(),
        tags="A",
        keys=["k1", "k2"],
        properties={"TRAN_MSG": "true", "app": "x"},
        born_host="10.0.0.9:5555",
        born_timestamp_ms=1_700_000_000_123,
    )


async def _setup(tmp_path: Path) -> tuple[Transactions, SendPath, ProducerStreams]:
    _node, _sm, topics, applied = world(tmp_path, CFG)
    await topics.upsert("T", 2, 2, 6)
    await topics.upsert("U", 2, 2, 6)
    txns = Transactions(applied)
    sender = SendPath(topics.ctx, topics, halves=txns.prepare)
    return txns, sender, ProducerStreams(applied, "127.0.0.1:8081")


def test_a_check_reaches_one_live_producer_of_the_topic(tmp_path: Path) -> None:
    async def body() -> None:
        txns, sender, streams = await _setup(tmp_path)
        of_t, of_u, consumer = streams.open("p1"), streams.open("p2"), streams.open("c1")
        streams.publishing(of_t, [v2.Resource(resource_namespace="ns", name="T")])
        streams.publishing(of_u, [v2.Resource(name="U")])
        [r] = await sender.send("T", [_half(1)])
        now = int(time.time() * 1000)
        await txns.check_pass(now + 1000)
        assert of_u.outbox.empty() and consumer.outbox.empty()
        command = of_t.outbox.get_nowait()
        cmd = command.recover_orphaned_transaction_command
        assert cmd.transaction_id == transaction_id(r.position)
        m = cmd.message
        assert (m.topic.name, m.topic.resource_namespace, m.body) == ("T", "ns", b"body-1")
        assert dict(m.user_properties) == {"app": "x"}  # the broker's own ones left out
        sp = m.system_properties
        assert sp.message_id == "01" + r.uniq_id and sp.message_type == v2.TRANSACTION
        assert (sp.tag, list(sp.keys), sp.queue_id) == ("A", ["k1", "k2"], 1)
        assert sp.born_timestamp.ToMilliseconds() == 1_700_000_000_123
        assert streams.checks_sent == 1 and streams.checks_unsent == 0
        # No producer of the topic on this node (it may be on another member): counted.
        streams.close(of_t)
        await txns.check_pass(now + 100_000)
        assert streams.checks_sent == 1 and streams.checks_unsent == 1
        # A repeated Settings replaces the topics a stream publishes.
        streams.publishing(of_u, [v2.Resource(name="T")])
        await txns.check_pass(now + 200_000)
        assert streams.checks_sent == 2 and of_u.outbox.qsize() == 1

    asyncio.run(body())


def test_a_full_outbox_passes_the_check_to_another_producer(tmp_path: Path) -> None:
    async def body() -> None:
        txns, sender, streams = await _setup(tmp_path)
        full, spare = streams.open("p1"), streams.open("p2")
        for s in (full, spare):
            streams.publishing(s, [v2.Resource(name="T")])
        for _ in range(MAX_OUTBOX_COMMANDS):
            full.outbox.put_nowait(None)
        await sender.send("T", [_half(2)])
        await sender.send("T", [_half(3)])
        await txns.check_pass(int(time.time() * 1000) + 1000)
        assert spare.outbox.qsize() == 2 and streams.checks_sent == 2
        # A replayed check record (its time long past): nobody is asked again.
        half = next(iter(txns.ctx.sm.txn.pending.values()))
        half.last_check_ms -= 3_600_000
        streams.on_checked([half])
        assert spare.outbox.qsize() == 2 and streams.checks_sent == 2

    asyncio.run(body())


def test_merged_interleaves_both_directions_and_ends_with_the_client() -> None:
    async def body() -> list[tuple[Any, Any]]:
        streams_out: asyncio.Queue[Any] = asyncio.Queue()
        gate = asyncio.Event()

        async def requests() -> AsyncIterator[str]:
            yield "settings"
            await gate.wait()
            yield "heartbeat"

        stream = Stream("c", outbox=streams_out)
        got: list[tuple[Any, Any]] = []
        async for item in merged(requests(), stream):
            got.append(item)
            if item == ("settings", None):
                await streams_out.put("check-1")
            elif item == (None, "check-1"):
                gate.set()
        return got

    assert asyncio.run(body()) == [("settings", None), (None, "check-1"), ("heartbeat", None)]
