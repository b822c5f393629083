"""The broker on a real 3-node group: processes on 127.0.0.1, real gRPC, files and SIGKILL."""

from __future__ import annotations

import hashlib
import re
import shutil
import signal
import struct
import time
from collections import Counter
from collections.abc import Callable, Sequence
from pathlib import Path

import grpc
import pytest
from raftmq.broker.v1 import broker_pb2 as pb
from raftmq.broker.v1 import broker_pb2_grpc as pb_grpc
from raftmq.common.v1 import error_pb2
from support import pulled, send_results, wait_for

from broker.state.message import UniqIdGenerator
from client.message import MessageExt
from mqcluster.cluster import LocalCluster
from mqcluster.leader_client import LeaderClient
from rpckit.status import read_error

pytestmark = pytest.mark.integration

TOPIC = "TopicTest"
QUEUES = 8
TAGS = ("TagA", "TagB", "TagC")
# Small key index files: the defaults (about 420 MB sparse per file) are for production.
INDEX_CONF = {"maxHashSlotNum": 100_000, "maxIndexNum": 400_000}


class Broker(LeaderClient):
    """A minimal client over the generated stubs: leader-only calls follow the structured
    NOT_LEADER redirect (mqcluster.leader_client, shared with the demo)."""

    def __init__(self, cluster: LocalCluster) -> None:
        super().__init__(self.live_addrs)
        self.cluster = cluster

    def live_addrs(self) -> list[str]:
        return [n.client_addr for n in self.cluster.nodes if self.cluster.pid(n) is not None]

    def write(self, method: str, request: object, timeout_s: float = 10.0) -> object:
        """Call a leader-only RPC, following redirects and retrying until the deadline (a
        retried send must carry the same uniq ids: the broker deduplicates)."""
        return self.call(lambda stub: getattr(stub, method)(request, timeout=5.0), timeout_s)

    def send(self, messages: Sequence[pb.Message], topic: str = TOPIC) -> pb.SendMessageResponse:
        resp = self.write("SendMessage", pb.SendMessageRequest(topic=topic, messages=messages))
        assert isinstance(resp, pb.SendMessageResponse)
        return resp

    def pull_all(
        self, addr: str, queue_id: int, start: int = 0, sub: str = "*"
    ) -> list[MessageExt]:
        out: list[MessageExt] = []
        offset = start
        while True:
            resp = self.stub(addr).PullMessage(
                pb.PullMessageRequest(
                    consumer_group="g",
                    topic=TOPIC,
                    queue_id=queue_id,
                    queue_offset=offset,
                    max_msgs=1024,
                    subscription=sub,
                    no_suspend=True,
                ),
                timeout=10,
            )
            if resp.status == pb.NO_NEW_MSG:
                return out
            assert resp.status in (pb.FOUND, pb.NO_MATCHED_MSG), resp.status
            out.extend(pulled(resp))
            offset = resp.next_begin_offset

    def max_offsets(self, addr: str) -> list[int]:
        return [
            self.stub(addr)
            .GetQueueOffsets(pb.GetQueueOffsetsRequest(topic=TOPIC, queue_id=q), timeout=5)
            .max_offset
            for q in range(QUEUES)
        ]

    def wait_same_offsets(
        self, timeout_s: float = 20.0, addrs: Sequence[str] | None = None
    ) -> list[int]:
        """Wait until ``addrs`` (default: the live nodes) hold the same queues."""
        seen: dict[str, list[int]] = {}

        def same() -> bool:
            seen.clear()
            for addr in addrs if addrs is not None else self.live_addrs():
                try:
                    seen[addr] = self.max_offsets(addr)
                except grpc.RpcError:
                    return False
            return len({tuple(v) for v in seen.values()}) == 1

        wait_for(same, timeout_s, f"every node to apply the same messages ({seen})")
        return next(iter(seen.values()))


def make_messages(ids: UniqIdGenerator, start: int, n: int) -> list[pb.Message]:
    return [
        pb.Message(
            queue_id=i % QUEUES,
            tags=TAGS[i % len(TAGS)],
            keys=[f"key-{i}"],
            body=f"message-{i:05d}".encode() * 4,
            born_host="127.0.0.1:5555",
            producer_group="pg",
            msg_id=ids.next_id(),
        )
        for i in range(start, start + n)
    ]


