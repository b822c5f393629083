"""client.admin.put_acl_rules (mqadmin copyAcl, mqcluster add-group): a rule the target
already has, the same in decision, actions and source IPs (in any order), is not written
again; a rule that differs is updated; a new resource is created."""

from __future__ import annotations

from typing import Any

from raftmq.broker.v1 import broker_pb2 as pb

from client.admin import put_acl_rules


class _Stub:
    def __init__(self) -> None:
        self.calls: list[tuple[str, list[str]]] = []

    def UpdateAcl(self, req: pb.UpdateAclRequest, timeout: float) -> Any:
        self.calls.append(("update", list(req.resources)))
        return pb.UpdateAclResponse(acl=pb.Acl(subject=req.subject))

    def CreateAcl(self, req: pb.CreateAclRequest, timeout: float) -> Any:
        self.calls.append(("create", list(req.resources)))
        return pb.CreateAclResponse(acl=pb.Acl(subject=req.subject))


def _rule(resource: str, actions: list[str], ips: list[str], decision: str = "Allow") -> Any:
    return pb.AclRule(resource=resource, actions=actions, decision=decision, source_ips=ips)


def test_identical_rules_are_not_written_again() -> None:
    have = pb.Acl(
        subject="User:carol",
        rules=[
            _rule("Topic:same", ["Sub", "Pub"], ["10.0.0.0/8", "127.0.0.1"]),
            _rule("Topic:other-ips", ["Pub"], ["10.0.0.0/8"]),
            _rule("Topic:denied", ["Pub"], []),
        ],
    )
    want = pb.Acl(
        subject="User:carol",
        rules=[
            _rule("Topic:same", ["Pub", "Sub"], ["127.0.0.1", "10.0.0.0/8"]),
            _rule("Topic:other-ips", ["Pub"], ["192.168.0.0/16"]),
            _rule("Topic:denied", ["Pub"], [], decision="Deny"),
            _rule("Topic:new", ["Pub"], []),
        ],
    )
    stub = _Stub()
    put_acl_rules(stub, want, have, 1.0)  # type: ignore[arg-type]
    assert stub.calls == [
        ("update", ["Topic:other-ips"]),
        ("update", ["Topic:denied"]),
        ("create", ["Topic:new"]),
    ]
    stub.calls.clear()
    put_acl_rules(stub, have, have, 1.0)  # type: ignore[arg-type]
    assert stub.calls == []
