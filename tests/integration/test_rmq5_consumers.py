"""RocketMQ 5's SimpleConsumer (POP semantics) on a real 3-node group: the official Python and
Node.js clients receive and ack what their producers sent, exactly once and intact; a second
group gets everything again; a leader SIGKILLed while messages are in flight loses no ack and
no un-acked message; un-acked messages reach %DLQ%{group} after the max attempts; hostile
receipt handles and invisible times get the protocol's status and change nothing
(docs/RMQ5.md, "Consumers")."""

from __future__ import annotations

import hashlib
import signal
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import grpc
import pytest
from google.protobuf.duration_pb2 import Duration
from rmq5_support import (
    NODE_MODULES,
    PYTHON,
    SCRIPTS,
    ClientProcess,
    client_env,
    running_group,
    topic_on_every_node,
)
from rmq5_support import code as _code
from rmq5_support import follower_v2_addr as _follower_v2_addr
from support import pull_all, wait_for

from broker.frontends.v2 import stubs
from mqcluster.cluster import LocalCluster

pytestmark = [pytest.mark.integration]

v2, v2_service, v2_grpc = stubs.load()

QUEUES = 4
# Each official client's producer sends this many; its consumer must ack each exactly once.
MESSAGES = 1000
# Held across the leader's SIGKILL.
HELD = 200
# Deliveries before %DLQ%{group} (popMaxDeliveryAttempts) and the shortest invisible time the
# group accepts (popMinInvisibleTimeMs): small, so that redeliveries take a second, not 10 s.
MAX_ATTEMPTS = 2
MIN_INVISIBLE_MS = 1000
CLIENT_TIMEOUT_S = 90
CALL_TIMEOUT_S = 10


@pytest.fixture(scope="module")
def group(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LocalCluster]:
    extra = {
        "popMaxDeliveryAttempts": str(MAX_ATTEMPTS),
        "popMinInvisibleTimeMs": str(MIN_INVISIBLE_MS),
    }
    with running_group(tmp_path_factory.mktemp("rmq5c"), extra) as cluster:
        yield cluster


def _topic(cluster: LocalCluster, name: str) -> str:
    return topic_on_every_node(cluster, name, QUEUES)


def _client(argv: list[str], home: Path, lang: str, stdin: bool = False) -> ClientProcess:
    """An official client's script; its output in files under ``home``, never pipes."""
    return ClientProcess(argv, home, client_env(home, node=lang == "nd"), stdin=stdin)


def _run_all(runs: list[list[str]], home: Path, lang: str) -> list[list[Any]]:
    """Run official clients' scripts side by side; each one's JSON lines (but its last)."""
    clients = [_client(argv, home, lang) for argv in runs]
    try:
        return [c.finish(CLIENT_TIMEOUT_S) for c in clients]
    finally:
        for c in clients:
            c.kill()


def _python(script: str, *args: str) -> list[str]:
    assert PYTHON.exists(), "build/rmq5/pyclient missing: run 'make venv'"
    return [str(PYTHON), str(SCRIPTS / script), *args]


def _node(script: str, *args: str) -> list[str]:
    assert (NODE_MODULES / "rocketmq-client-nodejs").exists(), "build/rmq5/node: run 'make venv'"
    return ["node", str(SCRIPTS / script), *args]


def _script(lang: str, name: str, *args: str) -> list[str]:
    if lang == "py":
        return _python(f"py_{name}.py", *args)
    return _node(f"node_{name}.js", *args)


def _produce(cluster: LocalCluster, home: Path, lang: str, topic: str, n: int) -> list[Any]:
    argv = _script(lang, "producer", _follower_v2_addr(cluster), topic, str(n), lang)
    return _run_all([argv], home, lang)[0]


def _consumers(
    cluster: LocalCluster, home: Path, lang: str, topic: str, groups: list[str]
) -> list[list[Any]]:
    """A SimpleConsumer per group, side by side, each acking MESSAGES messages."""
    addr = _follower_v2_addr(cluster)
    runs = [_script(lang, "consumer", addr, topic, g, "all", "30", str(MESSAGES)) for g in groups]
    return _run_all(runs, home, lang)


def _check_exactly_once(sent: list[Any], events: list[Any], prefix: str) -> None:
    """Every sent message received and acked once, intact, and nothing received twice."""
    received = [e for e in events if e["event"] == "received"]
    acked = [e for e in events if e["event"] == "acked"]
    assert not [e for e in events if e["event"] == "ack_failed"], [
        e.get("error") for e in events if e["event"] == "ack_failed"
    ]
    ids = [e["message_id"] for e in received]
    assert len(ids) == len(set(ids)) == len(sent), (
        f"a message was received twice or not at all: {len(ids)} received, "
        f"{len(set(ids))} distinct, {len(sent)} sent"
    )
    assert sorted(e["message_id"] for e in acked) == sorted(ids)
    by_id = {e["message_id"]: e for e in received}
    for r in sent:
        i = r["i"]
        got = by_id[r["message_id"]]
        assert got["body"] == f"{prefix}-body-{i}"
        assert got["tag"] == f"tag{i % 3}"
        assert got["keys"] == sorted([f"{prefix}-key-{i}", f"{prefix}-k2-{i}"])
        assert got["properties"] == {"seq": str(i), "origin": prefix}
        assert got["attempt"] == 1
        # Each client checks the body against body_digest (an MD5 digest, upper-case hex,
        # test_hostile_handles_... checks the fields themselves); the Node.js client also
        # exposes the queue offset, which must be the one its send was answered.
        assert got["corrupted"] is False, got
        if prefix == "nd":
            assert got["offset"] == r["offset"], (got, r)


