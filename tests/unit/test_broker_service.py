"""The broker's gRPC adapter (error mapping, requests to components and back) over fakes."""

from __future__ import annotations

import asyncio
import contextlib
import tracemalloc
from dataclasses import replace
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import grpc
import pytest
from broker_world import world
from google.rpc import status_pb2
from raftmq.broker.v1 import broker_pb2 as pb
from raftmq.common.v1 import error_pb2

from broker.app import Broker, assemble
from broker.components.applied import AppliedMessages, NodeContext
from broker.components.consumers import MAX_LOCK_BATCH, MAX_SUBSCRIPTIONS
from broker.components.locks import CONSUMER_EXPIRE_MS, MAX_CONSUMERS_PER_GROUP, ConsumerTable
from broker.components.lookups import Found, answer_bytes
from broker.components.offsets import offsets_record
from broker.components.pulling import PullPath, parse_subscription
from broker.frontends.v1.rpcerrors import (
    RESOURCE_EXHAUSTED_RETRY_AFTER_MS,
    error_failure,
    error_status,
)
from broker.frontends.v1.service import BrokerServicer, ServiceConfig
from broker.state.errors import (
    CorruptMessageError,
    InvalidTopicError,
    MessageNotFoundError,
    MessageTooLargeError,
    NoPermissionError,
    QueueIdOutOfRangeError,
    TooManyLocksError,
    TopicNotFoundError,
)
from broker.state.records import ENTRY_OFFSETS, PERM_RW, TopicConfig, decode_offsets_record
from client.consumer import pulled_messages
from dledger.core import BackPressureError, NotLeaderError, Role
from dledger.server.errormap import BACK_PRESSURE_RETRY_AFTER_MS, DISK_FULL_RETRY_AFTER_MS
from dledger.server.errors import ProposalLostError
from dledger.storage import DiskFullError
from prockit import fatal
from rpckit.status import DETAILS_KEY, UNAVAILABLE_RETRY_AFTER_MS


def test_subscriptions() -> None:
    assert parse_subscription("*") is None
    assert parse_subscription("  ") is None
    assert parse_subscription("TagA || TagB") == {"TagA", "TagB"}
    assert parse_subscription("TagA") == {"TagA"}
    with pytest.raises(Exception, match="names no tag"):
        parse_subscription("||")


def _node() -> Any:
    return SimpleNamespace(
        leader_client_addr=lambda: ("n2", "127.0.0.1:10931"),
        append_timeout_ms=3000,
    )


@pytest.mark.parametrize(
    ("exc", "status", "prefix"),
    [
        (
            NotLeaderError("x", leader_id="n2"),
            grpc.StatusCode.FAILED_PRECONDITION,
            "NOT_LEADER leader=n2 addr=127.0.0.1:10931",
        ),
        (TopicNotFoundError("t"), grpc.StatusCode.NOT_FOUND, "TOPIC_NOT_FOUND "),
        (MessageNotFoundError("m"), grpc.StatusCode.NOT_FOUND, "MESSAGE_NOT_FOUND "),
        (MessageTooLargeError("m"), grpc.StatusCode.INVALID_ARGUMENT, "MESSAGE_TOO_LARGE "),
        (InvalidTopicError("m"), grpc.StatusCode.INVALID_ARGUMENT, "INVALID_TOPIC "),
        (QueueIdOutOfRangeError("q"), grpc.StatusCode.INVALID_ARGUMENT, "QUEUE_ID_OUT_OF_RANGE "),
        (NoPermissionError("p"), grpc.StatusCode.PERMISSION_DENIED, "NO_PERMISSION "),
        (CorruptMessageError("bad", 3), grpc.StatusCode.DATA_LOSS, "CORRUPT_MESSAGE "),
        (BackPressureError("b"), grpc.StatusCode.RESOURCE_EXHAUSTED, "BACK_PRESSURE "),
        (ProposalLostError("l"), grpc.StatusCode.UNAVAILABLE, "LEADERSHIP_LOST "),
        (TimeoutError(), grpc.StatusCode.UNAVAILABLE, "NO_QUORUM "),
        (RuntimeError("boom"), grpc.StatusCode.INTERNAL, "INTERNAL RuntimeError"),
    ],
)
def test_every_error_maps_to_a_status_and_a_stable_code(
    exc: BaseException, status: grpc.StatusCode, prefix: str
) -> None:
    got_status, detail = error_status(exc, _node())
    assert got_status == status
    assert detail.startswith(prefix), detail
    info = error_failure(exc, _node()).info()
    assert info.code == prefix.split(" ")[0]
    if isinstance(exc, NotLeaderError):
        assert (info.leader_id, info.leader_addr, info.retryable) == ("n2", "127.0.0.1:10931", True)


