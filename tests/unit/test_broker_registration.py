"""Broker registration against an in-process NameServer (one event loop, real gRPC)."""

from __future__ import annotations

import asyncio
import socket
import time
from collections.abc import Callable
from pathlib import Path

import grpc
import pytest

from broker.config import parse_config
from broker.registration import BrokerRegistrar
from broker.state.machine import BrokerStateMachine
from broker.state.records import TopicConfig
from dledger.core import Role
from nameserver.config import NameServerConfig
from nameserver.server import NameServer
from prockit import fatal

# stop() of a registrar whose loop ended at once takes milliseconds; this is only the bound
# after which a loop that went on is reported.
STOP_BOUND_S = 5.0


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


def test_stop_ends_a_loop_whose_cancel_was_lost_in_its_call(tmp_path: Path) -> None:
    """grpc.aio may end a call cancelled under its task as an AioRpcError CANCELLED instead of
    a CancelledError: the loop took it for a NameServer failure and went on registering, and
    stop() waited for it forever (a node that did not stop on SIGTERM, found by a test of
    mqcluster remove-group). stop() must end the loop and unregister anyway."""
    calls: list[str] = []

    class SwallowingStub:
        async def RegisterBroker(self, request: object, **kw: object) -> None:
            calls.append("register")
            try:
                await asyncio.Event().wait()  # a NameServer that answers slowly
            except asyncio.CancelledError:
                if "swallowed" in calls:
                    raise  # once only, so that a failing run still ends
                calls.append("swallowed")
                raise grpc.aio.AioRpcError(
                    grpc.StatusCode.CANCELLED, grpc.aio.Metadata(), grpc.aio.Metadata()
                ) from None

        async def UnregisterBroker(self, request: object, **kw: object) -> None:
            calls.append("unregister")

    async def scenario() -> None:
        cfg = parse_config(conf(f"127.0.0.1:{free_port()}"))
        registrar = BrokerRegistrar(cfg, BrokerStateMachine(tmp_path))
        registrar.start()
        target = registrar._targets[0]
        target.stub = SwallowingStub()  # type: ignore[assignment]
        registrar.notify()
        await until(lambda: "register" in calls)
        stopping = asyncio.ensure_future(registrar.stop())
        done, _ = await asyncio.wait({stopping}, timeout=STOP_BOUND_S)
        assert done, f"stop() still waiting for its loop after {STOP_BOUND_S} s: {calls}"
        assert calls.count("register") == 1 and calls[-1] == "unregister", calls

    asyncio.run(scenario())
