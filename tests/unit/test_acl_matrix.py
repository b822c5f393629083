"""The authorization matrix (issue #32): every row of the one RPC map (broker/frontends/rpcmap.py:
the client port's Broker and DLedgerClient calls, every v2 RPC and every Telemetry command
kind), asked of the real guard for six callers: anonymous, a user with no rules, Sub only, Pub
only, Pub and Sub with a Deny on one topic, and an admin. What each may do is computed from a
model of their rules written here (not from the guard's matcher), on requests naming topic
``t`` and group ``g``; the map is what docs/SECURITY.md shows (tests/unit/test_rmq5_acl.py)."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Callable
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import grpc
import pytest
from broker_world import world
from raftmq.broker.internal.v1 import leaderops_pb2 as ipb
from raftmq.broker.v1 import broker_pb2 as bpb
from raftmq.dledger.v1 import dledger_pb2 as dpb
from raftmq.nameserver.v1 import nameserver_pb2 as nspb
from raftmq.nameserver.v1 import nameserver_pb2_grpc as nsgrpc

from broker.app import assemble
from broker.components.applied import NodeContext
from broker.components.authadmin import AuthAdmin
from broker.components.retry import SendBackItem
from broker.components.settings import ServiceConfig
from broker.frontends import rpcmap
from broker.frontends.authguard import AuthGuard, AuthSettings
from broker.frontends.v2 import stubs
from broker.state.auth.model import GROUP, PUB, SUB, TOPIC, Resource
from broker.state.auth.secrets import SecretBox
from broker.state.message import UniqIdGenerator
from client.errors import MQClientError
from client.message import Message
from dledger.server.peer_service import PeerServicer
from mqdashboard.reader import GroupReader, TopicSpec
from mqdashboard.web import ACTION_CALLS, ACTIONS
from mqsecurity import pki
from mqsecurity.channels import ClientSecurity
from mqsecurity.credentials import Credentials
from mqsecurity.membersig import MemberSigner, MemberVerifier
from mqsecurity.signing import signed_metadata
from nameserver.routes import RouteTable
from nameserver.server import NameServerServicer, registration_from_pb
from rpckit.callguard import GuardInterceptor

v2, v2_service, _ = stubs.load()
BOX = SecretBox(bytes(range(32)))
IDS = UniqIdGenerator(ip="10.0.0.7", pid=13, instance_hash=7)
PEER = "ipv4:127.0.0.1:40000"
Wants = list[tuple[Resource, str]]


def _none(wants: Wants) -> bool:
    return not wants


def _only(actions: set[str]) -> Callable[[Wants], bool]:
    return lambda wants: all(r.type in (TOPIC, GROUP) and a in actions for r, a in wants)


def _deny_t(wants: Wants) -> bool:
    return _only({PUB, SUB})(wants) and not any(r == Resource(TOPIC, "t") for r, _ in wants)


# caller -> (credentials, user type, rules, what it may do: a model of its rules)
CALLERS: dict[str, tuple[Credentials | None, str, list[tuple[list[str], list[str], str]], Any]] = {
    "anonymous": (None, "", [], None),
    "nobody": (Credentials("nobody", "nobody-secret-1"), "", [], _none),
    "sub": (Credentials("sub", "sub-secret-1"), "", [(["Topic:*", "Group:*"], ["Sub"], "Allow")],
            _only({SUB})),
    "pub": (Credentials("pub", "pub-secret-1"), "", [(["Topic:*"], ["Pub"], "Allow")],
            _only({PUB})),
    "deny": (
        Credentials("deny", "deny-secret-1"),
        "",
        [(["Topic:*", "Group:*"], ["Pub", "Sub"], "Allow"), (["Topic:t"], ["Pub", "Sub"], "Deny")],
        _deny_t,
    ),
    "admin": (Credentials("admin", "admin-secret-1"), "Super", [], lambda wants: True),
}  # fmt: skip


def _guard(tmp_path: Path) -> AuthGuard:
    node, sm, _, _ = world(tmp_path)
    admin = AuthAdmin(NodeContext(node, sm, ServiceConfig("127.0.0.1", 10911)), BOX)  # type: ignore[arg-type]

    async def users() -> None:
        for name, (creds, kind, rules, _) in CALLERS.items():
            if creds is None:
                continue
            await admin.create_user(creds.access_key, creds.secret_key, kind, "")
            for resources, actions, decision in rules:
                subject = f"User:{name}"
                await admin.put_acl(subject, resources, actions, decision, [], update=False)

    asyncio.run(users())
    guard = AuthGuard(sm, AuthSettings(True, True, cluster_name="c1"), BOX)
    guard.topic_at = lambda position: "t"
    guard.node_world = (node, sm)  # type: ignore[attr-defined]  # for a servicer of the same node
    return guard


def _fill(request: Any) -> Any:
    """``request`` naming topic ``t`` and group ``g`` wherever it has such a field."""
    fields = request.DESCRIPTOR.fields_by_name
    for name in ("topic", "consumer_group", "group", "producer_group"):
        field = fields.get(name)
        if field is None:
            continue
        value = "t" if name == "topic" else "g"
        if field.type == field.TYPE_STRING:
            setattr(request, name, value)
        elif "name" in field.message_type.fields_by_name:  # a v2 Resource
            getattr(request, name).name = value
        elif "topic_name" in field.message_type.fields_by_name:  # CreateTopic's TopicConfig
            getattr(request, name).topic_name = value
    if "message_queue" in fields:
        request.message_queue.topic.name = "t"
    if "config" in fields:
        request.config.group = "g"
    if request.DESCRIPTOR.full_name == "apache.rocketmq.v2.SendMessageRequest":
        request.messages.add(topic=v2.Resource(name="t"))
    return request


def _rows() -> list[tuple[str, Any]]:
    """(method, a request naming t and g) for every row of the map."""
    services = [
        (rpcmap.BROKER, bpb, bpb.DESCRIPTOR.services_by_name["Broker"]),
        (rpcmap.DLEDGER, dpb, dpb.DESCRIPTOR.services_by_name["DLedgerClient"]),
        (rpcmap.V2, v2_service, v2_service.DESCRIPTOR.services_by_name["MessagingService"]),
    ]
    rows = []
    for prefix, module, service in services:
        for m in service.methods:
            request = None if m.client_streaming else _fill(getattr(module, m.input_type.name)())
            rows.append((prefix + m.name, request))
    for kind in ipb.LeaderCall.DESCRIPTOR.oneofs_by_name["op"].fields:  # each forwarded op
        call = ipb.LeaderCall()
        _fill(getattr(call, kind.name))
        rows.append((rpcmap.LEADER_OPS + "Call", call))
    kinds = v2_service.TelemetryCommand.DESCRIPTOR.oneofs_by_name["command"].fields
    for kind in kinds:
        if kind.name == "settings":
            for client_type in (v2.PRODUCER, v2.PUSH_CONSUMER):
                s = v2.Settings(client_type=client_type)
                s.publishing.topics.add(name="t")
                s.subscription.group.name = "g"
                s.subscription.subscriptions.add(topic=v2.Resource(name="t"))
                rows.append((rpcmap.TELEMETRY + "settings", s))
        else:
            rows.append((rpcmap.TELEMETRY + kind.name, v2_service.TelemetryCommand()))
    return rows


def _expected(may: Any, method: str, request: Any) -> bool:
    needs = rpcmap.RPC_NEEDS[method]
    if isinstance(needs, str):  # SUPER_ONLY
        return may is CALLERS["admin"][3]
    alternatives = rpcmap.ANY_OF.get(method)
    options = alternatives(request, "c1") if alternatives else [needs(request, "c1")]
    stored = rpcmap.STORED_MESSAGES.get(method)
    extra = [rpcmap.topic("t", SUB) for _ in stored(request)] if stored else []
    return any(bool(may(list(wants) + extra)) for wants in options)


def test_every_row_for_every_caller(tmp_path: Path) -> None:
    guard = _guard(tmp_path)
    rows = _rows()
    # Every row; Settings as producer and consumer; a leader call once per operation.
    assert len(rows) == len(rpcmap.RPC_NEEDS) + 1 + len(rpcmap.LEADER_OP_NEEDS) - 1
    wrong = []
    for caller, (creds, _, _, may) in CALLERS.items():
        for method, request in rows:
            metadata = dict(signed_metadata(creds)) if creds is not None else {}
            refusal = guard.check(method, metadata, PEER, request)
            if creds is None:
                if refusal is None or refusal.authenticated:
                    wrong.append(f"{caller} {method}: {refusal}")
                continue
            allowed = refusal is None
            if allowed != _expected(may, method, request):
                wrong.append(f"{caller} {method}: allowed={allowed} ({refusal})")
    assert wrong == [], "\n".join(wrong)


def _v1_sample(method: str) -> Any:
    """A request of ``method`` (client port) naming topic ``t`` and group ``g`` everywhere,
    including its subscriptions and queues."""
    service, _, name = method.rpartition("/")
    module = bpb if service == rpcmap.BROKER.rstrip("/") else dpb
    descriptor = module.DESCRIPTOR.services_by_name[service.rsplit(".", 1)[1]]
    request = _fill(getattr(module, descriptor.methods_by_name[name].input_type.name)())
    fields = request.DESCRIPTOR.fields_by_name
    if "subscriptions" in fields:
        request.subscriptions.add(topic="t")
    if "topics" in fields:
        request.topics.append("t")
    for repeated in ("queues", "locked_queues"):
        if repeated in fields:
            getattr(request, repeated).add(topic="t")
    return request


# Calls whose needs depend on the request: (what the row says of each form, its request).
_V1_FORMS: dict[str, list[tuple[str, Any]]] = {
    rpcmap.BROKER + "ViewMessage": [
        ("by `msg_id` with a topic", bpb.ViewMessageRequest(msg_id="x", topic="t")),
        ("by `offset_msg_id`", bpb.ViewMessageRequest(offset_msg_id="x")),
    ],
    rpcmap.BROKER + "GetProducerConnections": [
        ("for one group", bpb.GetProducerConnectionsRequest(producer_group="g", topic="t")),
        ("for every producer", bpb.GetProducerConnectionsRequest()),
    ],
    rpcmap.BROKER + "UpdateSubscriptionGroup": [
        ("to create or replace a config", bpb.UpdateSubscriptionGroupRequest(
            config=bpb.SubscriptionGroup(group="g"))),
        ("with `create_only` (the defaults)", bpb.UpdateSubscriptionGroupRequest(
            config=bpb.SubscriptionGroup(group="g"), create_only=True)),
    ],
}  # fmt: skip


def _v1_needs(method: str, request: Any) -> str:
    needs = rpcmap.RPC_NEEDS[method]
    if isinstance(needs, str):
        return "a Super user"
    shown = " and ".join(f"`{r} {a}`" for r, a in needs(request, "c"))
    if method in rpcmap.STORED_MESSAGES:
        shown += " and `Sub` on the topic of each stored message it names"
    return shown or "an authenticated user, nothing more"


def v1_table() -> list[str]:
    """The beginnings of docs/SECURITY.md's client-port rows (``| `RPC` | needs |``, then a
    note), one per method of the Broker and DLedgerClient services, from the one map."""
    rows = []
    for prefix, module, service in (
        (rpcmap.BROKER, bpb, "Broker"),
        (rpcmap.DLEDGER, dpb, "DLedgerClient"),
    ):
        for m in module.DESCRIPTOR.services_by_name[service].methods:
            method = prefix + m.name
            forms = _V1_FORMS.get(method) or [("", _v1_sample(method))]
            shown = "; ".join(
                f"{_v1_needs(method, request)} {label}".rstrip() for label, request in forms
            )
            name = m.name if service == "Broker" else f"DLedgerClient/{m.name}"
            rows.append(f"| `{name}` | {shown} |")
    return rows


def test_the_docs_v1_table_is_the_map() -> None:
    """docs/SECURITY.md's client-port table has exactly one row per method of the map, and
    each row's needs are what broker/frontends/rpcmap.py says."""
    docs = (Path(__file__).parents[2] / "docs" / "SECURITY.md").read_text()
    section = docs.split("### What each RPC needs", 1)[1].split("\n### ", 1)[0]
    lines = [line for line in section.splitlines() if line.startswith("| `")]
    expected = v1_table()
    missing = [row for row in expected if not any(line.startswith(row) for line in lines)]
    assert missing == [], "docs/SECURITY.md lacks (or differs in) these rows:\n" + "\n".join(
        missing
    )
    assert len(lines) == len(expected), "rows the map does not have:\n" + "\n".join(
        line for line in lines if not any(line.startswith(row) for row in expected)
    )


