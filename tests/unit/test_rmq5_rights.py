"""Users stay inside their rights on the RocketMQ 5 port (issue #32), spoken over the v2
protocol with the generated stubs against one node's real ports in this process: the v2
servicer and the v1 Broker servicer on one grpc.aio server on 127.0.0.1, behind the node's
real call guard (broker.frontends.authguard) over a real state machine and an in-memory log
(tests/broker_world.py). Each test is one row of the issue's table."""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator
from dataclasses import dataclass, replace
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import grpc
import pytest
from broker_world import world
from raftmq.broker.v1 import broker_pb2 as pb
from raftmq.broker.v1 import broker_pb2_grpc as pb_grpc

from broker.app import assemble
from broker.components.applied import NodeContext
from broker.components.authadmin import AuthAdmin
from broker.components.settings import ServiceConfig
from broker.frontends.authguard import AuthGuard, AuthSettings
from broker.frontends.internal.forwarder import Forwarder
from broker.frontends.v1.service import BrokerServicer
from broker.frontends.v2 import stubs
from broker.frontends.v2.interceptor import V2GuardInterceptor
from broker.frontends.v2.service import MessagingServicer, V2Config
from broker.state import subgroups
from broker.state.auth.secrets import SecretBox
from broker.state.message import UniqIdGenerator
from dledger.core import Role
from mqsecurity.credentials import Credentials
from mqsecurity.signing import signed_metadata
from rpckit.status import read_error

v2, v2_service, v2_grpc = stubs.load()

BOX = SecretBox(bytes(range(32)))
# Quotas small enough to fill in a test: 3 subscription groups, 2 waiting receives per user.
GROUPS_PER_USER = 3
WAITERS_PER_USER = 2
CFG = ServiceConfig(
    "127.0.0.1",
    10911,
    txn_timeout_ms=1000,
    subgroups_per_user=GROUPS_PER_USER,
    pop_waiters_per_user=WAITERS_PER_USER,
)
IDS = UniqIdGenerator(ip="10.0.0.5", pid=11, instance_hash=5)
ADMIN = Credentials("admin", "admin-secret-1")
PUBLISHER = Credentials("publisher", "publisher-secret-1")  # Pub on TX and T
NOBODY = Credentials("nobody", "nobody-secret-1")  # no rules at all
READER = Credentials("reader", "reader-secret-1")  # Sub on Topic:* and Group:*, denied SECRET
OTHER = Credentials("other", "other-secret-1")  # Sub on Topic:* and Group:*
CALL_TIMEOUT_S = 5.0
TX, T, SECRET, GROUP = "TX", "T", "SECRET", "G"


@dataclass
class Node:
    """The node under test: its servicers, and where its ports listen. ``follower_addr``: a
    second v2 port whose front end believes another member leads (the node's own port), so
    its leader-only work is forwarded there with the caller's signature."""

    v2: MessagingServicer
    broker: BrokerServicer
    admin: AuthAdmin
    addr: str
    follower_addr: str
    servers: list[grpc.aio.Server]
    node: Any

    async def stop(self) -> None:
        for server in self.servers:
            await server.stop(None)


