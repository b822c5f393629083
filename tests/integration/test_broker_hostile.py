"""Issue #16 on a real 3-node group, through stock gRPC clients: pull answers that fit gRPC's
default 4 MiB receive limit, system topics closed to the public API, undecodable requests and
hostile fields answered with bounded, documented errors."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

import grpc
import pytest
from raftmq.broker.v1 import broker_pb2 as pb
from raftmq.broker.v1 import broker_pb2_grpc as pb_grpc
from support import pulled, wait_for

from broker.state.message import UniqIdGenerator
from mqcluster.cluster import LocalCluster
from mqcluster.leader_client import LeaderClient

pytestmark = pytest.mark.integration

# Small key index files: the defaults (about 420 MB sparse per file) are for production.
INDEX_CONF = {"maxHashSlotNum": 100_000, "maxIndexNum": 400_000}
GRPC_DEFAULT_MAX_RECEIVE_BYTES = 4 << 20
JUNK = b"\xff\xff\xff\xff"  # not protobuf


def _leader_stub(cluster: LocalCluster) -> pb_grpc.BrokerStub:
    leader = cluster.node(cluster.wait_leader())
    return pb_grpc.BrokerStub(grpc.insecure_channel(leader.client_addr))


def _write(cluster: LocalCluster, method: str, request: Any, timeout_s: float = 20.0) -> Any:
    """A leader-only call, following redirects until the deadline (mqcluster.leader_client)."""
    client = LeaderClient(lambda: cluster.client_addrs)
    try:
        return client.call(lambda stub: getattr(stub, method)(request, timeout=10), timeout_s)
    finally:
        client.close()


def _create_topic(cluster: LocalCluster, name: str, queues: int) -> None:
    _write(
        cluster,
        "CreateTopic",
        pb.CreateTopicRequest(
            topic=pb.TopicConfig(topic_name=name, read_queue_nums=queues, write_queue_nums=queues)
        ),
    )


def _refusal(call: Callable[[], Any]) -> grpc.RpcError:
    with pytest.raises(grpc.RpcError) as err:
        call()
    detail = err.value.details() or ""
    assert len(detail.encode()) < 1024, detail[:200]
    return err.value


def test_pull_and_key_query_answers_fit_a_stock_grpc_client(
    local_group: Callable[..., LocalCluster],
) -> None:
    """Finding: 256 x 16 KiB answered 4.2 MB and a stock client failed with
    ``Received message larger than max (4222346 vs. 4194304)``."""
    cluster = local_group(3, **INDEX_CONF)
    _create_topic(cluster, "Big", 1)
    ids = UniqIdGenerator()
    body = b"b" * (16 << 10)
    for _ in range(256 // 32):
        batch = [
            pb.Message(queue_id=0, keys=["same-key"], body=body, msg_id=ids.next_id())
            for _ in range(32)
        ]
        _write(cluster, "SendMessage", pb.SendMessageRequest(topic="Big", messages=batch))
    addr = cluster.node(cluster.wait_leader()).client_addr
    with grpc.insecure_channel(addr) as channel:  # default options: 4 MiB receive limit
        stub = pb_grpc.BrokerStub(channel)
        offset, got, answers = 0, 0, 0
        while got < 256:
            resp = stub.PullMessage(
                pb.PullMessageRequest(
                    consumer_group="g",
                    topic="Big",
                    queue_id=0,
                    queue_offset=offset,
                    max_msgs=256,
                    no_suspend=True,
                ),
                timeout=10,
            )
            assert resp.status == pb.FOUND, resp.status
            assert resp.ByteSize() <= GRPC_DEFAULT_MAX_RECEIVE_BYTES
            n = len(pulled(resp))
            assert n >= 1
            got += n
            offset = resp.next_begin_offset
            answers += 1
        assert got == 256 and offset == 256
        assert answers >= 2  # it did not fit one answer
        found = stub.QueryMessageByKey(
            pb.QueryMessageByKeyRequest(topic="Big", key="same-key", max_num=1024), timeout=10
        )
        assert 1 <= len(found.messages) < 256
        assert found.ByteSize() <= GRPC_DEFAULT_MAX_RECEIVE_BYTES


def _pull_bodies(addr: str, topic: str) -> list[bytes]:
    with grpc.insecure_channel(addr) as channel:
        resp = pb_grpc.BrokerStub(channel).PullMessage(
            pb.PullMessageRequest(
                consumer_group="g", topic=topic, queue_id=0, queue_offset=0, no_suspend=True
            ),
            timeout=5,
        )
    return [m.body for m in pulled(resp)]


def test_the_schedule_topic_cannot_be_recreated_or_deleted_and_delays_survive(
    local_group: Callable[..., LocalCluster],
) -> None:
    """Finding: CreateTopic then DeleteTopic of SCHEDULE_TOPIC_XXXX lost pending delayed
    messages."""
    cluster = local_group(3, delayLevelScale=0.1)  # level 4 (30 s) -> 3 s
    _create_topic(cluster, "Delayed", 1)
    msg = pb.Message(queue_id=0, body=b"later", properties={"DELAY": "4"})
    _write(cluster, "SendMessage", pb.SendMessageRequest(topic="Delayed", messages=[msg]))
    stub = _leader_stub(cluster)
    schedule = "SCHEDULE_TOPIC_XXXX"
    for call in (
        lambda: stub.CreateTopic(
            pb.CreateTopicRequest(topic=pb.TopicConfig(topic_name=schedule)), timeout=10
        ),
        lambda: stub.DeleteTopic(pb.DeleteTopicRequest(topic=schedule), timeout=10),
        lambda: stub.DeleteTopic(pb.DeleteTopicRequest(topic="%RETRY%g"), timeout=10),
        lambda: stub.SendMessage(
            pb.SendMessageRequest(topic=schedule, messages=[pb.Message(body=b"x")]), timeout=10
        ),
        lambda: stub.SendMessage(
            pb.SendMessageRequest(topic="%DLQ%g", messages=[pb.Message(body=b"x")]), timeout=10
        ),
    ):
        err = _refusal(call)
        assert err.code() == grpc.StatusCode.PERMISSION_DENIED, err
        assert (err.details() or "").startswith("SYSTEM_TOPIC "), err.details()
    for n in cluster.nodes:
        wait_for(
            lambda n=n: _pull_bodies(n.client_addr, "Delayed") == [b"later"],
            30,
            f"the delayed message delivered on {n.node_id}",
        )


def _raw_call(addr: str, method: str, kind: str = "unary") -> grpc.RpcError:
    with grpc.insecure_channel(addr) as channel:
        if kind == "unary":
            call = channel.unary_unary(method)
            return _refusal(lambda: call(JUNK, timeout=10))
        stream = channel.stream_unary(method)
        return _refusal(lambda: stream(iter([JUNK]), timeout=10))


def test_hostile_requests_get_bounded_documented_errors_and_no_traceback(
    local_group: Callable[..., LocalCluster],
) -> None:
    cluster = local_group(3, namesrv=True)
    _create_topic(cluster, "T", 2)
    leader = cluster.node(cluster.wait_leader())
    assert cluster.namesrv is not None
    # Undecodable bytes, on every service of every port.
    for addr, method in (
        (leader.client_addr, "/raftmq.broker.v1.Broker/SendMessage"),
        (leader.client_addr, "/raftmq.dledger.v1.DLedgerClient/Append"),
        (cluster.namesrv.addr, "/raftmq.nameserver.v1.NameServer/RegisterBroker"),
    ):
        err = _raw_call(addr, method)
        assert err.code() == grpc.StatusCode.INVALID_ARGUMENT, (method, err)
        assert (err.details() or "").startswith("BAD_REQUEST undecodable raftmq."), err.details()
    err = _raw_call(f"127.0.0.1:{leader.peer_port}", "/raftmq.dledger.v1.DLedgerPeer/Stream", "s")
    assert err.code() != grpc.StatusCode.UNKNOWN, err
    # Finding: one async offset commit with a 300-character group was accepted and then kept
    # every group's offsets from committing until the leader changed.
    stub = pb_grpc.BrokerStub(grpc.insecure_channel(leader.client_addr))
    err = _refusal(
        lambda: stub.UpdateConsumerOffset(
            pb.UpdateConsumerOffsetRequest(
                consumer_group="g" * 300, topic="T", queue_id=0, queue_offset=1
            ),
            timeout=10,
        )
    )
    assert err.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert (err.details() or "").startswith("INVALID_GROUP "), err.details()
    _write(
        cluster, "SendMessage", pb.SendMessageRequest(topic="T", messages=[pb.Message(body=b"m")])
    )
    _write(
        cluster,
        "UpdateConsumerOffset",
        pb.UpdateConsumerOffsetRequest(
            consumer_group="good", topic="T", queue_id=0, queue_offset=1
        ),
    )
    for n in cluster.nodes:
        follower = pb_grpc.BrokerStub(grpc.insecure_channel(n.client_addr))
        wait_for(
            lambda f=follower: (
                f.QueryConsumerOffset(
                    pb.QueryConsumerOffsetRequest(consumer_group="good", topic="T", queue_id=0),
                    timeout=5,
                ).queue_offset
                == 1
            ),
            15,
            f"the good group's offset committed on {n.node_id}",
        )
    # Finding: an error detail echoing a 1 MB message id broke gRPC's metadata limit.
    err = _refusal(
        lambda: stub.SendMessage(
            pb.SendMessageRequest(
                topic="T", messages=[pb.Message(body=b"x", msg_id="Z" * 1_000_000)]
            ),
            timeout=10,
        )
    )
    assert err.code() == grpc.StatusCode.INVALID_ARGUMENT, err
    assert (err.details() or "").startswith("INVALID_MESSAGE_ID "), err.details()
    # Finding: 1 MB of tags answered INTERNAL with a struct.error.
    err = _refusal(
        lambda: stub.SendMessage(
            pb.SendMessageRequest(
                topic="T", messages=[pb.Message(body=b"x", tags="t" * (1 << 20))]
            ),
            timeout=10,
        )
    )
    assert err.code() == grpc.StatusCode.INVALID_ARGUMENT, err
    assert (err.details() or "").startswith("PROPERTIES_TOO_LARGE "), err.details()
    # None of it cost a traceback in any log (one rate-limited line per process at most).
    for log in [n.log for n in cluster.nodes] + [cluster.namesrv.log]:
        text = Path(log).read_text(errors="replace")
        assert "Traceback" not in text, log
        assert text.count("BAD_REQUEST undecodable request") <= 1, log
