"""The call guard (authentication, authorization, the per-RPC table) and the admin component,
on a real state machine and an in-memory log (tests/broker_world.py), no gRPC server."""

from __future__ import annotations

import asyncio
from datetime import UTC, datetime, timedelta
from pathlib import Path
from types import SimpleNamespace

import pytest
from broker_world import world
from raftmq.broker.internal.v1 import leaderops_pb2 as ipb
from raftmq.broker.v1 import broker_pb2 as bpb
from raftmq.dledger.v1 import dledger_pb2 as dpb

from broker.components.applied import NodeContext
from broker.components.authadmin import (
    AclNotFoundError,
    AlreadyExistsError,
    AuthAdmin,
    UserNotFoundError,
)
from broker.components.settings import ServiceConfig
from broker.frontends import authguard as guard_module
from broker.frontends import rpcmap
from broker.frontends.authguard import AuthGuard, AuthSettings
from broker.frontends.remoting import service as remoting_service
from broker.state.auth.secrets import SecretBox
from broker.state.errors import InvalidRequestError
from mqsecurity.credentials import Credentials
from mqsecurity.refusals import AUTHENTICATION, AUTHORIZATION, REFUSALS
from mqsecurity.signing import SignedRequest, check_signature, signed_metadata
from remoting.codes import RequestCode
from remoting.protocol import RemotingCommand
from rpckit.callguard import OPEN_SERVICES, Refusal
from rpckit.decodeguard import Undecodable

BOX = SecretBox(bytes(range(32)))
PEER = "ipv4:127.0.0.1:40000"
ADMIN = Credentials("admin", "admin-secret-1")
ALICE = Credentials("alice", "alice-secret-1")
SEND = rpcmap.BROKER + "SendMessage"
PULL = rpcmap.BROKER + "PullMessage"


def setup(tmp_path: Path, authz: bool = True) -> tuple[AuthAdmin, AuthGuard]:
    node, sm, _, _ = world(tmp_path)
    ctx = NodeContext(node, sm, ServiceConfig("127.0.0.1", 10911))  # type: ignore[arg-type]
    admin = AuthAdmin(ctx, BOX)
    guard = AuthGuard(sm, AuthSettings(True, authz, cluster_name="c1"), BOX)

    async def users() -> None:
        await admin.create_user("admin", ADMIN.secret_key, "Super", "")
        await admin.create_user("alice", ALICE.secret_key, "", "")
        await admin.put_acl("User:alice", ["Topic:orders"], ["Pub"], "Allow", [], update=False)

    asyncio.run(users())
    return admin, guard


def md(creds: Credentials, now: datetime | None = None) -> dict[str, str]:
    return dict(signed_metadata(creds, now))


def check(
    guard: AuthGuard, method: str, creds: Credentials | None, request: object
) -> Refusal | None:
    return guard.check(method, md(creds) if creds else {}, PEER, request)


def test_every_client_port_rpc_is_in_the_table() -> None:
    methods = {
        f"/{svc.full_name}/{m.name}"
        for svc in (
            bpb.DESCRIPTOR.services_by_name["Broker"],
            dpb.DESCRIPTOR.services_by_name["DLedgerClient"],
            ipb.DESCRIPTOR.services_by_name["LeaderOps"],
        )
        for m in svc.methods
    }
    v1_rows = {m for m in rpcmap.RPC_NEEDS if not m.startswith(rpcmap.V2)}
    assert methods - v1_rows == set()
    assert v1_rows - methods == set()  # no stale rows (v2's: tests/unit/test_rmq5_acl.py)
    for svc in OPEN_SERVICES:
        assert not any(m.startswith(f"/{svc}/") for m in rpcmap.RPC_NEEDS)


def test_every_table_row_reads_an_empty_request() -> None:
    """A row must never raise on a valid request (the guard runs before the servicer)."""
    pools = {rpcmap.BROKER: bpb, rpcmap.DLEDGER: dpb}
    for method, needs in rpcmap.RPC_NEEDS.items():
        if isinstance(needs, str) or method.startswith((rpcmap.V2, rpcmap.LEADER_OPS)):
            continue  # v2: tests/unit/test_rmq5_acl.py; leader operations: below
        prefix = rpcmap.BROKER if method.startswith(rpcmap.BROKER) else rpcmap.DLEDGER
        svc = pools[prefix].DESCRIPTOR.services_by_name[prefix.strip("/").rsplit(".", 1)[-1]]
        rpc = svc.methods_by_name[method.rsplit("/", 1)[1]]
        module = pools[prefix]
        request = getattr(module, rpc.input_type.name)()
        assert needs(request, "c1"), method