def setup_group(
    local_group: Callable[..., LocalCluster], **conf: object
) -> tuple[LocalCluster, Broker]:
    cluster = local_group(3, **{**INDEX_CONF, **conf})
    client = Broker(cluster)
    client.write(
        "CreateTopic",
        pb.CreateTopicRequest(
            topic=pb.TopicConfig(topic_name=TOPIC, read_queue_nums=QUEUES, write_queue_nums=QUEUES)
        ),
    )
    return cluster, client


def cq_digest(root: Path) -> dict[str, str]:
    base = root / "consumequeue"
    return {
        str(p.relative_to(base)): hashlib.sha256(p.read_bytes()).hexdigest()
        for p in sorted(base.rglob("*"))
        if p.is_file()
    }


def assert_same_consumequeues(cluster: LocalCluster) -> None:
    """Every node's ConsumeQueue files hold the same bytes; on a mismatch, name the first
    differing record of each file."""
    roots = {n.node_id: Path(cluster.base) / n.node_id for n in cluster.nodes}
    digests = {node: cq_digest(root) for node, root in roots.items()}
    first = next(iter(digests.values()))
    if first and all(d == first for d in digests.values()):
        return
    problems = []
    names = sorted({name for d in digests.values() for name in d})
    for name in names:
        blobs = {
            node: (root / "consumequeue" / name).read_bytes()
            if (root / "consumequeue" / name).exists()
            else b""
            for node, root in roots.items()
        }
        if len(set(blobs.values())) == 1:
            continue
        size = max(len(b) for b in blobs.values())
        at = next(i for i in range(0, size, 20) if len({b[i : i + 20] for b in blobs.values()}) > 1)
        records = {
            node: struct.unpack(">QIq", b[at : at + 20]) if len(b) >= at + 20 else None
            for node, b in blobs.items()
        }
        problems.append(f"{name} record {at // 20}: {records}")
    raise AssertionError("ConsumeQueues differ: " + "; ".join(problems[:8]))