@pytest.mark.parametrize(
    ("exc", "retry_after_ms", "outcome_unknown"),
    [
        (BackPressureError("b"), BACK_PRESSURE_RETRY_AFTER_MS, False),
        (DiskFullError("disk"), DISK_FULL_RETRY_AFTER_MS, False),
        (TooManyLocksError("l"), RESOURCE_EXHAUSTED_RETRY_AFTER_MS, False),
        (TimeoutError(), UNAVAILABLE_RETRY_AFTER_MS, True),
        (ProposalLostError("l"), UNAVAILABLE_RETRY_AFTER_MS, True),
    ],
)
def test_retryable_errors_carry_a_retry_hint(
    exc: BaseException, retry_after_ms: int, outcome_unknown: bool
) -> None:
    info = error_failure(exc, _node()).info()
    assert info.retryable and info.retry_after_ms == retry_after_ms > 0
    assert info.outcome_unknown is outcome_unknown
    assert not error_failure(TopicNotFoundError("t"), _node()).info().retryable


@pytest.mark.parametrize(
    ("slave_read", "role", "behind_bytes", "expected"),
    [
        (True, "LEADER", 2_000, True),  # far behind the write position: likely not in memory
        (True, "LEADER", 500, False),  # recent data: page cache, serve it here
        (False, "LEADER", 2_000, False),  # slaveReadEnable=false: never send reads away
        (True, "FOLLOWER", 2_000, False),  # a follower is where the hint sends you already
    ],
)
def test_pull_from_follower_hint(
    slave_read: bool, role: str, behind_bytes: int, expected: bool
) -> None:
    node = SimpleNamespace(role=Role[role], store=SimpleNamespace(write_position=10_000))
    cfg = ServiceConfig("127.0.0.1", 1, slave_read_enable=slave_read, memory_ratio_percent=50)
    applied = AppliedMessages(NodeContext(node, FakeState(), cfg))  # type: ignore[arg-type]
    puller = PullPath(None, applied, memory_bytes=2_000)  # type: ignore[arg-type]
    assert puller.suggest_follower(10_000 - behind_bytes) is expected


# ---------------------------------------------------------------------- a servicer on fakes


class Aborted(Exception):
    def __init__(
        self, code: grpc.StatusCode, detail: str, info: error_pb2.ErrorInfo | None = None
    ) -> None:
        super().__init__(code, detail)
        self.code = code
        self.detail = detail
        self.info = info


class FakeContext:
    def __init__(self, peer: str = "ipv4:127.0.0.1:5555") -> None:
        self._peer = peer

    def peer(self) -> str:
        return self._peer

    async def abort(self, code: grpc.StatusCode, detail: str, trailing_metadata: Any = ()) -> None:
        trailers = dict(trailing_metadata)
        status = status_pb2.Status.FromString(trailers[DETAILS_KEY])
        info = error_pb2.ErrorInfo()
        assert status.details[0].Unpack(info), status
        # The trailer repeats the status and the detail: any client reads the same thing.
        assert (status.code, status.message) == (code.value[0], detail)
        raise Aborted(code, detail, info)


