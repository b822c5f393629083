"""``QueryAssignment``'s answer (:func:`broker.frontends.v2.consuming.assignments`): a push
consumer is assigned each queue once per member, each under a broker name of its own, so that
the official clients (which key their receive loops by topic, broker name and queue id) receive
through every member and one member's death stops only its own loops (docs/RMQ5.md, "Routes and
a dying node"); a Python client in plaintext gets every member in one Endpoints instead, so its
acks, retried forever through the Endpoints a message came by, reach a member that lives."""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

from broker_world import world

from broker.app import assemble
from broker.frontends.internal.forwarder import Forwarder
from broker.frontends.v2 import stubs
from broker.frontends.v2.consuming import assignments, pooled_endpoints
from broker.frontends.v2.service import MessagingServicer, V2Config
from broker.state.subgroups import SubGroup

v2, v2_service, _v2_grpc = stubs.load()

MEMBERS = ("127.0.0.1:8081", "127.0.0.1:8082", "127.0.0.1:8083")


def _endpoints(addr: str) -> Any:
    host, port = addr.rsplit(":", 1)
    return v2.Endpoints(scheme=v2.IPv4, addresses=[v2.Address(host=host, port=int(port))])


def _rows(found: list[Any]) -> list[tuple[int, str, str]]:
    """(queue id, broker name, the one address) of each assignment, in order."""
    out = []
    for a in found:
        mq = a.message_queue
        (address,) = mq.broker.endpoints.addresses
        out.append((mq.id, mq.broker.name, f"{address.host}:{address.port}"))
    return out


def test_a_normal_group_is_assigned_through_every_member() -> None:
    topic = v2.Resource(name="T")
    found = assignments(topic, SubGroup("G"), "broker-a", [_endpoints(m) for m in MEMBERS], [0, 1])
    assert _rows(found) == [(-1, f"broker-a@{m}", m) for m in MEMBERS]
    assert all(a.message_queue.permission == v2.READ for a in found)
    assert all(list(a.message_queue.accept_message_types) == [v2.NORMAL] for a in found)
    # The clients' loop keys (topic, broker name, queue id) are distinct: one loop per member.
    keys = {
        (a.message_queue.topic.name, a.message_queue.broker.name, a.message_queue.id) for a in found
    }
    assert len(keys) == len(MEMBERS)


def test_a_fifo_group_gets_each_readable_queue_through_every_member() -> None:
    topic = v2.Resource(name="T")
    members = [_endpoints(m) for m in MEMBERS[:2]]
    found = assignments(topic, SubGroup("G", fifo=True), "broker-a", members, [0, 1])
    assert _rows(found) == [(q, f"broker-a@{m}", m) for q in (0, 1) for m in MEMBERS[:2]]
    assert all(list(a.message_queue.accept_message_types) == [v2.FIFO] for a in found)


def test_one_endpoint_keeps_the_group_name() -> None:
    found = assignments(
        v2.Resource(name="T"), SubGroup("G"), "broker-a", [_endpoints(MEMBERS[0])], [0]
    )
    assert _rows(found) == [(-1, "broker-a", MEMBERS[0])]


# What a Python push consumer's QueryAssignment reaches the node with (its x-mq-language
# header) and what the Node.js client sends; the clients' own values.
PYTHON = ("x-mq-language", "PYTHON")
NODE_JS = ("x-mq-language", "HTTP")


class Context:
    """What QueryAssignment reads of its gRPC call: the headers and the connection's
    security (gRPC's auth context: ``ssl`` over TLS, ``insecure`` in plaintext)."""

    def __init__(self, headers: tuple[tuple[str, str], ...], security: bytes) -> None:
        self.headers = headers
        self.security = security

    def invocation_metadata(self) -> tuple[tuple[str, str], ...]:
        return self.headers

    def auth_context(self) -> dict[str, list[bytes]]:
        return {"transport_security_type": [self.security]}


def _query(tmp_path: Path, *headers: tuple[str, str], security: bytes = b"insecure") -> Any:
    """QueryAssignment of a normal group for topic T on a node of a 3-member group (the
    members: the addresses the client came by, as without a NameServer)."""
    node, sm, _topics, applied = world(tmp_path)
    parts = assemble(node, sm, applied.ctx.cfg)  # type: ignore[arg-type]
    cfg = V2Config("broker-a", "127.0.0.1", 8081, 1 << 20)
    forwarder = Forwarder(node, parts.leader_ops)  # type: ignore[arg-type]
    servicer = MessagingServicer(
        node,  # type: ignore[arg-type]
        parts.topics,
        parts.applied,
        parts.subgroups,
        forwarder,
        cfg,
    )
    request = v2_service.QueryAssignmentRequest(
        topic=v2.Resource(name="T"),
        group=v2.Resource(name="G"),
        endpoints=v2.Endpoints(
            scheme=v2.IPv4,
            addresses=[v2.Address(host="127.0.0.1", port=int(m.split(":")[1])) for m in MEMBERS],
        ),
    )

    async def run() -> Any:
        await parts.topics.upsert("T", 2, 2, 6)
        return await servicer.QueryAssignment(request, Context(headers, security))  # type: ignore[arg-type]

    answer = asyncio.run(run())
    assert answer.status.code == v2.OK, answer.status
    return answer


def _addresses(found: Any) -> list[tuple[str, list[str]]]:
    """(broker name, the Endpoints' addresses) of each assignment."""
    return [
        (
            a.message_queue.broker.name,
            [f"{x.host}:{x.port}" for x in a.message_queue.broker.endpoints.addresses],
        )
        for a in found.assignments
    ]


def test_a_python_client_in_plaintext_acks_through_any_member(tmp_path: Path) -> None:
    """The Python push consumer acks a message through the Endpoints it came by and retries
    a failed ack forever inside a consumption thread: its assignments list every member in
    one Endpoints (gRPC's pick-first), so a retried ack reaches a member that lives."""
    found = _query(tmp_path, PYTHON)
    assert _addresses(found) == [("broker-a", list(MEMBERS))]


def test_other_clients_and_tls_keep_one_member_per_endpoints(tmp_path: Path) -> None:
    per_member = [(f"broker-a@{m}", [m]) for m in MEMBERS]
    assert _addresses(_query(tmp_path / "node", NODE_JS)) == per_member
    assert _addresses(_query(tmp_path / "tls", PYTHON, security=b"ssl")) == per_member
    assert _addresses(_query(tmp_path / "none")) == per_member


def test_members_of_mixed_schemes_are_not_pooled() -> None:
    names = [
        v2.Endpoints(scheme=v2.DOMAIN_NAME, addresses=[v2.Address(host="a.example", port=1)]),
        _endpoints(MEMBERS[0]),
    ]
    assert pooled_endpoints(names) == names
    assert pooled_endpoints(names[1:]) == names[1:]
