"""The NameServer's RocketMQ remoting port (nameserver/remoting.py, docs/REMOTING.md) with a real
``mqnamesrv`` process on 127.0.0.1: routes as a 4.x client reads them (the leader's remoting
address as brokerId 0, following a new leader), refusals with RocketMQ's codes, malformed
frames closing one connection only, a fuzz of the port, and TLS."""

from __future__ import annotations

import asyncio
import json
import os
import socket
import ssl
import struct
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import grpc
import pytest
from hypothesis import HealthCheck, Phase, given, settings
from hypothesis import strategies as st
from raftmq.nameserver.v1 import nameserver_pb2 as pb
from raftmq.nameserver.v1 import nameserver_pb2_grpc as pb_grpc

from mqcluster import localsecurity
from prockit.processes import free_ports
from remoting.client import RemotingClient
from remoting.codes import RequestCode, ResponseCode
from remoting.protocol import (
    SERIALIZE_JSON,
    SERIALIZE_ROCKETMQ,
    FrameDecoder,
    RemotingCommand,
    encode_frame,
)

pytestmark = pytest.mark.integration

# Every wait here is bounded by this.
DEADLINE_S = 10.0
# The NameServer's RSS may grow by this much over the fuzz (buffers, the allocator's slack):
# a frame kept per connection, or a leak per request, would take far more.
RSS_GROWTH_BOUND_MIB = 40
# conftest's ``name_servers`` fixture: (**namesrv_conf) -> a started NameServerProc.
NameServerFactory = Callable[..., Any]


class Remoting:
    """A NameServer process with its remoting port, and calls to it from a test."""

    def __init__(self, ns: Any, port: int) -> None:
        self.ns = ns
        self.port = port
        self.channel = grpc.insecure_channel(ns.addr)
        self.stub = pb_grpc.NameServerStub(self.channel)

    def register(self, node: str, role: int, term: int, remoting: str, *topics: str) -> None:
        self.stub.RegisterBroker(
            pb.RegisterBrokerRequest(
                cluster="DefaultCluster",
                broker_name="broker-a" if node.startswith("a") else "broker-b",
                node_id=node,
                role=role,
                client_addr=f"127.0.0.1:{10000 + term}",
                term=term,
                topics=[
                    pb.TopicConfig(topic_name=t, read_queue_nums=4, write_queue_nums=2, perm=6)
                    for t in topics
                ],
                heartbeat_period_ms=30_000,
                remoting_addr=remoting,
            ),
            timeout=DEADLINE_S,
        )

    def call(
        self, code: int, serialize_type: int = SERIALIZE_JSON, **fields: str
    ) -> RemotingCommand:
        async def go() -> RemotingCommand:
            async with await RemotingClient.connect("127.0.0.1", self.port) as client:
                cmd = RemotingCommand(
                    code=code,
                    opaque=0,
                    ext_fields=fields,
                    language="JAVA",
                    serialize_type=serialize_type,
                )
                return await client.request(cmd, DEADLINE_S)

        return asyncio.run(go())


@pytest.fixture
def remoting(name_servers: NameServerFactory) -> Iterator[Remoting]:
    (port,) = free_ports(1)
    r = Remoting(name_servers(remotingListenPort=port), port)
    yield r
    r.channel.close()


def _route(r: Remoting, topic: str, serialize_type: int = SERIALIZE_JSON) -> dict[str, Any]:
    answer = r.call(RequestCode.GET_ROUTEINFO_BY_TOPIC, serialize_type, topic=topic)
    assert answer.code == ResponseCode.SUCCESS, answer
    assert answer.serialize_type == serialize_type
    data: dict[str, Any] = json.loads(answer.body)
    return data


def test_routes_name_the_leader_remoting_address_and_follow_a_new_leader(
    remoting: Remoting,
) -> None:
    r = remoting
    r.register("a0", pb.LEADER, 5, "127.0.0.1:30001", "Orders")
    r.register("a1", pb.FOLLOWER, 5, "127.0.0.1:30002", "Orders")
    for serialize_type in (SERIALIZE_JSON, SERIALIZE_ROCKETMQ):
        data = _route(r, "Orders", serialize_type)
        assert data["queueDatas"] == [
            {
                "brokerName": "broker-a",
                "readQueueNums": 4,
                "writeQueueNums": 2,
                "perm": 6,
                "topicSysFlag": 0,
            }
        ]
        assert data["brokerDatas"] == [
            {
                "cluster": "DefaultCluster",
                "brokerName": "broker-a",
                "brokerAddrs": {"0": "127.0.0.1:30001"},
            }
        ]
        assert "orderTopicConf" not in data
    # The follower wins an election: the route names it at once.
    r.register("a1", pb.LEADER, 6, "127.0.0.1:30002", "Orders")
    assert _route(r, "Orders")["brokerDatas"][0]["brokerAddrs"] == {"0": "127.0.0.1:30002"}
    # A group without remoting is not listed; one whose leader has none is listed addressless.
    r.register("b0", pb.LEADER, 1, "", "Orders", "OnlyB")
    assert [b["brokerName"] for b in _route(r, "Orders")["brokerDatas"]] == ["broker-a"]
    answer = r.call(RequestCode.GET_ROUTEINFO_BY_TOPIC, topic="OnlyB")
    assert answer.code == ResponseCode.TOPIC_NOT_EXIST
    assert "over remoting" in (answer.remark or "")
    r.register("a2", pb.LEADER, 7, "", "Orders")
    assert _route(r, "Orders")["brokerDatas"][0]["brokerAddrs"] == {}


