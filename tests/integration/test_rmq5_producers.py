"""RocketMQ 5's protocol (apache.rocketmq.v2) on a real 3-node group: the official Python and
Node.js clients, installed by the project's set-up (protos/rmq5_deps.py, build/rmq5), send
through a follower (forwarded to the leader); what raftmq's own pull reads back is intact and
stored once. Hostile and wrong requests through the generated v2 stubs get the protocol's status
and change nothing (docs/RMQ5.md)."""

from __future__ import annotations

import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import grpc
import pytest
from raftmq.broker.v1 import broker_pb2 as bpb
from raftmq.broker.v1 import broker_pb2_grpc as bpb_grpc
from rmq5_support import ClientProcess, client_env
from support import create_topic_on, pull_all, wait_for

from broker.frontends.v2 import stubs
from client.message import MessageExt
from mqcluster.cluster import LocalCluster

pytestmark = [pytest.mark.integration]

v2, v2_service, v2_grpc = stubs.load()

ROOT = Path(__file__).resolve().parents[2]
RMQ5 = ROOT / "build" / "rmq5"
SCRIPTS = ROOT / "tests" / "rmq5"
TOPIC = "RMQ5T"
QUEUES = 4
# A small maxMessageSize, so that "body over the limit" needs no big request.
MAX_MESSAGE_BYTES = 4096
# Messages each official client sends: every queue several times, well under a few seconds.
SENDS = 40
CLIENT_TIMEOUT_S = 60
# These groups store a few KB: the disk watermark at its top, so that a machine whose shared
# /tmp is nearly full (other test runs) does not turn protocol checks into DISK_FULL answers.
DISK_CONF = {"diskSpaceWarningLevelRatio": "99", "diskSpaceResumeRatio": "98"}
CALL_TIMEOUT_S = 10


@pytest.fixture(scope="module")
def group(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LocalCluster]:
    cluster = LocalCluster(tmp_path_factory.mktemp("rmq5"))
    cluster.configure(
        3,
        auto_ports=True,
        extra={
            "mappedFileSizeCommitLog": str(4 << 20),
            "maxMessageSize": str(MAX_MESSAGE_BYTES),
            **DISK_CONF,
        },
    )
    try:
        cluster.up()
        create_topic_on([cluster], [], TOPIC, QUEUES)
        for n in cluster.nodes:  # every member applied the topic: any node may be asked
            with grpc.insecure_channel(n.grpc_addr) as ch:
                stub = v2_grpc.MessagingServiceStub(ch)
                ask = v2_service.QueryRouteRequest(topic=v2.Resource(name=TOPIC))
                wait_for(
                    lambda s=stub, a=ask: _answers_ok(s, a),
                    10,
                    f"{TOPIC} on {n.node_id}",
                )
        yield cluster
    finally:
        cluster.down(grace_s=5.0)


def _answers_ok(stub: Any, ask: Any) -> bool:
    """The node's v2 port is up and routes the topic (it starts just after the node)."""
    try:
        return _code(stub.QueryRoute(ask, timeout=5).status) == "OK"
    except grpc.RpcError:
        return False


def _follower_v2_addr(cluster: LocalCluster) -> str:
    leader = cluster.wait_leader()
    return next(n.grpc_addr for n in cluster.nodes if n.node_id != leader)


def _stored(cluster: LocalCluster, topic: str = TOPIC, queues: int = QUEUES) -> list[MessageExt]:
    """Every message of ``topic``, read from the leader through raftmq's own pull."""
    addr = cluster.node(cluster.wait_leader()).client_addr
    return [m for q in range(queues) for m in pull_all(addr, topic, q)]


def _run_client(argv: list[str], home: Path, env: dict[str, str] | None = None) -> list[Any]:
    """Run an official client's script (output in files under ``home``, as
    rmq5_support.ClientProcess says why); its JSON lines. HOME points at the test's directory:
    both clients write their logs under ~/logs/rocketmq."""
    with ClientProcess(argv, home, client_env(home, **(env or {}))) as client:
        lines = client.finish(CLIENT_TIMEOUT_S)
        assert client.lines()[-1] == {"done": int(argv[-2])}, client.tail()
    return lines