# ------------------------------------------------------------------ the other ports
# docs/SECURITY.md, "The other ports": who may make each call of the peer port, the NameServer
# and the dashboard's actions. The peer port and the NameServer's registrations take no user at
# all (a member certificate decides), so every one of the six callers is refused there, and a
# member (the control) is served; the NameServer's reads are open to anyone who reaches the port;
# a dashboard action is the client-port calls it makes (mqdashboard.web.ACTION_CALLS), each
# decided by the one map for the credentials typed on its page.

MEMBER_OF_GROUP = "a member of the group (its certificate), never a user"
MEMBER_NAMED = "the member the request names (signed with its certificate), never a user"
ANYONE = "anyone who reaches the port"
MEMBER_GROUP, NODE, SELF = "g0", "n1", "n0"


def _other_ports_rows() -> dict[tuple[str, str], str]:
    """(port, call) -> who may, as docs/SECURITY.md's table of the other ports says."""
    docs = (Path(__file__).parents[2] / "docs" / "SECURITY.md").read_text()
    section = docs.split("### The other ports", 1)[1].split("\n#", 1)[0]
    rows = {}
    for line in section.splitlines():
        cells = [c.strip() for c in line.strip("|").split("|")]
        if len(cells) == 3 and cells[1].startswith("`"):
            rows[(cells[0], cells[1].split("`")[1])] = cells[2]
    return rows


