"""Leader operations forwarded over ``raftmq.broker.internal.v1.LeaderOps`` (a real gRPC server
with the node's call guard, the leader's components on an in-memory log): the leader checks the
ORIGINAL caller's rights for the operation inside each forward, exactly as for the direct call,
and refuses it before anything changes; a retried forwarded send is stored once; hostile calls
are refused BAD_REQUEST; the wire codec carries every request and answer unchanged."""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, replace
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import grpc
import pytest
from broker_world import world
from raftmq.broker.internal.v1 import leaderops_pb2 as ipb
from raftmq.broker.internal.v1 import leaderops_pb2_grpc as ipb_grpc
from remoting_support import sign

from broker.app import Broker, assemble
from broker.components.applied import NodeContext
from broker.components.authadmin import AuthAdmin
from broker.components.leaderops import (
    AckRequest,
    ChangeInvisibleRequest,
    CreateGroupRequest,
    DeadLetterRequest,
    EndTransactionRequest,
    LeaderRequest,
    ReceiveRequest,
    RenewRequest,
    SendRequest,
)
from broker.components.pop import Received
from broker.components.sending import OutgoingMessage
from broker.components.settings import ServiceConfig
from broker.frontends.authguard import AuthGuard, AuthSettings
from broker.frontends.internal import codec
from broker.frontends.internal.forwarder import Failure, Forwarder, Origin
from broker.frontends.remoting.service import RemotingBrokerService
from broker.state.auth.secrets import SecretBox
from broker.state.errors import InvalidRequestError
from broker.state.machine import SendResult
from broker.state.message import Message, UniqIdGenerator
from broker.state.popstate import MAX_HANDLE_CHARS, MAX_RECORD_ITEMS
from broker.state.transactions import transaction_id
from dledger.core import Role
from mqsecurity.credentials import Credentials
from mqsecurity.signing import signed_metadata
from remoting.client import RemotingClient
from remoting.codes import RequestCode as Q
from remoting.codes import ResponseCode as R
from remoting.protocol import RemotingCommand
from remoting.server import RemotingServer
from rpckit.callguard import GuardInterceptor
from rpckit.status import read_error

BOX = SecretBox(bytes(range(32)))
CFG = ServiceConfig("127.0.0.1", 10911, pop_min_invisible_ms=1000)
IDS = UniqIdGenerator(ip="10.0.0.9", pid=17, instance_hash=9)
T, G = "T", "G"
PUBLISHER = Credentials("publisher", "publisher-secret-1")  # Pub on T
READER = Credentials("reader", "reader-secret-1")  # Sub on T and G
NOBODY = Credentials("nobody", "nobody-secret-1")  # no rules at all
CALL_TIMEOUT_S = 5.0


@dataclass
class Leader:
    """The leader's port (the node's guard, the forwards' service) and a follower's forwarder
    that believes it leads."""

    parts: Broker
    addr: str
    server: grpc.aio.Server
    forwarder: Forwarder


async def start(tmp_path: Path) -> Leader:
    node, sm, _, _ = world(tmp_path, CFG)
    admin = AuthAdmin(NodeContext(node, sm, CFG), BOX)  # type: ignore[arg-type]
    for creds in (PUBLISHER, READER, NOBODY):
        await admin.create_user(creds.access_key, creds.secret_key, "", "")
    await admin.put_acl("User:publisher", [f"Topic:{T}"], ["Pub"], "Allow", [], update=False)
    await admin.put_acl(
        "User:reader", [f"Topic:{T}", f"Group:{G}"], ["Sub"], "Allow", [], update=False
    )
    guard = AuthGuard(sm, AuthSettings(True, True, cluster_name="c1"), BOX)
    parts = assemble(node, sm, CFG, secret_box=BOX, guard=guard)
    await parts.topics.upsert(T, 1, 1, 6)
    server = grpc.aio.server(interceptors=[GuardInterceptor(guard)])
    port = server.add_insecure_port("127.0.0.1:0")
    parts.leader_service.register(server)
    await server.start()
    addr = f"127.0.0.1:{port}"
    away = SimpleNamespace(role=Role.FOLLOWER, leader_client_addr=lambda: ("n0", addr))
    return Leader(parts, addr, server, Forwarder(away, parts.leader_ops))  # type: ignore[arg-type]