# A leader operation inside a forward -> the direct v1 call that does the same, as the guard
# sees it (both naming topic t and group g).
_DIRECT_CALLS = {
    "send": (ipb.Send(topic="t"), SEND, bpb.SendMessageRequest(topic="t")),
    "receive": (
        ipb.Receive(group="g", topic="t"),
        rpcmap.BROKER + "PopMessage",
        bpb.PopMessageRequest(group="g", topic="t"),
    ),
    "ack": (
        ipb.Ack(group="g", topic="t"),
        rpcmap.BROKER + "AckPop",
        bpb.AckPopRequest(group="g", topic="t"),
    ),
    "renew": (
        ipb.Renew(group="g", topic="t"),
        rpcmap.BROKER + "AckPop",
        bpb.AckPopRequest(group="g", topic="t", renew_ms=1),
    ),
    "change_invisible": (
        ipb.ChangeInvisible(group="g", topic="t"),
        rpcmap.BROKER + "ChangeInvisibleTime",
        bpb.ChangeInvisibleTimeRequest(group="g", topic="t"),
    ),
    "dead_letter": (
        ipb.DeadLetter(group="g", topic="t"),
        rpcmap.BROKER + "AckPop",
        bpb.AckPopRequest(group="g", topic="t", dead_letter=True),
    ),
    "end_transaction": (
        ipb.EndTransaction(topic="t"),
        rpcmap.BROKER + "EndTransaction",
        bpb.EndTransactionRequest(topic="t"),
    ),
    "create_group": (
        ipb.CreateGroup(group="g"),
        rpcmap.BROKER + "UpdateSubscriptionGroup",
        bpb.UpdateSubscriptionGroupRequest(
            config=bpb.SubscriptionGroup(group="g"), create_only=True
        ),
    ),
}


def test_a_forwarded_leader_operation_needs_what_its_direct_call_needs() -> None:
    """Every operation a member forwards is checked on the leader for the original user's
    rights exactly as the direct call is (a forward can do nothing its caller may not); a call
    naming no operation needs nothing but a user (its servicer refuses it, BAD_REQUEST)."""
    kinds = ipb.LeaderCall.DESCRIPTOR.oneofs_by_name["op"].fields
    assert {k.name for k in kinds} == set(_DIRECT_CALLS) == set(rpcmap.LEADER_OP_NEEDS)
    needs = rpcmap.RPC_NEEDS[rpcmap.LEADER_OPS + "Call"]
    assert not isinstance(needs, str)
    for kind, (op, method, direct) in _DIRECT_CALLS.items():
        direct_needs = rpcmap.RPC_NEEDS[method]
        assert not isinstance(direct_needs, str)
        call = ipb.LeaderCall(**{kind: op})
        assert needs(call, "c1") == direct_needs(direct, "c1") != [], kind
    assert needs(ipb.LeaderCall(), "c1") == []


