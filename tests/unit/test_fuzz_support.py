"""The fuzz suite's own parts (tests/fuzz_support.py): it covers every RPC, its generated
requests serialize and stay bounded, and its answer check flags what it must."""

from __future__ import annotations

from typing import Any

import grpc
from fuzz_support import (
    BROKER_RPCS,
    DLEDGER_RPCS,
    HUGE_BYTES,
    LEADER_OPS_RPCS,
    MANY,
    MAX_REQUEST_BYTES,
    NAMESERVER_RPCS,
    NO_ERROR_INFO,
    SC,
    Findings,
    answered_detail,
    messages,
)
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from raftmq.broker.internal.v1 import leaderops_pb2
from raftmq.broker.v1 import broker_pb2
from raftmq.dledger.v1 import dledger_pb2
from raftmq.nameserver.v1 import nameserver_pb2

from rpckit.status import RpcFailure

ALL = [*BROKER_RPCS, *LEADER_OPS_RPCS, *DLEDGER_RPCS, *NAMESERVER_RPCS]


def test_every_unary_rpc_of_the_client_port_and_nameserver_services_is_fuzzed() -> None:
    expected = {
        f"{svc.full_name}/{m.name}"
        for fd, name in (
            (broker_pb2.DESCRIPTOR, "Broker"),
            (leaderops_pb2.DESCRIPTOR, "LeaderOps"),
            (dledger_pb2.DESCRIPTOR, "DLedgerClient"),
            (nameserver_pb2.DESCRIPTOR, "NameServer"),
        )
        for svc in [fd.services_by_name[name]]
        for m in svc.methods
    }
    assert {r.path.lstrip("/") for r in ALL} == expected
    assert all(SC.UNKNOWN not in r.allowed and SC.INTERNAL not in r.allowed for r in ALL)


@settings(max_examples=400, derandomize=True, database=None, deadline=None,
          suppress_health_check=list(HealthCheck))  # fmt: skip
@given(st.sampled_from(ALL).flatmap(lambda r: messages(r.request)))
def test_generated_requests_serialize_and_are_bounded(msg: object) -> None:
    data = msg.SerializeToString()  # type: ignore[attr-defined]
    assert len(data) < MAX_REQUEST_BYTES
    assert type(msg).FromString(data) == msg  # type: ignore[attr-defined]
    assert HUGE_BYTES * 8 < MAX_REQUEST_BYTES and MANY > 1000


def test_findings_flag_undocumented_statuses_and_bad_details() -> None:
    f = Findings()
    allowed = frozenset({SC.OK, SC.INVALID_ARGUMENT, SC.RESOURCE_EXHAUSTED})
    f.check("X.Ok", allowed, "req", SC.OK, "")
    f.check("X.Coded", allowed, "req", SC.INVALID_ARGUMENT, "INVALID_TOPIC bad name")
    f.check(
        "X.TooLarge",
        allowed,
        "req",
        SC.RESOURCE_EXHAUSTED,
        "SERVER: Received message larger than max (5 vs. 4)",
    )
    assert not f.seen
    f.check("X.Unknown", allowed, "req", SC.UNKNOWN, "Unexpected <class 'ValueError'>")
    f.check("X.Internal", allowed, "req", SC.INTERNAL, "INTERNAL error")
    f.check("X.Long", allowed, "req", SC.INVALID_ARGUMENT, "INVALID_REQUEST " + "y" * 1100)
    f.check("X.NoCode", allowed, "req", SC.INVALID_ARGUMENT, "topic is empty")
    f.check(  # an answer too large for a stock client
        "X.Answer",
        allowed,
        "req",
        SC.RESOURCE_EXHAUSTED,
        "Stream removed (CLIENT: Received message larger than max (5160022 vs. 4194304))",
    )
    kinds = {(rpc, code) for rpc, code, _ in f.seen}
    assert kinds == {
        ("X.Unknown", "UNKNOWN"),
        ("X.Internal", "INTERNAL"),
        ("X.Long", "INVALID_ARGUMENT"),
        ("X.NoCode", "INVALID_ARGUMENT"),
        ("X.Answer", "RESOURCE_EXHAUSTED"),
    }
    assert "X.Long" in f.report() and f.calls == 8


class _Answer(grpc.RpcError):
    def __init__(self, code: grpc.StatusCode, detail: str, trailers: tuple[Any, ...]) -> None:
        self.answer = (code, detail, trailers)

    def code(self) -> grpc.StatusCode:
        return self.answer[0]

    def details(self) -> str:
        return self.answer[1]

    def trailing_metadata(self) -> tuple[Any, ...]:
        return self.answer[2]


def test_a_server_answer_without_its_error_info_is_flagged() -> None:
    st = RpcFailure(grpc.StatusCode.NOT_FOUND, "TOPIC_NOT_FOUND", "T").grpc_status()
    good = _Answer(st.code, st.details, st.trailing_metadata)
    assert answered_detail(good) == "TOPIC_NOT_FOUND T"
    bare = _Answer(grpc.StatusCode.NOT_FOUND, "TOPIC_NOT_FOUND T", ())
    assert answered_detail(bare).startswith(NO_ERROR_INFO)
    wrong = _Answer(grpc.StatusCode.NOT_FOUND, "NO_PERMISSION T", st.trailing_metadata)
    assert answered_detail(wrong).startswith(NO_ERROR_INFO)
    findings = Findings()
    findings.check("R", frozenset({grpc.StatusCode.NOT_FOUND}), "r", st.code, answered_detail(bare))
    assert findings.seen  # reported like a detail without a code
    grpc_own = _Answer(grpc.StatusCode.DEADLINE_EXCEEDED, "Deadline Exceeded", ())
    assert answered_detail(grpc_own) == "Deadline Exceeded"