def origin(creds: Credentials) -> Origin:
    return Origin(creds.access_key, False, tuple(signed_metadata(creds)))


def run(test: Callable[[Leader], Awaitable[None]], tmp_path: Path) -> None:
    async def body() -> None:
        leader = await start(tmp_path)
        try:
            await test(leader)
        finally:
            await leader.forwarder.close()
            await leader.server.stop(None)

    asyncio.run(body())


def _message(**properties: str) -> OutgoingMessage:
    return OutgoingMessage(T, 0, b"body", msg_id=IDS.next_id(), properties=properties)


async def _refused(leader: Leader, request: LeaderRequest[Any], creds: Credentials) -> Failure:
    return await _refused_as(leader, request, origin(creds))


async def _refused_as(leader: Leader, request: LeaderRequest[Any], caller: Origin) -> Failure:
    with pytest.raises(Failure) as failure:
        await leader.forwarder.call(request, caller)
    return failure.value


def _stored(leader: Leader) -> int:
    return leader.parts.sm.queue_offsets(T, 0)[1]


def test_a_forwarded_send_is_checked_for_its_original_caller(tmp_path: Path) -> None:
    async def test(leader: Leader) -> None:
        send = SendRequest(T, (_message(),))
        for creds in (NOBODY, READER):  # no Pub on T (a reader may Sub only)
            failure = await _refused(leader, send, creds)
            assert failure.code == "PERMISSION_DENIED" and "Pub" in failure.text
        assert _stored(leader) == 0  # refused before anything changed
        [stored] = await leader.forwarder.call(send, origin(PUBLISHER))
        assert stored.uniq_id == send.messages[0].msg_id and not stored.duplicate
        # A forward retried after a lost answer: the same ids, stored once.
        [again] = await leader.forwarder.call(send, origin(PUBLISHER))
        assert again.duplicate and again.queue_offset == stored.queue_offset
        assert _stored(leader) == 1

    run(test, tmp_path)


def test_a_forwarded_receive_and_its_handles_are_checked_for_their_caller(
    tmp_path: Path,
) -> None:
    async def test(leader: Leader) -> None:
        sent = SendRequest(T, (_message(),))
        await leader.forwarder.call(sent, origin(PUBLISHER))
        receive = ReceiveRequest(G, T, -1, 32, 60_000)
        for creds in (NOBODY, PUBLISHER):  # no Sub on G and T
            failure = await _refused(leader, receive, creds)
            assert failure.code == "PERMISSION_DENIED"
        assert leader.parts.sm.pop.inflight_total == 0  # nothing received
        [got] = await leader.forwarder.receive(receive, origin(READER))
        assert got.message.uniq_id == sent.messages[0].msg_id and got.message.body == b"body"
        handle = got.receipt_handle
        for op in (
            AckRequest(G, T, (handle,)),
            RenewRequest(G, T, (handle,), 30_000),
            ChangeInvisibleRequest(G, T, handle, 30_000),
            DeadLetterRequest(G, T, handle),
            CreateGroupRequest("G2"),
        ):
            assert (await _refused(leader, op, NOBODY)).code == "PERMISSION_DENIED", op
        assert leader.parts.sm.pop.inflight_total == 1  # still in flight: nothing acked
        changed = await leader.forwarder.call(
            ChangeInvisibleRequest(G, T, handle, 30_000), origin(READER)
        )
        assert changed.message.uniq_id == got.message.uniq_id
        codes = await leader.forwarder.call(
            AckRequest(G, T, (changed.receipt_handle,)), origin(READER)
        )
        assert codes == [""] and leader.parts.sm.pop.inflight_total == 0

    run(test, tmp_path)