async def start(tmp_path: Path) -> Node:
    node, sm, _, _ = world(tmp_path, CFG)
    ctx = NodeContext(node, sm, CFG)  # type: ignore[arg-type]
    admin = AuthAdmin(ctx, BOX)
    await admin.create_user("admin", ADMIN.secret_key, "Super", "")
    for creds in (PUBLISHER, NOBODY, READER, OTHER):
        await admin.create_user(creds.access_key, creds.secret_key, "", "")
    await admin.put_acl(
        "User:publisher", [f"Topic:{TX}", f"Topic:{T}"], ["Pub"], "Allow", [], update=False
    )
    await admin.put_acl("User:reader", ["Topic:*", "Group:*"], ["Sub"], "Allow", [], update=False)
    await admin.put_acl("User:other", ["Topic:*", "Group:*"], ["Sub"], "Allow", [], update=False)
    await admin.put_acl("User:reader", [f"Topic:{SECRET}"], ["Sub"], "Deny", [], update=False)
    guard = AuthGuard(sm, AuthSettings(True, True, cluster_name="c1"), BOX)
    parts = assemble(node, sm, CFG, secret_box=BOX, guard=guard)
    broker = parts.servicer
    for name in (TX, T, SECRET):
        await broker.topics.upsert(name, 1, 1, 6)
    leader = Forwarder(node, parts.leader_ops)
    server = grpc.aio.server(interceptors=[V2GuardInterceptor(guard)])
    port = server.add_insecure_port("127.0.0.1:0")
    addr = f"127.0.0.1:{port}"
    cfg = V2Config("g0", "127.0.0.1", port, 1 << 20)
    servicer = MessagingServicer(node, parts.topics, parts.applied, parts.subgroups, leader, cfg)
    servicer.register(server)
    parts.consumers.v2_sources.append(servicer.clients)  # as broker.frontends.v2.server
    broker.register(server)
    parts.leader_service.register(server)
    await server.start()
    # The follower's front end: the same components, another member (this port) leading.
    away = SimpleNamespace(
        role=Role.FOLLOWER, leader_id="n0", leader_client_addr=lambda: ("n0", addr)
    )
    forwarding = Forwarder(away, parts.leader_ops)  # type: ignore[arg-type]
    second = grpc.aio.server(interceptors=[V2GuardInterceptor(guard)])
    follower_port = second.add_insecure_port("127.0.0.1:0")
    MessagingServicer(away, parts.topics, parts.applied, parts.subgroups, forwarding, cfg).register(  # type: ignore[arg-type]
        second
    )
    await second.start()
    follower_addr = f"127.0.0.1:{follower_port}"
    return Node(servicer, broker, admin, addr, follower_addr, [server, second], node)


def md(creds: Credentials, client_id: str = "") -> tuple[tuple[str, str], ...]:
    extra = (("x-mq-client-id", client_id),) if client_id else ()
    return tuple(signed_metadata(creds)) + extra


class Stream:
    """One Telemetry stream of a client: send a command, read the next one."""

    def __init__(self, channel: grpc.aio.Channel, creds: Credentials, client_id: str) -> None:
        self._out: asyncio.Queue[Any] = asyncio.Queue()
        stub = v2_grpc.MessagingServiceStub(channel)
        self.call = stub.Telemetry(self._requests(), metadata=md(creds, client_id))

    async def _requests(self) -> AsyncIterator[Any]:
        while True:
            item = await self._out.get()
            if item is None:
                return
            yield item

    async def ask(self, command: Any) -> Any:
        await self._out.put(command)
        return await self.next()

    async def next(self) -> Any:
        return await asyncio.wait_for(self.call.read(), CALL_TIMEOUT_S)

    async def close(self) -> None:
        await self._out.put(None)
        self.call.cancel()


def producer(*topics: str) -> Any:
    s = v2.Settings(client_type=v2.PRODUCER)
    for t in topics:
        s.publishing.topics.add(name=t)
    return v2_service.TelemetryCommand(settings=s)


def consumer(group: str, *topics: str) -> Any:
    s = v2.Settings(client_type=v2.SIMPLE_CONSUMER)
    s.subscription.group.name = group
    for t in topics:
        s.subscription.subscriptions.add(topic=v2.Resource(name=t))
    return v2_service.TelemetryCommand(settings=s)


def code(response: Any) -> str:
    return str(v2.Code.Name(response.status.code))


def half(n: int) -> pb.Message:
    return pb.Message(
        queue_id=0,
        body=f"secret-body-{n}".encode(),
        msg_id=IDS.next_id(),
        properties={"TRAN_MSG": "true"},
    )


def test_row1_producer_settings_need_pub_and_checks_go_to_allowed_streams(tmp_path: Path) -> None:
    async def body() -> None:
        n = await start(tmp_path)
        try:
            async with grpc.aio.insecure_channel(n.addr) as ch:
                thief = Stream(ch, NOBODY, "thief-1")
                refused = await thief.ask(producer(TX))
                assert code(refused) == "FORBIDDEN", refused
                assert "Pub" in refused.status.message
                # Nothing registered: no client record, no producer stream of TX.
                assert n.v2.clients.get("thief-1", "nobody") is None
                real = Stream(ch, PUBLISHER, "real-1")
                assert code(await real.ask(producer(TX))) == "OK"
                [r] = await n.broker.sender.send(TX, [half(1)])
                now_ms = int(time.time() * 1000)
                for k in range(1, 5):  # every check reaches the real producer, none the thief
                    await n.broker.txns.check_pass(now_ms + k * 100_000)
                    cmd = (await real.next()).recover_orphaned_transaction_command
                    assert cmd.message.body == b"secret-body-1"
                streams = n.v2.producers._by_topic.get(TX, set())
                assert {s.client_id for s in streams} == {"real-1"}
                assert n.v2.producers.checks_unsent == 0
                del r
                await thief.close()
                await real.close()
        finally:
            await n.stop()

    asyncio.run(body())


