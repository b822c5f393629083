"""Where the remoting ports come from (issue #37, docs/REMOTING.md) without processes: the
broker's and the NameServer's ``remotingListenPort`` keys, the broker's registration carrying
its remoting address to an in-process NameServer whose remoting port routes 4.x clients to it,
and mqcluster's ports, cluster.json and status line."""

from __future__ import annotations

import asyncio
import json
import socket
import time
from collections.abc import Callable
from pathlib import Path

import pytest

from broker.config import ConfigError as BrokerConfigError
from broker.config import load_config
from broker.config import parse_config as parse_broker_config
from broker.registration import BrokerRegistrar
from broker.state.machine import BrokerStateMachine
from broker.state.records import TopicConfig
from dledger.core import Role
from mqcluster.cluster import (
    NAMESRV_REMOTING_PORT,
    LocalCluster,
    remoting_line,
)
from nameserver.config import ConfigError, NameServerConfig
from nameserver.config import parse_config as parse_namesrv_config
from nameserver.metrics import nameserver_families
from nameserver.server import NameServer
from remoting.client import RemotingClient
from remoting.codes import RequestCode, ResponseCode
from remoting.protocol import RemotingCommand

BROKER = "brokerName=broker-x\ndLegerPeers=n0-127.0.0.1:40911\ndLegerSelfId=n0\nlistenPort=10921\n"


def _free_ports(n: int) -> list[int]:
    socks = [socket.socket() for _ in range(n)]
    try:
        for s in socks:
            s.bind(("127.0.0.1", 0))
        return [int(s.getsockname()[1]) for s in socks]
    finally:
        for s in socks:
            s.close()


def test_the_broker_key_gives_the_registered_address() -> None:
    assert parse_broker_config(BROKER).remoting_addr == ""  # off by default
    cfg = parse_broker_config(BROKER + "remotingListenPort=10922\nbrokerIP1=10.0.0.5\n")
    assert (cfg.remotingListenPort, cfg.remoting_addr) == (10922, "10.0.0.5:10922")


@pytest.mark.parametrize("port", ["10921", "40911", "8081"])
def test_a_broker_remoting_port_already_used_is_refused(port: str) -> None:
    with pytest.raises(BrokerConfigError, match=r"remotingListenPort.*already used"):
        parse_broker_config(BROKER + f"grpcServerPort=8081\nremotingListenPort={port}\n")


def test_the_namesrv_key_is_off_by_default_and_must_not_reuse_a_port() -> None:
    assert NameServerConfig().remotingListenPort == 0
    assert parse_namesrv_config("remotingListenPort=9877\n").remotingListenPort == 9877
    for text in ("remotingListenPort=9876\n", "metricsPort=5556\nremotingListenPort=5556\n"):
        with pytest.raises(ConfigError, match=r"remotingListenPort.*already used"):
            parse_namesrv_config(text)


async def _until(cond: Callable[[], bool], timeout_s: float = 5.0) -> None:
    deadline = time.monotonic() + timeout_s
    while not cond():
        assert time.monotonic() < deadline, "condition not met in time"
        await asyncio.sleep(0.01)


def test_a_registered_leader_is_routed_at_its_remoting_address(tmp_path: Path) -> None:
    """The whole path in one process: a broker's registration over gRPC, the NameServer's
    remoting port answering GET_ROUTEINFO_BY_TOPIC with the leader's remoting address."""

    async def scenario() -> None:
        grpc_port, remoting_port = _free_ports(2)
        cfg = NameServerConfig(listenPort=grpc_port, remotingListenPort=remoting_port)
        ns = NameServer(cfg, host="127.0.0.1")
        await ns.start()
        broker = parse_broker_config(
            BROKER + f"namesrvAddr=127.0.0.1:{grpc_port}\nremotingListenPort=10922\n"
        )
        sm = BrokerStateMachine(tmp_path)
        registrar = BrokerRegistrar(broker, sm)
        registrar.start()
        try:
            sm.topics["T"] = TopicConfig("T", 2, 3, 6)
            sm.on_role_change(Role.LEADER, 4, "n0")
            await _until(lambda: ns.table.leader("DefaultCluster", "broker-x") is not None)
            async with await RemotingClient.connect("127.0.0.1", remoting_port) as client:
                request = RemotingCommand(
                    code=RequestCode.GET_ROUTEINFO_BY_TOPIC, opaque=0, ext_fields={"topic": "T"}
                )
                answer = await client.request(request, 5.0)
            assert answer.code == ResponseCode.SUCCESS, answer.remark
            [broker_data] = json.loads(answer.body)["brokerDatas"]
            assert broker_data["brokerAddrs"] == {"0": "127.0.0.1:10922"}
        finally:
            await registrar.stop()
            await ns.stop()
            sm.close()

    asyncio.run(scenario())