def test_a_forwarded_end_transaction_is_checked_for_its_original_caller(
    tmp_path: Path,
) -> None:
    async def test(leader: Leader) -> None:
        half = _message(TRAN_MSG="true")
        [stored] = await leader.forwarder.call(SendRequest(T, (half,)), origin(PUBLISHER))
        end = EndTransactionRequest(T, half.msg_id, transaction_id(stored.position), True)
        for creds in (NOBODY, READER):
            assert (await _refused(leader, end, creds)).code == "PERMISSION_DENIED"
        assert _stored(leader) == 0  # still a half message: not delivered
        assert await leader.forwarder.call(end, origin(PUBLISHER)) == "COMMITTED"
        assert _stored(leader) == 1

    run(test, tmp_path)


def test_a_forwarded_bad_handle_is_answered_as_the_direct_call_answers_it(
    tmp_path: Path,
) -> None:
    async def test(leader: Leader) -> None:
        long = "A" * (MAX_HANDLE_CHARS + 1)
        for handles in (("",), ("not a handle!",), (long, "")):
            codes = await leader.forwarder.call(AckRequest(G, T, handles), origin(READER))
            assert codes == ["INVALID_RECEIPT_HANDLE"] * len(handles)
        for op in (ChangeInvisibleRequest(G, T, long, 30_000), DeadLetterRequest(G, T, long)):
            assert (await _refused(leader, op, READER)).code == "INVALID_RECEIPT_HANDLE"
        end = EndTransactionRequest(T, "A" * 32, "F" * 100, True)
        assert (await _refused(leader, end, PUBLISHER)).code == "INVALID_TRANSACTION_ID"

    run(test, tmp_path)


def test_an_unsigned_forward_is_refused(tmp_path: Path) -> None:
    async def test(leader: Leader) -> None:
        failure = await _refused(
            leader, SendRequest(T, (_message(),)), Credentials("stranger", "stranger-secret-1")
        )
        assert failure.code == "UNAUTHENTICATED"
        with pytest.raises(Failure) as unsigned:
            await leader.forwarder.call(SendRequest(T, (_message(),)))
        assert unsigned.value.code == "UNAUTHENTICATED"
        assert _stored(leader) == 0

    run(test, tmp_path)


# ------------------------------------------------------------------ hostile calls

_HOSTILE = [
    ipb.LeaderCall(),  # no operation
    ipb.LeaderCall(send=ipb.Send(topic=T)),  # no message
    ipb.LeaderCall(send=ipb.Send(topic="T" * 200, messages=[ipb.Outgoing(body=b"x")])),
    ipb.LeaderCall(send=ipb.Send(topic=T, messages=[ipb.Outgoing(body=b"x", msg_id="A" * 200)])),
    ipb.LeaderCall(send=ipb.Send(topic=T, messages=[ipb.Outgoing(body=b"x", topic="U" * 200)])),
    ipb.LeaderCall(ack=ipb.Ack(group=G, topic=T, receipt_handles=["h"] * (MAX_RECORD_ITEMS + 1))),
    ipb.LeaderCall(renew=ipb.Renew(group="G" * 300, topic=T, receipt_handles=["h"])),
    ipb.LeaderCall(
        change_invisible=ipb.ChangeInvisible(
            group=G, topic=T, receipt_handle="h" * (MAX_HANDLE_CHARS + 1)
        )
    ),
    ipb.LeaderCall(receive=ipb.Receive(group=G, topic=T, subscription="a" * 5000)),
    ipb.LeaderCall(end_transaction=ipb.EndTransaction(topic=T, transaction_id="1" * 100)),
    ipb.LeaderCall(create_group=ipb.CreateGroup(group="G" * 300)),
]


def test_hostile_calls_are_refused_and_change_nothing(tmp_path: Path) -> None:
    admin = Credentials("admin", "admin-secret-1")

    async def test(leader: Leader) -> None:
        await AuthAdmin(leader.parts.auth.ctx, BOX).create_user(
            admin.access_key, admin.secret_key, "Super", ""
        )
        async with grpc.aio.insecure_channel(leader.addr) as ch:
            stub = ipb_grpc.LeaderOpsStub(ch)
            for call in _HOSTILE:
                with pytest.raises(grpc.aio.AioRpcError) as refused:
                    await stub.Call(
                        call, timeout=CALL_TIMEOUT_S, metadata=tuple(signed_metadata(admin))
                    )
                info = read_error(refused.value)
                assert refused.value.code() is grpc.StatusCode.INVALID_ARGUMENT, call
                assert info is not None and not info.retryable, call
        assert _stored(leader) == 0 and not leader.parts.subgroups.known("G" * 300)

    run(test, tmp_path)