def _check_intact(cluster: LocalCluster, receipts: list[Any], prefix: str) -> None:
    """Each receipt's message is stored exactly once with everything the client set."""
    mine = [m for m in _stored(cluster) if m.properties.get("origin") == prefix]
    by_id: dict[str, list[MessageExt]] = {}
    for m in mine:
        by_id.setdefault(m.msg_id, []).append(m)
    assert len(mine) == len(receipts) == SENDS
    for r in receipts:
        i, v2_id = r["i"], r["message_id"]
        assert v2_id.startswith("01") and len(v2_id) == 34
        copies = by_id.get(v2_id[2:], [])
        assert len(copies) == 1, f"message {v2_id} stored {len(copies)} times"
        m = copies[0]
        assert m.body == f"{prefix}-body-{i}".encode()
        assert m.tags == f"tag{i % 3}"
        assert sorted(m.keys) == sorted([f"{prefix}-key-{i}", f"{prefix}-k2-{i}"])
        assert m.properties["seq"] == str(i)
        assert m.queue_offset == r["offset"]
        assert m.born_timestamp_ms > 0


def test_python_client_producer_through_a_follower(group: LocalCluster, tmp_path: Path) -> None:
    python = RMQ5 / "pyclient" / "bin" / "python"
    assert python.exists(), "build/rmq5/pyclient missing: run 'make venv'"
    argv = [str(python), str(SCRIPTS / "py_producer.py"), _follower_v2_addr(group)]
    receipts = _run_client([*argv, TOPIC, str(SENDS), "py"], tmp_path)
    _check_intact(group, receipts, "py")


def test_node_client_producer_through_a_follower(group: LocalCluster, tmp_path: Path) -> None:
    modules = RMQ5 / "node" / "node_modules"
    assert (modules / "rocketmq-client-nodejs").exists(), "build/rmq5/node: run 'make venv'"
    argv = ["node", str(SCRIPTS / "node_producer.js"), _follower_v2_addr(group)]
    receipts = _run_client([*argv, TOPIC, str(SENDS), "nd"], tmp_path, {"NODE_PATH": str(modules)})
    _check_intact(group, receipts, "nd")


# ---------------------------------------------------------------------- the raw protocol


def _v2_message(msg_id: str, body: bytes = b"raw", topic: str = TOPIC, **props: str) -> Any:
    m = v2.Message(topic=v2.Resource(name=topic), body=body)
    m.system_properties.message_id = msg_id
    m.system_properties.message_type = v2.NORMAL
    m.system_properties.body_encoding = v2.IDENTITY
    m.system_properties.tag = "raw"
    m.system_properties.born_host = "127.0.0.1"
    m.user_properties.update(props)
    return m


def _send(stub: Any, *messages: Any) -> Any:
    return stub.SendMessage(
        v2_service.SendMessageRequest(messages=list(messages)), timeout=CALL_TIMEOUT_S
    )


def _code(status: Any) -> str:
    return str(v2.Code.Name(status.code))


@pytest.fixture
def v2_stub(group: LocalCluster) -> Iterator[Any]:
    with grpc.insecure_channel(_follower_v2_addr(group)) as ch:
        yield v2_grpc.MessagingServiceStub(ch)


def test_query_route_names_queue_zero_and_the_asked_endpoints(v2_stub: Any) -> None:
    asked = v2.Endpoints(scheme=v2.IPv4, addresses=[v2.Address(host="127.0.0.1", port=8081)])
    resp = v2_stub.QueryRoute(
        v2_service.QueryRouteRequest(topic=v2.Resource(name=TOPIC), endpoints=asked),
        timeout=CALL_TIMEOUT_S,
    )
    assert _code(resp.status) == "OK"
    assert [q.id for q in resp.message_queues] == list(range(QUEUES))
    for q in resp.message_queues:
        assert q.permission == v2.READ_WRITE
        # MIXED, the default message.type, takes every type.
        assert list(q.accept_message_types) == [v2.NORMAL, v2.FIFO, v2.DELAY, v2.TRANSACTION]
        assert q.broker.name == "broker-a" and q.broker.id == 0
        assert q.broker.endpoints == asked
    missing = v2_stub.QueryRoute(
        v2_service.QueryRouteRequest(topic=v2.Resource(name="NoSuchTopic")), timeout=5
    )
    assert _code(missing.status) == "TOPIC_NOT_FOUND" and not missing.message_queues