def test_cluster_info_topic_list_and_refusals(remoting: Remoting) -> None:
    r = remoting
    r.register("a0", pb.LEADER, 3, "127.0.0.1:30001", "T1", "T2")
    r.register("b0", pb.LEADER, 3, "", "T3")
    info = json.loads(r.call(RequestCode.GET_BROKER_CLUSTER_INFO).body)
    assert info == {
        "brokerAddrTable": {
            "broker-a": {
                "cluster": "DefaultCluster",
                "brokerName": "broker-a",
                "brokerAddrs": {"0": "127.0.0.1:30001"},
            }
        },
        "clusterAddrTable": {"DefaultCluster": ["broker-a"]},
    }
    topics = json.loads(r.call(RequestCode.GET_ALL_TOPIC_LIST_FROM_NAMESERVER).body)
    assert topics == {"topicList": ["T1", "T2", "T3"]}

    unknown = r.call(RequestCode.GET_ROUTEINFO_BY_TOPIC, topic="Nope")
    assert unknown.code == ResponseCode.TOPIC_NOT_EXIST and "'Nope'" in (unknown.remark or "")
    invalid = r.call(RequestCode.GET_ROUTEINFO_BY_TOPIC, topic="bad topic!")
    assert invalid.code == ResponseCode.TOPIC_NOT_EXIST and "must be" in (invalid.remark or "")
    missing = r.call(RequestCode.GET_ROUTEINFO_BY_TOPIC)
    assert missing.code == ResponseCode.SYSTEM_ERROR and "'topic'" in (missing.remark or "")
    kv = r.call(RequestCode.GET_KV_CONFIG, namespace="ORDER_TOPIC_CONFIG", key="T1")
    assert kv.code == ResponseCode.QUERY_NOT_FOUND
    register = r.call(RequestCode.REGISTER_BROKER)
    assert register.code == ResponseCode.REQUEST_CODE_NOT_SUPPORTED
    assert "gRPC" in (register.remark or "")
    other = r.call(RequestCode.SEND_MESSAGE)
    assert other.code == ResponseCode.REQUEST_CODE_NOT_SUPPORTED
    assert other.remark == "request code 10 (SEND_MESSAGE) is not supported"


def _closed_without_answer(port: int, data: bytes) -> bool:
    with socket.create_connection(("127.0.0.1", port), timeout=DEADLINE_S) as s:
        s.sendall(data)
        try:
            return s.recv(65536) == b""
        except ConnectionResetError:
            return True


def test_a_malformed_frame_closes_its_connection_only(remoting: Remoting) -> None:
    r = remoting
    r.register("a0", pb.LEADER, 3, "127.0.0.1:30001", "T1")

    async def main() -> None:
        async with await RemotingClient.connect("127.0.0.1", r.port) as good:
            request = RemotingCommand(
                code=RequestCode.GET_ROUTEINFO_BY_TOPIC, opaque=0, ext_fields={"topic": "T1"}
            )
            assert (await good.request(request, DEADLINE_S)).code == ResponseCode.SUCCESS
            for junk in (
                struct.pack(">i", 1 << 30),
                struct.pack(">iI", 12, 8) + b'{"code":1',
                struct.pack(">iI", 8, (1 << 24) | 4) + b"\x00\x01\x00\x00",
                b"\x16\x03\x01\x00\xa5\x01\x00\x00\xa1\x03\x03",  # a TLS ClientHello's start
            ):
                closed = await asyncio.to_thread(_closed_without_answer, r.port, junk)
                assert closed, junk
            assert (await good.request(request, DEADLINE_S)).code == ResponseCode.SUCCESS

    asyncio.run(main())
    assert r.ns.alive()
    assert r.stub.GetAllTopicList(pb.GetAllTopicListRequest(), timeout=DEADLINE_S).topics == ["T1"]