# ------------------------------------------------------------------ the codec

_MESSAGE = Message(
    topic=T,
    queue_id=0,
    body=b"b",
    tags="tag",
    keys=("k",),
    properties={"p": "v"},
    born_host="10.0.0.1:1",
    born_timestamp_ms=5,
    store_timestamp_ms=6,
    uniq_id="C" * 32,
)
_RECEIVED = Received(_MESSAGE, 0, 3, 1234, 2, "handle")
_OUTGOING = OutgoingMessage(
    T, 0, b"b", "tag", ("k",), {"p": "v"}, "h:1", 5, "pg", "D" * 32, 1, 2, 3
)
_ROUND_TRIPS: list[tuple[LeaderRequest[Any], Any]] = [
    (SendRequest(T, (_OUTGOING,)), [SendResult("D" * 32, T, 0, 7, 99, 6, True)]),
    (ReceiveRequest(G, T, -1, 32, 30_000, "a || b", 2000), [_RECEIVED]),
    (AckRequest(G, T, ("h1", "h2")), ["", "INVALID_RECEIPT_HANDLE"]),
    (RenewRequest(G, T, ("h1",), 30_000), [""]),
    (ChangeInvisibleRequest(G, T, "h1", 0, True), _RECEIVED),
    (DeadLetterRequest(G, T, "h1"), None),
    (EndTransactionRequest(T, "E" * 32, "12", False), "ROLLED_BACK"),
    (CreateGroupRequest(G), None),
]


@pytest.mark.parametrize("request_, answer", _ROUND_TRIPS)
def test_the_codec_carries_every_request_and_answer_unchanged(
    request_: LeaderRequest[Any], answer: Any
) -> None:
    wire = ipb.LeaderCall.FromString(codec.call_pb(request_).SerializeToString())
    assert codec.request_of(wire) == request_
    back = ipb.LeaderAnswer.FromString(
        codec.answer_pb(request_, answer, 1 << 20).SerializeToString()
    )
    assert codec.answer_of(request_, back) == answer


def test_an_answer_that_does_not_fit_its_request_is_refused() -> None:
    ack = AckRequest(G, T, ("h1", "h2"))
    short = ipb.LeaderAnswer(codes=ipb.HandleCodes(codes=[""]))
    with pytest.raises(codec.MalformedAnswerError):
        codec.answer_of(ack, short)
    with pytest.raises(codec.MalformedAnswerError):  # another operation's answer
        codec.answer_of(ack, ipb.LeaderAnswer(done=ipb.Done()))
    bad = ipb.LeaderAnswer(received=ipb.Deliveries(deliveries=[ipb.Delivery(stored=b"junk")]))
    with pytest.raises(codec.MalformedAnswerError):
        codec.answer_of(ReceiveRequest(G, T, -1, 32, 30_000), bad)


# ------------------------------------------------------------------ remoting callers


def _proof(creds: Credentials, ext: dict[str, str], body: bytes) -> codec.RemotingProof:
    """What a remoting request signed by ``creds`` proves (RocketMQ's ACL, as ali-ons signs)."""
    fields = sign(ext, body, creds.access_key, creds.secret_key)
    signed = "".join(fields[k] for k in sorted(fields) if k != "Signature").encode() + body
    return codec.RemotingProof(creds.access_key, fields["Signature"], signed)


def _remoting(creds: Credentials, ext: dict[str, str] | None = None) -> Origin:
    proof = _proof(creds, ext or {"b": T, "e": "0"}, b"body")
    return Origin(creds.access_key, False, remoting=proof)


