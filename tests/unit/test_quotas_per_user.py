"""Quotas per user on the client port's shared tables (issue #32, docs/SECURITY.md "Quotas per
user"): one user fills its share of a table, another user is still served at once, a Super user
is bounded by the table's own size only. Spoken over gRPC with signed calls to one node's real
Broker servicer on 127.0.0.1, whose user the node's real guard reads from each signature, over a
real state machine and an in-memory log (tests/broker_world.py)."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import grpc
import pytest
from broker_world import world
from raftmq.broker.v1 import broker_pb2 as pb
from raftmq.broker.v1 import broker_pb2_grpc as pb_grpc

from broker.app import assemble
from broker.components import offsets as offsets_module
from broker.components.applied import NodeContext
from broker.components.authadmin import AuthAdmin
from broker.components.locks import CONSUMER_EXPIRE_MS, LOCK_MAX_LIVE_MS
from broker.components.settings import ServiceConfig
from broker.frontends.authguard import AuthGuard, AuthSettings
from broker.frontends.v1.service import BrokerServicer
from broker.state.auth.secrets import SecretBox
from broker.state.errors import CorruptMessageError
from broker.state.machine import _topic_of_row, _topic_row
from broker.state.message import UniqIdGenerator
from broker.state.records import TOPIC_UPSERT, TopicConfig, decode_topic_record, encode_topic_record
from mqsecurity.credentials import Credentials
from mqsecurity.signing import signed_metadata
from rpckit.status import read_error

BOX = SecretBox(bytes(range(32)))
# Quotas small enough to fill in a test.
POLLS, CONSUMERS, LOCKS, OFFSETS, TOPICS = 2, 2, 3, 2, 2
GROUPS = 3  # consumer groups with offsets: one more than the pending offsets' share
CFG = ServiceConfig(
    "127.0.0.1",
    10911,
    auto_create_topic=True,  # a send creates a topic too: counted as CreateTopic is
    topics_per_user=TOPICS,
    # No flush between the commits of a test: the buffer is what is measured.
    offset_commit_interval_ms=60_000,
    long_polls_per_user=POLLS,
    consumers_per_user=CONSUMERS,
    queue_locks_per_user=LOCKS,
    pending_offsets_per_user=OFFSETS,
    offset_groups_per_user=GROUPS,
)
IDS = UniqIdGenerator(ip="10.0.0.6", pid=12, instance_hash=6)
ALICE = Credentials("alice", "alice-secret-1")  # fills her shares
BOB = Credentials("bob", "bob-secret-1")  # is served meanwhile
ROOT = Credentials("root", "root-secret-1")  # Super: the tables' sizes only
T = "T"
QUEUES = 8
CALL_TIMEOUT_S = 5.0
HOLD_MS = 20_000  # a held pull's timeout: far beyond every wait of a test


@dataclass
class Node:
    broker: BrokerServicer
    stub: pb_grpc.BrokerStub
    server: grpc.aio.Server
    channel: grpc.aio.Channel

    async def stop(self) -> None:
        await self.channel.close()
        await self.server.stop(None)


async def start(tmp_path: Path) -> Node:
    node, sm, _, _ = world(tmp_path, CFG)
    admin = AuthAdmin(NodeContext(node, sm, CFG), BOX)  # type: ignore[arg-type]
    await admin.create_user(ROOT.access_key, ROOT.secret_key, "Super", "")
    for creds in (ALICE, BOB):
        await admin.create_user(creds.access_key, creds.secret_key, "", "")
    guard = AuthGuard(sm, AuthSettings(True, True, cluster_name="c1"), BOX)
    broker = assemble(node, sm, CFG, secret_box=BOX, guard=guard).servicer
    await broker.topics.upsert(T, QUEUES, QUEUES, 6)
    server = grpc.aio.server()
    port = server.add_insecure_port("127.0.0.1:0")
    broker.register(server)
    await server.start()
    channel = grpc.aio.insecure_channel(f"127.0.0.1:{port}")
    return Node(broker, pb_grpc.BrokerStub(channel), server, channel)


def run(tmp_path: Path, test: Callable[[Node], Awaitable[None]]) -> None:
    async def body() -> None:
        n = await start(tmp_path)
        try:
            await test(n)
        finally:
            await n.stop()

    asyncio.run(body())


def md(creds: Credentials) -> tuple[tuple[str, str], ...]:
    return tuple(signed_metadata(creds))


async def refusal(call: Awaitable[Any]) -> tuple[str, str]:
    """(error code, details) of a call that must be refused."""
    try:
        await call
    except grpc.aio.AioRpcError as exc:
        info = read_error(exc)
        assert info is not None, exc
        assert exc.code() is grpc.StatusCode.RESOURCE_EXHAUSTED, exc
        return info.code, exc.details() or ""
    raise AssertionError("the call was answered")


async def until(condition: Callable[[], bool], what: str) -> None:
    deadline = time.monotonic() + CALL_TIMEOUT_S
    while not condition():
        assert time.monotonic() < deadline, what
        await asyncio.sleep(0.01)


def pull(n: Node, creds: Credentials, queue_id: int) -> Any:
    request = pb.PullMessageRequest(
        topic=T, queue_id=queue_id, queue_offset=0, suspend_timeout_ms=HOLD_MS
    )
    return n.stub.PullMessage(request, metadata=md(creds), timeout=HOLD_MS / 1000 + 5)


def test_quota_long_polls_one_user_fills_its_share_and_another_is_served(
    tmp_path: Path,
) -> None:
    async def test(n: Node) -> None:
        polls = n.broker.puller.polls
        held = [pull(n, ALICE, q) for q in range(POLLS)]
        await until(lambda: polls.held_by_user("alice") == POLLS, "alice's pulls held")
        code, details = await refusal(pull(n, ALICE, POLLS))
        assert code == "RESOURCE_EXHAUSTED"
        assert details.startswith("RESOURCE_EXHAUSTED quota longPollsPerUser:"), details
        # Bob's pull is held, and answered as soon as a message arrives on its queue.
        bobs = pull(n, BOB, 7)
        await until(lambda: polls.held_by_user("bob") == 1, "bob's pull held")
        m = pb.Message(queue_id=7, body=b"m", msg_id=IDS.next_id())
        await n.broker.sender.send(T, [m])
        answer = await asyncio.wait_for(bobs, CALL_TIMEOUT_S)
        assert answer.status == pb.FOUND
        # A Super user is bounded by the node's limits only.
        roots = [pull(n, ROOT, q) for q in range(POLLS + 1)]
        await until(lambda: polls.held == POLLS + POLLS + 1, "root's pulls held")
        for call in [*held, *roots]:
            call.cancel()
        await until(lambda: polls.held == 0, "every pull let go")
        assert polls.held_by_user("alice") == 0

    run(tmp_path, test)


def heartbeat(n: Node, creds: Credentials, group: str, client_id: str) -> Any:
    request = pb.HeartbeatRequest(consumer_group=group, client_id=client_id)
    return n.stub.Heartbeat(request, metadata=md(creds), timeout=CALL_TIMEOUT_S)


def test_quota_consumers_one_user_fills_its_share_and_another_is_served(
    tmp_path: Path,
) -> None:
    async def test(n: Node) -> None:
        for i in range(CONSUMERS):
            await heartbeat(n, ALICE, f"fake-{i}", f"c-{i}")
        await heartbeat(n, ALICE, "fake-0", "c-0")  # a renewal takes no room
        code, details = await refusal(heartbeat(n, ALICE, "fake-x", "c-x"))
        assert code == "RESOURCE_EXHAUSTED"
        assert details.startswith("RESOURCE_EXHAUSTED quota consumersPerUser:"), details
        await heartbeat(n, BOB, "real", "b-1")
        for i in range(CONSUMERS + 1):
            await heartbeat(n, ROOT, "ops", f"r-{i}")
        assert n.broker.consumers.clients("real") == ["b-1"]
        # Alice's consumer leaves: her room comes back.
        request = pb.UnregisterConsumerRequest(consumer_group="fake-0", client_id="c-0")
        await n.stub.UnregisterConsumer(request, metadata=md(ALICE))
        await heartbeat(n, ALICE, "fake-x", "c-x")

    run(tmp_path, test)


def lock(n: Node, creds: Credentials, client_id: str, queues: range) -> Any:
    request = pb.LockBatchRequest(
        consumer_group="G",
        client_id=client_id,
        queues=[pb.QueueRef(topic=T, queue_id=q) for q in queues],
    )
    return n.stub.LockBatchMQ(request, metadata=md(creds), timeout=CALL_TIMEOUT_S)


def test_quota_queue_locks_one_user_fills_its_share_and_another_is_served(
    tmp_path: Path,
) -> None:
    async def test(n: Node) -> None:
        got = await lock(n, ALICE, "a-1", range(LOCKS))
        assert len(got.locked) == LOCKS
        # Another client id of the same user: the user's share, not the client's, is full.
        code, details = await refusal(lock(n, ALICE, "a-2", range(LOCKS, LOCKS + 1)))
        assert code == "RESOURCE_EXHAUSTED"
        assert details.startswith("RESOURCE_EXHAUSTED quota queueLocksPerUser:"), details
        renewed = await lock(n, ALICE, "a-1", range(LOCKS))  # renewals take no room
        assert len(renewed.locked) == LOCKS
        bobs = await lock(n, BOB, "b-1", range(LOCKS, LOCKS + 1))
        assert [q.queue_id for q in bobs.locked] == [LOCKS]
        roots = await lock(n, ROOT, "r-1", range(LOCKS + 1, QUEUES))
        assert len(roots.locked) == QUEUES - LOCKS - 1
        assert n.broker.consumers.locks.held_by_user("alice") == LOCKS
        # Released locks give the room back.
        request = pb.UnlockBatchRequest(
            consumer_group="G", client_id="a-1", queues=[pb.QueueRef(topic=T, queue_id=0)]
        )
        await n.stub.UnlockBatchMQ(request, metadata=md(ALICE))
        assert n.broker.consumers.locks.held_by_user("alice") == LOCKS - 1

    run(tmp_path, test)


def commit(n: Node, creds: Credentials, group: str, sync: bool = False) -> Any:
    request = pb.UpdateConsumerOffsetRequest(
        consumer_group=group, topic=T, queue_id=0, queue_offset=0, sync=sync
    )
    return n.stub.UpdateConsumerOffset(request, metadata=md(creds), timeout=CALL_TIMEOUT_S)


def test_quota_pending_offsets_one_user_fills_its_share_and_another_is_served(
    tmp_path: Path,
) -> None:
    async def test(n: Node) -> None:
        offsets = n.broker.offsets
        for i in range(OFFSETS):
            await commit(n, ALICE, f"fake-{i}")
        await commit(n, ALICE, "fake-0")  # a newer offset of a pending key takes no room
        code, details = await refusal(commit(n, ALICE, "fake-x"))
        assert code == "RESOURCE_EXHAUSTED"
        assert details.startswith("RESOURCE_EXHAUSTED quota pendingOffsetsPerUser:"), details
        await commit(n, BOB, "real")
        for i in range(OFFSETS + 1):
            await commit(n, ROOT, f"ops-{i}")
        assert offsets.committed("real", T, 0) == 0
        assert offsets.pending_by_user("alice") == OFFSETS
        # Once flushed, the buffer is free again (and everything pending was committed).
        await commit(n, BOB, "real", sync=True)
        assert offsets.pending_by_user("alice") == 0
        assert n.broker.offsets.ctx.sm.offsets[("fake-1", T, 0)] == 0
        await commit(n, ALICE, "fake-x")

    run(tmp_path, test)


def send_back(n: Node, creds: Credentials, group: str, position: int, level: int = 0) -> Any:
    request = pb.ConsumerSendMsgBackRequest(
        consumer_group=group,
        messages=[pb.SendBackItem(commitlog_position=position)],
        delay_level=level,
    )
    return n.stub.ConsumerSendMsgBack(request, metadata=md(creds), timeout=CALL_TIMEOUT_S)


def test_quota_topics_retry_and_dead_letter_topics_are_their_callers(tmp_path: Path) -> None:
    async def test(n: Node) -> None:
        topics = n.broker.topics
        sent = await send(n, ROOT, T)
        position = sent.packed_positions[0]
        await send_back(n, ALICE, "g-1", position)  # %RETRY%g-1
        await send_back(n, ALICE, "g-2", position, level=-1)  # %DLQ%g-2
        assert topics.get("%RETRY%g-1").owner == "alice"
        assert topics.get("%DLQ%g-2").owner == "alice"
        assert topics.held_by("alice") == TOPICS
        await send_back(n, ALICE, "g-1", position)  # an existing one takes no room
        for level in (0, -1):
            code, details = await refusal(send_back(n, ALICE, "g-3", position, level))
            assert code == "RESOURCE_EXHAUSTED"
            assert details.startswith("RESOURCE_EXHAUSTED quota topicsPerUser:"), details
        assert not {"%RETRY%g-3", "%DLQ%g-3"} & set(topics.ctx.sm.topics)  # nothing proposed
        started = time.monotonic()
        await send_back(n, BOB, "g-3", position)
        assert time.monotonic() - started < 1.0  # at once
        assert topics.get("%RETRY%g-3").owner == "bob"
        for i in range(TOPICS + 1):
            await send_back(n, ROOT, f"ops-{i}", position)

    run(tmp_path, test)


def test_quota_offset_groups_one_user_fills_its_share_and_another_is_served(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    async def test(n: Node) -> None:
        sm = n.broker.offsets.ctx.sm
        await commit(n, ALICE, "made-up-0", sync=True)
        await commit(n, ALICE, "made-up-1")  # buffered: counted before it is proposed
        await commit(n, ALICE, "made-up-2", sync=True)
        await commit(n, ALICE, "made-up-0", sync=True)  # a group she has takes no room
        code, details = await refusal(commit(n, ALICE, "made-up-x", sync=True))
        assert code == "RESOURCE_EXHAUSTED"
        assert details.startswith("RESOURCE_EXHAUSTED quota offsetGroupsPerUser:"), details
        started = time.monotonic()
        await commit(n, BOB, "real", sync=True)
        assert time.monotonic() - started < 1.0  # at once
        for i in range(GROUPS + 1):
            await commit(n, ROOT, f"ops-{i}", sync=True)
        assert {g for g, o in sm.offset_groups.items() if o == "alice"} == {
            f"made-up-{i}" for i in range(GROUPS)
        }
        assert sm.offset_groups["real"] == "bob" and sm.offset_groups_of("root") == GROUPS + 1
        assert ("made-up-x", T, 0) not in sm.offsets
        # Bob may reset a group of his own into being; a reset counts as a commit does.
        reset = pb.ResetConsumerOffsetRequest(consumer_group="real-2", topic=T, queue_id=0)
        reset.queue_offset = 0
        await n.stub.ResetConsumerOffset(reset, metadata=md(BOB), timeout=CALL_TIMEOUT_S)
        assert sm.offset_groups["real-2"] == "bob"
        # The broker group's table bounds everyone, Super users too.
        monkeypatch.setattr(offsets_module, "MAX_OFFSET_GROUPS", len(sm.offset_groups))
        code, details = await refusal(commit(n, ROOT, "ops-x", sync=True))
        assert code == "TOO_MANY_OFFSET_GROUPS", details
        await commit(n, ROOT, "ops-0", sync=True)

    run(tmp_path, test)


def create_topic(n: Node, creds: Credentials, name: str, queues: int = 1) -> Any:
    config = pb.TopicConfig(topic_name=name, read_queue_nums=queues, write_queue_nums=queues)
    request = pb.CreateTopicRequest(topic=config)
    return n.stub.CreateTopic(request, metadata=md(creds), timeout=CALL_TIMEOUT_S)


def send(n: Node, creds: Credentials, topic: str) -> Any:
    request = pb.SendMessageRequest(
        topic=topic, messages=[pb.Message(queue_id=0, body=b"m", msg_id=IDS.next_id())]
    )
    return n.stub.SendMessage(request, metadata=md(creds), timeout=CALL_TIMEOUT_S)


def test_quota_topics_one_user_fills_its_share_and_another_is_served(tmp_path: Path) -> None:
    async def test(n: Node) -> None:
        topics = n.broker.topics
        await create_topic(n, ALICE, "a-1")
        await send(n, ALICE, "a-2")  # auto-created by her send: hers too
        assert topics.held_by("alice") == TOPICS
        await create_topic(n, ALICE, "a-1", 2)  # a change of her own takes no room
        for refused in (create_topic(n, ALICE, "a-3"), send(n, ALICE, "a-4")):
            code, details = await refusal(refused)
            assert code == "RESOURCE_EXHAUSTED"
            assert details.startswith("RESOURCE_EXHAUSTED quota topicsPerUser:"), details
        assert "a-3" not in n.broker.offsets.ctx.sm.topics  # nothing proposed
        await create_topic(n, BOB, "b-1")
        for i in range(TOPICS + 1):
            await create_topic(n, ROOT, f"r-{i}")
        # An admin's change keeps the creator; a delete gives the room back.
        await create_topic(n, ROOT, "a-2", 4)
        assert topics.get("a-2").owner == "alice"
        assert topics.get("a-2").read_queue_nums == 4
        await n.stub.DeleteTopic(pb.DeleteTopicRequest(topic="a-1"), metadata=md(ROOT))
        await create_topic(n, ALICE, "a-3")

    run(tmp_path, test)


def test_a_topic_keeps_its_owner_in_the_record_and_the_snapshot() -> None:
    owned = TopicConfig("t", 2, 2, 6, "FIFO", "alice")
    assert decode_topic_record(encode_topic_record(TOPIC_UPSERT, owned)) == (TOPIC_UPSERT, owned)
    assert _topic_of_row("t", _topic_row(owned)) == owned
    plain = TopicConfig("t", 2, 2, 6)
    record = encode_topic_record(TOPIC_UPSERT, plain)
    assert record[0] == 1  # without an owner: the version-1 bytes it always was
    assert decode_topic_record(record) == (TOPIC_UPSERT, plain)
    assert _topic_row(plain) == [2, 2, 6]
    good = encode_topic_record(TOPIC_UPSERT, owned)
    for bad in (good[:-1], good + b"x", good[:-6] + b"\x00"):  # short, long, empty owner
        with pytest.raises(CorruptMessageError):
            decode_topic_record(bad)
    with pytest.raises(ValueError):
        _topic_of_row("t", [2, 2, 6, "FIFO", ""])


def test_consumers_and_locks_of_another_user_are_left_alone(tmp_path: Path) -> None:
    """v1 ``UnregisterConsumer`` and ``UnlockBatchMQ`` naming another user's client id act on
    nothing of it, answered as for an id never seen; its owner's own calls still act."""

    async def test(n: Node) -> None:
        consumers = n.broker.consumers

        def unregister(creds: Credentials, group: str, client_id: str) -> Any:
            request = pb.UnregisterConsumerRequest(consumer_group=group, client_id=client_id)
            return n.stub.UnregisterConsumer(request, metadata=md(creds), timeout=CALL_TIMEOUT_S)

        def unlock(creds: Credentials, client_id: str) -> Any:
            request = pb.UnlockBatchRequest(
                consumer_group="G",
                client_id=client_id,
                queues=[pb.QueueRef(topic=T, queue_id=q) for q in range(2)],
            )
            return n.stub.UnlockBatchMQ(request, metadata=md(creds), timeout=CALL_TIMEOUT_S)

        await heartbeat(n, ALICE, "G", "victim")
        assert len((await lock(n, ALICE, "victim", range(2))).locked) == 2
        unknown = await unregister(BOB, "G", "never-seen")
        assert (await unregister(BOB, "G", "victim")) == unknown
        assert not unknown.removed
        assert (await unlock(BOB, "victim")) == (await unlock(BOB, "never-seen"))
        assert not (await unlock(BOB, "victim")).unlocked
        assert (await unlock(ROOT, "victim")).unlocked == []  # a Super user's too
        assert consumers.clients("G") == ["victim"]
        assert consumers.locks.held_by("G", "victim", "alice") == 2
        # Its owner's calls still act.
        assert len((await unlock(ALICE, "victim")).unlocked) == 2
        await lock(n, ALICE, "victim", range(2))
        assert (await unregister(ALICE, "G", "victim")).removed
        assert consumers.clients("G") == [] and consumers.locks.held_by("G", "victim", "alice") == 0

    run(tmp_path, test)