def test_the_topic_message_type_attribute_reaches_routes_and_sends(
    group: LocalCluster, v2_stub: Any
) -> None:
    with grpc.insecure_channel(group.node(group.wait_leader()).client_addr) as ch:
        bpb_grpc.BrokerStub(ch).CreateTopic(
            bpb.CreateTopicRequest(
                topic=bpb.TopicConfig(
                    topic_name="RMQ5Fifo",
                    read_queue_nums=2,
                    write_queue_nums=2,
                    message_type="FIFO",
                )
            ),
            timeout=CALL_TIMEOUT_S,
        )
    ask = v2_service.QueryRouteRequest(topic=v2.Resource(name="RMQ5Fifo"))
    # A follower answers from its replicated topic table, once it applied the topic.
    wait_for(lambda: _code(v2_stub.QueryRoute(ask, timeout=5).status) == "OK", 10, "the topic")
    route = v2_stub.QueryRoute(ask, timeout=5)
    assert {tuple(q.accept_message_types) for q in route.message_queues} == {(v2.FIFO,)}
    normal = _send(v2_stub, _v2_message("01" + "D1" * 16, topic="RMQ5Fifo"))
    assert _code(normal.status) == "MESSAGE_PROPERTY_CONFLICT_WITH_TYPE"


def test_a_retried_message_id_is_stored_once(group: LocalCluster, v2_stub: Any) -> None:
    msg_id = "01" + "AB" * 16
    first = _send(v2_stub, _v2_message(msg_id, b"once", origin="retry"))
    again = _send(v2_stub, _v2_message(msg_id, b"once", origin="retry"))
    for resp in (first, again):
        assert _code(resp.status) == "OK" and len(resp.entries) == 1
        assert resp.entries[0].message_id == msg_id
    assert again.entries[0].offset == first.entries[0].offset
    stored = [m for m in _stored(group) if m.properties.get("origin") == "retry"]
    assert [(m.msg_id, m.body) for m in stored] == [("AB" * 16, b"once")]


def test_bad_sends_get_their_status_and_store_nothing(group: LocalCluster, v2_stub: Any) -> None:
    before = len(_stored(group))
    cases = {
        "TOPIC_NOT_FOUND": [_v2_message("01" + "C1" * 16, topic="NoSuchTopic")],
        "ILLEGAL_TOPIC": [_v2_message("01" + "C2" * 16, topic="bad topic!")],
        "MESSAGE_BODY_TOO_LARGE": [_v2_message("01" + "C3" * 16, b"x" * (MAX_MESSAGE_BYTES + 1))],
        "MESSAGE_BODY_EMPTY": [_v2_message("01" + "C4" * 16, b"")],
        "ILLEGAL_MESSAGE_ID": [_v2_message("")],
        "ILLEGAL_MESSAGE_PROPERTY_KEY": [_v2_message("01" + "C5" * 16, DELAY="3")],
    }
    for want, messages in cases.items():
        resp = _send(v2_stub, *messages)
        assert _code(resp.status) == want, (want, resp)
        assert [_code(e.status) for e in resp.entries] == [want]
    lower = _send(v2_stub, _v2_message("01" + "c6" * 16))
    assert _code(lower.status) == "ILLEGAL_MESSAGE_ID"
    fifo = _v2_message("01" + "C7" * 16)
    fifo.system_properties.message_type = v2.FIFO  # without its message group
    assert _code(_send(v2_stub, fifo).status) == "ILLEGAL_MESSAGE_GROUP"
    # One bad message fails the whole send (one entry per message), nothing stored.
    mixed = _send(v2_stub, _v2_message("01" + "C8" * 16), _v2_message("nope"))
    assert _code(mixed.status) == "ILLEGAL_MESSAGE_ID" and len(mixed.entries) == 2
    empty = _send(v2_stub)
    assert _code(empty.status) == "BAD_REQUEST" and not empty.entries
    assert len(_stored(group)) == before