def test_authentication(tmp_path: Path) -> None:
    admin, guard = setup(tmp_path, authz=False)
    before = REFUSALS.snapshot()[AUTHENTICATION]
    req = bpb.SendMessageRequest(topic="anything")
    assert check(guard, SEND, ALICE, req) is None  # authorization off: any known user
    reasons = []
    for creds, why in [
        (None, "requires signed requests"),
        (Credentials("alice", "wrong-secret-1"), "does not match"),
        (Credentials("mallory", "mallory-secret"), "does not match"),
    ]:
        refusal = check(guard, SEND, creds, req)
        assert refusal is not None and not refusal.authenticated, creds
        assert why in refusal.reason and "secret-1" not in refusal.reason
        reasons.append(refusal.reason)
    # A known user's wrong secret and an unknown user get the same answer: no probing.
    assert reasons[1].replace("alice", "mallory") == reasons[2]
    old = guard.check(SEND, md(ALICE, datetime.now(UTC) - timedelta(hours=1)), PEER, req)
    assert old is not None and "away from the server's clock" in old.reason
    bad = guard.check(SEND, {"authorization": "Basic abc"}, PEER, req)
    assert bad is not None and bad.code == "UNAUTHENTICATED"
    signed = md(ALICE)  # checked once, then remembered: a new password must still end it
    assert guard.check(SEND, signed, PEER, req) is None
    asyncio.run(admin.update_user("alice", "alice-secret-2", "", ""))
    assert guard.check(SEND, signed, PEER, req) is not None
    assert check(guard, SEND, Credentials("alice", "alice-secret-2"), req) is None
    asyncio.run(admin.update_user("alice", "", "", "disable"))
    disabled = check(guard, SEND, Credentials("alice", "alice-secret-2"), req)
    assert disabled is not None and disabled.reason == reasons[1]
    assert REFUSALS.snapshot()[AUTHENTICATION] - before == 7