def test_mqcluster_gives_every_process_a_remoting_port(tmp_path: Path) -> None:
    cluster = LocalCluster(tmp_path)
    cluster.configure(3, namesrv=True)
    assert [n.remoting_port for n in cluster.nodes] == [n.client_port + 1 for n in cluster.nodes]
    assert cluster.namesrv is not None
    assert cluster.namesrv.remoting_port == NAMESRV_REMOTING_PORT
    assert [load_config(n.conf).remotingListenPort for n in cluster.nodes] == [
        10912,
        10922,
        10932,
    ]
    assert "remotingListenPort=9877\n" in Path(cluster.namesrv.conf).read_text()
    assert {10912, 10922, 10932, 9877} <= cluster.configured_ports()
    assert remoting_line(cluster) == (
        "remoting (RocketMQ 4.x clients, docs/REMOTING.md): namesrvAddr 127.0.0.1:9877"
    )
    # cluster.json records them, and a file from before them reads as "not served".
    state = json.loads((tmp_path / "cluster.json").read_text())
    assert [n["remoting_port"] for n in state["nodes"]] == [10912, 10922, 10932]
    assert state["namesrv"]["remoting_port"] == 9877
    for n in state["nodes"]:
        del n["remoting_port"]
    del state["namesrv"]["remoting_port"]
    (tmp_path / "cluster.json").write_text(json.dumps(state))
    old = LocalCluster(tmp_path)
    assert [n.remoting_port for n in old.nodes] == [0, 0, 0]
    assert remoting_line(old) == (
        "remoting (RocketMQ 4.x clients): not served (remotingListenPort=0)"
    )


def test_mqcluster_without_a_namesrv_says_so(tmp_path: Path) -> None:
    cluster = LocalCluster(tmp_path)
    cluster.configure(1, auto_ports=True)
    assert cluster.nodes[0].remoting_port not in {0, cluster.nodes[0].client_port}
    assert "needs a NameServer" in remoting_line(cluster)


def test_the_namesrv_metrics_show_the_remoting_port() -> None:
    """Its connections and refusals, by a fixed vocabulary of reasons; nothing when the port
    is not served."""

    async def scenario() -> None:
        grpc_port, remoting_port = _free_ports(2)
        ns = NameServer(
            NameServerConfig(listenPort=grpc_port, remotingListenPort=remoting_port),
            host="127.0.0.1",
        )
        await ns.start()
        try:
            assert ns.remoting is not None
            reader, writer = await asyncio.open_connection("127.0.0.1", remoting_port)
            writer.write(b"\x7f\xff\xff\xff")  # a 2 GiB frame: malformed, the connection closed
            assert await asyncio.wait_for(reader.read(), 5.0) == b""
            writer.close()
            families = {f.name: f for f in nameserver_families(ns.table, ns.stats, ns.remoting)}
            refusals = {
                s.labels["reason"]: s.value
                for s in families["raftmq_nameserver_remoting_refusals"].samples
            }
            assert refusals["malformed_frame"] == 1
            assert set(refusals) == {
                "malformed_frame",
                "busy",
                "connection_limit",
                "idle",
                "slow_reader",
                "handler_error",
            }
            assert "raftmq_nameserver_remoting_connections" in families
            plain = {f.name for f in nameserver_families(ns.table, ns.stats)}
            assert not any("remoting" in name for name in plain)
        finally:
            await ns.stop()

    asyncio.run(scenario())