class FakeNode:
    """What BrokerServicer uses of a ``broker.components.raftnode.RaftNode``: a leader that commits
    every proposal."""

    def __init__(self) -> None:
        self.role = Role.LEADER
        self.leader_id = "n1"
        self.term = 1
        self.self_id = "n1"
        self.append_timeout_ms = 3000
        self.max_body_bytes = 64 << 20
        self.proposals: list[tuple[int, list[bytes]]] = []
        self.propose_error: BaseException | None = None

    def leader_client_addr(self) -> tuple[str, str]:
        return ("n1", "127.0.0.1:10911")

    def set_readers_waiting(self, waiting: bool) -> None:
        """A leader's flag changes nothing (only a follower's answers carry it)."""

    async def propose(
        self, bodies: list[bytes], entry_type: int, *, headroom_bytes: int = 0
    ) -> tuple[int, int, int]:
        if self.propose_error is not None:
            raise self.propose_error
        self.proposals.append((entry_type, bodies))
        return (len(self.proposals), len(self.proposals), 1)


class FakeState:
    def __init__(self) -> None:
        self.topics = {"T": TopicConfig("T", 8, 8, PERM_RW)}
        self.offsets: dict[Any, int] = {}
        self.offset_groups: dict[str, str] = {}
        self.config_overrides: dict[str, str] = {}
        self.role = Role.FOLLOWER
        self.dispatch_end = 0
        self.cqs = SimpleNamespace(find=lambda topic, queue_id: None)

    def add_change_listener(self, fn: Any) -> None:
        pass

    def add_listener(self, fn: Any) -> None:
        pass


def _broker() -> tuple[Broker, FakeNode]:
    node = FakeNode()
    return assemble(node, FakeState(), ServiceConfig("127.0.0.1", 10911)), node  # type: ignore[arg-type]


def _servicer() -> tuple[BrokerServicer, FakeNode]:
    broker, node = _broker()
    return broker.servicer, node


async def _refused(call: Any) -> Aborted:
    with pytest.raises(Aborted) as err:
        await call
    assert len(err.value.detail.encode()) < 1024
    info = err.value.info
    assert info is not None and err.value.detail.split(" ", 1)[0] == info.code, info
    return err.value


def test_a_bad_group_cannot_poison_the_offset_buffer() -> None:
    """Finding: one async UpdateConsumerOffset with a 300-character group was accepted, then
    every flush failed to encode it, so no group's offsets committed any more."""

    async def body() -> None:
        s, node = _servicer()
        bad = pb.UpdateConsumerOffsetRequest(
            consumer_group="g" * 300, topic="T", queue_id=0, queue_offset=5
        )
        err = await _refused(s.UpdateConsumerOffset(bad, FakeContext()))
        assert err.code == grpc.StatusCode.INVALID_ARGUMENT
        assert err.detail.startswith("INVALID_GROUP ")
        good = pb.UpdateConsumerOffsetRequest(
            consumer_group="good", topic="T", queue_id=1, queue_offset=7, sync=True
        )
        await s.UpdateConsumerOffset(good, FakeContext())
        [(entry_type, [record])] = node.proposals
        assert entry_type == ENTRY_OFFSETS
        assert decode_offsets_record(record) == {("good", "T", 1): 7}

    asyncio.run(body())


def test_the_offset_record_drops_an_entry_it_cannot_encode_and_keeps_the_rest() -> None:
    record = offsets_record({("g" * 300, "T", 0): 1, ("ok", "T", 0): 5, ("ok", "bad/t", 1): 2})
    assert record is not None
    assert decode_offsets_record(record) == {("ok", "T", 0): 5}
    assert offsets_record({("g" * 300, "T", 0): 1}) is None