def _telemetry(stub: Any, client_id: str, settings: Any) -> Any:
    replies = stub.Telemetry(
        iter([v2_service.TelemetryCommand(settings=settings)]),
        metadata=[("x-mq-client-id", client_id)],
        timeout=CALL_TIMEOUT_S,
    )
    return next(iter(replies))


def test_settings_then_heartbeat_and_unknown_client_types(v2_stub: Any) -> None:
    meta = [("x-mq-client-id", "rmq5-test-client")]
    early = v2_stub.Heartbeat(
        v2_service.HeartbeatRequest(client_type=v2.PRODUCER), metadata=meta, timeout=5
    )
    assert _code(early.status) == "UNRECOGNIZED_CLIENT_TYPE"
    asked = v2.Settings(
        client_type=v2.PRODUCER,
        publishing=v2.Publishing(topics=[v2.Resource(name=TOPIC)]),
        user_agent=v2.UA(language=v2.PYTHON, version="5.1.2"),
    )
    reply = _telemetry(v2_stub, "rmq5-test-client", asked)
    assert _code(reply.status) == "OK"
    assert reply.settings.publishing.max_body_size == MAX_MESSAGE_BYTES
    assert reply.settings.backoff_policy.WhichOneof("strategy") == "exponential_backoff"
    assert reply.settings.backoff_policy.max_attempts > 0
    ok = v2_stub.Heartbeat(
        v2_service.HeartbeatRequest(client_type=v2.PRODUCER), metadata=meta, timeout=5
    )
    assert _code(ok.status) == "OK"
    # A SimpleConsumer is told how long to long-poll and how many messages to ask for at most
    # (what RocketMQ's proxy answers: 20 s, 32).
    consumer = v2.Settings(
        client_type=v2.SIMPLE_CONSUMER,
        subscription=v2.Subscription(group=v2.Resource(name="GSettings")),
        user_agent=v2.UA(language=v2.PYTHON, version="5.1.2"),
    )
    got = _telemetry(v2_stub, "rmq5-test-consumer", consumer)
    assert _code(got.status) == "OK"
    assert got.settings.subscription.long_polling_timeout.ToMilliseconds() == 20_000
    assert got.settings.subscription.receive_batch_size == 32
    unknown = _telemetry(v2_stub, "rmq5-other", v2.Settings(user_agent=asked.user_agent))
    assert _code(unknown.status) == "UNRECOGNIZED_CLIENT_TYPE"
    no_id = _telemetry(v2_stub, "", asked)
    assert _code(no_id.status) == "BAD_REQUEST"
    hostile = {
        "BAD_REQUEST": v2.Settings(
            client_type=v2.PRODUCER, user_agent=v2.UA(language=v2.PYTHON, hostname="h" * 256)
        ),
        "ILLEGAL_TOPIC": v2.Settings(
            client_type=v2.PRODUCER, publishing=v2.Publishing(topics=[v2.Resource(name="a b")])
        ),
        "ILLEGAL_CONSUMER_GROUP": v2.Settings(client_type=v2.SIMPLE_CONSUMER),
    }
    for want, settings in hostile.items():
        assert _code(_telemetry(v2_stub, "rmq5-hostile", settings).status) == want
    still_unknown = v2_stub.Heartbeat(
        v2_service.HeartbeatRequest(client_type=v2.PRODUCER),
        metadata=[("x-mq-client-id", "rmq5-hostile")],
        timeout=5,
    )
    assert _code(still_unknown.status) == "UNRECOGNIZED_CLIENT_TYPE"  # nothing was recorded
    bye = v2_stub.NotifyClientTermination(
        v2_service.NotifyClientTerminationRequest(), metadata=meta, timeout=5
    )
    assert _code(bye.status) == "OK"
    after = v2_stub.Heartbeat(
        v2_service.HeartbeatRequest(client_type=v2.PRODUCER), metadata=meta, timeout=5
    )
    assert _code(after.status) == "UNRECOGNIZED_CLIENT_TYPE"


