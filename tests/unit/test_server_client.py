"""The membership change clients (dledger.server.client.LogClient for mqcluster, and
client.members for mqadmin) against a scripted in-process server (no Raft): a change whose
first answer was lost (outcome unknown) but which committed is refused when retried
("already a voter"); the client must report the change done, not fail (mqcluster add failed
so under the jepsen membership nemesis)."""

from __future__ import annotations

from collections.abc import Iterator
from concurrent import futures

import grpc
import pytest
from raftmq.dledger.v1 import dledger_pb2 as pb
from raftmq.dledger.v1 import dledger_pb2_grpc as pb_grpc

from client.errors import MQClientError
from client.members import change_member
from client.route import ChannelPool
from dledger.server.client import ClientError, LogClient
from rpckit.status import RpcFailure, abort_sync

LOST = RpcFailure(
    grpc.StatusCode.UNAVAILABLE,
    "LEADERSHIP_LOST",
    "the leader stepped down before the change committed",
    retryable=True,
    outcome_unknown=True,
)


def _refused(text: str) -> RpcFailure:
    return RpcFailure(grpc.StatusCode.FAILED_PRECONDITION, "INVALID_MEMBERSHIP_CHANGE", text)


class _Group(pb_grpc.DLedgerClientServicer):
    """A leader whose answers are scripted: each ChangeMember takes the next failure (None:
    answers); ListMembers shows ``members``."""

    def __init__(self, failures: list[RpcFailure | None], members: dict[str, str]) -> None:
        self.failures = failures
        self.members = members
        self.changes = 0

    def Metadata(self, request: pb.MetadataRequest, context: grpc.ServicerContext) -> object:
        return pb.MetadataResponse(role="LEADER")

    def ChangeMember(
        self, request: pb.ChangeMemberRequest, context: grpc.ServicerContext
    ) -> object:
        self.changes += 1
        failure = self.failures.pop(0)
        if failure is not None:
            abort_sync(context, failure)
        return pb.ChangeMemberResponse(index=9, term=2)

    def ListMembers(self, request: pb.ListMembersRequest, context: grpc.ServicerContext) -> object:
        rows = [pb.Member(id=i, role=r) for i, r in sorted(self.members.items())]
        return pb.ListMembersResponse(
            members=rows, leader_id="n0", config_index=9, config_committed=True, term=2
        )


@pytest.fixture
def serve() -> Iterator[object]:
    servers: list[grpc.Server] = []

    def start(group: _Group) -> str:
        server = grpc.server(futures.ThreadPoolExecutor(max_workers=2))
        pb_grpc.add_DLedgerClientServicer_to_server(group, server)
        port = server.add_insecure_port("127.0.0.1:0")
        server.start()
        servers.append(server)
        return f"127.0.0.1:{port}"

    yield start
    for s in servers:
        s.stop(None)


VOTERS = {"n0": "VOTER", "n1": "VOTER", "n2": "VOTER", "n3": "VOTER"}


@pytest.mark.parametrize(
    ("kind", "members", "text"),
    [
        ("PROMOTE", VOTERS, "n3 is already a voter"),
        ("ADD_LEARNER", {**VOTERS, "n3": "LEARNER"}, "n3 is already a learner"),
        ("REMOVE", {k: v for k, v in VOTERS.items() if k != "n3"}, "n3 is not a member"),
    ],
)
def test_a_change_whose_answer_was_lost_is_reported_done(
    serve: object, kind: str, members: dict[str, str], text: str
) -> None:
    group = _Group([LOST, _refused(text)], members)
    addr = serve(group)  # type: ignore[operator]
    with LogClient([addr], timeout_s=2.0) as client:
        resp = client.change_member(kind, "n3", timeout_s=10)
    assert group.changes == 2 and resp.index == 9
    assert {m.id for m in resp.members} == set(members)


def test_a_refusal_without_a_lost_answer_is_an_error(serve: object) -> None:
    group = _Group([_refused("n3 is already a voter")], VOTERS)
    addr = serve(group)  # type: ignore[operator]
    with LogClient([addr], timeout_s=2.0) as client, pytest.raises(ClientError) as info:
        client.change_member("PROMOTE", "n3", timeout_s=10)
    assert "already a voter" in str(info.value)


def test_a_lost_answer_for_a_change_not_in_effect_stays_an_error(serve: object) -> None:
    # The first attempt was lost and did not commit; the retry is refused for another reason.
    group = _Group([LOST, _refused("n3 is not a learner")], {**VOTERS, "n3": "LEARNER"})
    addr = serve(group)  # type: ignore[operator]
    with LogClient([addr], timeout_s=2.0) as client, pytest.raises(ClientError):
        client.change_member("PROMOTE", "n3", timeout_s=10)


@pytest.mark.parametrize(
    ("kind", "members", "text"),
    [
        ("PROMOTE", VOTERS, "n3 is already a voter"),
        ("REMOVE", {k: v for k, v in VOTERS.items() if k != "n3"}, "n3 is not a member"),
    ],
)
def test_mqadmins_client_reports_a_change_whose_answer_was_lost_done(
    serve: object, kind: str, members: dict[str, str], text: str
) -> None:
    """The same for mqadmin's member commands (client.members)."""
    group = _Group([LOST, _refused(text)], members)
    addr = serve(group)  # type: ignore[operator]
    channels = ChannelPool()
    try:
        index, rows = change_member(channels, addr, kind, "n3", timeout_s=10)
        assert group.changes == 2 and index == 9
        assert {r.node_id for r in rows} == set(members)
        group.failures = [_refused(text)]  # no lost answer before: the refusal stands
        with pytest.raises(MQClientError):
            change_member(channels, addr, kind, "n3", timeout_s=10)
    finally:
        channels.close()