class FakeClock:
    """The consumer table's clock, moved by the test (ms)."""

    def __init__(self) -> None:
        self.now_ms = 1_000_000

    def __call__(self) -> int:
        return self.now_ms


def test_a_heartbeat_naming_another_users_consumer_is_refused_and_changes_nothing(
    tmp_path: Path,
) -> None:
    """v1 ``Heartbeat`` naming a live consumer another user's heartbeats registered is refused
    (``PERMISSION_DENIED CLIENT_ID_TAKEN``, as v2 ``Settings``), Super users' too: it neither
    keeps the victim's record alive nor claims locks under its id."""

    async def test(n: Node) -> None:
        consumers = n.broker.consumers
        clock = consumers.clock_ms = FakeClock()
        await heartbeat(n, ALICE, "G", "victim")
        assert len((await lock(n, ALICE, "victim", range(2))).locked) == 2
        for creds in (BOB, ROOT):
            request = pb.HeartbeatRequest(
                consumer_group="G",
                client_id="victim",
                locked_queues=[pb.QueueRef(topic=T, queue_id=q) for q in range(4)],
            )
            clock.now_ms += 1000
            with pytest.raises(grpc.aio.AioRpcError) as refused:
                await n.stub.Heartbeat(request, metadata=md(creds), timeout=CALL_TIMEOUT_S)
            assert refused.value.code() is grpc.StatusCode.PERMISSION_DENIED
            info = read_error(refused.value)
            assert info is not None and info.code == "CLIENT_ID_TAKEN", info
        locks = consumers.locks
        assert [locks.holder(("G", T, q), clock.now_ms) for q in range(4)] == [
            "victim",
            "victim",
            None,
            None,
        ]
        assert locks.held_by("G", "victim", "bob") == locks.held_by("G", "victim", "root") == 0
        # Not kept alive: the victim's record expires from its own last heartbeat.
        clock.now_ms += CONSUMER_EXPIRE_MS - 2000
        assert consumers.clients("G") == []
        assert locks.held_by("G", "victim", "alice") == 0
        # A client id nobody holds any more is anyone's.
        await heartbeat(n, BOB, "G", "victim")
        assert consumers.clients("G") == ["victim"]

    run(tmp_path, test)