def test_a_producers_settings_lists_it_in_the_producer_registry(group: LocalCluster) -> None:
    """A producer's Settings registers it under its topic with its language and version
    (mqadmin producerConnection reads it over the v1 port); its termination removes it."""
    node = group.nodes[0]
    meta = [("x-mq-client-id", "rmq5-registered")]
    settings = v2.Settings(
        client_type=v2.PRODUCER,
        publishing=v2.Publishing(topics=[v2.Resource(name=TOPIC)]),
        user_agent=v2.UA(language=v2.JAVA, version="5.0.7"),
    )
    ask = bpb.GetProducerConnectionsRequest(producer_group=TOPIC, topic=TOPIC)
    with (
        grpc.insecure_channel(node.grpc_addr) as v2ch,
        grpc.insecure_channel(node.client_addr) as v1ch,
    ):
        stub, v1 = v2_grpc.MessagingServiceStub(v2ch), bpb_grpc.BrokerStub(v1ch)
        assert _code(_telemetry(stub, "rmq5-registered", settings).status) == "OK"
        [p] = v1.GetProducerConnections(ask, timeout=CALL_TIMEOUT_S).producers
        c = p.connection
        assert (p.producer_group, c.client_id, c.language, c.version, c.protocol) == (
            TOPIC, "rmq5-registered", "JAVA", "5.0.7", "v2",
        )  # fmt: skip
        assert c.address.startswith("127.0.0.1:"), c.address
        heartbeat = v2_service.HeartbeatRequest(client_type=v2.PRODUCER)
        assert _code(stub.Heartbeat(heartbeat, metadata=meta, timeout=5).status) == "OK"
        bye = v2_service.NotifyClientTerminationRequest()
        assert _code(stub.NotifyClientTermination(bye, metadata=meta, timeout=5).status) == "OK"
        assert not v1.GetProducerConnections(ask, timeout=CALL_TIMEOUT_S).producers


def test_rpcs_not_served_yet_say_so_in_the_body(v2_stub: Any) -> None:
    pull = v2_stub.PullMessage(
        v2_service.PullMessageRequest(group=v2.Resource(name="g")), timeout=5
    )
    assert [_code(r.status) for r in pull] == ["NOT_IMPLEMENTED"]
    offset = v2_stub.GetOffset(v2_service.GetOffsetRequest(), timeout=5)
    assert _code(offset.status) == "NOT_IMPLEMENTED"


def test_the_stubs_are_generated_not_committed() -> None:
    tracked = subprocess.run(
        ["git", "ls-files", "build", "*service_pb2*"],
        cwd=ROOT,
        capture_output=True,
        text=True,
        check=False,
    )
    assert tracked.returncode == 0 and tracked.stdout == ""
    assert sys.modules[v2.__name__].__file__ is not None
    assert Path(str(sys.modules[v2.__name__].__file__)).is_relative_to(stubs.stubs_dir())


def _route(addr: str, topic: str) -> Any:
    with grpc.insecure_channel(addr) as ch:
        return v2_grpc.MessagingServiceStub(ch).QueryRoute(
            v2_service.QueryRouteRequest(topic=v2.Resource(name=topic)), timeout=CALL_TIMEOUT_S
        )


def _brokers(route: Any) -> dict[str, set[str]]:
    """Broker name -> the endpoints of its queues in a route answer."""
    out: dict[str, set[str]] = {}
    for q in route.message_queues:
        addrs = {f"{a.host}:{a.port}" for a in q.broker.endpoints.addresses}
        out.setdefault(q.broker.name, set()).update(addrs)
    return out