def test_10k_messages_pulled_in_order_filtered_and_found_on_every_node(
    local_group: Callable[..., LocalCluster],
) -> None:
    cluster, client = setup_group(local_group)
    ids = UniqIdGenerator(ip="127.0.0.1")
    sent = make_messages(ids, 0, 10_000)
    started = time.monotonic()
    results: list[pb.SendResult] = []
    for i in range(0, len(sent), 200):
        results.extend(send_results(client.send(sent[i : i + 200])))
    elapsed = time.monotonic() - started
    print(f"\nsend: 10,000 messages in batches of 200: {len(sent) / elapsed:,.0f} msg/s")
    assert [r.msg_id for r in results] == [m.msg_id for m in sent]
    # Only a retried send (outcome unknown, e.g. a leader change) may be answered as duplicate.
    print(f"client retries by code: {dict(client.retries)}")
    assert not any(r.duplicate for r in results) or set(client.retries) - {"NOT_LEADER"}, (
        client.retries
    )
    expected = {q: [m for m in sent if m.queue_id == q] for q in range(QUEUES)}
    assert client.wait_same_offsets() == [len(expected[q]) for q in range(QUEUES)]

    for addr in cluster.client_addrs:
        for q in range(QUEUES):
            got = client.pull_all(addr, q)
            assert [m.msg_id for m in got] == [m.msg_id for m in expected[q]], (addr, q)
            assert [m.queue_offset for m in got] == list(range(len(got)))
            assert got[0].body == expected[q][0].body and got[-1].tags == expected[q][-1].tags
        tag_b = [m for q in range(QUEUES) for m in client.pull_all(addr, q, sub="TagB")]
        assert sorted(m.msg_id for m in tag_b) == sorted(m.msg_id for m in sent if m.tags == "TagB")
        both = [m for m in client.pull_all(addr, 3, sub="TagA || TagC")]
        assert [m.msg_id for m in both] == [
            m.msg_id for m in expected[3] if m.tags in ("TagA", "TagC")
        ]

    sample = [0, 1, 777, 4242, 9999]
    for addr in cluster.client_addrs:
        stub = client.stub(addr)
        for i in sample:
            by_key = stub.QueryMessageByKey(
                pb.QueryMessageByKeyRequest(topic=TOPIC, key=f"key-{i}"), timeout=5
            ).messages
            assert [m.msg_id for m in by_key] == [sent[i].msg_id], (addr, i)
            by_id = stub.ViewMessage(
                pb.ViewMessageRequest(msg_id=sent[i].msg_id, topic=TOPIC), timeout=5
            ).message
            assert by_id.body == sent[i].body and by_id.keys == [f"key-{i}"]
            by_offset_id = stub.ViewMessage(
                pb.ViewMessageRequest(offset_msg_id=results[i].offset_msg_id), timeout=5
            ).message
            assert by_offset_id.msg_id == sent[i].msg_id
            assert by_offset_id.commitlog_position == results[i].commitlog_position

    # Long polling: a pull held on a follower, woken by the commit of a later send.
    leader_addr = client.leader
    follower = next(a for a in cluster.client_addrs if a != leader_addr)
    for addr in (leader_addr, follower):
        end = client.wait_same_offsets()[5]  # a follower applies a commit a little later
        consumer = grpc.insecure_channel(addr)  # a consumer's own connection
        held = pb_grpc.BrokerStub(consumer).PullMessage.future(
            pb.PullMessageRequest(
                consumer_group="g",
                topic=TOPIC,
                queue_id=5,
                queue_offset=end,
                subscription="TagA",
                suspend_timeout_ms=20_000,
            ),
            timeout=30,
        )
        with pytest.raises(grpc.FutureTimeoutError):
            held.result(timeout=0.3)  # it is held, not answered
        one = make_messages(ids, 10_005, 1)  # queue 5, TagA
        assert one[0].queue_id == 5 and one[0].tags == "TagA"
        t0 = time.monotonic()
        client.send(one)
        acked = time.monotonic() - t0
        resp = held.result(timeout=10)
        woke = time.monotonic() - t0
        role = "leader" if addr == leader_addr else "follower"
        print(
            f"long poll on {role}: send acked {acked * 1000:.1f} ms,"
            f" pull returned {woke * 1000:.1f} ms after the send began"
        )
        assert resp.status == pb.FOUND and [m.msg_id for m in pulled(resp)] == [one[0].msg_id]
        consumer.close()
        assert woke < 5.0
    # A held pull is woken only by a message its subscription matches.
    end = client.wait_same_offsets()[5]
    consumer = grpc.insecure_channel(follower)
    held = pb_grpc.BrokerStub(consumer).PullMessage.future(
        pb.PullMessageRequest(
            consumer_group="g",
            topic=TOPIC,
            queue_id=5,
            queue_offset=end,
            subscription="TagB",
            suspend_timeout_ms=20_000,
        ),
        timeout=30,
    )
    tag_a, tag_b = make_messages(ids, 10_029, 1), make_messages(ids, 10_021, 1)
    assert (tag_a[0].queue_id, tag_a[0].tags, tag_b[0].queue_id, tag_b[0].tags) == (
        5,
        "TagA",
        5,
        "TagB",
    )
    client.send(tag_a)
    with pytest.raises(grpc.FutureTimeoutError):
        held.result(timeout=0.5)  # TagA does not wake a TagB subscriber
    client.send(tag_b)
    resp = held.result(timeout=10)
    assert resp.status == pb.FOUND and [m.msg_id for m in pulled(resp)] == [tag_b[0].msg_id]
    assert resp.next_begin_offset == end + 2
    consumer.close()
    client.close()