def test_a_forwarded_remoting_send_is_checked_for_its_original_caller(tmp_path: Path) -> None:
    """A remoting caller's forward is checked on the leader by its own proof (RocketMQ's ACL
    signature over the exact signed material) and its user's rights, as the direct request."""

    async def test(leader: Leader) -> None:
        send = SendRequest(T, (_message(),))
        for creds in (NOBODY, READER):
            failure = await _refused_as(leader, send, _remoting(creds))
            assert failure.code == "PERMISSION_DENIED" and "Pub" in failure.text
        good = _remoting(PUBLISHER)
        assert good.remoting is not None
        forged = [
            replace(good.remoting, signed=good.remoting.signed + b"x"),  # other material
            replace(good.remoting, signature=_proof(NOBODY, {}, b"").signature),
            replace(good.remoting, access_key=READER.access_key),  # another user's name
            replace(good.remoting, signature="A" * (codec.MAX_PROOF_SIGNATURE_CHARS + 1)),
        ]
        for proof in forged:
            failure = await _refused_as(leader, send, replace(good, remoting=proof))
            assert failure.code == "UNAUTHENTICATED", proof
        assert _stored(leader) == 0  # refused before anything changed
        [stored] = await leader.forwarder.call(send, good)
        assert stored.uniq_id == send.messages[0].msg_id and _stored(leader) == 1
        half = _message(TRAN_MSG="true")
        [held] = await leader.forwarder.call(SendRequest(T, (half,)), good)
        end = EndTransactionRequest(T, half.msg_id, transaction_id(held.position), True)
        assert (await _refused_as(leader, end, _remoting(READER))).code == "PERMISSION_DENIED"
        assert await leader.forwarder.call(end, good) == "COMMITTED"
        assert _stored(leader) == 2

    run(test, tmp_path)


def test_a_guarded_member_forwards_a_remoting_send_to_its_leader(tmp_path: Path) -> None:
    """A 4.x producer that reaches a member that does not lead is served with users on: the
    member checks the request, forwards it with its proof, and the leader checks it again."""

    async def test(leader: Leader) -> None:
        # The member's remoting port: the leader's state (the same users), its forwarder away.
        service = RemotingBrokerService(leader.parts, leader.forwarder, "10.1.2.3:9876")
        server = RemotingServer(service.handle)
        client = await RemotingClient.connect("127.0.0.1", await server.start("127.0.0.1", 0))
        try:
            ext = {"a": "PG", "b": T, "c": "TBW102", "d": "4", "e": "0", "f": "0"}
            ext |= {"g": "1700000000000", "h": "5", "i": "", "j": "0", "k": "false"}
            for n, creds in enumerate((PUBLISHER, READER)):
                fields = sign(ext, b"x", creds.access_key, creds.secret_key)
                cmd = RemotingCommand(Q.SEND_MESSAGE_V2, n + 1, ext_fields=fields, body=b"x")
                answers.append(await client.request(cmd, CALL_TIMEOUT_S))
        finally:
            await client.close()
            await server.stop()
        assert answers[0].code == R.SUCCESS, answers[0].remark
        assert answers[1].code == R.NO_PERMISSION
        assert _stored(leader) == 1

    answers: list[RemotingCommand] = []
    run(test, tmp_path)


def test_a_remoting_proof_crosses_the_codec_unchanged_and_bounded() -> None:
    proof = codec.RemotingProof(PUBLISHER.access_key, "S" * 28, b"signed material")
    wire = ipb.LeaderCall.FromString(
        codec.call_pb(SendRequest(T, (_OUTGOING,)), proof).SerializeToString()
    )
    assert codec.proof_of(wire) == proof
    assert codec.proof_of(codec.call_pb(SendRequest(T, (_OUTGOING,)))) is None
    for over in (
        replace(proof, access_key="k" * (codec.MAX_PROOF_ACCESS_KEY_CHARS + 1)),
        replace(proof, signature="s" * (codec.MAX_PROOF_SIGNATURE_CHARS + 1)),
        replace(proof, signed=b"m" * (codec.MAX_PROOF_SIGNED_BYTES + 1)),
    ):
        call = codec.call_pb(SendRequest(T, (_OUTGOING,)), over)
        with pytest.raises(InvalidRequestError):
            codec.proof_of(call)
        with pytest.raises(InvalidRequestError):
            codec.request_of(call)