def test_routes_span_every_group_the_nameserver_knows(
    name_servers: Any, local_group: Any, tmp_path: Path
) -> None:
    """Two groups registered with one NameServer: a node of broker-a routes a topic of both
    groups to both, each with its own members' v2 endpoints, and a topic only broker-b holds to
    broker-b; the official Python client, given broker-a's node only, sends to broker-b."""
    ns = name_servers()
    group_a = local_group(1, namesrvAddr=ns.addr, **DISK_CONF)
    group_b = local_group(1, namesrvAddr=ns.addr, brokerName="broker-b", **DISK_CONF)
    create_topic_on([group_a, group_b], [ns.addr], "Both5", 2)
    create_topic_on([group_b], [ns.addr], "OnlyB5", 2)
    a_addr, b_addr = group_a.nodes[0].grpc_addr, group_b.nodes[0].grpc_addr

    def routed(topic: str, want: dict[str, set[str]]) -> bool:
        try:
            return _brokers(_route(a_addr, topic)) == want
        except grpc.RpcError:  # the v2 port starts just after the node
            return False

    both = {"broker-a": {a_addr}, "broker-b": {b_addr}}
    wait_for(lambda: routed("Both5", both), 10, "Both5 routed to both groups")
    wait_for(lambda: routed("OnlyB5", {"broker-b": {b_addr}}), 10, "OnlyB5 routed to broker-b")
    assert _code(_route(a_addr, "NoWhere5").status) == "TOPIC_NOT_FOUND"

    python = RMQ5 / "pyclient" / "bin" / "python"
    argv = [str(python), str(SCRIPTS / "py_producer.py"), a_addr, "OnlyB5", "5", "mg"]
    receipts = _run_client(argv, tmp_path)
    assert len(receipts) == 5
    stored = ["01" + m.msg_id for m in _stored(group_b, "OnlyB5", 2)]
    assert sorted(stored) == sorted(r["message_id"] for r in receipts)


def test_a_telemetry_stream_of_junk_is_refused_and_the_node_serves_on(
    group: LocalCluster, v2_stub: Any
) -> None:
    addr = _follower_v2_addr(group)
    with grpc.insecure_channel(addr) as ch:
        raw = ch.stream_stream(
            "/apache.rocketmq.v2.MessagingService/Telemetry",
            request_serializer=None,
            response_deserializer=v2_service.TelemetryCommand.FromString,
        )
        try:
            answers = list(raw(iter([b"\xff\xff\xff"]), timeout=5))
        except grpc.RpcError as exc:
            assert exc.code() is grpc.StatusCode.INVALID_ARGUMENT
            assert (exc.details() or "").startswith("BAD_REQUEST")
        else:
            assert [_code(a.status) for a in answers] == ["BAD_REQUEST"]
    # Commands that are not Settings are read and ignored; Settings is still answered.
    settings = v2.Settings(client_type=v2.PRODUCER, user_agent=v2.UA(language=v2.JAVA))
    commands = [
        v2_service.TelemetryCommand(thread_stack_trace=v2_service.ThreadStackTrace(nonce="x")),
        v2_service.TelemetryCommand(settings=settings),
    ]
    replies = v2_stub.Telemetry(iter(commands), metadata=[("x-mq-client-id", "j")], timeout=5)
    assert [_code(r.status) for r in replies] == ["OK"]


def test_a_busy_grpc_server_port_stops_the_broker_before_its_store(tmp_path: Path) -> None:
    import socket

    from prockit.processes import free_ports

    peer, client = free_ports(2)
    with socket.socket() as busy:
        busy.bind(("127.0.0.1", 0))
        busy.listen()
        port = busy.getsockname()[1]
        conf = tmp_path / "broker.conf"
        conf.write_text(
            f"dLegerPeers=n0-127.0.0.1:{peer}\ndLegerSelfId=n0\nlistenPort={client}\n"
            f"grpcServerPort={port}\nstorePathRootDir={tmp_path / 'store'}\n"
        )
        run = subprocess.run(
            [sys.executable, "-m", "broker", "-c", str(conf)],
            capture_output=True,
            text=True,
            timeout=60,
            check=False,
        )
    assert run.returncode == 1
    assert run.stderr.strip().splitlines() == [
        f"mqbroker: cannot start: port in use or not bindable: 127.0.0.1:{port} "
        "(Address already in use)"
    ]
    assert not (tmp_path / "store").exists()
