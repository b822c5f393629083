"""Producer send logic against in-process fake NameServer and broker nodes: NOT_LEADER
redirects, retry on another broker group with the same msg ids, no retry of request errors,
no success without the broker's OK, and a leader's own refusals (a full disk, back pressure)
reported as what they are, with the leader kept."""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Iterator
from concurrent import futures
from dataclasses import dataclass, field
from types import SimpleNamespace

import grpc
import pytest
from raftmq.broker.v1 import broker_pb2 as bpb
from raftmq.broker.v1 import broker_pb2_grpc as bpb_grpc
from raftmq.nameserver.v1 import nameserver_pb2 as pb
from raftmq.nameserver.v1 import nameserver_pb2_grpc as pb_grpc

from client import Message, MQClientError, Producer, mqadmin
from client import producer as producer_module
from client.producer import SelectMessageQueueByHash
from dledger.server import errormap
from dledger.server.errormap import DISK_FULL_RETRY_AFTER_MS
from dledger.storage import DiskFullError
from rpckit import status
from rpckit.status import RpcFailure

# A structured failure (as raftmq servers answer), a text-only (status, detail) as a server
# that predates the structured error answers, or None to answer OK.
Failure = RpcFailure | tuple[grpc.StatusCode, str]
Behaviour = Callable[[], Failure | None]
# The text detail of a failure sent with FakeBroker.garble: no code, no address to parse.
GARBLED = "?? l3ad3r is el5ewhere ??"


@dataclass
class FakeBroker(bpb_grpc.BrokerServicer):
    name: str
    behaviour: Behaviour = lambda: None
    seen: list[list[str]] = field(default_factory=list)
    lock: threading.Lock = field(default_factory=threading.Lock)
    # Looks at the request; (status, detail) to abort with.
    inspect: Callable[[bpb.SendMessageRequest], Failure | None] = lambda r: None
    # Send a structured failure with its text detail replaced by GARBLED (the details intact).
    garble: bool = False
    times: list[float] = field(default_factory=list)
    # Answer with one queue offset missing (a broken or lying broker).
    short: bool = False

    def SendMessage(
        self, request: bpb.SendMessageRequest, context: grpc.ServicerContext
    ) -> bpb.SendMessageResponse:
        with self.lock:
            self.seen.append([m.msg_id for m in request.messages])
            self.times.append(time.monotonic())
        failure = self.behaviour() or self.inspect(request)
        if isinstance(failure, tuple):
            context.abort(*failure)
        if failure is not None and self.garble:
            context.set_trailing_metadata(failure.grpc_status().trailing_metadata)
            context.abort(failure.status, GARBLED)
        if failure is not None:
            status.abort_sync(context, failure)
        n = len(request.messages)
        return bpb.SendMessageResponse(
            packed_msg_ids=[m.msg_id for m in request.messages],
            packed_queue_ids=[m.queue_id for m in request.messages],
            packed_queue_offsets=list(range(n - self.short)),
            packed_positions=[1000 * i for i in range(n)],
            packed_duplicates=[i % 2 == 1 for i in range(n)],
            offset_msg_id_prefix="7F00000100002A9F",
        )


class FakeNameServer(pb_grpc.NameServerServicer):
    def __init__(self) -> None:
        self.groups: list[pb.GroupRoute] = []

    def GetRouteInfoByTopic(
        self, request: pb.GetRouteInfoByTopicRequest, context: grpc.ServicerContext
    ) -> pb.GetRouteInfoByTopicResponse:
        return pb.GetRouteInfoByTopicResponse(topic=request.topic, groups=self.groups)


@dataclass
class World:
    namesrv: FakeNameServer
    namesrv_addr: str
    brokers: dict[str, FakeBroker]  # addr -> broker node
    addrs: dict[str, str]  # node name -> addr


@pytest.fixture(autouse=True)
def _round_robin_from_the_first_queue(monkeypatch: pytest.MonkeyPatch) -> None:
    """These tests script what each node answers to a producer's first send: start its round
    robin at the first queue (broker-a's), not at the random one a producer starts from."""
    monkeypatch.setattr(producer_module, "RR_START_SPAN", 1)


