"""The authorization matrix (issue #32): every row of the one RPC map (broker/auth/rpcmap.py:
the client port's Broker and DLedgerClient calls, every v2 RPC and every Telemetry command
kind), asked of the real guard for six callers: anonymous, a user with no rules, Sub only, Pub
only, Pub and Sub with a Deny on one topic, and an admin. What each may do is computed from a
model of their rules written here (not from the guard's matcher), on requests naming topic
``t`` and group ``g``; the map is what docs/SECURITY.md shows (tests/unit/test_rmq5_acl.py)."""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from pathlib import Path
from typing import Any

from broker_world import world
from raftmq.broker.v1 import broker_pb2 as bpb
from raftmq.dledger.v1 import dledger_pb2 as dpb

from broker.applied import NodeContext
from broker.auth import rpcmap
from broker.auth.admin import AuthAdmin
from broker.auth.guard import AuthGuard, AuthSettings
from broker.auth.model import GROUP, PUB, SUB, TOPIC, Resource
from broker.auth.secrets import SecretBox
from broker.rmq5 import stubs
from broker.settings import ServiceConfig
from mqsecurity.credentials import Credentials
from mqsecurity.signing import signed_metadata

v2, v2_service, _ = stubs.load()
BOX = SecretBox(bytes(range(32)))
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
    return guard


def _fill(request: Any) -> Any:
    """``request`` naming topic ``t`` and group ``g`` wherever it has such a field."""
    fields = request.DESCRIPTOR.fields_by_name
    for name in ("topic", "consumer_group", "group"):
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
    assert len(rows) == len(rpcmap.RPC_NEEDS) + 1  # every row; Settings as producer and consumer
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
    each row's needs are what broker/auth/rpcmap.py says."""
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