def test_leader_kill_keeps_offsets_and_a_retried_send_is_stored_once(
    local_group: Callable[..., LocalCluster],
) -> None:
    cluster, client = setup_group(local_group)
    ids = UniqIdGenerator(ip="127.0.0.1")
    sent = make_messages(ids, 0, 1990)
    for i in range(0, len(sent), 250):
        client.send(sent[i : i + 250])
    leader_addr = client.leader
    # A consumer reads queues and commits what it processed (sync: committed through Raft).
    consumed: list[str] = []
    committed: dict[int, int] = {}
    for q in range(QUEUES):
        got = client.pull_all(leader_addr, q)[: 100 + q]
        consumed.extend(m.msg_id for m in got)
        committed[q] = len(got)
        client.write(
            "UpdateConsumerOffset",
            pb.UpdateConsumerOffsetRequest(
                consumer_group="cg", topic=TOPIC, queue_id=q, queue_offset=len(got), sync=q % 2 == 0
            ),
        )
    # The asynchronous ones are committed within the offset commit interval.
    wait_for(
        lambda: all(
            client.stub(a)
            .QueryConsumerOffset(
                pb.QueryConsumerOffsetRequest(consumer_group="cg", topic=TOPIC, queue_id=q),
                timeout=5,
            )
            .queue_offset
            == committed[q]
            for a in cluster.client_addrs
            for q in range(QUEUES)
        ),
        10,
        "offsets committed on every node",
    )
    # A send in flight when the leader dies, retried with the same uniq ids until it succeeds.
    acked_before = make_messages(ids, 1990, 10)
    acked_results = send_results(client.send(acked_before))
    retried = make_messages(ids, 2000, 50)
    leader = next(n.node_id for n in cluster.nodes if n.client_addr == leader_addr)
    with cluster.client() as log_client:
        before = log_client.metadata(leader_addr).last_index
        in_flight = client.stub(leader_addr).SendMessage.future(
            pb.SendMessageRequest(topic=TOPIC, messages=retried), timeout=5
        )
        # Kill it once the entry is in its log, before the client has the answer.
        wait_for(
            lambda: log_client.metadata(leader_addr).last_index > before,
            5,
            "the send to reach the leader's log",
        )
    cluster.signal(leader, signal.SIGKILL)
    killed_at = time.monotonic()
    first_outcome = "acked"
    try:
        in_flight.result(timeout=10)
    except grpc.RpcError as exc:
        first_outcome = str(exc.code())
    client.leader = ""
    resp = client.send(retried)
    retry_s = time.monotonic() - killed_at
    dups = sum(resp.packed_duplicates)
    print(f"\nin-flight send: {first_outcome}; retry answered {retry_s:.2f} s after the kill")
    print(f"retried batch: {dups} of {len(retried)} answered as duplicates of the original")
    again = send_results(client.send(acked_before))
    assert all(r.duplicate for r in again)
    assert [(r.queue_id, r.queue_offset, r.commitlog_position) for r in again] == [
        (r.queue_id, r.queue_offset, r.commitlog_position) for r in acked_results
    ]
    more = make_messages(ids, 2050, 400)
    client.send(more)
    new_addr = client.leader
    assert new_addr != leader_addr
    for q in range(QUEUES):
        off = client.stub(new_addr).QueryConsumerOffset(
            pb.QueryConsumerOffsetRequest(consumer_group="cg", topic=TOPIC, queue_id=q), timeout=5
        )
        assert off.queue_offset == committed[q]
        consumed.extend(m.msg_id for m in client.pull_all(new_addr, q, start=off.queue_offset))
    counts = Counter(consumed)
    acked = [m.msg_id for m in sent + acked_before + retried + more]
    assert [i for i in acked if counts[i] != 1] == [], "lost or duplicated messages"
    assert len(consumed) == len(acked)  # the in-flight batch is stored exactly once
    # The killed node comes back and catches up with the same queues.
    cluster.start(leader)
    # All three (a restarted process is not "live" until it runs its own command line).
    client.wait_same_offsets(timeout_s=30, addrs=cluster.client_addrs)
    # No ConsumeQueue anywhere points at an entry the failover removed: all are equal.
    assert_same_consumequeues(cluster)
    client.close()


def test_deleted_consumequeue_and_index_are_rebuilt_equal(
    local_group: Callable[..., LocalCluster],
) -> None:
    cluster, client = setup_group(local_group)
    ids = UniqIdGenerator(ip="127.0.0.1")
    sent = make_messages(ids, 0, 3000)
    for i in range(0, len(sent), 500):
        client.send(sent[i : i + 500])
    client.write(
        "UpdateConsumerOffset",
        pb.UpdateConsumerOffsetRequest(
            consumer_group="cg", topic=TOPIC, queue_id=2, queue_offset=7, sync=True
        ),
    )
    client.wait_same_offsets()
    victim = next(n for n in cluster.nodes if n.client_addr != client.leader)
    cluster.signal(victim.node_id, signal.SIGTERM)
    wait_for(lambda: cluster.pid(victim) is None, 15, "the node to stop")
    root = Path(cluster.base) / victim.node_id
    assert (root / "consumequeue").is_dir() and (root / "index").is_dir()
    shutil.rmtree(root / "consumequeue")
    shutil.rmtree(root / "index")
    cluster.start(victim.node_id)
    client.send(make_messages(ids, 3000, 100))  # and new messages meanwhile
    client.wait_same_offsets(timeout_s=30, addrs=cluster.client_addrs)
    assert_same_consumequeues(cluster)
    stub = client.stub(victim.client_addr)
    for i in (0, 1500, 2999):
        found = stub.QueryMessageByKey(
            pb.QueryMessageByKeyRequest(topic=TOPIC, key=f"key-{i}"), timeout=5
        ).messages
        assert [m.msg_id for m in found] == [sent[i].msg_id]
    off = stub.QueryConsumerOffset(
        pb.QueryConsumerOffsetRequest(consumer_group="cg", topic=TOPIC, queue_id=2), timeout=5
    )
    assert off.queue_offset == 7
    client.close()