@pytest.mark.parametrize("lang", ["py", "nd"])
def test_simple_consumer_acks_every_message_once_and_a_second_group_gets_all(
    group: LocalCluster, tmp_path: Path, lang: str
) -> None:
    topic = _topic(group, f"PopAll{lang}")
    sent = _produce(group, tmp_path, lang, topic, MESSAGES)
    assert len(sent) == MESSAGES
    for events in _consumers(group, tmp_path, lang, topic, [f"G1{lang}", f"G2{lang}"]):
        _check_exactly_once(sent, events, lang)


def test_unacked_messages_reach_the_dead_letter_queue(group: LocalCluster, tmp_path: Path) -> None:
    topic = _topic(group, "PopDlq")
    sent = _produce(group, tmp_path, "py", topic, 5)
    argv = _python("py_consumer.py", _follower_v2_addr(group), topic, "GDead", "never", "1", "0")
    with _client(argv, tmp_path, "py", stdin=True) as consumer:
        dlq: list[Any] = []

        def dead_lettered() -> bool:
            try:
                dlq[:] = pull_all(group.node(group.wait_leader()).client_addr, "%DLQ%GDead", 0)
            except grpc.RpcError:  # the dead-letter topic is created with its first copy
                return False
            return len(dlq) == len(sent)

        wait_for(dead_lettered, 30, "every message in %DLQ%GDead")
        time.sleep(MIN_INVISIBLE_MS / 1000 * 2)  # nothing is delivered after the DLQ
        events = consumer.finish(30)  # it stops once its stdin is closed
    deliveries = [e for e in events if e.get("event") == "received"]
    by_id: dict[str, list[int]] = {}
    for e in deliveries:
        by_id.setdefault(e["message_id"], []).append(e["attempt"])
    assert by_id == {r["message_id"]: [1, 2] for r in sent}
    assert sorted(m.properties["ORIGIN_MESSAGE_ID"] for m in dlq) == sorted(
        r["message_id"][2:] for r in sent
    )


# ---------------------------------------------------------------------- the raw protocol


@pytest.fixture
def v2_stub(group: LocalCluster) -> Iterator[Any]:
    with grpc.insecure_channel(_follower_v2_addr(group)) as ch:
        yield v2_grpc.MessagingServiceStub(ch)


def _receive(stub: Any, topic: str, grp: str, invisible_ms: int, batch: int = 32) -> list[Any]:
    request = v2_service.ReceiveMessageRequest(
        group=v2.Resource(name=grp),
        message_queue=v2.MessageQueue(topic=v2.Resource(name=topic), id=-1),
        filter_expression=v2.FilterExpression(type=v2.TAG, expression="*"),
        batch_size=batch,
        invisible_duration=Duration(
            seconds=invisible_ms // 1000, nanos=invisible_ms % 1000 * 10**6
        ),
        long_polling_timeout=Duration(seconds=1),
    )
    # The answers but the delivery timestamp (sent before the messages, as the proxy does).
    answers = stub.ReceiveMessage(request, timeout=CALL_TIMEOUT_S)
    return [r for r in answers if not r.HasField("delivery_timestamp")]


def _ack(stub: Any, topic: str, grp: str, handle: str) -> Any:
    entry = v2_service.AckMessageEntry(message_id="x", receipt_handle=handle)
    return stub.AckMessage(
        v2_service.AckMessageRequest(
            group=v2.Resource(name=grp), topic=v2.Resource(name=topic), entries=[entry]
        ),
        timeout=CALL_TIMEOUT_S,
    )