def test_row1_a_check_skips_a_stream_whose_user_lost_pub(tmp_path: Path) -> None:
    async def body() -> None:
        n = await start(tmp_path)
        try:
            async with grpc.aio.insecure_channel(n.addr) as ch:
                real = Stream(ch, PUBLISHER, "real-2")
                assert code(await real.ask(producer(TX))) == "OK"
                await n.admin.delete_acl("User:publisher", [f"Topic:{TX}"])
                await n.broker.sender.send(TX, [half(2)])
                await n.broker.txns.check_pass(int(time.time() * 1000) + 100_000)
                assert n.v2.producers.checks_sent == 0
                assert n.v2.producers.checks_unsent == 1
                await real.close()
        finally:
            await n.stop()

    asyncio.run(body())


def _pop_secret(n: Node, ch: grpc.aio.Channel) -> Any:
    """A SECRET message the admin received (in flight for group G): its v1 popped form."""

    async def run() -> Any:
        await n.broker.sender.send(
            SECRET, [pb.Message(queue_id=0, body=b"top-secret", msg_id=IDS.next_id())]
        )
        stub = pb_grpc.BrokerStub(ch)
        popped = await stub.PopMessage(
            pb.PopMessageRequest(
                group=GROUP, topic=SECRET, queue_id=-1, max_msgs=1, invisible_ms=60_000
            ),
            metadata=md(ADMIN),
        )
        [m] = popped.messages
        return m

    return run()


async def _v1_error(call: Any) -> tuple[str, str]:
    try:
        await call
    except grpc.aio.AioRpcError as exc:
        info = read_error(exc)
        assert info is not None
        return info.code, exc.details() or ""
    raise AssertionError("the call was answered")


def test_row6_pop_calls_are_bound_to_the_handle_topic_and_group(tmp_path: Path) -> None:
    """A user allowed Topic:* Sub but denied SECRET cannot read or ack SECRET's in-flight
    message by naming no topic, or another topic, with its receipt handle; and a handle of
    another topic or group is answered as a garbage one (no oracle)."""

    async def body() -> None:
        n = await start(tmp_path)
        try:
            async with grpc.aio.insecure_channel(n.addr) as ch:
                m = await _pop_secret(n, ch)
                stub = pb_grpc.BrokerStub(ch)
                handle = m.receipt_handle
                for topic in ("", T):  # no topic, or one the reader may Sub on
                    change = pb.ChangeInvisibleTimeRequest(
                        group=GROUP, topic=topic, receipt_handle=handle, invisible_ms=60_000
                    )
                    got = await _v1_error(stub.ChangeInvisibleTime(change, metadata=md(READER)))
                    assert got[0] in ("INVALID_TOPIC", "INVALID_RECEIPT_HANDLE"), got
                ack = pb.AckPopRequest(group=GROUP, topic="", receipt_handles=[handle])
                code_, _ = await _v1_error(stub.AckPop(ack, metadata=md(READER)))
                assert code_ == "INVALID_TOPIC"
                # Another topic's (or group's) handle: the answer of a garbage one, word for word.
                garbage = "A" * len(handle)
                for group in (GROUP, "G2"):
                    foreign = await _v1_error(
                        stub.ChangeInvisibleTime(
                            pb.ChangeInvisibleTimeRequest(
                                group=group, topic=T, receipt_handle=handle, invisible_ms=60_000
                            ),
                            metadata=md(READER),
                        )
                    )
                    junk = await _v1_error(
                        stub.ChangeInvisibleTime(
                            pb.ChangeInvisibleTimeRequest(
                                group=group, topic=T, receipt_handle=garbage, invisible_ms=60_000
                            ),
                            metadata=md(READER),
                        )
                    )
                    assert foreign == junk
                    acks = await stub.AckPop(
                        pb.AckPopRequest(group=group, topic=T, receipt_handles=[handle, garbage]),
                        metadata=md(READER),
                    )
                    assert acks.codes[0] == acks.codes[1] == "INVALID_RECEIPT_HANDLE"
                # The v2 forms, through the leader's port and a follower's (forwarded).
                for addr in (n.addr, n.follower_addr):
                    async with grpc.aio.insecure_channel(addr) as v2ch:
                        v2stub = v2_grpc.MessagingServiceStub(v2ch)
                        entries = [
                            v2_service.AckMessageEntry(receipt_handle=h) for h in (handle, garbage)
                        ]
                        resp = await v2stub.AckMessage(
                            v2_service.AckMessageRequest(
                                group=v2.Resource(name=GROUP),
                                topic=v2.Resource(name=T),
                                entries=entries,
                            ),
                            metadata=md(READER),
                        )
                        a, b = resp.entries
                        assert (a.status.code, a.status.message) == (
                            b.status.code,
                            b.status.message,
                        )
                        assert code(a) == "INVALID_RECEIPT_HANDLE"
                # The message is still the admin's, in flight, not acked.
                assert n.broker.pops.ctx.sm.pop.inflight_total == 1
                acked = await stub.AckPop(
                    pb.AckPopRequest(group=GROUP, topic=SECRET, receipt_handles=[handle]),
                    metadata=md(ADMIN),
                )
                assert list(acked.codes) == [""]
        finally:
            await n.stop()

    asyncio.run(body())