def _action_needs(action: str) -> str:
    """The docs' words for what a dashboard action needs, from the one map."""
    wants: list[str] = []
    for method in ACTION_CALLS[action]:
        needs = rpcmap.RPC_NEEDS[method]
        assert not isinstance(needs, str)
        for r, a in needs(_action_request(method), "c1"):
            if f"`{r} {a}`" not in wants:
                wants.append(f"`{r} {a}`")
    return " and ".join(wants) + ", as the acting user (keys typed on its page, or logged in)"


def _action_request(method: str) -> Any:
    """The request ``method`` makes in an action on group ``g`` whose dead letters came from
    topic ``t``."""
    if method.endswith("/PullMessage"):
        return bpb.PullMessageRequest(consumer_group="g", topic="%DLQ%g")
    return _fill(getattr(bpb, method.rsplit("/", 1)[1] + "Request")())


def test_the_docs_table_of_the_other_ports_is_every_call() -> None:
    rows = _other_ports_rows()
    peer = dpb.DESCRIPTOR.services_by_name["DLedgerPeer"]
    names = nspb.DESCRIPTOR.services_by_name["NameServer"]
    expected = {("peer", m.name): MEMBER_OF_GROUP for m in peer.methods}
    for m in names.methods:
        registration = m.name in ("RegisterBroker", "UnregisterBroker")
        expected[("NameServer", m.name)] = MEMBER_NAMED if registration else ANYONE
    for action in ACTIONS:
        expected[("dashboard", action)] = _action_needs(action)
    assert rows == expected