def _change(stub: Any, topic: str, grp: str, handle: str, invisible_ms: int) -> Any:
    return stub.ChangeInvisibleDuration(
        v2_service.ChangeInvisibleDurationRequest(
            group=v2.Resource(name=grp),
            topic=v2.Resource(name=topic),
            receipt_handle=handle,
            invisible_duration=Duration(seconds=invisible_ms // 1000),
        ),
        timeout=CALL_TIMEOUT_S,
    )


def _check_system_properties(cluster: LocalCluster, msg: Any) -> None:
    """What the clients check and read of a received message (docs/RMQ5.md, "Consumers"):
    the body's digest (MD5, upper-case hex: the clients compare it as a string) and encoding,
    and the store timestamp, queue and offset of the message as the group stored it."""
    sp = msg.system_properties
    assert sp.body_digest.type == v2.MD5
    assert sp.body_digest.checksum == hashlib.md5(msg.body).hexdigest().upper()
    assert sp.body_encoding == v2.IDENTITY
    leader = cluster.node(cluster.wait_leader()).client_addr
    (stored,) = [m for m in pull_all(leader, msg.topic.name, sp.queue_id) if m.body == msg.body]
    assert "01" + stored.msg_id == sp.message_id
    assert sp.queue_offset == stored.queue_offset
    assert sp.store_timestamp.ToMilliseconds() == stored.store_timestamp_ms > 0
    assert sp.born_timestamp.ToMilliseconds() == stored.born_timestamp_ms > 0


def test_hostile_handles_and_invisible_times_change_nothing(
    group: LocalCluster, tmp_path: Path, v2_stub: Any
) -> None:
    topic = _topic(group, "PopBad")
    _produce(group, tmp_path, "py", topic, 1)
    for invisible_ms in (MIN_INVISIBLE_MS - 1, 12 * 3600 * 1000 + 1000):
        (answer,) = _receive(v2_stub, topic, "GBad", invisible_ms)
        assert _code(answer.status) == "ILLEGAL_INVISIBLE_TIME"
    first = _receive(v2_stub, topic, "GBad", 60_000)
    assert _code(first[-1].status) == "OK" and len(first) == 2
    _check_system_properties(group, first[0].message)
    handle = first[0].message.system_properties.receipt_handle
    for bad in ("", "not a handle!", "A" * 2000, handle[:-4]):
        assert _code(_ack(v2_stub, topic, "GBad", bad).status) == "INVALID_RECEIPT_HANDLE"
    # Another group's handle, a change to a range it refuses: still in flight with its handle.
    assert _code(_ack(v2_stub, topic, "GOther", handle).status) == "INVALID_RECEIPT_HANDLE"
    over_ms = 12 * 3600 * 1000 + 1000
    assert (
        _code(_change(v2_stub, topic, "GBad", handle, over_ms).status) == "ILLEGAL_INVISIBLE_TIME"
    )
    assert _code(_receive(v2_stub, topic, "GBad", 60_000)[0].status) == "MESSAGE_NOT_FOUND"
    changed = _change(v2_stub, topic, "GBad", handle, 30_000)
    assert _code(changed.status) == "OK" and changed.receipt_handle != handle
    assert _code(_ack(v2_stub, topic, "GBad", handle).status) == "INVALID_RECEIPT_HANDLE"
    assert _code(_change(v2_stub, topic, "GBad", handle, 30_000).status) == (
        "INVALID_RECEIPT_HANDLE"
    )
    assert _code(_ack(v2_stub, topic, "GBad", changed.receipt_handle).status) == "OK"
    # A repeated ack of a done message is answered OK and changes nothing.
    assert _code(_ack(v2_stub, topic, "GBad", changed.receipt_handle).status) == "OK"
    # The other group never received it: it gets it now, with attempt 1.
    other = _receive(v2_stub, topic, "GOther", 60_000)
    assert other[0].message.system_properties.delivery_attempt == 1


def test_leader_sigkill_between_receive_and_ack(group: LocalCluster, tmp_path: Path) -> None:
    topic = _topic(group, "PopFail")
    sent = _produce(group, tmp_path, "py", topic, HELD)
    invisible_s = 6
    argv = _python(
        "py_consumer.py",
        _follower_v2_addr(group),
        topic,
        "GFail",
        "hold",
        str(invisible_s),
        str(HELD),
    )
    with _client(argv, tmp_path, "py", stdin=True) as consumer:
        lines = consumer.wait_lines(
            lambda got: any(e.get("event") == "held" for e in got), CLIENT_TIMEOUT_S
        )
        assert lines[-1] == {"event": "held", "count": HELD}, lines[-3:]
        leader = group.wait_leader()
        group.signal(leader, signal.SIGKILL)
        killed_at = time.monotonic()
        consumer.say("go\n")
        events = consumer.finish(CLIENT_TIMEOUT_S)
    head, out = lines[:-1], events[len(lines) :]
    held = [e["message_id"] for e in head]
    assert sorted(held) == sorted(r["message_id"] for r in sent)
    acked_early = set(held[0::2])
    assert not [e for e in events if e["event"] == "ack_failed"], [
        e["error"] for e in events if e["event"] == "ack_failed"
    ]
    later = [e for e in out if e.get("event") == "received"]
    assert sorted(e["message_id"] for e in later) == sorted(held[1::2]), "redelivered set"
    assert all(e["attempt"] == 2 for e in later)
    # Not before the invisible time: it runs from the first receive's answer, which came
    # after the receive was asked ("asked"); the redelivery's line is printed after it ("t").
    asked = {e["message_id"]: e["asked"] for e in head}
    waits = [(e["t"] - asked[e["message_id"]], e) for e in later]
    assert all(waited >= invisible_s for waited, _ in waits), min(waits, key=lambda w: w[0])
    assert not acked_early & {e["message_id"] for e in later}, "an acked message came again"
    assert time.monotonic() - killed_at < CLIENT_TIMEOUT_S
    group.start(leader)