def test_row2_consumer_settings_need_sub_and_create_groups_only_with_the_right(
    tmp_path: Path,
) -> None:
    async def body() -> None:
        n = await start(tmp_path)
        try:
            for addr in (n.addr, n.follower_addr):
                async with grpc.aio.insecure_channel(addr) as ch:
                    thief = Stream(ch, NOBODY, f"thief-{addr}")
                    refused = await thief.ask(consumer("NEWG", T))
                    assert code(refused) == "FORBIDDEN", refused
                    assert not n.v2.subgroups.known("NEWG")
                    # A Pub-only user may not consume either (Sub on the topic and group).
                    pub = Stream(ch, PUBLISHER, f"pub-{addr}")
                    assert code(await pub.ask(consumer("NEWG", T))) == "FORBIDDEN"
                    assert not n.v2.subgroups.known("NEWG")
                    assert n.v2.clients.get(f"thief-{addr}", "nobody") is None
                    await thief.close()
                    await pub.close()
            # A user with Sub on the group and topic: created, through the follower too.
            async with grpc.aio.insecure_channel(n.follower_addr) as ch:
                reader = Stream(ch, READER, "reader-1")
                assert code(await reader.ask(consumer("READERG", T))) == "OK"
                assert n.v2.subgroups.known("READERG")
                denied = await reader.ask(consumer("READERG2", SECRET))  # the Deny on SECRET
                assert code(denied) == "FORBIDDEN"
                assert not n.v2.subgroups.known("READERG2")
                await reader.close()
        finally:
            await n.stop()

    asyncio.run(body())


def test_row8_client_records_belong_to_the_user_that_made_them(tmp_path: Path) -> None:
    async def body() -> None:
        n = await start(tmp_path)
        try:
            async with grpc.aio.insecure_channel(n.addr) as ch:
                stub = v2_grpc.MessagingServiceStub(ch)
                victim = Stream(ch, PUBLISHER, "victim-1")
                assert code(await victim.ask(producer(T))) == "OK"
                beat = v2_service.HeartbeatRequest(client_type=v2.PRODUCER)
                # Another user names the victim's client id: as if it did not exist.
                mine = await stub.Heartbeat(beat, metadata=md(NOBODY, "victim-1"))
                unknown = await stub.Heartbeat(beat, metadata=md(NOBODY, "never-seen"))
                assert code(mine) == code(unknown) == "UNRECOGNIZED_CLIENT_TYPE"
                bye = v2_service.NotifyClientTerminationRequest()
                await stub.NotifyClientTermination(bye, metadata=md(NOBODY, "victim-1"))
                hijack = Stream(ch, NOBODY, "victim-1")
                taken = await hijack.ask(producer())
                assert code(taken) == "FORBIDDEN"
                # The victim's record is intact: its heartbeats go on.
                ok = await stub.Heartbeat(beat, metadata=md(PUBLISHER, "victim-1"))
                assert code(ok) == "OK"
                record = n.v2.clients.get("victim-1", "publisher")
                assert record is not None and record.client_type == v2.PRODUCER
                # Its own termination works.
                await stub.NotifyClientTermination(bye, metadata=md(PUBLISHER, "victim-1"))
                assert n.v2.clients.get("victim-1", "publisher") is None
                await victim.close()
                await hijack.close()
        finally:
            await n.stop()

    asyncio.run(body())