class _Aborted(Exception):
    pass


class _PeerContext:
    """What the peer servicer reads of a call: the TLS peer's certificates and the headers."""

    def __init__(self, pems: list[bytes], metadata: list[tuple[str, str]]) -> None:
        self.pems, self.metadata = pems, metadata

    def auth_context(self) -> dict[str, list[bytes]]:
        return {"x509_pem_cert": self.pems} if self.pems else {}

    def invocation_metadata(self) -> list[tuple[str, str]]:
        return self.metadata

    def peer(self) -> str:
        return PEER

    async def abort(self, code: Any, details: str, trailing: Any = None) -> None:
        raise _Aborted(f"{code} {details}")


async def _no_messages() -> AsyncIterator[Any]:
    return
    yield  # an async generator that yields nothing


def _peer_call(servicer: Any, method: str, context: _PeerContext) -> bool:
    """Whether the real peer servicer serves ``method`` for ``context`` (False: refused)."""
    if method == "Join":
        call = servicer.Join(dpb.JoinRequest(group=MEMBER_GROUP, node_id=NODE), context)
    elif method == "Holdings":
        call = servicer.Holdings(dpb.HoldingsRequest(group=MEMBER_GROUP), context)
    elif method == "PeerSocket":
        call = servicer.PeerSocket(dpb.PeerSocketRequest(group=MEMBER_GROUP), context)
    else:
        call = getattr(servicer, method)(_no_messages(), context)
    try:
        asyncio.run(call)
    except _Aborted:
        return False
    return True


