"""RocketMQ 5's PushConsumer and FIFO message groups on a real 3-node group, with the official
Python and Node.js clients (docs/RMQ5.md, "Push consumers", "FIFO message groups",
"Subscription groups"):

- a Python and a Node.js PushConsumer of one group split 2,000 messages, each consumed exactly
  once overall;
- a listener failing a message k times sees it k + 1 times, the group's backoff (set with
  ``mqadmin updateSubGroup``) between deliveries; one that always fails finds it in
  ``%DLQ%{group}`` after the group's max attempts;
- a FIFO PushConsumer sees 20 message groups x 100 messages each in send order, no gap and no
  repeat, across a SIGKILL of the leader in the middle (a Python and a Node.js one, each in a
  consumer group of its own, through the same kill);
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

from broker.frontends.v2 import stubs
from client.admin import MQAdmin
from client.errors import MQClientError
from mqcluster.cluster import LocalCluster

pytestmark = [pytest.mark.integration]

v2, v2_service, v2_grpc = stubs.load()

QUEUES = 4
# The split: sent in SendMessage requests of SEND_BATCH (the official producers send one message
# per request, ~25 ms each on a loaded box: their sends are tested in test_rmq5_producers.py).
SPLIT_MESSAGES = 2000
SEND_BATCH = 100
# FIFO: message groups x messages per group. The official Python producer sends one group's;
# the others go in requests of FIFO_BATCH messages of one group, a thread per group (each
# group's requests one after the other: its send order).
FIFO_GROUPS = 20
FIFO_PER_GROUP = 100
FIFO_BATCH = 10
# The leader is SIGKILLed once each FIFO consumer consumed this many (low: the kill must come
# before the faster of the two is done; seen at the kill: 300 to 900 of 2,000).
FIFO_KILL_AFTER = 300
# A FIFO push consumer of each language, in a consumer group of its own, at once.
FIFO_LANGS = ("py", "nd")
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
# Send statuses worth another try: no leader yet, the leader busy, an outcome unknown.
RETRY_CODES = frozenset({"HA_NOT_AVAILABLE", "TOO_MANY_REQUESTS", "MASTER_PERSISTENCE_TIMEOUT"})
CALL_TIMEOUT_S = 10
EXTRA = {
    "mappedFileSizeCommitLog": str(8 << 20),
    "diskSpaceWarningLevelRatio": "99",
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


# Numbers the clients' stderr files (several clients of one script share a HOME).
_CLIENT_SEQ = itertools.count(1)


class Client:
    """An official client's script in its own process; its JSON lines gathered by a thread.
    Its stderr goes to a file in ``home`` (``<script>-<n>.err``), never to a pipe: a pipe
    read only at the end fills up with the client's logging, and the client then stalls on
    its next write (as test_rmq5_timer.py's clients learnt). Its stdin stays open: the
    consumer scripts run until it closes (:meth:`kill` ends them sooner)."""

    def __init__(self, argv: list[str], home: Path, node: bool) -> None:
        env = {"PATH": os.environ.get("PATH", ""), "HOME": str(home)}
        if node:
            env["NODE_PATH"] = str(NODE_MODULES)
        self.argv = argv
        self.err_path = home / f"{Path(argv[1]).stem}-{next(_CLIENT_SEQ)}.err"
        with self.err_path.open("w") as err:
            self.proc = subprocess.Popen(
                argv,
                stdin=subprocess.PIPE,
                stdout=subprocess.PIPE,
                stderr=err,
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
        """A producer: wait for its end; every line but the last ``done``."""
        try:
            self.proc.wait(timeout=timeout_s)
        finally:
            self.kill()
        self._reader.join(timeout=5)
        err = self.stderr_tail(3000)
        assert self.proc.returncode == 0, f"{self.argv[:3]} failed: {err}"
        assert self.lines and "done" in self.lines[-1], (self.lines[-3:], err[-2000:])
        return self.lines[:-1]

    def stderr_tail(self, limit: int = 2000) -> str:
        """The end of what the client wrote to stderr (its file: readable at any time)."""
        text = self.err_path.read_text(errors="replace")
        return f"stderr ({self.err_path}): {text[-limit:]}" if text else "stderr: empty"

    def stop(self) -> list[dict[str, Any]]:
        """A consumer, once the test saw what it waits for: killed (a clean shutdown waits out
        its long-polling receives, 20 s); every line it printed."""
        assert self.proc.poll() is None, (
            f"{self.argv[:3]} ended early: {self.lines[-3:]} {self.stderr_tail()}"
        )
        self.kill()
        self._reader.join(timeout=5)
        return list(self.lines)

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
    assert consumer.proc.poll() is None, (
        f"{consumer.argv[1]} ended before it started: {consumer.lines[-3:]} "
        f"{consumer.stderr_tail()}"
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


def _configure(cluster: LocalCluster, config: bpb.SubscriptionGroup) -> bpb.SubscriptionGroup:
    """A group's config through the admin API (in process: an mqadmin process costs seconds on
    a loaded box; the command line is run where its output is checked)."""
    leader_addr = cluster.node(cluster.wait_leader()).client_addr
    applied = MQAdmin(leader_addr).update_sub_group(config, broker_addr=leader_addr)
    return applied[leader_addr]


def _configs(cluster: LocalCluster) -> dict[str, bpb.SubscriptionGroup]:
    leader_addr = cluster.node(cluster.wait_leader()).client_addr
    (listed,) = MQAdmin(leader_addr).sub_groups(broker_addr=leader_addr).values()
    return {c.group: c for c in listed}


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
        ids = set(_send_batches(first, topic, SPLIT_MESSAGES, SEND_BATCH))
        assert len(ids) == SPLIT_MESSAGES

        def all_consumed() -> bool:
            return {e["message_id"] for c in consumers for e in c.consumed()} >= ids

        wait_for(all_consumed, WAIT_S, f"{SPLIT_MESSAGES} messages consumed")
        # A late duplicate would come after a redelivery pass or an expired slice.
        time.sleep(1.0)
        events = [c.stop() for c in consumers]
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
    (row,) = _sub_group(
        group, "-g", "GRetrypy", "-r", str(RETRY_MAX_TIMES), "--retryPolicy", json.dumps(policy)
    )
    assert row["maxDeliveryAttempts"] == RETRY_MAX_TIMES + 1
    assert row["retryPolicy"] == "CUSTOMIZED 1000ms,2000ms"
    same = bpb.SubscriptionGroup(
        group="GRetrynd",
        max_delivery_attempts=RETRY_MAX_TIMES + 1,
        backoff_type="CUSTOMIZED",
        customized_backoff_ms=RETRY_BACKOFF_MS,
    )
    applied = _configure(group, same)
    assert (applied.max_delivery_attempts, list(applied.customized_backoff_ms)) == (
        RETRY_MAX_TIMES + 1,
        list(RETRY_BACKOFF_MS),
    )
    for lang in ("py", "nd"):
        grp = f"GRetry{lang}"
        topic = _create_topic(group, f"PushRetry{lang}")
        consumer = _start(lang, "push_consumer", tmp_path, _followers(group)[0], topic, grp, "fail")
        runs.append((lang, grp, topic, consumer))
    try:
        for _lang, _grp, _topic, consumer in runs:
            _started(consumer)
        addr = _followers(group)[0]
        for _lang, _grp, topic, _consumer in runs:
            _send_failing(addr, topic, fails)
        leader_addr = group.node(group.wait_leader()).client_addr
        for _lang, grp, _topic, _consumer in runs:
            wait_for(lambda g=grp: _dlq(leader_addr, g) == 1, WAIT_S, f"%DLQ%{grp}")
        time.sleep(1.0)  # nothing is delivered after the DLQ
        events = {lang: consumer.stop() for lang, _grp, _topic, consumer in runs}
    finally:
        for *_rest, consumer in runs:
            consumer.kill()
    for lang, lines in events.items():
        by_body: dict[str, list[tuple[int, float]]] = {}
        for e in lines:
            if e.get("event") == "consumed":
                by_body.setdefault(e["body"], []).append((e["attempt"], e["t"]))
        assert sorted(by_body) == sorted(f"fails-{k}" for k in fails)
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


def _send_failing(addr: str, topic: str, fails: list[str]) -> None:
    """One message "fails-{k}" with the user property ``fails`` = k per k."""
    with grpc.insecure_channel(addr) as ch:
        messages = [
            v2.Message(
                topic=v2.Resource(name=topic),
                body=f"fails-{k}".encode(),
                user_properties={"fails": k},
                system_properties=v2.SystemProperties(
                    message_id=mid, message_type=v2.NORMAL, body_encoding=v2.IDENTITY
                ),
            )
            for k, mid in zip(fails, _v2_ids(0, len(fails)), strict=True)
        ]
        assert _code(_send(v2_grpc.MessagingServiceStub(ch), messages).status) == "OK"


def _dlq(addr: str, grp: str) -> int:
    try:
        return len(pull_all(addr, f"%DLQ%{grp}", 0))
    except grpc.RpcError:  # created with its first copy
        return 0


# ---------------------------------------------------------------------- FIFO


def test_fifo_groups_in_order_across_a_leader_sigkill(group: LocalCluster, tmp_path: Path) -> None:
    topic = _create_topic(group, "PushFifo", "FIFO")
    # One consumer group per client language: each sees every message group whole.
    groups = {lang: f"GFifo{lang.title()}" for lang in FIFO_LANGS}
    for name in groups.values():
        assert _configure(group, bpb.SubscriptionGroup(group=name, consume_message_orderly=True))
    leader = group.wait_leader()
    addr = _followers(group)[0]
    last = FIFO_GROUPS - 1  # the official producer's group
    name = f"g{last}"
    official = _start("py", "producer", tmp_path, addr, topic, str(FIFO_PER_GROUP), name, name)
    threads = [
        threading.Thread(target=_send_fifo_group, args=(addr, topic, f"g{j}"), daemon=True)
        for j in range(last)
    ]
    for t in threads:
        t.start()
    assert len(official.finish()) == FIFO_PER_GROUP
    for t in threads:
        t.join(WAIT_S)
    total = FIFO_GROUPS * FIFO_PER_GROUP
    assert sum(_offsets(group, topic)) == total
    with grpc.insecure_channel(addr) as ch:  # the consumers read the FIFO flag once, at start
        for name in groups.values():
            _wait_fifo(v2_grpc.MessagingServiceStub(ch), topic, name)
    consumers = {
        lang: _start(lang, "push_consumer", tmp_path, addr, topic, name, "ok")
        for lang, name in groups.items()
    }
    killed = ""
    try:
        wait_for(
            lambda: all(len(c.consumed()) >= FIFO_KILL_AFTER for c in consumers.values()),
            WAIT_S,
            "FIFO progress",
        )
        group.signal(leader, signal.SIGKILL)
        killed = leader
        at_kill = {lang: len(c.consumed()) for lang, c in consumers.items()}
        wait_for(
            lambda: all(len(c.consumed()) >= total for c in consumers.values()),
            WAIT_S,
            f"{total} FIFO messages in each consumer group",
        )
        time.sleep(1.0)  # a repeat would come now
        lines = {lang: c.stop() for lang, c in consumers.items()}
    finally:
        for c in consumers.values():
            c.kill()
        if killed:
            group.start(killed)
    print(f"FIFO: leader {killed} SIGKILLed after {at_kill} of {total} consumed")
    for lang, events in lines.items():
        assert at_kill[lang] < total, f"{lang}: the leader was killed after the last message"
        _check_fifo_order(lang, events)


def _check_fifo_order(lang: str, events: list[dict[str, Any]]) -> None:
    """Every message group's messages consumed once each, in send order, no gap."""
    by_group: dict[str, list[int]] = {}
    for e in events:
        if e.get("event") == "consumed":
            assert e["body"].startswith(e["group"] + "-"), (lang, e)
            by_group.setdefault(e["group"], []).append(int(e["body"].rsplit("-", 1)[1]))
    assert sorted(by_group) == sorted(f"g{j}" for j in range(FIFO_GROUPS)), lang
    for name, seq in by_group.items():
        assert seq == list(range(FIFO_PER_GROUP)), (lang, name, seq[:20])