BIG_S = 2**62


def test_row7_out_of_range_fields_are_bad_requests_naming_the_field(tmp_path: Path) -> None:
    async def body() -> None:
        n = await start(tmp_path)
        try:
            for addr in (n.addr, n.follower_addr):
                async with grpc.aio.insecure_channel(addr) as ch:
                    stub = v2_grpc.MessagingServiceStub(ch)
                    for field, kind in (
                        ("born_timestamp", v2.NORMAL),
                        ("delivery_timestamp", v2.DELAY),
                    ):
                        sp = v2.SystemProperties(message_id="01" + IDS.next_id(), message_type=kind)
                        getattr(sp, field).seconds = BIG_S
                        if field == "delivery_timestamp":
                            sp.born_timestamp.seconds = 1
                        send = v2_service.SendMessageRequest(
                            messages=[
                                v2.Message(
                                    topic=v2.Resource(name=T), system_properties=sp, body=b"x"
                                )
                            ]
                        )
                        resp = await stub.SendMessage(send, metadata=md(PUBLISHER))
                        assert code(resp) in ("BAD_REQUEST", "ILLEGAL_DELIVERY_TIME"), resp
                        assert field in resp.status.message
                    change = v2_service.ChangeInvisibleDurationRequest(
                        group=v2.Resource(name=GROUP),
                        topic=v2.Resource(name=T),
                        receipt_handle="AAAA",
                    )
                    change.invisible_duration.seconds = BIG_S
                    resp = await stub.ChangeInvisibleDuration(change, metadata=md(READER))
                    assert code(resp) == "ILLEGAL_INVISIBLE_TIME", resp
                    assert "invisible_duration" in resp.status.message
                    receive = v2_service.ReceiveMessageRequest(
                        group=v2.Resource(name=GROUP),
                        message_queue=v2.MessageQueue(topic=v2.Resource(name=T)),
                    )
                    receive.invisible_duration.seconds = 30
                    receive.long_polling_timeout.seconds = -1
                    [resp] = [r async for r in stub.ReceiveMessage(receive, metadata=md(READER))]
                    assert code(resp) == "ILLEGAL_POLLING_TIME"
                    assert "long_polling_timeout" in resp.status.message
        finally:
            await n.stop()

    asyncio.run(body())


def test_row4_one_user_fills_its_client_quota_and_another_is_served(tmp_path: Path) -> None:
    async def body() -> None:
        n = await start(tmp_path)
        n.v2.clients.max_per_user = 3
        try:
            async with grpc.aio.insecure_channel(n.addr) as ch:
                streams = [Stream(ch, NOBODY, f"fake-{i}") for i in range(4)]
                for s in streams[:3]:
                    assert code(await s.ask(producer())) == "OK"
                full = await streams[3].ask(producer())
                assert code(full) == "TOO_MANY_REQUESTS"
                assert "grpcClientsPerUser" in full.status.message
                assert n.v2.clients.get("fake-3", "nobody") is None
                other = Stream(ch, PUBLISHER, "real-3")  # another user: served at once
                assert code(await other.ask(producer(T))) == "OK"
                admins = [Stream(ch, ADMIN, f"admin-{i}") for i in range(4)]
                for s in admins:  # a Super user: the global limit only
                    assert code(await s.ask(producer())) == "OK"
                for s in [*streams, other, *admins]:
                    await s.close()
        finally:
            await n.stop()

    asyncio.run(body())