@pytest.fixture(scope="module")
def member(tmp_path_factory: pytest.TempPathFactory) -> tuple[bytes, Any]:
    """(the CA's PEM, the member certificate files of node n1 of group g0)."""
    root = tmp_path_factory.mktemp("pki")
    ca = pki.create_authority(str(root))
    files = pki.issue_member(ca, str(root), MEMBER_GROUP, NODE, ["127.0.0.1"])
    return Path(ca.cert_path).read_bytes(), files


def test_the_peer_port_serves_members_only(member: tuple[bytes, Any]) -> None:
    _, files = member
    node = SimpleNamespace(
        cfg=SimpleNamespace(tls=object(), group=MEMBER_GROUP, self_id=SELF),
        accepts_peer=lambda node_id: node_id in (NODE, "n2"),
        on_peer_message=lambda sender, message: None,
        peer_socket_offer=lambda: (0, 0),
        join=lambda request: asyncio.sleep(0, dpb.JoinResponse()),
        snapshots_in=SimpleNamespace(
            receive=lambda sender, chunks: asyncio.sleep(0, dpb.SnapshotReply())
        ),
        core=SimpleNamespace(
            term=1,
            repairing=False,
            repair_target=0,
            leader_id=None,
            commit_index=0,
            # Holdings answers the committed configuration too (dledger.server.confrepair).
            conf_state_at=lambda index: SimpleNamespace(encode=lambda: b"{}", index=0),
        ),
        store=SimpleNamespace(
            first_index=lambda: 1,
            last_index=lambda: 0,
            term_at=lambda index: 0,
            chain_at=lambda index: 0,
            damage=None,
        ),
    )
    servicer = PeerServicer(node)  # type: ignore[arg-type]
    claims = [("x-raftmq-group", MEMBER_GROUP), ("x-raftmq-from", NODE)]
    pem = Path(files.cert_path).read_bytes()
    wrong = []
    for m in dpb.DESCRIPTOR.services_by_name["DLedgerPeer"].methods:
        assert _peer_call(servicer, m.name, _PeerContext([pem], claims)), m.name
        for caller, (creds, _, _, _) in CALLERS.items():
            signed = list(signed_metadata(creds)) if creds is not None else []
            if _peer_call(servicer, m.name, _PeerContext([], signed + claims)):
                wrong.append(f"{caller} peer {m.name}: served")
    assert wrong == []