@pytest.fixture
def world() -> Iterator[World]:
    servers = []

    def serve(add: Callable[[grpc.Server], None]) -> str:
        server = grpc.server(futures.ThreadPoolExecutor(4))
        add(server)
        port = server.add_insecure_port("127.0.0.1:0")
        server.start()
        servers.append(server)
        return f"127.0.0.1:{port}"

    brokers, addrs = {}, {}
    for name in ("a0", "a1", "b0"):
        broker = FakeBroker(name)
        addr = serve(lambda s, b=broker: bpb_grpc.add_BrokerServicer_to_server(b, s))
        brokers[addr], addrs[name] = broker, addr
    namesrv = FakeNameServer()
    namesrv.groups = [
        pb.GroupRoute(
            broker_name="broker-a",
            read_queue_nums=1,
            write_queue_nums=1,
            perm=6,
            leader_id="a0",
            leader_addr=addrs["a0"],
            followers=[pb.NodeAddr(node_id="a1", addr=addrs["a1"])],
        ),
        pb.GroupRoute(
            broker_name="broker-b",
            read_queue_nums=1,
            write_queue_nums=1,
            perm=6,
            leader_id="b0",
            leader_addr=addrs["b0"],
        ),
    ]
    ns_addr = serve(lambda s: pb_grpc.add_NameServerServicer_to_server(namesrv, s))
    yield World(namesrv, ns_addr, brokers, addrs)
    for server in servers:
        server.stop(None).wait()


def node(w: World, name: str) -> FakeBroker:
    return w.brokers[w.addrs[name]]


def test_follows_not_leader_with_the_same_msg_id(world: World) -> None:
    node(world, "a0").behaviour = lambda: status.not_leader("a1", world.addrs["a1"])
    with Producer("pg", world.namesrv_addr) as producer:
        msg = Message("T", b"x")
        result = producer.send(msg)
    assert result.message_queue.broker_name == "broker-a"
    assert node(world, "a0").seen == [[msg.msg_id]] and node(world, "a1").seen == [[msg.msg_id]]
    assert result.msg_id == msg.msg_id and len(msg.msg_id) == 32


def test_retries_on_another_group_with_the_same_msg_ids(world: World) -> None:
    for name in ("a0", "a1"):
        node(world, name).behaviour = lambda: (grpc.StatusCode.UNAVAILABLE, "NO_QUORUM")
    with Producer("pg", world.namesrv_addr, send_msg_timeout_s=0.3) as producer:
        msgs = [Message("T", b"1"), Message("T", b"2")]
        results = producer.send_batch(msgs)
    assert {r.message_queue.broker_name for r in results} == {"broker-b"}
    ids = [m.msg_id for m in msgs]
    seen = node(world, "a0").seen + node(world, "a1").seen + node(world, "b0").seen
    assert len(seen) >= 2 and all(s == ids for s in seen)


def test_request_errors_are_not_retried(world: World) -> None:
    node(world, "a0").behaviour = lambda: (
        grpc.StatusCode.INVALID_ARGUMENT,
        "MESSAGE_TOO_LARGE 5000000 > 4194304",
    )
    with Producer("pg", world.namesrv_addr) as producer, pytest.raises(MQClientError) as info:
        producer.send(Message("T", b"big"))
    assert (info.value.code, info.value.status) == ("MESSAGE_TOO_LARGE", "INVALID_ARGUMENT")
    assert len(node(world, "a0").seen) == 1 and not node(world, "b0").seen


def test_no_success_without_an_ok(world: World) -> None:
    for b in world.brokers.values():
        b.behaviour = lambda: (grpc.StatusCode.UNAVAILABLE, "LEADERSHIP_LOST")
    failures: list[BaseException] = []
    with Producer(
        "pg", world.namesrv_addr, send_msg_timeout_s=0.2, retry_times_when_send_failed=2
    ) as producer:
        with pytest.raises(MQClientError) as info:
            producer.send(Message("T", b"x"))
        future = producer.send_async(Message("T", b"y"), on_exception=failures.append)
        with pytest.raises(MQClientError):
            future.result(timeout=10)
    assert info.value.code == "LEADERSHIP_LOST"
    assert len(failures) == 1
    # 1 + 2 attempts alternate between the groups.
    assert node(world, "b0").seen and node(world, "a0").seen