def test_row3_one_user_fills_its_group_quota_another_is_served_and_groups_can_be_deleted(
    tmp_path: Path,
) -> None:
    async def body() -> None:
        n = await start(tmp_path)
        try:
            async with (
                grpc.aio.insecure_channel(n.addr) as leader,
                grpc.aio.insecure_channel(n.follower_addr) as follower,
            ):
                reader = Stream(leader, READER, "reader-q")
                for i in range(GROUPS_PER_USER):
                    assert code(await reader.ask(consumer(f"RG{i}", T))) == "OK"
                # Past the quota, on the leader's port and through a follower: not OK.
                away = Stream(follower, READER, "reader-q2")
                for s in (reader, away):
                    full = await s.ask(consumer("RG-more", T))
                    assert code(full) == "TOO_MANY_REQUESTS", full
                    assert "subscriptionGroupsPerUser" in full.status.message
                    assert not n.v2.subgroups.known("RG-more")
                assert n.v2.clients.get("reader-q2", "reader") is None  # nothing registered
                # Another user is served at once; a Super user has no quota.
                other = Stream(follower, OTHER, "other-q")
                assert code(await other.ask(consumer("OG0", T))) == "OK"
                boss = Stream(leader, ADMIN, "admin-q")
                for i in range(GROUPS_PER_USER + 1):
                    assert code(await boss.ask(consumer(f"AG{i}", T))) == "OK"
                # Deleting a group (through the log) gives its creator room again; it needs
                # Group Delete, which a Sub-only user lacks.
                stub = pb_grpc.BrokerStub(leader)
                delete = pb.DeleteSubscriptionGroupRequest(group="RG0")
                code_, _ = await _v1_error(
                    stub.DeleteSubscriptionGroup(delete, metadata=md(READER))
                )
                assert code_ == "PERMISSION_DENIED"
                await stub.DeleteSubscriptionGroup(delete, metadata=md(ADMIN))
                assert not n.v2.subgroups.known("RG0")
                missing = await _v1_error(stub.DeleteSubscriptionGroup(delete, metadata=md(ADMIN)))
                assert missing[0] == "SUBGROUP_NOT_FOUND"
                assert code(await reader.ask(consumer("RG-more", T))) == "OK"
                for s in (reader, away, other, boss):
                    await s.close()
        finally:
            await n.stop()

    asyncio.run(body())