def _v2_ids(start: int, count: int) -> list[str]:
    """Message ids as a RocketMQ 5 client makes them ("01" + 32 upper-case hex), unique per
    test run."""
    base = time.time_ns() & ((1 << 80) - 1)
    return [f"01{(base << 40) + start + i:032X}" for i in range(count)]


def _send(stub: Any, messages: list[Any]) -> Any:
    """One SendMessage, retried while the group elects a leader (the same ids: stored once)."""
    deadline = time.monotonic() + WAIT_S
    while True:
        resp = stub.SendMessage(
            v2_service.SendMessageRequest(messages=messages), timeout=CALL_TIMEOUT_S
        )
        code = _code(resp.status)
        if code == "OK" or time.monotonic() > deadline or code not in RETRY_CODES:
            return resp
        time.sleep(0.1)


def _send_batches(addr: str, topic: str, count: int, batch: int) -> list[str]:
    """``count`` NORMAL messages in requests of ``batch``; their ids."""
    ids = _v2_ids(0, count)
    with grpc.insecure_channel(addr) as ch:
        stub = v2_grpc.MessagingServiceStub(ch)
        for start in range(0, count, batch):
            messages = [
                v2.Message(
                    topic=v2.Resource(name=topic),
                    body=f"split-{start + i}".encode(),
                    system_properties=v2.SystemProperties(
                        message_id=mid, message_type=v2.NORMAL, body_encoding=v2.IDENTITY
                    ),
                )
                for i, mid in enumerate(ids[start : start + batch])
            ]
            assert _code(_send(stub, messages).status) == "OK"
    return ids