def test_heartbeats_are_bounded_per_group_in_total_and_per_field() -> None:
    """Finding: 5,000 heartbeats with distinct ids grew a node by 57 MiB (no caps)."""

    async def body() -> None:
        s, _ = _servicer()
        ctx = FakeContext()
        subs = [pb.Subscription(topic=f"T{i}", expression="A || B" * 60) for i in range(20)]
        for i in range(MAX_CONSUMERS_PER_GROUP):
            await s.Heartbeat(
                pb.HeartbeatRequest(client_id=f"c{i}", consumer_group="g", subscriptions=subs),
                ctx,
            )
        err = await _refused(
            s.Heartbeat(pb.HeartbeatRequest(client_id="one-more", consumer_group="g"), ctx)
        )
        assert err.code == grpc.StatusCode.RESOURCE_EXHAUSTED
        assert err.detail.startswith("TOO_MANY_CONSUMERS ")
        for request in (
            pb.HeartbeatRequest(client_id="x" * 1_000_000, consumer_group="g"),
            pb.HeartbeatRequest(client_id="c", consumer_group="g" * 1000),
            pb.HeartbeatRequest(
                client_id="c",
                consumer_group="g2",
                subscriptions=[pb.Subscription(topic="T")] * (MAX_SUBSCRIPTIONS + 1),
            ),
            pb.HeartbeatRequest(
                client_id="c",
                consumer_group="g2",
                subscriptions=[pb.Subscription(topic="T", expression="A" * 100_000)],
            ),
        ):
            err = await _refused(s.Heartbeat(request, ctx))
            assert err.code == grpc.StatusCode.INVALID_ARGUMENT, err.detail

    asyncio.run(body())


def test_heartbeat_memory_stays_bounded_under_a_flood_of_distinct_ids() -> None:
    limit = 2000

    async def body() -> int:
        s, _ = _servicer()
        if hasattr(s.consumers.consumers, "max_consumers"):
            s.consumers.consumers = ConsumerTable(max_consumers=limit)
        ctx = FakeContext()
        subs = [
            pb.Subscription(topic=f"Topic{i}", expression="TagA || TagB" * 40) for i in range(8)
        ]
        tracemalloc.start()
        before = tracemalloc.get_traced_memory()[0]
        for i in range(2 * limit):
            with contextlib.suppress(Aborted):
                await s.Heartbeat(
                    pb.HeartbeatRequest(
                        client_id=f"client-{i}", consumer_group=f"g{i % 30}", subscriptions=subs
                    ),
                    ctx,
                )
        grown = tracemalloc.get_traced_memory()[0] - before
        tracemalloc.stop()
        assert len(s.consumers.consumers) == limit
        return grown

    grown = asyncio.run(body())
    # A few hundred bytes per tracked consumer; the old table kept every subscription of
    # every id it ever saw (about 5 KB each here).
    assert grown < 4 << 20, grown


def test_consumers_expire_eagerly_and_free_their_locks(monkeypatch: pytest.MonkeyPatch) -> None:
    clock = [1_000_000]

    async def body() -> None:
        s, _ = _servicer()
        s.consumers.clock_ms = lambda: clock[0]
        ctx = FakeContext()
        q = [pb.QueueRef(topic="T", queue_id=0)]
        await s.Heartbeat(pb.HeartbeatRequest(client_id="a", consumer_group="g"), ctx)
        resp = await s.LockBatchMQ(
            pb.LockBatchRequest(consumer_group="g", client_id="a", queues=q), ctx
        )
        assert list(resp.locked) == q
        clock[0] += CONSUMER_EXPIRE_MS
        # Any heartbeat (not only GetConsumerList) drops the silent ones, and their locks.
        await s.Heartbeat(pb.HeartbeatRequest(client_id="b", consumer_group="other"), ctx)
        assert len(s.consumers.consumers) == 1 and len(s.consumers.locks) == 0

    asyncio.run(body())


def test_locks_on_queues_that_do_not_exist_take_no_room() -> None:
    async def body() -> None:
        s, _ = _servicer()
        junk = [pb.QueueRef(topic=f"J{i}", queue_id=i) for i in range(MAX_LOCK_BATCH)]
        resp = await s.LockBatchMQ(
            pb.LockBatchRequest(consumer_group="g", client_id="junk", queues=junk), FakeContext()
        )
        assert not resp.locked and len(s.consumers.locks) == 0
        beyond = [pb.QueueRef(topic="T", queue_id=8)]  # T has 8 queues
        resp = await s.LockBatchMQ(
            pb.LockBatchRequest(consumer_group="g", client_id="junk", queues=beyond),
            FakeContext(),
        )
        assert not resp.locked

    asyncio.run(body())


