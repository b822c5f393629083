"""RocketMQ 5's PushConsumer and FIFO message groups on a real 3-node group, with the official
Python and Node.js clients (docs/RMQ5.md, "Push consumers", "FIFO message groups",
"Subscription groups"):

- a Python and a Node.js PushConsumer of one group split 2,000 messages, each consumed exactly
  once overall;
- a listener failing a message k times sees it k + 1 times, the group's backoff (set with
  ``mqadmin updateSubGroup``) between deliveries; one that always fails finds it in
  ``%DLQ%{group}`` after the group's max attempts;
- a FIFO PushConsumer sees 20 message groups x 100 messages each in send order, no gap and no
  repeat, across a SIGKILL of the leader in the middle;
- bad input (a FIFO send without a message group, and others) gets the protocol's status and
  stores nothing; QueryAssignment and the Settings answer the group's config.
"""

from __future__ import annotations

import itertools
import json
import os
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import grpc
import pytest
from raftmq.broker.v1 import broker_pb2 as bpb
from raftmq.broker.v1 import broker_pb2_grpc as bpb_grpc
from rmq5_support import NODE_MODULES, PYTHON, SCRIPTS, v2_code, wait_v2_routes
from support import pull_all, wait_for

from broker.cluster import LocalCluster
from broker.rmq5 import stubs

pytestmark = [pytest.mark.integration]

v2, v2_service, v2_grpc = stubs.load()

QUEUES = 4
# The split: each official producer sends half.
SPLIT_MESSAGES = 2000
# FIFO: message groups x messages per group, sent by FIFO_PRODUCERS processes side by side
# (each its own groups, so each group's send order is one process's order).
FIFO_GROUPS = 20
FIFO_PER_GROUP = 100
FIFO_PRODUCERS = 4
# The leader is SIGKILLed once this many FIFO messages were consumed.
FIFO_KILL_AFTER = 600
# auto_renew's slice (popAutoRenewInvisibleMs): short, so that a batch whose answer died with
# the leader is delivered again within seconds, not the default 60 s.
RENEW_SLICE_MS = 4000
# The retry test's group: 2 retries (3 deliveries), backoff 1 s then 2 s.
RETRY_BACKOFF_MS = (1000, 2000)
RETRY_MAX_TIMES = 2
# A redelivery comes after its backoff, within the redelivery pass (250 ms), the client's
# receive loop and a loaded box's scheduling.
BACKOFF_EARLY_S = 0.15
BACKOFF_LATE_S = 2.5
WAIT_S = 60
CALL_TIMEOUT_S = 10
EXTRA = {
    "mappedFileSizeCommitLog": str(8 << 20),
    "diskMaxUsedSpaceRatio": "99",
    "diskSpaceResumeRatio": "98",
    "popMinInvisibleTimeMs": "1000",
    "popAutoRenewInvisibleMs": str(RENEW_SLICE_MS),
}


@pytest.fixture(scope="module")
def group(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LocalCluster]:
    cluster = LocalCluster(tmp_path_factory.mktemp("rmq5push"))
    cluster.configure(3, auto_ports=True, extra=EXTRA)
    try:
        cluster.up()
        yield cluster
    finally:
        cluster.down(grace_s=5.0)


class Client:
    """An official client's script in its own process; its JSON lines gathered by a thread.
    Closing its stdin asks a consumer to stop."""

    def __init__(self, argv: list[str], home: Path, node: bool) -> None:
        env = {"PATH": os.environ.get("PATH", ""), "HOME": str(home)}
        if node:
            env["NODE_PATH"] = str(NODE_MODULES)
        self.argv = argv
        self.proc = subprocess.Popen(
            argv,
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
            env=env,
        )
        self.lines: list[dict[str, Any]] = []
        self._reader = threading.Thread(target=self._read, daemon=True)
        self._reader.start()

    def _read(self) -> None:
        assert self.proc.stdout is not None
        for line in self.proc.stdout:
            if line.startswith("{"):
                self.lines.append(json.loads(line))

    def consumed(self) -> list[dict[str, Any]]:
        return [e for e in list(self.lines) if e.get("event") == "consumed"]

    def finish(self, timeout_s: float = WAIT_S) -> list[dict[str, Any]]:
        """Stop (stdin closed) and wait; every line but the last ``done``."""
        assert self.proc.stdin is not None
        if not self.proc.stdin.closed:
            self.proc.stdin.close()
        try:
            self.proc.wait(timeout=timeout_s)
        finally:
            self.kill()
        self._reader.join(timeout=5)
        err = self.proc.stderr.read() if self.proc.stderr else ""
        assert self.proc.returncode == 0, f"{self.argv[:3]} failed: {err[-3000:]}"
        assert self.lines and "done" in self.lines[-1], (self.lines[-3:], err[-2000:])
        return self.lines[:-1]

    def kill(self) -> None:
        if self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait()