def test_lock_batch_naming_another_users_client_renews_none_of_its_locks(
    tmp_path: Path,
) -> None:
    """v1 ``LockBatchMQ`` naming another user's client id is answered as for a new id (the
    victim's queues held by another client, free ones locked as the caller's own), Super
    users' too: the victim's locks are neither renewed nor counted against."""

    async def test(n: Node) -> None:
        consumers = n.broker.consumers
        clock = consumers.clock_ms = FakeClock()
        await heartbeat(n, ALICE, "G", "victim")
        assert len((await lock(n, ALICE, "victim", range(2))).locked) == 2
        for creds in (BOB, ROOT):
            clock.now_ms += 1000
            assert (await lock(n, creds, "victim", range(2))) == (
                await lock(n, creds, "never-seen", range(2))
            )
            assert not (await lock(n, creds, "victim", range(2))).locked
        # A free queue is the caller's own lock under that id, not the victim's.
        assert len((await lock(n, BOB, "victim", range(2, 3))).locked) == 1
        locks = consumers.locks
        assert locks.held_by("G", "victim", "alice") == 2
        assert locks.held_by("G", "victim", "bob") == 1
        # Not renewed: the victim's locks expire from its own last lock.
        clock.now_ms += LOCK_MAX_LIVE_MS - 2000
        assert [locks.holder(("G", T, q), clock.now_ms) for q in range(2)] == [None, None]
        assert len((await lock(n, BOB, "b-1", range(2))).locked) == 2

    run(tmp_path, test)