def test_row3_settings_past_the_global_group_limit_do_not_answer_ok(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    async def body() -> None:
        n = await start(tmp_path)
        try:
            async with grpc.aio.insecure_channel(n.addr) as ch:
                boss = Stream(ch, ADMIN, "admin-full")
                assert code(await boss.ask(consumer("FULL0", T))) == "OK"
                monkeypatch.setattr(subgroups, "MAX_SUBGROUPS", len(n.v2.subgroups.list()))
                full = await boss.ask(consumer("FULL1", T))
                assert code(full) == "TOO_MANY_REQUESTS", full
                assert not n.v2.subgroups.known("FULL1")
                await boss.close()
        finally:
            await n.stop()

    asyncio.run(body())


def _receive(stub: Any, creds: Credentials, group: str, poll_s: int) -> Any:
    request = v2_service.ReceiveMessageRequest(
        group=v2.Resource(name=group),
        message_queue=v2.MessageQueue(topic=v2.Resource(name=T)),
    )
    request.invisible_duration.seconds = 30
    request.long_polling_timeout.seconds = poll_s
    return stub.ReceiveMessage(request, metadata=md(creds), timeout=poll_s + 5)


async def _until(condition: Any, what: str, timeout_s: float = CALL_TIMEOUT_S) -> None:
    deadline = time.monotonic() + timeout_s
    while not condition():
        assert time.monotonic() < deadline, what
        await asyncio.sleep(0.01)


def test_quota_one_user_fills_its_waiting_receives_and_another_is_served(tmp_path: Path) -> None:
    async def body() -> None:
        n = await start(tmp_path)
        try:
            async with (
                grpc.aio.insecure_channel(n.addr) as leader,
                grpc.aio.insecure_channel(n.follower_addr) as follower,
            ):
                # Parked through a follower (forwarded: the leader counts the caller's user).
                waiting = [
                    _receive(v2_grpc.MessagingServiceStub(follower), READER, GROUP, 20)
                    for _ in range(WAITERS_PER_USER)
                ]
                pops = n.broker.pops
                await _until(
                    lambda: pops._waiting_by["reader"] == WAITERS_PER_USER, "receives parked"
                )
                stub = v2_grpc.MessagingServiceStub(leader)
                [full] = [r async for r in _receive(stub, READER, GROUP, 20)]
                assert code(full) == "TOO_MANY_REQUESTS", full
                assert "popWaitersPerUser" in full.status.message
                # Another user's receive waits, and gets the message sent meanwhile.
                other = _receive(stub, OTHER, "OG", 20)
                await _until(lambda: pops._waiting_by["other"] == 1, "the other's receive parked")
                m = pb.Message(queue_id=0, body=b"m", msg_id=IDS.next_id())
                await n.broker.sender.send(T, [m])
                got = [r async for r in other]
                assert [r.message.body for r in got if r.HasField("message")] == [b"m"]
                for call in waiting:
                    call.cancel()
        finally:
            await n.stop()

    asyncio.run(body())


def test_quota_one_user_fills_its_telemetry_streams_and_another_is_served(
    tmp_path: Path,
) -> None:
    async def body() -> None:
        n = await start(tmp_path)
        n.v2.cfg = replace(n.v2.cfg, clients_per_user=2)
        try:
            async with grpc.aio.insecure_channel(n.addr) as ch:
                held = [Stream(ch, NOBODY, f"s-{i}") for i in range(2)]
                for s in held:  # open: a Settings with no topics is answered on each
                    assert code(await s.ask(producer())) == "OK"
                extra = Stream(ch, NOBODY, "s-extra")
                refused = await extra.next()
                assert code(refused) == "TOO_MANY_REQUESTS"
                assert "grpcClientsPerUser" in refused.status.message
                other = Stream(ch, PUBLISHER, "p-1")
                assert code(await other.ask(producer(T))) == "OK"
                for s in [*held, extra, other]:
                    await s.close()
        finally:
            await n.stop()

    asyncio.run(body())


def test_row9_v2_consumers_are_listed_as_connections_not_as_rebalancing_ids(
    tmp_path: Path,
) -> None:
    """A RocketMQ 5 consumer's Settings lists it in GetConsumerList's connections (mqadmin
    consumerConnection, the dashboard) with what it said of itself, under the rights of the v1
    listing; never among the client ids v1 consumers rebalance by (issue #35)."""

    async def body() -> None:
        n = await start(tmp_path)
        try:
            async with grpc.aio.insecure_channel(n.addr) as ch:
                asked = consumer(GROUP, T)
                asked.settings.user_agent.language = v2.PYTHON
                asked.settings.user_agent.version = "5.0.3"
                asked.settings.subscription.subscriptions[0].expression.expression = "A || B"
                reader = Stream(ch, READER, "v2-reader-1")
                assert code(await reader.ask(asked)) == "OK"
                assert code(await Stream(ch, READER, "v2-other").ask(consumer("G2", T))) == "OK"
                n.broker.consumers.heartbeat(
                    GROUP, "v1-a", [(T, "*")], [], described=("10.0.0.9:1", "PYTHON", "0.3.0")
                )
                stub = pb_grpc.BrokerStub(ch)
                ask = pb.GetConsumerListRequest(consumer_group=GROUP, with_connections=True)
                listed = await stub.GetConsumerList(ask, metadata=md(ADMIN))
                assert list(listed.client_ids) == ["v1-a"]
                rows = [
                    (c.client_id, c.protocol, c.language, c.version) for c in listed.connections
                ]
                assert rows == [
                    ("v1-a", "v1", "PYTHON", "0.3.0"),
                    ("v2-reader-1", "v2", "PYTHON", "5.0.3"),
                ]
                v2c = listed.connections[1]
                assert v2c.address.startswith("127.0.0.1:") and v2c.last_heartbeat_age_ms >= 0
                assert [(s.topic, s.expression) for s in v2c.subscriptions] == [(T, "A || B")]
                ids = await stub.GetConsumerList(
                    pb.GetConsumerListRequest(consumer_group=GROUP), metadata=md(ADMIN)
                )
                assert (list(ids.client_ids), list(ids.connections)) == (["v1-a"], [])
                # The v1 listing's rights: Sub on the group (the reader), none for nobody.
                own = await stub.GetConsumerList(ask, metadata=md(READER))
                assert [c.client_id for c in own.connections] == ["v1-a", "v2-reader-1"]
                refused = await _v1_error(stub.GetConsumerList(ask, metadata=md(NOBODY)))
                assert refused[0] == "PERMISSION_DENIED", refused
                # The group list counts them apart; a group with only RocketMQ 5 consumers is in.
                listing = await stub.ListConsumerGroups(
                    pb.ListConsumerGroupsRequest(), metadata=md(ADMIN)
                )
                counts = {
                    g.consumer_group: (g.online_clients, g.online_v2_clients)
                    for g in listing.groups
                }
                assert (counts[GROUP], counts["G2"]) == ((1, 1), (0, 1)), counts
                await reader.close()
        finally:
            await n.stop()

    asyncio.run(body())