def test_errors_and_topic_admin(local_group: Callable[..., LocalCluster]) -> None:
    cluster, client = setup_group(local_group, maxMessageSize=1024)

    raised: list[grpc.RpcError] = []

    def error(addr: str, method: str, request: object) -> tuple[grpc.StatusCode, str]:
        with pytest.raises(grpc.RpcError) as info:
            getattr(client.stub(addr), method)(request, timeout=5)
        raised.append(info.value)
        return info.value.code(), info.value.details() or ""

    def fields() -> error_pb2.ErrorInfo:
        """The structured error of the last failed call (every broker failure has one)."""
        info = read_error(raised[-1])
        assert info is not None, raised[-1]
        return info

    one = [pb.Message(queue_id=0, body=b"x")]
    answers: list[tuple[grpc.StatusCode, str]] = []

    def redirect_names_leader() -> bool:
        # Right after an election (a loaded CI box can cause one) a follower may not know the
        # leader yet and answers "NOT_LEADER leader= addr="; it must name it once it does.
        client.leader = cluster.node(cluster.wait_leader()).client_addr
        follower = next(a for a in cluster.client_addrs if a != client.leader)
        answers.append(
            error(follower, "SendMessage", pb.SendMessageRequest(topic=TOPIC, messages=one))
        )
        return answers[-1][1].endswith(client.leader)

    wait_for(redirect_names_leader, 15, "a follower's NOT_LEADER to name the leader")
    leader = client.leader
    code, detail = answers[-1]
    assert code == grpc.StatusCode.FAILED_PRECONDITION
    assert re.fullmatch(r"NOT_LEADER leader=n\d addr=127\.0\.0\.1:\d+", detail), detail
    assert detail.endswith(leader)
    info = fields()  # the same redirect as fields: what clients act on
    assert (info.code, info.leader_addr, info.retryable) == ("NOT_LEADER", leader, True)
    assert cluster.node(info.leader_id).client_addr == leader
    code, detail = error(leader, "SendMessage", pb.SendMessageRequest(topic="Nope", messages=one))
    assert code == grpc.StatusCode.NOT_FOUND and detail.startswith("TOPIC_NOT_FOUND")
    info = fields()
    assert (info.code, info.retryable, info.leader_addr) == ("TOPIC_NOT_FOUND", False, "")
    big = [pb.Message(queue_id=0, body=b"x" * 1025)]
    code, detail = error(leader, "SendMessage", pb.SendMessageRequest(topic=TOPIC, messages=big))
    assert code == grpc.StatusCode.INVALID_ARGUMENT and detail.startswith("MESSAGE_TOO_LARGE")
    bad_q = [pb.Message(queue_id=QUEUES, body=b"x")]
    code, detail = error(leader, "SendMessage", pb.SendMessageRequest(topic=TOPIC, messages=bad_q))
    assert code == grpc.StatusCode.INVALID_ARGUMENT and detail.startswith("QUEUE_ID_OUT_OF_RANGE")
    code, detail = error(leader, "SendMessage", pb.SendMessageRequest(topic="a b", messages=one))
    assert code == grpc.StatusCode.INVALID_ARGUMENT and detail.startswith("INVALID_TOPIC")
    assert (fields().code, fields().retryable) == ("INVALID_TOPIC", False)
    code, detail = error(
        leader,
        "ViewMessage",
        pb.ViewMessageRequest(offset_msg_id="7F0000010000000000000000000000FF"),
    )
    assert code == grpc.StatusCode.NOT_FOUND and detail.startswith("MESSAGE_NOT_FOUND")
    # Topic admin is replicated: every node lists it; deleting it removes its queues.
    client.write(
        "CreateTopic",
        pb.CreateTopicRequest(
            topic=pb.TopicConfig(topic_name="Other", read_queue_nums=2, write_queue_nums=2)
        ),
    )
    client.send([pb.Message(queue_id=1, body=b"y")], topic="Other")
    wait_for(
        lambda: all(
            [
                t.topic_name
                for t in client.stub(a).ListTopics(pb.ListTopicsRequest(), timeout=5).topics
            ]
            == ["Other", TOPIC]
            for a in cluster.client_addrs
        ),
        10,
        "topics on every node",
    )
    client.write("DeleteTopic", pb.DeleteTopicRequest(topic="Other"))
    code, detail = error(leader, "GetTopic", pb.GetTopicRequest(topic="Other"))
    assert code == grpc.StatusCode.NOT_FOUND
    # Heartbeats and offsets by timestamp.
    client.stub(leader).Heartbeat(
        pb.HeartbeatRequest(client_id="c1", consumer_group="cg"), timeout=5
    )
    assert client.stub(leader).GetConsumerList(
        pb.GetConsumerListRequest(consumer_group="cg"), timeout=5
    ).client_ids == ["c1"]
    client.send(make_messages(UniqIdGenerator(ip="127.0.0.1"), 0, 16))
    reset = client.write(
        "ResetConsumerOffset",
        pb.ResetConsumerOffsetRequest(
            consumer_group="cg", topic=TOPIC, queue_id=-1, timestamp_ms=0
        ),
    )
    assert isinstance(reset, pb.ResetConsumerOffsetResponse)
    assert [(o.queue_id, o.queue_offset) for o in reset.offsets] == [(q, 0) for q in range(QUEUES)]
    future = int(time.time() * 1000) + 60_000
    assert (
        client.stub(leader)
        .SearchOffset(
            pb.SearchOffsetRequest(topic=TOPIC, queue_id=0, timestamp_ms=future), timeout=5
        )
        .queue_offset
        == client.max_offsets(leader)[0]
    )
    client.close()


