"""Broker registration against an in-process NameServer (one event loop, real gRPC)."""

from __future__ import annotations

import asyncio
import socket
import time
from collections.abc import Callable
from pathlib import Path

import pytest

from broker.config import parse_config
from broker.registration import BrokerRegistrar
from broker.state.machine import BrokerStateMachine
from broker.state.records import TopicConfig
from dledger.core import Role
from nameserver.config import NameServerConfig
from nameserver.server import NameServer
from prockit import fatal


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def conf(namesrv: str, period_ms: int = 30_000) -> str:
    return (
        "brokerName=broker-x\ndLegerPeers=n0-127.0.0.1:40911;n1-127.0.0.1:40912\n"
        f"dLegerSelfId=n1\nlistenPort=10921\nnamesrvAddr={namesrv}\n"
        f"registerBrokerPeriod={period_ms}\n"
    )


async def until(cond: Callable[[], bool], timeout_s: float = 5.0) -> None:
    deadline = time.monotonic() + timeout_s
    while not cond():
        assert time.monotonic() < deadline, "condition not met in time"
        await asyncio.sleep(0.01)


def test_registers_at_start_on_change_and_unregisters_on_stop(tmp_path: Path) -> None:
    async def scenario() -> None:
        port = free_port()
        ns = NameServer(NameServerConfig(listenPort=port), host="127.0.0.1")
        await ns.start()
        cfg = parse_config(conf(f"127.0.0.1:{port}"))
        sm = BrokerStateMachine(tmp_path)
        registrar = BrokerRegistrar(cfg, sm)
        registrar.start()
        try:
            await until(lambda: len(ns.table) == 1)
            [group] = ns.table.cluster_info()
            [(reg, _)] = group.members
            assert (reg.cluster, reg.broker_name, reg.node_id) == (
                "DefaultCluster",
                "broker-x",
                "n1",
            )
            assert (reg.role, reg.term, reg.client_addr) == ("FOLLOWER", 0, "127.0.0.1:10921")
            assert reg.heartbeat_period_ms == 30_000
            # A role change is registered at once (the period is 30 s).
            sm.topics["T"] = TopicConfig("T", 2, 3, 6)
            sm.on_role_change(Role.LEADER, 7, "n1")
            await until(lambda: ns.table.leader("DefaultCluster", "broker-x") is not None)
            [route] = ns.table.route("T")
            assert route.leader is not None and route.leader.term == 7
            assert (route.topic.read_queue_nums, route.topic.write_queue_nums) == (2, 3)
        finally:
            await registrar.stop()
        assert len(ns.table) == 0  # unregistered on stop
        await registrar.stop()  # idempotent
        await ns.stop()
        sm.close()

    asyncio.run(scenario())


def test_a_dead_namesrv_never_blocks(tmp_path: Path) -> None:
    async def scenario() -> None:
        dead, live = free_port(), free_port()
        ns = NameServer(NameServerConfig(listenPort=live), host="127.0.0.1")
        await ns.start()
        cfg = parse_config(conf(f"127.0.0.1:{dead};127.0.0.1:{live}", period_ms=100))
        sm = BrokerStateMachine(tmp_path)
        registrar = BrokerRegistrar(cfg, sm)
        registrar.start()
        await until(lambda: len(ns.table) == 1)
        for term in range(1, 6):
            sm.on_role_change(Role.FOLLOWER, term, "n0")
        await until(lambda: ns.table.cluster_info()[0].members[0][0].term == 5)
        started = time.monotonic()
        await registrar.stop()
        assert time.monotonic() - started < 2.0
        assert len(ns.table) == 0
        await ns.stop()
        sm.close()

    asyncio.run(scenario())


def test_an_unexpected_error_in_a_registration_loop_is_fatal_a_down_namesrv_is_not(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Fail fast: a registration loop that died on a bug used to leave a node that silently
    stopped registering; a NameServer that is down stays an expected, logged failure."""
    exits: list[int] = []
    monkeypatch.setattr(fatal, "_exit", exits.append)

    async def scenario() -> None:
        cfg = parse_config(conf(f"127.0.0.1:{free_port()}"))  # nothing listens there
        registrar = BrokerRegistrar(cfg, BrokerStateMachine(tmp_path), register_deadline_ms=200)
        registrar.start()
        try:
            await until(lambda: registrar._targets[0].failing)
            assert exits == []

            async def broken(t: object) -> None:
                raise RuntimeError("registration bug")

            monkeypatch.setattr(registrar, "_register", broken)
            registrar.notify()
            await until(lambda: exits == [fatal.EXIT_FATAL])
        finally:
            await registrar.stop()

    asyncio.run(scenario())
