"""Users and permissions on the RocketMQ 5 port: every apache.rocketmq.v2 RPC has its row in
the table (RocketMQ 5.3's mapping), the guard decides on v2 requests, and a refusal is the
method's own response with UNAUTHORIZED or FORBIDDEN in its Status."""

from __future__ import annotations

import asyncio
from pathlib import Path

from unit.test_acl_guard import ADMIN, ALICE, check, setup

from broker.components.authadmin import AuthAdmin
from broker.frontends import rpcmap
from broker.frontends.authguard import AuthGuard
from broker.frontends.v2 import stubs
from broker.frontends.v2.codes import v2_code_name
from broker.frontends.v2.interceptor import RESPONSES, refusal_response
from mqsecurity.credentials import Credentials
from rpckit.callguard import Refusal

v2, v2_service, _ = stubs.load()
SERVICE = v2_service.DESCRIPTOR.services_by_name["MessagingService"]
BOB = Credentials("bob", "bob-secret-1")
# RPCs any authenticated caller may make (RocketMQ 5.3: no resource to check).
AUTHENTICATED_ONLY = {"Heartbeat", "Telemetry", "NotifyClientTermination"}


def test_every_v2_rpc_is_in_the_table() -> None:
    methods = {f"/{SERVICE.full_name}/{m.name}" for m in SERVICE.methods}
    v2_rows = {
        m
        for m in rpcmap.RPC_NEEDS
        if m.startswith(rpcmap.V2) and not m.startswith(rpcmap.TELEMETRY)
    }
    assert methods - v2_rows == set()
    assert v2_rows - methods == set()  # no stale rows
    assert set(RESPONSES) == methods
    for method, needs in rpcmap.RPC_NEEDS.items():
        if not method.startswith(rpcmap.V2) or method.startswith(rpcmap.TELEMETRY):
            continue
        assert not isinstance(needs, str), method  # no v2 call is for admins only
        rpc = SERVICE.methods_by_name[method.rsplit("/", 1)[1]]
        request = getattr(v2_service, rpc.input_type.name)()
        if rpc.name == "SendMessage":  # an empty batch touches no topic (and is refused later)
            request.messages.add()
        wants = needs(None if rpc.client_streaming else request, "c1")
        assert bool(wants) == (rpc.name not in AUTHENTICATED_ONLY), method
        assert "status" in RESPONSES[method].DESCRIPTOR.fields_by_name, method


def test_every_telemetry_command_has_its_row() -> None:
    """Each command a client may send on its stream is a row of its own; Settings is the one
    that needs rights (Pub for a producer, Sub for a consumer)."""
    kinds = v2_service.TelemetryCommand.DESCRIPTOR.oneofs_by_name["command"].fields
    rows = {m for m in rpcmap.RPC_NEEDS if m.startswith(rpcmap.TELEMETRY)}
    assert rows == {rpcmap.TELEMETRY + f.name for f in kinds}
    assert rpcmap.V2_PRODUCER == v2.PRODUCER
    settings = rpcmap.RPC_NEEDS[rpcmap.TELEMETRY + "settings"]
    assert not isinstance(settings, str)
    producer = v2.Settings(client_type=v2.PRODUCER)
    producer.publishing.topics.add(name="orders")
    assert [str(r) + a for r, a in settings(producer, "c1")] == ["Topic:ordersPub"]
    consumer = v2.Settings(client_type=v2.SIMPLE_CONSUMER)
    consumer.subscription.group.name = "g1"
    consumer.subscription.subscriptions.add(topic=v2.Resource(name="orders"))
    assert [str(r) + a for r, a in settings(consumer, "c1")] == ["Group:g1Sub", "Topic:ordersSub"]


def _users(admin: AuthAdmin) -> None:
    async def run() -> None:
        await admin.create_user("bob", BOB.secret_key, "", "")
        await admin.put_acl(
            "User:bob", ["Topic:orders", "Group:g1"], ["Sub"], "Allow", [], update=False
        )

    asyncio.run(run())


def _v2(guard: AuthGuard, rpc: str, creds: Credentials | None, request: object) -> Refusal | None:
    return check(guard, rpcmap.V2 + rpc, creds, request)


def test_v2_decisions(tmp_path: Path) -> None:
    admin, guard = setup(tmp_path)  # alice: Pub on Topic:orders
    _users(admin)
    orders, other = v2.Resource(name="orders"), v2.Resource(name="other")
    route = v2_service.QueryRouteRequest
    for who in (ALICE, BOB, ADMIN):  # a producer (Pub) or a consumer (Sub) may look it up
        assert _v2(guard, "QueryRoute", who, route(topic=orders)) is None
    refused = _v2(guard, "QueryRoute", ALICE, route(topic=other))
    assert refused is not None and refused.authenticated
    send = v2_service.SendMessageRequest(messages=[v2.Message(topic=orders)])
    assert _v2(guard, "SendMessage", ALICE, send) is None
    assert _v2(guard, "SendMessage", BOB, send) is not None
    send.messages.add(topic=other)  # one topic of the batch not allowed: the whole call refused
    assert _v2(guard, "SendMessage", ALICE, send) is not None
    queue = v2.MessageQueue(topic=orders)
    receive = v2_service.ReceiveMessageRequest(group=v2.Resource(name="g1"), message_queue=queue)
    assert _v2(guard, "ReceiveMessage", BOB, receive) is None
    assert _v2(guard, "ReceiveMessage", ALICE, receive) is not None
    for rpc, req in (
        ("AckMessage", v2_service.AckMessageRequest),
        ("ChangeInvisibleDuration", v2_service.ChangeInvisibleDurationRequest),
    ):
        assert _v2(guard, rpc, BOB, req(group=v2.Resource(name="g1"), topic=orders)) is None
        assert _v2(guard, rpc, BOB, req(group=v2.Resource(name="g2"), topic=orders)) is not None
    heartbeat = v2_service.HeartbeatRequest()
    assert _v2(guard, "Heartbeat", ALICE, heartbeat) is None
    unknown = _v2(guard, "Heartbeat", Credentials("mallory", "mallory-secret"), heartbeat)
    assert unknown is not None and not unknown.authenticated
    assert _v2(guard, "Telemetry", None, None) is not None