def test_system_topics_cannot_be_created_deleted_or_written() -> None:
    async def body() -> None:
        s, node = _servicer()
        ctx = FakeContext()
        for name in ("SCHEDULE_TOPIC_XXXX", "%RETRY%g", "%DLQ%g"):
            s.topics.ctx.sm.topics[name] = TopicConfig(name, 1, 1, PERM_RW)
            for call in (
                s.CreateTopic(pb.CreateTopicRequest(topic=pb.TopicConfig(topic_name=name)), ctx),
                s.DeleteTopic(pb.DeleteTopicRequest(topic=name), ctx),
                s.SendMessage(
                    pb.SendMessageRequest(topic=name, messages=[pb.Message(body=b"x")]), ctx
                ),
            ):
                err = await _refused(call)
                assert err.code == grpc.StatusCode.PERMISSION_DENIED
                assert err.detail.startswith("SYSTEM_TOPIC "), err.detail
        assert node.proposals == []

    asyncio.run(body())


def test_a_long_poll_that_times_out_leaves_no_waiter_and_polls_are_capped(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    async def body() -> None:
        s, _ = _servicer()
        request = pb.PullMessageRequest(
            consumer_group="g", topic="T", queue_id=0, suspend_timeout_ms=20
        )
        resp = await s.PullMessage(request, FakeContext())
        assert resp.status == pb.NO_NEW_MSG
        assert len(s.puller.polls) == 0 and s.puller.polls.queues() == 0
        monkeypatch.setattr("broker.components.pulling.MAX_LONG_POLLS_PER_PEER", 3)
        request.suspend_timeout_ms = 5000
        held: list[asyncio.Task[Any]] = [
            asyncio.ensure_future(s.PullMessage(request, FakeContext())) for _ in range(3)
        ]
        for _ in range(100):
            if len(s.puller.polls) == 3:
                break
            await asyncio.sleep(0.01)
        assert len(s.puller.polls) == 3
        err = await _refused(s.PullMessage(request, FakeContext()))
        assert err.code == grpc.StatusCode.RESOURCE_EXHAUSTED
        assert err.detail.startswith("TOO_MANY_LONG_POLLS ")
        # Another connection is not refused for this one's polls.
        other: asyncio.Future[Any] = asyncio.ensure_future(
            s.PullMessage(request, FakeContext("ipv4:10.0.0.2:1"))
        )
        for _ in range(100):
            if len(s.puller.polls) == 4:
                break
            await asyncio.sleep(0.01)
        assert len(s.puller.polls) == 4
        for task in [*held, other]:  # clients that went away: their waiters leave too
            task.cancel()
        await asyncio.gather(*held, other, return_exceptions=True)
        assert len(s.puller.polls) == 0 and s.puller.polls.queues() == 0

    asyncio.run(body())


def test_error_details_are_bounded_and_never_echo_a_huge_input() -> None:
    """Finding: an error echoing a 1 MB message id exceeded gRPC's metadata limit."""

    async def body() -> None:
        s, _ = _servicer()
        ctx = FakeContext()
        huge = "Z" * 1_000_000
        for call in (
            s.SendMessage(
                pb.SendMessageRequest(topic="T", messages=[pb.Message(body=b"x", msg_id=huge)]),
                ctx,
            ),
            s.ViewMessage(pb.ViewMessageRequest(msg_id=huge), ctx),
            s.PullMessage(pb.PullMessageRequest(topic="T", queue_id=0, subscription=huge), ctx),
            s.QueryMessageByKey(pb.QueryMessageByKeyRequest(topic="T", key=huge), ctx),
            s.SendMessage(
                pb.SendMessageRequest(
                    topic="T", messages=[pb.Message(body=b"x", keys=[huge[:30_000] + " x"])]
                ),
                ctx,
            ),
        ):
            err = await _refused(call)
            assert err.code == grpc.StatusCode.INVALID_ARGUMENT
            assert "ZZZZ" not in err.detail, err.detail[:100]

    asyncio.run(body())
    _, detail = error_status(RuntimeError("y" * 1_000_000), _node())
    assert detail.startswith("INTERNAL RuntimeError") and len(detail.encode()) <= 1000
    _, detail = error_status(RuntimeError("\u00e9" * 600), _node())
    assert len(detail.encode()) <= 1000


def test_a_megabyte_of_tags_is_invalid_argument_not_internal() -> None:
    """Finding: 1 MB of tags gave INTERNAL with a struct.error."""

    async def body() -> None:
        s, _ = _servicer()
        err = await _refused(
            s.SendMessage(
                pb.SendMessageRequest(
                    topic="T", messages=[pb.Message(body=b"x", tags="t" * (1 << 20))]
                ),
                FakeContext(),
            )
        )
        assert err.code == grpc.StatusCode.INVALID_ARGUMENT
        assert err.detail.startswith("PROPERTIES_TOO_LARGE "), err.detail[:200]

    asyncio.run(body())


def test_the_pb_size_estimate_bounds_the_serialized_size() -> None:
    """Pull answers are bounded with an O(1) estimate per message: it must never be below the
    real serialized size, whatever the message's shape."""
    from broker.state.message import Message, encode_message

    shapes = [
        Message("T", 0, b"x"),
        Message("T" * 127, (1 << 31) - 1, b"b" * 70_000, tags="t" * 300),
        Message("T", 1, b"y", keys=tuple("k" for _ in range(5000))),
        Message("T", 2, b"z", properties={f"p{i}": "" for i in range(2000)}),
        Message(
            "T",
            3,
            b"w" * 10,
            born_host="h" * 255,
            producer_group="g" * 255,
            born_timestamp_ms=(1 << 63) - 1,
            store_timestamp_ms=(1 << 63) - 1,
            reconsume_times=(1 << 31) - 1,
            flag=-(1 << 31),
            sys_flag=-1,
        ),
    ]
    s, _ = _servicer()
    for msg in shapes:
        msg = replace(msg, uniq_id="A" * 32)
        stored = len(encode_message(msg))
        m = s._message_pb(Found(msg, (1 << 63) - 1, (1 << 63) - 1))
        answer = pb.QueryMessageByKeyResponse(messages=[m])
        assert answer.ByteSize() <= answer_bytes(stored, msg), msg.topic[:5]


def test_background_tasks_are_supervised(monkeypatch: pytest.MonkeyPatch) -> None:
    """Finding (fail fast): an unexpected exception in the scheduler or the offset flush
    ended that task silently; now it ends the process with a FATAL line."""
    exits: list[int] = []
    monkeypatch.setattr(fatal, "_exit", exits.append)

    async def body() -> None:
        broker, node = _broker()
        s, scheduler = broker.servicer, broker.scheduler
        scheduler.ctx.sm.role = Role.LEADER

        async def broken(level: int) -> int | None:
            raise ValueError("scheduler bug")

        monkeypatch.setattr(scheduler, "deliver_level", broken)
        scheduler.maybe_start()
        assert scheduler.task is not None
        with contextlib.suppress(ValueError):
            await scheduler.task
        await asyncio.sleep(0)
        assert exits == [fatal.EXIT_FATAL]
        # The offset flush: transient errors are logged, anything else is fatal.
        s.offsets.ctx.cfg = replace(s.offsets.ctx.cfg, offset_commit_interval_ms=1)
        node.propose_error = TimeoutError()
        await s.UpdateConsumerOffset(
            pb.UpdateConsumerOffsetRequest(consumer_group="g", topic="T", queue_offset=1),
            FakeContext(),
        )
        assert s.offsets.flush_task is not None
        await s.offsets.flush_task
        assert exits == [fatal.EXIT_FATAL]
        node.propose_error = TypeError("flush bug")
        s.offsets.schedule_flush()
        with contextlib.suppress(TypeError):
            await s.offsets.flush_task
        await asyncio.sleep(0)
        assert exits == [fatal.EXIT_FATAL, fatal.EXIT_FATAL]

    asyncio.run(body())


def test_the_adapter_answers_in_the_one_shape_over_real_components(tmp_path: Path) -> None:
    """Requests in, components on a real state machine, responses out: the packed send
    answer, the raw pull answer (decoded as the client does) and GetConsumerLag."""

    async def body() -> None:
        node, sm, _, _ = world(tmp_path)
        s = assemble(node, sm, ServiceConfig("127.0.0.1", 10911)).servicer
        ctx = FakeContext()
        topic = pb.TopicConfig(topic_name="T", read_queue_nums=2, write_queue_nums=2)
        await s.CreateTopic(pb.CreateTopicRequest(topic=topic), ctx)
        msgs = [pb.Message(queue_id=i % 2, body=f"m{i}".encode(), tags="A") for i in range(5)]
        sent = await s.SendMessage(pb.SendMessageRequest(topic="T", messages=msgs), ctx)
        assert list(sent.packed_queue_ids) == [0, 1, 0, 1, 0]
        assert list(sent.packed_queue_offsets) == [0, 0, 1, 1, 2]
        assert not any(sent.packed_duplicates) and len(sent.packed_msg_ids) == 5
        pull = pb.PullMessageRequest(consumer_group="g", topic="T", queue_id=0, no_suspend=True)
        got = await s.PullMessage(pull, ctx)
        assert got.status == pb.FOUND and got.node_id == "n0"
        pulled = pulled_messages(got, "b")
        assert [m.body for m in pulled] == [b"m0", b"m2", b"m4"]
        assert [m.msg_id for m in pulled] == list(sent.packed_msg_ids)[::2]
        assert (
            pulled[2].offset_msg_id
            == sent.offset_msg_id_prefix + f"{sent.packed_positions[4]:016X}"
        )
        commit = pb.UpdateConsumerOffsetRequest(
            consumer_group="g", topic="T", queue_id=0, queue_offset=2, sync=True
        )
        await s.UpdateConsumerOffset(commit, ctx)
        lag = await s.GetConsumerLag(pb.GetConsumerLagRequest(consumer_group="g", topic="T"), ctx)
        assert [(q.queue_id, q.max_offset, q.committed_offset, q.lag) for q in lag.queues] == [
            (0, 3, 2, 1),
            (1, 2, -1, 2),
        ]
        err = await _refused(
            s.GetConsumerLag(pb.GetConsumerLagRequest(consumer_group="g", topic="Nope"), ctx)
        )
        assert err.code == grpc.StatusCode.NOT_FOUND and err.detail.startswith("TOPIC_NOT_FOUND ")

    asyncio.run(body())


def test_list_consumer_groups_merges_offsets_and_live_consumers_within_a_limit() -> None:
    async def body() -> None:
        s, _ = _servicer()
        ctx = FakeContext()
        s.consumers.ctx.sm.offsets.update({("g-offsets", "T2", 0): 5, ("g-offsets", "T1", 3): 1})
        await s.Heartbeat(pb.HeartbeatRequest(client_id="c1", consumer_group="g-live"), ctx)
        await s.Heartbeat(pb.HeartbeatRequest(client_id="c2", consumer_group="g-live"), ctx)
        resp = await s.ListConsumerGroups(pb.ListConsumerGroupsRequest(), ctx)
        got = [(g.consumer_group, list(g.topics), g.online_clients) for g in resp.groups]
        assert got == [("g-live", [], 2), ("g-offsets", ["T1", "T2"], 0)]
        assert not resp.truncated
        listed, truncated = s.consumers.listed(limit=1)
        assert [g.group for g in listed] == ["g-live"] and truncated

    asyncio.run(body())