def test_a_resend_while_the_original_is_in_flight_waits_for_it(
    local_group: Callable[..., LocalCluster],
) -> None:
    """A send retried before the original was answered (the client's deadline passed, say)
    is answered from the original's proposal: the same positions, flagged duplicate, and no
    second entry in the log."""
    # A leader that hears from no follower steps down after an election timeout (check
    # quorum): give the test's pause of the followers room.
    cluster, client = setup_group(local_group, raftElectionTimeoutMs=3000)
    ids = UniqIdGenerator(ip="127.0.0.1")
    client.send(make_messages(ids, 0, 4))
    leader_addr = client.leader
    followers = [n.node_id for n in cluster.nodes if n.client_addr != leader_addr]
    request = pb.SendMessageRequest(topic=TOPIC, messages=make_messages(ids, 4, 16))
    stub = client.stub(leader_addr)
    with cluster.client() as log_client:
        before = log_client.metadata(leader_addr).last_index
        for f in followers:  # no quorum: the original stays in flight
            cluster.signal(f, signal.SIGSTOP)
        try:
            original = stub.SendMessage.future(request, timeout=20)
            wait_for(
                lambda: log_client.metadata(leader_addr).last_index > before,
                5,
                "the original to reach the leader's log",
            )
            resend = stub.SendMessage.future(request, timeout=20)
            time.sleep(0.2)
            assert not original.done() and not resend.done()
        finally:
            for f in followers:
                cluster.signal(f, signal.SIGCONT)
        first, second = original.result(), resend.result()
        assert not any(first.packed_duplicates) and all(second.packed_duplicates)
        assert len(second.packed_positions) == len(request.messages)
        assert _rows(first) == _rows(second)
        assert log_client.metadata(leader_addr).last_index == before + 1
        # A new send, then resent (a duplicate from the dedup window).
        fresh = pb.SendMessageRequest(topic=TOPIC, messages=make_messages(ids, 20, 8))
        new = stub.SendMessage(fresh, timeout=20)
        again = stub.SendMessage(fresh, timeout=20)
        assert not any(new.packed_duplicates) and all(again.packed_duplicates)
        assert _rows(again) == _rows(new)
    client.close()


def _rows(resp: pb.SendMessageResponse) -> list[tuple[str, str, int, int, int]]:
    """Every message's ids, queue, queue offset and position, read from a send answer."""
    return list(
        zip(
            resp.packed_msg_ids,
            [f"{resp.offset_msg_id_prefix}{p:016X}" for p in resp.packed_positions],
            resp.packed_queue_ids,
            resp.packed_queue_offsets,
            resp.packed_positions,
            strict=True,
        )
    )