def test_the_nameserver_registrations_take_members_and_reads_anyone(
    member: tuple[bytes, Any],
) -> None:
    ca_pem, files = member
    table = RouteTable()
    table.register(registration_from_pb(_registration("127.0.0.1:1", NODE)))
    # Another member stays registered: the reads find a route whatever n1 does.
    table.register(registration_from_pb(_registration("127.0.0.1:3", "n2")))
    servicer = NameServerServicer(table, MemberVerifier(ca_pem))
    signer = MemberSigner(files.cert_path, files.key_path)
    requests = {
        "RegisterBroker": _registration("127.0.0.1:2", NODE),
        "UnregisterBroker": nspb.UnregisterBrokerRequest(
            cluster="c1", broker_name=MEMBER_GROUP, node_id=NODE
        ),
        "GetRouteInfoByTopic": nspb.GetRouteInfoByTopicRequest(topic="t"),
        "GetClusterInfo": nspb.GetClusterInfoRequest(),
        "GetAllTopicList": nspb.GetAllTopicListRequest(),
    }
    rows = _other_ports_rows()

    async def body() -> list[str]:
        server = grpc.aio.server()
        nsgrpc.add_NameServerServicer_to_server(servicer, server)
        port = server.add_insecure_port("127.0.0.1:0")
        await server.start()
        wrong = []
        try:
            async with grpc.aio.insecure_channel(f"127.0.0.1:{port}") as channel:
                for m in nspb.DESCRIPTOR.services_by_name["NameServer"].methods:
                    request = requests[m.name]
                    call = channel.unary_unary(
                        f"/raftmq.nameserver.v1.NameServer/{m.name}",
                        request_serializer=lambda r: r.SerializeToString(deterministic=True),
                        response_deserializer=lambda b: b,
                    )
                    path = f"/raftmq.nameserver.v1.NameServer/{m.name}"
                    body = request.SerializeToString(deterministic=True)
                    assert await _ns_allowed(call, request, signer.metadata(path, body)), m.name
                    anyone = rows[("NameServer", m.name)] == ANYONE
                    for caller, (creds, _, _, _) in CALLERS.items():
                        signed = tuple(signed_metadata(creds)) if creds is not None else ()
                        if await _ns_allowed(call, request, signed) != anyone:
                            wrong.append(f"{caller} NameServer {m.name}: allowed={not anyone}")
        finally:
            await server.stop(None)
        return wrong

    assert asyncio.run(body()) == []


def _registration(addr: str, node_id: str) -> Any:
    topic = nspb.TopicConfig(topic_name="t", read_queue_nums=1, write_queue_nums=1, perm=6)
    return nspb.RegisterBrokerRequest(
        cluster="c1",
        broker_name=MEMBER_GROUP,
        node_id=node_id,
        role=nspb.LEADER,
        client_addr=addr,
        term=1,
        topics=[topic],
        heartbeat_period_ms=30_000,
    )


async def _ns_allowed(call: Any, request: Any, metadata: Any) -> bool:
    try:
        await call(request, metadata=metadata, timeout=5)
    except grpc.aio.AioRpcError as exc:
        if exc.code() in (grpc.StatusCode.UNAUTHENTICATED, grpc.StatusCode.PERMISSION_DENIED):
            return False
        raise
    return True


class _Recorder(grpc.aio.ServerInterceptor):  # type: ignore[misc]
    """The methods called on a server, in order."""

    def __init__(self) -> None:
        self.methods: list[str] = []

    async def intercept_service(self, continuation: Any, details: Any) -> Any:
        self.methods.append(details.method)
        return await continuation(details)


async def _dashboard_group(
    guard: AuthGuard, recorder: _Recorder
) -> tuple[list[grpc.aio.Server], str]:
    """One node behind the real ``guard`` (six callers' users), topic t, a dead letter of
    group g from t, and a NameServer routing both topics to it, on a port of its own with
    its reads open to anyone (as the real NameServer's); the NameServer's address."""
    node, sm = guard.node_world  # type: ignore[attr-defined]
    broker = assemble(node, sm, ServiceConfig("127.0.0.1", 10911), secret_box=BOX).servicer
    await broker.topics.upsert("t", 1, 1, 6)
    [sent] = await broker.sender.send(
        "t", [bpb.Message(queue_id=0, body=b"dead", msg_id=IDS.next_id())]
    )
    # Straight to g's dead-letter topic (a delay level below 0), as a consumer's send-back.
    await broker.retries.send_back("g", [SendBackItem(sent.position, sent.uniq_id)], -1)
    server = grpc.aio.server(interceptors=[recorder, GuardInterceptor(guard)])
    port = server.add_insecure_port("127.0.0.1:0")
    addr = f"127.0.0.1:{port}"
    broker.register(server)
    table = RouteTable()
    registration = _registration(addr, SELF)
    registration.topics.add(topic_name="%DLQ%g", read_queue_nums=1, write_queue_nums=1, perm=6)
    table.register(registration_from_pb(registration))
    namesrv = grpc.aio.server()
    ns_port = namesrv.add_insecure_port("127.0.0.1:0")
    nsgrpc.add_NameServerServicer_to_server(NameServerServicer(table), namesrv)
    await server.start()
    await namesrv.start()
    return [server, namesrv], f"127.0.0.1:{ns_port}"


