"""``QueryAssignment``'s answer (:func:`broker.frontends.v2.consuming.assignments`): a push
consumer is assigned each queue once per member, each under a broker name of its own, so that
the official clients (which key their receive loops by topic, broker name and queue id) receive
through every member and one member's death stops only its own loops (docs/RMQ5.md, "Routes and
a dying node")."""

from __future__ import annotations

from typing import Any

from broker.frontends.v2 import stubs
from broker.frontends.v2.consuming import assignments
from broker.state.subgroups import SubGroup

v2, _v2_service, _v2_grpc = stubs.load()

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