def _concurrently(n: int, fn: Callable[[int], object]) -> list[object]:
    out: list[object] = [None] * n
    start = threading.Barrier(n)

    def run(i: int) -> None:
        start.wait()
        try:
            out[i] = fn(i)
        except BaseException as exc:
            out[i] = exc

    threads = [threading.Thread(target=run, args=(i,)) for i in range(n)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(30)
    return out


def test_concurrent_sends_share_calls_and_each_gets_its_own_result(world: World) -> None:
    gate = threading.Event()

    def slow() -> None:
        gate.wait(0.2)  # the first calls stall: everyone else queues up behind them

    node(world, "a0").behaviour = slow  # type: ignore[assignment]
    n = 64
    with Producer("pg", world.namesrv_addr) as producer:
        msgs = [Message("T", f"m{i}".encode()) for i in range(n)]
        # Both groups take sends round-robin; to count calls, send to broker-a only.
        world.namesrv.groups = world.namesrv.groups[:1]
        results = _concurrently(n, lambda i: producer.send(msgs[i]))
    calls = node(world, "a0").seen
    assert sum(len(c) for c in calls) == n
    assert len(calls) <= n // 4, f"{len(calls)} calls for {n} concurrent sends: no coalescing"
    assert max(len(c) for c in calls) > 1
    for msg, r in zip(msgs, results, strict=True):
        assert not isinstance(r, BaseException), r
        assert r.msg_id == msg.msg_id  # type: ignore[union-attr]


def test_a_bad_message_fails_only_its_own_coalesced_send(world: World) -> None:
    world.namesrv.groups = world.namesrv.groups[:1]
    seen_bodies: list[list[bytes]] = []

    def refuse_bad(request: bpb.SendMessageRequest) -> tuple[grpc.StatusCode, str] | None:
        seen_bodies.append([m.body for m in request.messages])
        threading.Event().wait(0.1)
        if any(m.body == b"bad" for m in request.messages):
            return (grpc.StatusCode.INVALID_ARGUMENT, "MESSAGE_TOO_LARGE bad")
        return None

    node(world, "a0").inspect = refuse_bad
    n = 32
    with Producer("pg", world.namesrv_addr) as producer:
        bodies = [b"bad" if i == n // 2 else f"ok{i}".encode() for i in range(n)]

        def send_one(i: int) -> object:
            if bodies[i] == b"bad":  # arrives while the first calls are in flight: it waits
                threading.Event().wait(0.05)
            return producer.send(Message("T", bodies[i]))

        results = _concurrently(n, send_one)
    assert any(len(b) > 1 and b"bad" in b for b in seen_bodies), "never coalesced with bad"
    for body, r in zip(bodies, results, strict=True):
        if body == b"bad":
            assert isinstance(r, MQClientError) and r.code == "MESSAGE_TOO_LARGE"
        else:
            assert not isinstance(r, BaseException), (body, r)


def test_async_sends_share_calls_and_hold_no_thread_each(world: World) -> None:
    gate = threading.Event()
    node(world, "a0").behaviour = lambda: (gate.wait(0.2), None)[1]  # type: ignore[assignment]
    world.namesrv.groups = world.namesrv.groups[:1]
    n = 300
    threads_seen: set[str] = set()
    ok: list[str] = []
    running = [0]  # callbacks running at once: never more than one
    overlaps: list[int] = []
    with Producer("pg", world.namesrv_addr) as producer:
        before = threading.active_count()
        msgs = [Message("T", f"m{i}".encode()) for i in range(n)]

        def on_success(r: object) -> None:
            running[0] += 1
            if running[0] > 1:
                overlaps.append(running[0])
            threads_seen.add(threading.current_thread().name)
            ok.append(r.msg_id)  # type: ignore[attr-defined]
            time.sleep(0.0001)  # widen the window a second runner would show in
            running[0] -= 1

        futures_ = [producer.send_async(m, on_success=on_success) for m in msgs]
        during = threading.active_count()
        results = [f.result(timeout=30) for f in futures_]
    assert during - before < 8, f"{during - before} threads for {n} async sends"
    calls = node(world, "a0").seen
    assert sum(len(c) for c in calls) == n and len(calls) <= n // 50, [len(c) for c in calls]
    assert [r.msg_id for r in results] == [m.msg_id for m in msgs]
    assert sorted(ok) == sorted(m.msg_id for m in msgs)
    # One at a time, on the producer's sender threads (the one that got the answer).
    assert not overlaps
    assert threads_seen and all(t.startswith("producer-sender-") for t in threads_seen)


def test_async_send_follows_redirects_and_retries_on_another_group(world: World) -> None:
    node(world, "a0").behaviour = lambda: status.not_leader("a1", world.addrs["a1"])
    with Producer("pg", world.namesrv_addr, send_msg_timeout_s=0.5) as producer:
        first = producer.send_async(Message("T", b"x"))
        redirected = first.result(timeout=10)
        assert redirected.message_queue.broker_name in {"broker-a", "broker-b"}
        # broker-a now fails as a whole: the send goes to broker-b with the same msg id.
        for name in ("a0", "a1"):
            node(world, name).behaviour = lambda: status.no_quorum(3000)
        for b in world.brokers.values():
            b.seen.clear()
        msgs = [Message("T", f"r{i}".encode()) for i in range(4)]
        results = [f.result(timeout=20) for f in [producer.send_async(m) for m in msgs]]
    assert {r.message_queue.broker_name for r in results} == {"broker-b"}
    assert {r.msg_id for r in results} == {m.msg_id for m in msgs}
    tried_a = {i for c in node(world, "a0").seen + node(world, "a1").seen for i in c}
    assert tried_a and tried_a <= {m.msg_id for m in msgs}


def test_shutdown_waits_for_async_sends_and_a_callback_may_send(world: World) -> None:
    node(world, "a0").behaviour = lambda: (threading.Event().wait(0.05), None)[1]  # type: ignore[assignment]
    world.namesrv.groups = world.namesrv.groups[:1]
    nested: list[object] = []
    producer = Producer("pg", world.namesrv_addr)
    producer.start()
    futures_ = [producer.send_async(Message("T", f"s{i}".encode())) for i in range(40)]
    # A callback that sends synchronously must not deadlock the producer.
    producer.send_async(
        Message("T", b"outer"),
        on_success=lambda r: nested.append(producer.send(Message("T", b"in"))),
    )
    producer.shutdown()
    assert all(f.done() and f.exception() is None for f in futures_)
    assert len(nested) == 1 and nested[0].msg_id  # type: ignore[attr-defined]
    with pytest.raises(MQClientError) as info:
        producer.send_async(Message("T", b"late"))
    assert info.value.code == "NOT_STARTED"


def test_async_sends_block_beyond_the_pending_limit(
    world: World, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr("client.producer.ASYNC_MAX_PENDING", 3)
    gate = threading.Event()
    node(world, "a0").behaviour = lambda: (gate.wait(10), None)[1]  # type: ignore[assignment]
    world.namesrv.groups = world.namesrv.groups[:1]
    issued: list[object] = []
    with Producer("pg", world.namesrv_addr) as producer:

        def issue() -> None:
            for i in range(6):
                issued.append(producer.send_async(Message("T", f"p{i}".encode())))

        sender = threading.Thread(target=issue)
        sender.start()
        sender.join(0.5)
        assert sender.is_alive() and len(issued) == 3  # the fourth waits for a free slot
        gate.set()
        sender.join(10)
        assert len(issued) == 6
        assert all(f.result(timeout=10).msg_id for f in issued)  # type: ignore[attr-defined]


def test_a_callback_beyond_the_pending_limit_is_refused_not_hung(
    world: World, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A send callback whose async send finds every slot taken would wait for slots that
    only the callbacks after it free (the same thread runs them): it hears
    TOO_MANY_PENDING_SENDS at once, and the sends it made before still complete."""
    monkeypatch.setattr("client.producer.ASYNC_MAX_PENDING", 1)
    world.namesrv.groups = world.namesrv.groups[:1]
    made: list[object] = []
    refused: list[MQClientError] = []
    finished = threading.Event()
    with Producer("pg", world.namesrv_addr, send_msg_timeout_s=2.0) as producer:

        def outer_done(_: object) -> None:
            try:
                made.append(producer.send_async(Message("T", b"takes-the-slot")))
                made.append(producer.send_async(Message("T", b"finds-none")))
            except MQClientError as exc:
                refused.append(exc)
            finally:
                finished.set()

        producer.send_async(Message("T", b"outer"), on_success=outer_done)
        assert finished.wait(10), "a send callback waited for a slot it alone could free"
        assert len(made) == 1 and [e.code for e in refused] == ["TOO_MANY_PENDING_SENDS"]
        assert made[0].result(timeout=10).msg_id  # type: ignore[attr-defined]


def test_packed_answers_are_read_and_a_short_column_is_refused(world: World) -> None:
    world.namesrv.groups = world.namesrv.groups[:1]
    with Producer("pg", world.namesrv_addr) as producer:
        msgs = [Message("T", f"m{i}".encode()) for i in range(3)]
        batch = producer.send_batch(msgs)
        one = producer.send(Message("T", b"alone"))
        node(world, "a0").short = True
        with pytest.raises(MQClientError) as bad:
            producer.send_batch([Message("T", b"x"), Message("T", b"y")])
    assert [r.msg_id for r in batch] == [m.msg_id for m in msgs]
    assert [r.queue_offset for r in batch] == [0, 1, 2]
    assert [r.commitlog_position for r in batch] == [0, 1000, 2000]
    assert [r.duplicate for r in batch] == [False, True, False]
    assert batch[2].offset_msg_id == "7F00000100002A9F" + f"{2000:016X}"
    assert all(r.message_queue.broker_name == "broker-a" for r in batch)
    assert one.queue_offset == 0 and one.offset_msg_id == "7F00000100002A9F" + "0" * 16
    assert bad.value.code == "BAD_RESPONSE"


def test_follows_the_structured_redirect_when_the_text_is_garbled(world: World) -> None:
    """The client acts on the ErrorInfo fields, not on the text: with a detail that names
    neither a code nor an address, the redirect to a1 is still followed."""
    a0 = node(world, "a0")
    a0.garble = True
    a0.behaviour = lambda: status.not_leader("a1", world.addrs["a1"])
    with Producer("pg", world.namesrv_addr) as producer:
        msg = Message("T", b"x")
        result = producer.send(msg)
    assert result.message_queue.broker_name == "broker-a"
    assert a0.seen == [[msg.msg_id]] and node(world, "a1").seen == [[msg.msg_id]]
    assert not node(world, "b0").seen  # redirected within the group, not retried elsewhere


def test_the_error_fields_reach_the_caller(world: World) -> None:
    a0 = node(world, "a0")
    a0.garble = True
    a0.behaviour = lambda: RpcFailure(grpc.StatusCode.NOT_FOUND, "TOPIC_NOT_FOUND", "T")
    with Producer("pg", world.namesrv_addr) as producer, pytest.raises(MQClientError) as info:
        producer.send(Message("T", b"x"))
    err = info.value
    assert (err.code, err.status, err.structured) == ("TOPIC_NOT_FOUND", "NOT_FOUND", True)
    assert err.message == GARBLED and not err.retryable
    assert len(a0.seen) == 1  # not retryable: one attempt


def test_a_retry_waits_for_the_servers_hint(world: World) -> None:
    """BACK_PRESSURE with a 400 ms hint: the next attempt (another node or group) comes no
    sooner than that, although the client's own wait is 100-200 ms."""
    hint_ms = 400
    refused = [False]

    def once() -> Failure | None:
        if refused[0]:
            return None
        refused[0] = True
        return RpcFailure(
            grpc.StatusCode.RESOURCE_EXHAUSTED,
            "BACK_PRESSURE",
            "busy",
            retryable=True,
            retry_after_ms=hint_ms,
        )

    for b in world.brokers.values():
        b.behaviour = once
    with Producer("pg", world.namesrv_addr) as producer:
        producer.send(Message("T", b"x"))
    times = sorted(t for b in world.brokers.values() for t in b.times)
    assert len(times) == 2, times
    assert times[1] - times[0] >= hint_ms / 1000 * 0.95, times


def test_a_server_without_structured_errors_still_gets_retries(world: World) -> None:
    """Text-only answers (a server that predates ErrorInfo): the code is read from the text
    and a transport status such as UNAVAILABLE is retried (on broker-b here)."""
    for name in ("a0", "a1"):
        node(world, name).behaviour = lambda: (grpc.StatusCode.UNAVAILABLE, "NO_QUORUM x")
    with Producer("pg", world.namesrv_addr, send_msg_timeout_s=0.3) as producer:
        msgs = [Message("T", f"m{i}".encode()) for i in range(3)]
        results = [producer.send(m) for m in msgs]
    assert {r.message_queue.broker_name for r in results} == {"broker-b"}
    err = MQClientError("NO_QUORUM", "UNAVAILABLE", "x", retryable=True)
    assert err.retryable and not err.structured


def _disk_full() -> RpcFailure:
    """What a leader's DiskGuard answers, through the servers' own mapping."""
    node = SimpleNamespace(leader_client_addr=lambda: ("a0", ""), append_timeout_ms=3000)
    failure = errormap.dledger_failure(DiskFullError("node=a0 path=/s used=95.0% max=90%"), node)
    assert failure is not None
    return failure


def test_a_full_disk_is_reported_as_disk_full_at_once(world: World) -> None:
    """The leader's DISK_FULL reaches the caller as DISK_FULL, after one call: no follower is
    asked (it would only redirect back, and the send used to end as NOT_LEADER after its
    whole timeout), no retry in the only group, and the leader stays the known leader."""
    world.namesrv.groups = world.namesrv.groups[:1]
    a0, a1 = node(world, "a0"), node(world, "a1")
    a0.behaviour = _disk_full
    a1.behaviour = lambda: status.not_leader("a0", world.addrs["a0"])
    with Producer("pg", world.namesrv_addr, send_msg_timeout_s=2.0) as producer:
        with pytest.raises(MQClientError) as info:
            producer.send(Message("T", b"x"))
        future = producer.send_async(Message("T", b"y"))
        with pytest.raises(MQClientError) as async_info:
            future.result(timeout=10)
        assert len(a0.seen) == 2 and not a1.seen
        a0.behaviour = lambda: None  # space freed: the next send goes straight to a0
        assert producer.send(Message("T", b"z")).message_queue.broker_name == "broker-a"
    for err in (info.value, async_info.value):
        assert (err.code, err.status, err.structured) == ("DISK_FULL", "RESOURCE_EXHAUSTED", True)
        assert err.retryable and err.retry_after_ms == DISK_FULL_RETRY_AFTER_MS
        assert err.message.startswith("DISK_FULL node=a0 ")
    assert len(a0.seen) == 3 and not a1.seen


def test_a_full_disk_moves_the_send_to_another_group(world: World) -> None:
    a0, a1, b0 = node(world, "a0"), node(world, "a1"), node(world, "b0")
    a0.behaviour = _disk_full
    with Producer("pg", world.namesrv_addr) as producer:
        msgs = [Message("T", f"m{i}".encode()) for i in range(4)]
        results = [producer.send(m) for m in msgs]
        async_results = [producer.send_async(m).result(timeout=10) for m in msgs[:2]]
    assert {r.message_queue.broker_name for r in results + async_results} == {"broker-b"}
    # One refused call in all: the group is avoided afterwards, not asked on every send.
    assert not a1.seen and len(a0.seen) == 1
    assert {i for c in b0.seen for i in c} == {m.msg_id for m in msgs}


def test_a_full_group_is_probed_again_after_its_avoidance(
    world: World, monkeypatch: pytest.MonkeyPatch
) -> None:
    # The producer's clock, moved past the avoidance instead of sleeping it out (no send is
    # in flight when it moves, so no deadline is cut short).
    skew_s = [0.0]
    clock = SimpleNamespace(monotonic=lambda: time.monotonic() + skew_s[0], sleep=time.sleep)
    monkeypatch.setattr(producer_module, "time", clock)
    a0, b0 = node(world, "a0"), node(world, "b0")
    a0.behaviour = _disk_full
    with Producer("pg", world.namesrv_addr) as producer:
        for i in range(4):
            assert producer.send(Message("T", b"%d" % i)).message_queue.broker_name == "broker-b"
        assert len(a0.seen) == 1
        a0.behaviour = lambda: None  # space freed
        skew_s[0] = producer_module.FULL_GROUP_AVOID_S + 1
        groups = {
            producer.send(Message("T", b"%d" % i)).message_queue.broker_name for i in range(4)
        }
    assert groups == {"broker-a", "broker-b"} and len(a0.seen) >= 2 and b0.seen


def test_an_ordered_send_to_a_full_group_fails_at_once(world: World) -> None:
    for b in world.brokers.values():
        b.behaviour = _disk_full
    with Producer("pg", world.namesrv_addr) as producer, pytest.raises(MQClientError) as info:
        producer.send(Message("T", b"x"), SelectMessageQueueByHash(), "order-1")
    assert info.value.code == "DISK_FULL"
    # One call in all: the queue the selector chose, on its group's leader.
    assert sum(len(b.seen) for b in world.brokers.values()) == 1


def test_a_busy_leader_is_asked_again_and_its_code_is_kept(world: World) -> None:
    """BACK_PRESSURE is the leader speaking of itself: the same node again after the hint
    (never a follower), and at the timeout the caller hears BACK_PRESSURE."""
    world.namesrv.groups = world.namesrv.groups[:1]
    a0, a1 = node(world, "a0"), node(world, "a1")
    busy = RpcFailure(
        grpc.StatusCode.RESOURCE_EXHAUSTED,
        "BACK_PRESSURE",
        "busy",
        retryable=True,
        retry_after_ms=50,
    )
    a0.behaviour = lambda: busy
    a1.behaviour = lambda: status.not_leader("a0", world.addrs["a0"])
    with Producer(
        "pg", world.namesrv_addr, send_msg_timeout_s=0.3, retry_times_when_send_failed=0
    ) as producer:
        with pytest.raises(MQClientError) as info:
            producer.send(Message("T", b"x"))
        assert info.value.code == "BACK_PRESSURE"
        assert len(a0.seen) >= 2 and not a1.seen
        a0.behaviour = lambda: None
        producer.send(Message("T", b"y"))
    assert not a1.seen


def test_mqadmin_reports_a_full_disk(world: World, capsys: pytest.CaptureFixture[str]) -> None:
    world.namesrv.groups = world.namesrv.groups[:1]
    node(world, "a0").behaviour = _disk_full
    code = mqadmin.main(["-n", world.namesrv_addr, "sendMessage", "-t", "T", "-p", "x"])
    err = capsys.readouterr().err.strip()
    assert code == 1
    assert err.startswith("mqadmin sendMessage: DISK_FULL (RESOURCE_EXHAUSTED): node=a0 "), err
    assert "\n" not in err and not node(world, "a1").seen


def test_an_attempt_with_an_unknown_outcome_marks_the_final_error(world: World) -> None:
    """The first attempt dies with the connection (it may have been stored); the retries are
    answered NOT_LEADER with no leader known. The caller must not read a definite failure."""
    world.namesrv.groups = world.namesrv.groups[:1]
    a0, a1 = node(world, "a0"), node(world, "a1")
    answers = iter([(grpc.StatusCode.UNAVAILABLE, "connection reset")])
    a0.behaviour = lambda: next(answers, status.not_leader(None, ""))
    a1.behaviour = lambda: status.not_leader(None, "")
    with (
        Producer(
            "pg", world.namesrv_addr, send_msg_timeout_s=0.5, retry_times_when_send_failed=1
        ) as producer,
        pytest.raises(MQClientError) as info,
    ):
        producer.send(Message("T", b"x"))
    assert info.value.code in ("NOT_LEADER", "NO_LEADER") and info.value.outcome_unknown


def test_producers_start_their_round_robin_at_a_random_queue(
    world: World, monkeypatch: pytest.MonkeyPatch
) -> None:
    """From queue 0, many short-lived producers sending one message each would all land on
    broker-a: 24 producers over the route's two groups reach both (1 in 2**23 they do not)."""
    monkeypatch.setattr(producer_module, "RR_START_SPAN", 1 << 20)
    groups = set()
    for i in range(24):
        with Producer(f"pg{i}", world.namesrv_addr) as producer:
            groups.add(producer.send(Message("T", b"x")).message_queue.broker_name)
    assert groups == {"broker-a", "broker-b"}


@pytest.fixture
def thread_starts(monkeypatch: pytest.MonkeyPatch) -> list[str]:
    """The names of the threads started from now on (gRPC's own threads included: its
    synchronous channel starts them through ``threading.Thread`` too)."""
    started: list[str] = []
    real_start = threading.Thread.start

    def counting_start(self: threading.Thread) -> None:
        started.append(self.name)
        real_start(self)

    monkeypatch.setattr(threading.Thread, "start", counting_start)
    return started


# Sends in a row that count their thread starts; a thread start per send (gRPC's "channel
# spin" thread for a future at one call in flight) would start at least this many.
SENDS_IN_A_ROW = 60
# Thread starts allowed meanwhile, none of them per send: the fake servers' handler pools
# (up to 4 threads each, made on demand), the producer's heartbeat thread (started with the
# first topic), a second sender (a send handed on while the first was finishing).
OTHER_THREAD_STARTS = 10


def test_sends_in_a_row_start_no_thread_each(world: World, thread_starts: list[str]) -> None:
    world.namesrv.groups = world.namesrv.groups[:1]
    with Producer("pg", world.namesrv_addr) as producer:
        for i in range(3):  # warm-up: the route, the channel, the server's handler threads
            producer.send(Message("T", f"w{i}".encode()))
        thread_starts.clear()
        for i in range(SENDS_IN_A_ROW):
            producer.send(Message("T", f"s{i}".encode()))
        during = list(thread_starts)
    assert len(during) <= OTHER_THREAD_STARTS, f"{SENDS_IN_A_ROW} sends started {during}"


def test_a_chain_of_async_sends_starts_no_thread_and_stays_on_one_thread(
    world: World, thread_starts: list[str]
) -> None:
    """Each callback sends the next message (bench.loadgen's closed loop): the next send
    leaves from the thread that ran the callback, so the chain needs neither a thread start
    nor a hand-over per send."""
    world.namesrv.groups = world.namesrv.groups[:1]
    done = threading.Event()
    callback_threads: list[str] = []
    errors: list[BaseException] = []
    with Producer("pg", world.namesrv_addr) as producer:
        producer.send(Message("T", b"warm-up"))
        thread_starts.clear()

        def next_send(left: int) -> None:
            if left == 0:
                done.set()
                return

            def ok(_: object) -> None:
                callback_threads.append(threading.current_thread().name)
                next_send(left - 1)

            def failed(exc: BaseException) -> None:
                errors.append(exc)
                done.set()

            producer.send_async(Message("T", f"c{left}".encode()), ok, failed)

        next_send(SENDS_IN_A_ROW)
        assert done.wait(30), f"{len(callback_threads)} of {SENDS_IN_A_ROW} sends answered"
        during = list(thread_starts)
    assert not errors
    assert len(callback_threads) == SENDS_IN_A_ROW
    assert len(during) <= OTHER_THREAD_STARTS, f"{SENDS_IN_A_ROW} sends started {during}"
    # After the first send (handed from this thread) the chain runs on one sender.
    assert len(set(callback_threads[1:])) == 1, sorted(set(callback_threads))


def test_a_callback_sending_async_then_sync_to_one_group_does_not_deadlock(
    world: World,
) -> None:
    """The async send takes the group's call and waits for the callback to be over; the
    sync send behind it in the same callback would wait for it forever unless the deferred
    call leaves first."""
    world.namesrv.groups = world.namesrv.groups[:1]
    inner: list[object] = []
    finished = threading.Event()
    with Producer("pg", world.namesrv_addr, send_msg_timeout_s=2.0) as producer:

        def outer_done(_: object) -> None:
            first = producer.send_async(Message("T", b"async-in-callback"))
            inner.append(producer.send(Message("T", b"sync-in-callback")))
            inner.append(first)
            finished.set()

        producer.send_async(Message("T", b"outer"), on_success=outer_done)
        assert finished.wait(10), "a sync send from a callback deadlocked"
        assert inner[0].msg_id  # type: ignore[attr-defined]
        assert inner[1].result(timeout=10).msg_id  # type: ignore[attr-defined]