def _send_fifo_group(addr: str, topic: str, name: str) -> None:
    """FIFO_PER_GROUP messages "{name}-{i}" of message group ``name``, FIFO_BATCH per request,
    in order."""
    ids = _v2_ids(int(name[1:]) * FIFO_PER_GROUP, FIFO_PER_GROUP)
    with grpc.insecure_channel(addr) as ch:
        stub = v2_grpc.MessagingServiceStub(ch)
        for start in range(0, FIFO_PER_GROUP, FIFO_BATCH):
            messages = []
            for i in range(start, start + FIFO_BATCH):
                m = _fifo_message(topic, name)
                m.body = f"{name}-{i}".encode()
                m.system_properties.message_id = ids[i]
                messages.append(m)
            assert _code(_send(stub, messages).status) == "OK"


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
    fifo_config = bpb.SubscriptionGroup(
        group="GAssignFifo", consume_message_orderly=True, max_delivery_attempts=5
    )
    _configure(group, fifo_config)

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
    _wait_fifo(v2_stub, topic, "GAssignFifo")  # this follower applied the config
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
    assert listed.returncode == 0, listed.stderr
    (row,) = json.loads(listed.stdout)
    assert (row["group"], row["consumeMessageOrderly"], row["maxDeliveryAttempts"]) == (
        "GBySettings",
        False,
        16,
    )
    # Bad configs are refused and change nothing.
    before = _configs(group)["GAssignFifo"]
    for bad in (
        bpb.SubscriptionGroup(group="GAssignFifo", max_delivery_attempts=5000),
        bpb.SubscriptionGroup(group="GAssignFifo", backoff_type="CUSTOMIZED"),
        bpb.SubscriptionGroup(group="GAssignFifo", backoff_type="LINEAR"),
        bpb.SubscriptionGroup(
            group="GAssignFifo", backoff_type="EXPONENTIAL", exponential_multiplier=float("nan")
        ),
        bpb.SubscriptionGroup(group="bad group!"),
    ):
        with pytest.raises(MQClientError):
            _configure(group, bad)
    assert _configs(group)["GAssignFifo"] == before
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


def _wait_fifo(stub: Any, topic: str, grp: str) -> None:
    """Wait until the node behind ``stub`` applied ``grp``'s FIFO config: its QueryAssignment
    answers every queue (a follower applies a committed entry a moment after the leader)."""

    def fifo_applied() -> bool:
        resp = stub.QueryAssignment(
            v2_service.QueryAssignmentRequest(
                topic=v2.Resource(name=topic), group=v2.Resource(name=grp)
            ),
            timeout=CALL_TIMEOUT_S,
        )
        ids = [a.message_queue.id for a in resp.assignments]
        return _code(resp.status) == "OK" and ids == list(range(QUEUES))

    wait_for(fifo_applied, WAIT_S, f"{grp}'s FIFO config applied")


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