def _rss_mib(pid: int) -> float:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    raise AssertionError(f"no VmRSS for {pid}")


_fields = st.dictionaries(
    st.sampled_from(["topic", "namespace", "key", "", "x" * 200]) | st.text(max_size=8),
    st.sampled_from(["T1", "", "bad topic", "x" * 70_000, "\u0000", "%RETRY%g"])
    | st.text(max_size=20),
    max_size=5,
)
_codes = st.sampled_from([int(c) for c in RequestCode] + [0, -1, 32767, 200050, 1 << 30])


@st.composite
def _frames(draw: st.DrawFn) -> bytes:
    """A frame of either serialize type with hostile codes and fields, at times cut or with a
    byte changed; or raw bytes."""
    if draw(st.integers(0, 9)) == 0:
        return draw(st.binary(min_size=1, max_size=64))
    serialize_type = draw(st.sampled_from([SERIALIZE_JSON, SERIALIZE_ROCKETMQ]))
    code = draw(_codes)
    if serialize_type == SERIALIZE_ROCKETMQ:
        code = max(-32768, min(32767, code))
    try:
        frame = bytearray(
            encode_frame(
                RemotingCommand(
                    code=code,
                    opaque=draw(st.integers(-(1 << 31), (1 << 31) - 1)),
                    flag=draw(st.sampled_from([0, 1, 2, 3, -1])),
                    ext_fields=draw(_fields),
                    body=draw(st.binary(max_size=32)),
                    language="JAVA",
                    serialize_type=serialize_type,
                )
            )
        )
    except ValueError:
        return b"\x00\x00\x00\x00"
    if draw(st.booleans()):
        at = draw(st.integers(0, len(frame) - 1))
        frame[at] = draw(st.integers(0, 255))
    return bytes(frame)


def _send_frames(port: int, frames: list[bytes]) -> None:
    """Send ``frames`` on one connection, read what comes back until the server closes or
    stops answering (a oneway frame, a response frame: no answer)."""
    with socket.create_connection(("127.0.0.1", port), timeout=DEADLINE_S) as s:
        try:
            s.sendall(b"".join(frames))
            s.shutdown(socket.SHUT_WR)
            s.settimeout(DEADLINE_S)
            decoder = FrameDecoder()
            while chunk := s.recv(65536):
                for answer in decoder.feed(chunk):
                    assert answer.is_response
                    assert answer.code in {c.value for c in ResponseCode}, answer.code
        except (ConnectionResetError, BrokenPipeError):
            pass


def test_fuzz_the_remoting_port(remoting: Remoting) -> None:
    r = remoting
    r.register("a0", pb.LEADER, 3, "127.0.0.1:30001", "T1")
    pid = r.ns.proc.pid
    rss_before = _rss_mib(pid)
    examples = 3000 if os.environ.get("RAFTMQ_SOAK") else 400

    @settings(
        max_examples=examples,
        deadline=None,
        derandomize=True,
        database=None,
        phases=[Phase.generate],
        suppress_health_check=list(HealthCheck),
    )
    @given(st.lists(_frames(), min_size=1, max_size=4))
    def fuzz(frames: list[bytes]) -> None:
        _send_frames(r.port, frames)

    fuzz()
    assert r.ns.alive()
    assert _rss_mib(pid) - rss_before < RSS_GROWTH_BOUND_MIB
    data = _route(r, "T1")
    assert data["brokerDatas"][0]["brokerAddrs"] == {"0": "127.0.0.1:30001"}


def test_the_remoting_port_speaks_tls_only_with_tls_enable(
    name_servers: NameServerFactory, tmp_path: Path
) -> None:
    layout, _ = localsecurity.create_secure_files(tmp_path / "sec", "broker-a", {})
    (port,) = free_ports(1)
    ns = name_servers(**localsecurity.namesrv_keys(layout), remotingListenPort=port)
    context = ssl.create_default_context(cafile=str(layout.ca_cert))

    async def main() -> RemotingCommand:
        client = await RemotingClient.connect("127.0.0.1", port, ssl_context=context)
        async with client:
            request = RemotingCommand(
                code=RequestCode.GET_ROUTEINFO_BY_TOPIC, opaque=0, ext_fields={"topic": "T"}
            )
            return await client.request(request, DEADLINE_S)

    answer = asyncio.run(main())
    assert answer.code == ResponseCode.TOPIC_NOT_EXIST
    # A plaintext frame is not a TLS handshake: closed, never answered.
    frame = encode_frame(
        RemotingCommand(
            code=RequestCode.GET_ROUTEINFO_BY_TOPIC, opaque=1, ext_fields={"topic": "T"}
        )
    )
    assert _closed_without_answer(port, frame)
    assert ns.alive()