def _act(reader: GroupReader, action: str, creds: Credentials | None) -> bool:
    """Whether the dashboard's ``action`` on group g (topic t) succeeds as ``creds``."""
    security = ClientSecurity(credentials=creds)
    try:
        if action == "resend":
            resent = reader.resend_dlq("g", "", security)
            assert len(resent) == 1
        elif action == "reset":
            reader.reset_offset("g", "t", 0, security)
        else:
            _operate(reader, action, security)
    except MQClientError as exc:
        assert exc.code in ("UNAUTHENTICATED", "PERMISSION_DENIED"), exc
        return False
    return True


def _operate(reader: GroupReader, action: str, security: ClientSecurity) -> None:
    """The dashboard's other actions on topic t and group g (``ACTIONS`` runs the deleting
    ones last: an admin's delete succeeds once, and the callers before it are refused)."""
    if action == "send":
        reader.send_test(Message("t", b"test"), security)
    elif action == "topic-update":
        assert reader.update_topic(TopicSpec("t", 1, 6, "NORMAL"), "", security) == ["g0"]
    elif action == "topic-delete":
        assert reader.delete_topic("t", "", security) == ["g0"]
    elif action == "group-update":
        reader.update_group(bpb.SubscriptionGroup(group="g"), "", security)
    else:
        assert action == "group-delete", action
        assert reader.delete_group("g", "", security) == ["g0"]


def test_the_dashboard_actions_for_every_caller(tmp_path: Path) -> None:
    recorder = _Recorder()
    guard = _guard(tmp_path)

    async def body() -> list[str]:
        servers, namesrv_addr = await _dashboard_group(guard, recorder)
        reader = GroupReader(namesrv_addr)
        wrong = []
        try:
            for action in ACTIONS:
                for caller, (creds, _, _, may) in CALLERS.items():
                    recorder.methods.clear()
                    done = await asyncio.to_thread(_act, reader, action, creds)
                    calls = [_action_request(m) for m in ACTION_CALLS[action]]
                    expected = may is not None and all(
                        _expected(may, m, r)
                        for m, r in zip(ACTION_CALLS[action], calls, strict=True)
                    )
                    if done != expected:
                        wrong.append(f"{caller} dashboard {action}: done={done}")
                    if caller == "admin":  # every call made: the declared ones (and routes)
                        made = {m for m in recorder.methods if m.startswith(rpcmap.BROKER)}
                        assert made == set(ACTION_CALLS[action]), (action, made)
        finally:
            reader.close()
            for server in servers:
                await server.stop(None)
        return wrong

    assert asyncio.run(body()) == []


def test_the_dashboard_login_authenticates_and_needs_no_permission(tmp_path: Path) -> None:
    """A login is accepted for every user the group knows, whatever it may do (a user without
    rules: PERMISSION_DENIED is an authenticated answer), and refused for a wrong SecretKey,
    an unknown AccessKey and no credentials at all."""
    guard = _guard(tmp_path)

    async def body() -> dict[str, str]:
        servers, namesrv_addr = await _dashboard_group(guard, _Recorder())
        reader = GroupReader(namesrv_addr)
        answers: dict[str, str] = {}
        tries = {
            **{name: creds for name, (creds, _, _, _) in CALLERS.items()},
            "wrong secret": Credentials("admin", "not-the-secret-1"),
            "unknown user": Credentials("stranger", "stranger-secret-1"),
        }
        try:
            for name, creds in tries.items():
                security = ClientSecurity(credentials=creds)
                try:
                    await asyncio.to_thread(reader.check_user, security)
                    answers[name] = "ok"
                except MQClientError as exc:
                    answers[name] = exc.status
        finally:
            reader.close()
            for server in servers:
                await server.stop(None)
        return answers

    answers = asyncio.run(body())
    refused = {"anonymous", "wrong secret", "unknown user"}
    assert answers == {n: "UNAUTHENTICATED" if n in refused else "ok" for n in answers}