def test_an_unknown_access_key_costs_the_same_hmac_as_a_wrong_secret(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Timing must not tell which users exist either: an unknown access key's signature is
    checked (against a secret nobody has) as a known user's is."""
    _, guard = setup(tmp_path, authz=False)
    checked: list[str] = []

    def counting(request: SignedRequest, secret: str, *args: object) -> None:
        checked.append(request.access_key)
        check_signature(request, secret, *args)  # type: ignore[arg-type]

    monkeypatch.setattr(guard_module, "check_signature", counting)
    req = bpb.SendMessageRequest(topic="anything")
    for creds in (Credentials("alice", "wrong-secret-1"), Credentials("mallory", "m-secret")):
        assert check(guard, SEND, creds, req) is not None
    assert checked == ["alice", "mallory"]


def test_authorization(tmp_path: Path) -> None:
    admin, guard = setup(tmp_path)
    before = REFUSALS.snapshot()[AUTHORIZATION]
    assert check(guard, SEND, ALICE, bpb.SendMessageRequest(topic="orders")) is None
    refusal = check(guard, SEND, ALICE, bpb.SendMessageRequest(topic="other"))
    assert refusal is not None and refusal.authenticated and refusal.code == "PERMISSION_DENIED"
    assert "may not Pub on Topic:other" in refusal.reason
    pull = bpb.PullMessageRequest(topic="orders", consumer_group="g")
    assert check(guard, PULL, ALICE, pull) is not None
    for method in ("DeleteTopic", "CreateUser"):
        assert check(guard, rpcmap.BROKER + method, ALICE, bpb.DeleteTopicRequest()) is not None
    for method in ("Append", "TransferLeadership", "Get"):
        refused = check(guard, rpcmap.DLEDGER + method, ALICE, dpb.AppendEntriesRequest())
        assert refused is not None and "Super" in refused.reason
        assert check(guard, rpcmap.DLEDGER + method, ADMIN, dpb.AppendEntriesRequest()) is None
    # An unknown method is for Super users only.
    assert check(guard, "/x.Y/Z", ALICE, None) is not None
    assert check(guard, "/x.Y/Z", ADMIN, None) is None
    # Undecodable requests pass to decodeguard (which refuses them) once authenticated.
    junk = Undecodable("SendMessageRequest", 3, "bad")
    assert check(guard, SEND, ALICE, junk) is None
    assert check(guard, SEND, None, junk) is not None
    assert REFUSALS.snapshot()[AUTHORIZATION] - before == 8
    # A rule change takes effect on the next call; a retry topic is its group.
    asyncio.run(admin.put_acl("User:alice", ["Group:g"], ["Sub"], "", [], update=False))
    asyncio.run(admin.put_acl("User:alice", ["Topic:orders"], ["Pub", "Sub"], "", [], update=True))
    assert check(guard, PULL, ALICE, pull) is None
    retry = bpb.PullMessageRequest(topic="%RETRY%g", consumer_group="g")
    assert check(guard, PULL, ALICE, retry) is None
    asyncio.run(admin.put_acl("User:alice", ["Topic:ord*"], ["Sub"], "Deny", [], update=False))
    assert check(guard, PULL, ALICE, pull) is not None
    assert check(guard, SEND, ALICE, bpb.SendMessageRequest(topic="orders")) is None


def test_admin_component(tmp_path: Path) -> None:
    admin, _ = setup(tmp_path)

    async def body() -> None:
        with pytest.raises(AlreadyExistsError):
            await admin.create_user("alice", "another-pw-1", "", "")
        with pytest.raises(UserNotFoundError):
            await admin.delete_user("ghost")
        with pytest.raises(InvalidRequestError, match="password"):
            await admin.create_user("bob", "short", "", "")
        with pytest.raises(InvalidRequestError, match="user type"):
            await admin.create_user("bob", "long-enough-1", "Root", "")
        with pytest.raises(AlreadyExistsError):
            await admin.put_acl("User:alice", ["Topic:orders"], ["Sub"], "", [], update=False)
        with pytest.raises(AclNotFoundError):
            await admin.put_acl("User:alice", ["Topic:new"], ["Sub"], "", [], update=True)
        with pytest.raises(UserNotFoundError):
            await admin.put_acl("User:ghost", ["Topic:t"], ["Sub"], "", [], update=False)
        await admin.delete_acl("User:alice", [])
        with pytest.raises(AclNotFoundError):
            admin.get_acl("User:alice")
        await admin.delete_user("alice")

    proposals = admin.ctx.node.proposals  # type: ignore[attr-defined]
    asyncio.run(body())
    assert admin.ctx.node.proposals == proposals + 2  # type: ignore[attr-defined]
    assert [u.username for u in admin.list_users()] == ["admin"]
    assert "secret" not in repr(admin.list_users())


def test_no_key_no_users(tmp_path: Path) -> None:
    node, sm, _, _ = world(tmp_path)
    ctx = NodeContext(node, sm, ServiceConfig("127.0.0.1", 10911))  # type: ignore[arg-type]
    with pytest.raises(InvalidRequestError, match="aclEncryptionKeyPath"):
        asyncio.run(AuthAdmin(ctx, None).create_user("bob", "long-enough-1", "", ""))
    guard = AuthGuard(sm, AuthSettings(False, False), None)
    assert guard.check(SEND, {}, PEER, bpb.SendMessageRequest()) is None  # both off: open


def test_oversized_consumer_requests_are_not_matched_topic_by_topic() -> None:
    """Beyond the servicer's limits (which refuse the request before anything changes) the
    guard does not match thousands of topics against the rules."""
    from broker.components.consumers import MAX_LOCK_BATCH, MAX_SUBSCRIPTIONS

    subs = [bpb.Subscription(topic=f"t{i}", expression="*") for i in range(MAX_SUBSCRIPTIONS + 1)]
    heartbeat = rpcmap.RPC_NEEDS[rpcmap.BROKER + "Heartbeat"]
    assert not isinstance(heartbeat, str)
    assert len(heartbeat(bpb.HeartbeatRequest(consumer_group="g", subscriptions=subs), "c")) == 1
    assert (
        len(heartbeat(bpb.HeartbeatRequest(consumer_group="g", subscriptions=subs[:3]), "c")) == 4
    )
    queues = [bpb.QueueRef(topic="t", queue_id=i) for i in range(MAX_LOCK_BATCH + 1)]
    lock = rpcmap.RPC_NEEDS[rpcmap.BROKER + "LockBatchMQ"]
    assert not isinstance(lock, str)
    assert len(lock(bpb.LockBatchRequest(consumer_group="g", queues=queues), "c")) == 1
    assert len(lock(bpb.LockBatchRequest(consumer_group="g", queues=queues[:5]), "c")) == 2


def test_send_back_needs_sub_on_the_stored_messages_topics(tmp_path: Path) -> None:
    """A group's consumer may not copy another topic's message into its retry topic."""
    from broker.state.errors import MessageNotFoundError

    admin, guard = setup(tmp_path)
    asyncio.run(
        admin.put_acl("User:alice", ["Group:g", "Topic:subbed"], ["Sub"], "", [], update=False)
    )
    topics = {100: "secret", 200: "subbed", 300: "%RETRY%g"}

    def topic_at(position: int) -> str:
        if position not in topics:
            raise MessageNotFoundError(f"no applied message at position {position}")
        return topics[position]

    method = rpcmap.BROKER + "ConsumerSendMsgBack"

    def send_back(*positions: int) -> Refusal | None:
        items = [bpb.SendBackItem(commitlog_position=p) for p in positions]
        return check(
            guard, method, ALICE, bpb.ConsumerSendMsgBackRequest(consumer_group="g", messages=items)
        )

    assert (
        send_back(200) is not None
        and "admins only" in (send_back(200) or Refusal(True, "", "")).reason
    )
    guard.topic_at = topic_at
    assert send_back(200, 300) is None
    refusal = send_back(200, 100)
    assert refusal is not None and "may not Sub on Topic:secret" in refusal.reason
    assert send_back(999) is None  # unreadable: the servicer refuses it (MESSAGE_NOT_FOUND)
    assert check(guard, method, ADMIN, bpb.ConsumerSendMsgBackRequest(consumer_group="g")) is None


def test_initial_user_is_proposed_once_per_term_even_when_not_yet_applied(tmp_path: Path) -> None:
    """An accepted proposal that is not applied at once (the test-only unsafe ack acknowledges
    on the local append) must not make the leader propose again and again: that spun the event
    loop and starved the heartbeats (mqjepsen --unsafe-ack found no leader)."""
    node, sm, _, _ = world(tmp_path)
    ctx = NodeContext(node, sm, ServiceConfig("127.0.0.1", 10911))  # type: ignore[arg-type]
    admin = AuthAdmin(ctx, BOX, init_user=ADMIN)
    proposed: list[int] = []

    async def acked_not_applied(op: int, doc: object) -> None:
        proposed.append(op)
        await asyncio.sleep(0)  # a real proposal yields to the loop

    admin._propose = acked_not_applied  # type: ignore[method-assign]
    asyncio.run(asyncio.wait_for(admin._init_loop(), timeout=5))
    assert len(proposed) == 1 and not admin.table.users


def test_a_group_without_users_yet_refuses_without_counting(tmp_path: Path) -> None:
    """Before the first leader's initial user is applied nobody can be authenticated: the call
    is refused, but a healthy group starting is not an authentication failure to count."""
    _, sm, _, _ = world(tmp_path)
    guard = AuthGuard(sm, AuthSettings(True, True, cluster_name="c1"), BOX)
    before = REFUSALS.snapshot().get(AUTHENTICATION, 0)
    refused = check(guard, SEND, ADMIN, bpb.SendMessageRequest(topic="orders"))
    assert refused is not None and not refused.authenticated
    assert refused.reason == guard_module.NO_USERS_YET
    assert REFUSALS.snapshot().get(AUTHENTICATION, 0) == before
    # Unsigned calls are still counted: they are refused whatever the table holds.
    assert check(guard, SEND, None, bpb.SendMessageRequest(topic="orders")) is not None
    assert REFUSALS.snapshot().get(AUTHENTICATION, 0) == before + 1


def test_a_forwarded_remoting_request_needs_what_the_direct_one_needs() -> None:
    """A remoting send or transaction verdict that a member forwards is checked on the leader
    (its LeaderCall row) for the rights the member checked on the direct request."""
    needs = rpcmap.RPC_NEEDS[rpcmap.LEADER_OPS + "Call"]
    assert not isinstance(needs, str)
    forwarded = needs(ipb.LeaderCall(send=ipb.Send(topic="t")), "c1")
    for code, ext in (
        (RequestCode.SEND_MESSAGE, {"topic": "t"}),
        (RequestCode.SEND_MESSAGE_V2, {"b": "t"}),
        (RequestCode.SEND_BATCH_MESSAGE, {"topic": "t"}),
    ):
        cmd = RemotingCommand(code, 1, ext_fields=ext)
        assert remoting_service._send_wants(cmd) == forwarded != [], code
    half = SimpleNamespace(_half_at=lambda position: (None, "t"))
    end = RemotingCommand(RequestCode.END_TRANSACTION, 1, ext_fields={"commitLogOffset": "7"})
    direct = remoting_service.RemotingBrokerService._end_wants(half, end)  # type: ignore[arg-type]
    call = ipb.LeaderCall(end_transaction=ipb.EndTransaction(topic="t"))
    assert direct == needs(call, "c1") != []