def _script(lang: str, name: str, *args: str) -> list[str]:
    if lang == "py":
        assert PYTHON.exists(), "build/rmq5/pyclient missing: run 'make venv'"
        return [str(PYTHON), str(SCRIPTS / f"py_{name}.py"), *args]
    assert (NODE_MODULES / "rocketmq-client-nodejs").exists(), "build/rmq5/node: run 'make venv'"
    return ["node", str(SCRIPTS / f"node_{name}.js"), *args]


def _start(lang: str, name: str, home: Path, *args: str) -> Client:
    return Client(_script(lang, name, *args), home, lang == "nd")


def _started(consumer: Client) -> None:
    wait_for(
        lambda: (
            any(e.get("event") == "started" for e in consumer.lines)
            or consumer.proc.poll() is not None
        ),
        WAIT_S,
        f"{consumer.argv[1]} started",
    )


def _followers(cluster: LocalCluster) -> list[str]:
    leader = cluster.wait_leader()
    return [n.grpc_addr for n in cluster.nodes if n.node_id != leader]


def _admin(cluster: LocalCluster, *args: str) -> subprocess.CompletedProcess[str]:
    """``mqadmin`` on the leader's group (-b: no NameServer in this group)."""
    leader_addr = cluster.node(cluster.wait_leader()).client_addr
    argv = [sys.executable, "-m", "client.mqadmin", "-n", leader_addr, "--json", *args]
    return subprocess.run(
        [*argv, "-b", leader_addr], capture_output=True, text=True, timeout=30, check=False
    )


def _sub_group(cluster: LocalCluster, *args: str) -> list[dict[str, Any]]:
    done = _admin(cluster, "updateSubGroup", *args)
    assert done.returncode == 0, done.stderr
    rows: list[dict[str, Any]] = json.loads(done.stdout)
    return rows


def _create_topic(cluster: LocalCluster, name: str, message_type: str = "") -> str:
    with grpc.insecure_channel(cluster.node(cluster.wait_leader()).client_addr) as ch:
        bpb_grpc.BrokerStub(ch).CreateTopic(
            bpb.CreateTopicRequest(
                topic=bpb.TopicConfig(
                    topic_name=name,
                    read_queue_nums=QUEUES,
                    write_queue_nums=QUEUES,
                    message_type=message_type,
                )
            ),
            timeout=CALL_TIMEOUT_S,
        )
    wait_v2_routes(cluster, name)  # every member applied it: any node may be asked
    return name


_code = v2_code


def _produced(clients: list[Client]) -> list[dict[str, Any]]:
    out: list[dict[str, Any]] = []
    for c in clients:
        out += c.finish()
    return out


# ---------------------------------------------------------------------- push consumers