def test_refusals_are_answered_in_the_body_status() -> None:
    for method, response in RESPONSES.items():
        denied = refusal_response(method, Refusal(True, "PERMISSION_DENIED", "no Pub"))
        assert isinstance(denied, response)
        assert denied.status.code == v2.Code.Value("FORBIDDEN")
        assert denied.status.message == "PERMISSION_DENIED no Pub"
        unknown = refusal_response(method, Refusal(False, "UNAUTHENTICATED", "x" * 5000))
        assert unknown.status.code == v2.Code.Value("UNAUTHORIZED")
        assert len(unknown.status.message) <= 512


def test_a_refusal_of_a_forwarded_call_keeps_its_meaning() -> None:
    """The leader's guard refuses with the error contract's codes: the v2 answer says the same
    as the v2 port's own guard would."""
    assert v2_code_name("UNAUTHENTICATED") == "UNAUTHORIZED"
    assert v2_code_name("PERMISSION_DENIED") == "FORBIDDEN"


def _sample(rpc: str) -> object:
    """A request of ``rpc`` naming topic ``t`` and group ``g`` wherever it has one."""
    method = SERVICE.methods_by_name[rpc]
    request = getattr(v2_service, method.input_type.name)()
    fields = request.DESCRIPTOR.fields_by_name
    if "topic" in fields:
        request.topic.name = "t"
    if "group" in fields:
        request.group.name = "g"
    if "message_queue" in fields:
        request.message_queue.topic.name = "t"
    if "messages" in fields:
        request.messages.add(topic=v2.Resource(name="t"))
    return request


def _shown(wants: list[tuple[object, str]]) -> str:
    return " and ".join(f"`{r} {a}`" for r, a in wants) or "an authenticated user, nothing more"


def v2_table() -> list[str]:
    """docs/SECURITY.md's v2 table, row by row, from broker/frontends/rpcmap.py."""
    rows = []
    for m in SERVICE.methods:
        method = rpcmap.V2 + m.name
        needs = rpcmap.RPC_NEEDS[method]
        assert not isinstance(needs, str)
        request = None if m.client_streaming else _sample(m.name)
        alternatives = rpcmap.ANY_OF.get(method)
        if alternatives is not None:
            shown = " **or** ".join(_shown(w) for w in alternatives(request, "c"))
        else:
            shown = _shown(needs(request, "c"))
        if m.name == "Telemetry":
            shown = (
                "an authenticated user to open the stream; each command on it is checked (below)"
            )
        if m.name == "SendMessage":
            shown += " for every topic of the batch"
        rows.append(f"| `{m.name}` | {shown} |")
    settings = rpcmap.RPC_NEEDS[rpcmap.TELEMETRY + "settings"]
    assert not isinstance(settings, str)
    producer = v2.Settings(client_type=v2.PRODUCER)
    producer.publishing.topics.add(name="t")
    rows.append(
        f"| `Telemetry` `settings`, a producer's | {_shown(settings(producer, 'c'))}"
        " for every topic it publishes |"
    )
    consumer = v2.Settings(client_type=v2.PUSH_CONSUMER)
    consumer.subscription.group.name = "g"
    consumer.subscription.subscriptions.add(topic=v2.Resource(name="t"))
    rows.append(
        f"| `Telemetry` `settings`, a consumer's | {_shown(settings(consumer, 'c'))}"
        " for every topic it subscribes |"
    )
    others = sorted(
        m[len(rpcmap.TELEMETRY) :] for m in rpcmap.RPC_NEEDS if m.startswith(rpcmap.TELEMETRY)
    )
    for kind in others:
        if kind != "settings":
            needs = rpcmap.RPC_NEEDS[rpcmap.TELEMETRY + kind]
            assert not isinstance(needs, str)
            rows.append(f"| `Telemetry` `{kind}` | {_shown(needs(None, 'c'))} |")
    return rows


def test_the_docs_v2_table_is_the_map() -> None:
    """Every row of docs/SECURITY.md's v2 table is what broker/frontends/rpcmap.py says."""
    docs = (Path(__file__).parents[2] / "docs" / "SECURITY.md").read_text()
    missing = [row for row in v2_table() if row not in docs.splitlines()]
    assert missing == [], "docs/SECURITY.md lacks (or differs in) these rows:\n" + "\n".join(
        missing
    )