def test_python_and_node_push_consumers_split_the_work(group: LocalCluster, tmp_path: Path) -> None:
    topic = _create_topic(group, "PushSplit")
    first, second = _followers(group)
    consumers = [
        _start("py", "push_consumer", tmp_path, first, topic, "GSplit", "ok"),
        _start("nd", "push_consumer", tmp_path, second, topic, "GSplit", "ok"),
    ]
    try:
        for c in consumers:
            _started(c)
        half = str(SPLIT_MESSAGES // 2)
        sent = _produced(
            [
                _start("py", "producer", tmp_path, first, topic, half, "py"),
                _start("nd", "producer", tmp_path, second, topic, half, "nd"),
            ]
        )
        ids = {r["message_id"] for r in sent}
        assert len(ids) == SPLIT_MESSAGES

        def all_consumed() -> bool:
            return {e["message_id"] for c in consumers for e in c.consumed()} >= ids

        wait_for(all_consumed, WAIT_S, f"{SPLIT_MESSAGES} messages consumed")
        # A late duplicate would come after a redelivery pass or an expired slice.
        time.sleep(1.0)
        events = [c.finish() for c in consumers]
    finally:
        for c in consumers:
            c.kill()
    per_consumer = [[e["message_id"] for e in ev if e.get("event") == "consumed"] for ev in events]
    everything = per_consumer[0] + per_consumer[1]
    assert sorted(everything) == sorted(ids), "a message consumed twice or not at all"
    assert all(per_consumer), f"one consumer got nothing: {[len(p) for p in per_consumer]}"
    print(f"split: python {len(per_consumer[0])}, node.js {len(per_consumer[1])}")


def test_failing_listener_gets_the_group_backoff_then_the_dlq(
    group: LocalCluster, tmp_path: Path
) -> None:
    policy = {"type": "CUSTOMIZED", "customizedRetryPolicy": {"next": list(RETRY_BACKOFF_MS)}}
    fails = ["0", "1", "2", "always"]
    runs = []
    for lang in ("py", "nd"):
        grp = f"GRetry{lang}"
        (row,) = _sub_group(
            group, "-g", grp, "-r", str(RETRY_MAX_TIMES), "--retryPolicy", json.dumps(policy)
        )
        assert row["maxDeliveryAttempts"] == RETRY_MAX_TIMES + 1
        topic = _create_topic(group, f"PushRetry{lang}")
        consumer = _start(lang, "push_consumer", tmp_path, _followers(group)[0], topic, grp, "fail")
        runs.append((lang, grp, topic, consumer))
    try:
        for _lang, _grp, _topic, consumer in runs:
            _started(consumer)
        addr = _followers(group)[0]
        sent = {
            lang: _produced(
                [_start("py", "push_producer", tmp_path, addr, topic, "fails", ",".join(fails))]
            )
            for lang, _grp, topic, _consumer in runs
        }
        leader_addr = group.node(group.wait_leader()).client_addr
        for _lang, grp, _topic, _consumer in runs:
            wait_for(lambda g=grp: _dlq(leader_addr, g) == 1, WAIT_S, f"%DLQ%{grp}")
        time.sleep(1.0)  # nothing is delivered after the DLQ
        events = {lang: consumer.finish() for lang, _grp, _topic, consumer in runs}
    finally:
        for *_rest, consumer in runs:
            consumer.kill()
    for lang, lines in events.items():
        by_body: dict[str, list[tuple[int, float]]] = {}
        for e in lines:
            if e.get("event") == "consumed":
                by_body.setdefault(e["body"], []).append((e["attempt"], e["t"]))
        assert sorted(by_body) == sorted(r["body"] for r in sent[lang])
        for body, deliveries in by_body.items():
            k = body.rsplit("-", 1)[1]
            expected = RETRY_MAX_TIMES + 1 if k == "always" else int(k) + 1
            assert [a for a, _t in deliveries] == list(range(1, expected + 1)), (lang, body)
            for n, ((_a, t0), (_b, t1)) in enumerate(itertools.pairwise(deliveries)):
                backoff_s = RETRY_BACKOFF_MS[min(n, len(RETRY_BACKOFF_MS) - 1)] / 1000
                gap = t1 - t0
                assert backoff_s - BACKOFF_EARLY_S <= gap <= backoff_s + BACKOFF_LATE_S, (
                    lang,
                    body,
                    n,
                    gap,
                )


def _dlq(addr: str, grp: str) -> int:
    try:
        return len(pull_all(addr, f"%DLQ%{grp}", 0))
    except grpc.RpcError:  # created with its first copy
        return 0


# ---------------------------------------------------------------------- FIFO


def test_fifo_groups_in_order_across_a_leader_sigkill(group: LocalCluster, tmp_path: Path) -> None:
    topic = _create_topic(group, "PushFifo", "FIFO")
    (row,) = _sub_group(group, "-g", "GFifo", "-o", "true")
    assert row["consumeMessageOrderly"] is True
    leader = group.wait_leader()
    addr = _followers(group)[0]
    consumer = _start("py", "push_consumer", tmp_path, addr, topic, "GFifo", "ok")
    killed = ""
    try:
        _started(consumer)
        per = FIFO_GROUPS // FIFO_PRODUCERS
        producers = [
            _start(
                "py",
                "push_producer",
                tmp_path,
                addr,
                topic,
                "fifo",
                str(i * per),
                str(per),
                str(FIFO_PER_GROUP),
            )
            for i in range(FIFO_PRODUCERS)
        ]
        wait_for(lambda: len(consumer.consumed()) >= FIFO_KILL_AFTER, WAIT_S, "FIFO progress")
        group.signal(leader, signal.SIGKILL)
        killed = leader
        sent = _produced(producers)
        assert len(sent) == FIFO_GROUPS * FIFO_PER_GROUP
        total = len(sent)
        wait_for(lambda: len(consumer.consumed()) >= total, WAIT_S, f"{total} FIFO messages")
        time.sleep(1.0)
        lines = consumer.finish()
    finally:
        consumer.kill()
        if killed:
            group.start(killed)
    by_group: dict[str, list[int]] = {}
    for e in lines:
        if e.get("event") == "consumed":
            assert e["body"].startswith(e["group"] + "-"), e
            by_group.setdefault(e["group"], []).append(int(e["body"].rsplit("-", 1)[1]))
    assert sorted(by_group) == sorted(f"g{j}" for j in range(FIFO_GROUPS))
    for name, seq in by_group.items():
        assert seq == list(range(FIFO_PER_GROUP)), (name, seq[:20])


# ---------------------------------------------------------------------- the raw protocol


@pytest.fixture
def v2_stub(group: LocalCluster) -> Iterator[Any]:
    with grpc.insecure_channel(_followers(group)[0]) as ch:
        yield v2_grpc.MessagingServiceStub(ch)


def _fifo_message(topic: str, group_name: str | None, n: int = 0) -> Any:
    sp = v2.SystemProperties(
        message_id=f"01{n:032X}", message_type=v2.FIFO, body_encoding=v2.IDENTITY
    )
    if group_name is not None:
        sp.message_group = group_name
    return v2.Message(topic=v2.Resource(name=topic), body=b"x", system_properties=sp)


def _offsets(cluster: LocalCluster, topic: str) -> list[int]:
    with grpc.insecure_channel(cluster.node(cluster.wait_leader()).client_addr) as ch:
        stub = bpb_grpc.BrokerStub(ch)
        return [
            stub.GetQueueOffsets(
                bpb.GetQueueOffsetsRequest(topic=topic, queue_id=q), timeout=CALL_TIMEOUT_S
            ).max_offset
            for q in range(QUEUES)
        ]


def test_bad_fifo_sends_store_nothing(group: LocalCluster, v2_stub: Any) -> None:
    topic = _create_topic(group, "PushFifoBad", "FIFO")
    normal = _fifo_message(topic, None, 1)
    normal.system_properties.message_type = v2.NORMAL
    cases = [
        ([_fifo_message(topic, None)], "ILLEGAL_MESSAGE_GROUP"),
        ([_fifo_message(topic, "")], "ILLEGAL_MESSAGE_GROUP"),
        ([_fifo_message(topic, "g" * 129)], "ILLEGAL_MESSAGE_GROUP"),
        ([_fifo_message(topic, "a\nb")], "ILLEGAL_MESSAGE_GROUP"),
        ([_fifo_message(topic, "a", 2), _fifo_message(topic, "b", 3)], "BAD_REQUEST"),
        ([normal], "MESSAGE_PROPERTY_CONFLICT_WITH_TYPE"),
    ]
    for messages, code in cases:
        resp = v2_stub.SendMessage(
            v2_service.SendMessageRequest(messages=messages), timeout=CALL_TIMEOUT_S
        )
        assert _code(resp.status) == code, (messages[0].system_properties, resp.status)
        assert [_code(e.status) for e in resp.entries] == [code] * len(messages)
    assert _offsets(group, topic) == [0] * QUEUES
    # The same group always lands in one queue.
    for n in range(6):
        resp = v2_stub.SendMessage(
            v2_service.SendMessageRequest(messages=[_fifo_message(topic, "order-7", 10 + n)]),
            timeout=CALL_TIMEOUT_S,
        )
        assert _code(resp.status) == "OK"
    assert sorted(_offsets(group, topic)) == [0] * (QUEUES - 1) + [6]


def test_assignments_settings_and_dead_letter_forward(
    group: LocalCluster, v2_stub: Any, tmp_path: Path
) -> None:
    topic = _create_topic(group, "PushAssign")
    _sub_group(group, "-g", "GAssignFifo", "-o", "true", "-r", "4")

    def assignment(grp: str, name: str = topic) -> Any:
        return v2_stub.QueryAssignment(
            v2_service.QueryAssignmentRequest(
                topic=v2.Resource(name=name), group=v2.Resource(name=grp)
            ),
            timeout=CALL_TIMEOUT_S,
        )

    normal = assignment("GAssignNormal")
    assert _code(normal.status) == "OK"
    assert [a.message_queue.id for a in normal.assignments] == [-1]
    fifo = assignment("GAssignFifo")
    assert [a.message_queue.id for a in fifo.assignments] == list(range(QUEUES))
    assert _code(assignment("GAssignNormal", "NoSuchTopic").status) == "TOPIC_NOT_FOUND"
    assert _code(assignment("bad group!").status) == "ILLEGAL_CONSUMER_GROUP"
    # A push consumer's Settings carry the group's config, in the form its language reads.
    for language, strategy in (
        (v2.PYTHON, "customized_backoff"),
        (v2.NODE_JS, "exponential_backoff"),
    ):
        settings = _settings(v2_stub, "GAssignFifo", topic, language)
        assert settings.subscription.fifo is True
        assert settings.backoff_policy.max_attempts == 5
        assert settings.backoff_policy.WhichOneof("strategy") == strategy
    # A consumer naming an unknown group creates it with the defaults: mqadmin lists it.
    _settings(v2_stub, "GBySettings", topic, v2.JAVA)
    listed = _admin(group, "getConsumerConfig", "-g", "GBySettings")
    assert listed.returncode == 0 and json.loads(listed.stdout)[0]["group"] == "GBySettings"
    # Bad configs are refused and change nothing.
    for bad in (
        ["-r", "5000"],
        ["--retryPolicy", '{"type":"CUSTOMIZED","customizedRetryPolicy":{"next":[]}}'],
    ):
        assert _admin(group, "updateSubGroup", "-g", "GAssignFifo", *bad).returncode != 0
    assert _sub_group_config(group, "GAssignFifo")["maxDeliveryAttempts"] == 5
    # A malformed handle cannot be forwarded to the DLQ.
    resp = v2_stub.ForwardMessageToDeadLetterQueue(
        v2_service.ForwardMessageToDeadLetterQueueRequest(
            group=v2.Resource(name="GAssignNormal"),
            topic=v2.Resource(name=topic),
            receipt_handle="not a handle",
        ),
        timeout=CALL_TIMEOUT_S,
    )
    assert _code(resp.status) == "INVALID_RECEIPT_HANDLE"


def _sub_group_config(cluster: LocalCluster, grp: str) -> dict[str, Any]:
    listed = _admin(cluster, "getConsumerConfig", "-g", grp)
    assert listed.returncode == 0, listed.stderr
    (row,) = json.loads(listed.stdout)
    return dict(row)


def _settings(stub: Any, grp: str, topic: str, language: int) -> Any:
    settings = v2.Settings(
        client_type=v2.PUSH_CONSUMER,
        user_agent=v2.UA(language=language, version="5"),
        subscription=v2.Subscription(
            group=v2.Resource(name=grp),
            subscriptions=[
                v2.SubscriptionEntry(
                    topic=v2.Resource(name=topic),
                    expression=v2.FilterExpression(type=v2.TAG, expression="*"),
                )
            ],
        ),
    )
    replies = stub.Telemetry(
        iter([v2_service.TelemetryCommand(settings=settings)]),
        timeout=CALL_TIMEOUT_S,
        metadata=(("x-mq-client-id", f"test-{grp}-{language}"),),
    )
    (reply,) = list(replies)
    assert _code(reply.status) == "OK", reply.status
    return reply.settings
