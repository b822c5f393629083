"""Users and permissions on a real 3-node group (issue #18, item 3; docs/SECURITY.md "Users and
permissions"): the attacks refused with a clear status, nothing changed and the refusal counted;
a Pub user and a Sub user limited to their topic and group; ACL changes on every node within a
second and after a kill -9 of the leader; secrets never in the store files or logs; and the
eight mqadmin commands."""

from __future__ import annotations

import json
import signal
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import grpc
import pytest
from raftmq.broker.v1 import broker_pb2 as pb
from raftmq.broker.v1 import broker_pb2_grpc as pb_grpc
from raftmq.dledger.v1 import dledger_pb2 as dpb
from raftmq.dledger.v1 import dledger_pb2_grpc as dpb_grpc

from broker.auth.secrets import generate_key_file
from broker.cluster import LocalCluster
from dledger.server.status import read_error
from mqsecurity.channels import ClientSecurity, open_channel
from mqsecurity.credentials import Credentials

pytestmark = pytest.mark.integration

ADMIN = Credentials("admin", "admin-secret-0001")
ALICE = Credentials("alice", "alice-secret-0001")  # Pub on t-pub
BOB = Credentials("bob", "bob-secret-00001")  # Sub on t-pub, group g-bob
CAROL = Credentials("carol", "carol-secret-0001")  # no rules
WRONG = Credentials("admin", "not-the-secret-1")
RPC_S = 5.0
ACL_PROPAGATION_S = 1.0

Stubs = tuple[pb_grpc.BrokerStub, dpb_grpc.DLedgerClientStub]


class Clients:
    """Signed stubs per (address, credentials); closed at the end."""

    def __init__(self) -> None:
        self.channels: dict[tuple[str, str], grpc.Channel] = {}

    def __call__(self, addr: str, creds: Credentials | None) -> Stubs:
        key = (addr, creds.access_key + creds.secret_key if creds else "")
        if key not in self.channels:
            self.channels[key] = open_channel(addr, ClientSecurity(credentials=creds))
        ch = self.channels[key]
        return pb_grpc.BrokerStub(ch), dpb_grpc.DLedgerClientStub(ch)

    def close(self) -> None:
        for ch in self.channels.values():
            ch.close()


@pytest.fixture
def clients() -> Iterator[Clients]:
    c = Clients()
    yield c
    c.close()


def secure_group(local_group: Callable[..., LocalCluster], tmp_path: Path) -> LocalCluster:
    key = tmp_path / "acl.key"
    generate_key_file(str(key))
    init = json.dumps({"username": ADMIN.access_key, "password": ADMIN.secret_key})
    return local_group(
        3,
        wait=False,
        authenticationEnabled="true",
        authorizationEnabled="true",
        aclEncryptionKeyPath=str(key),
        initAuthenticationUser=init,
    )


def leader_addr(cluster: LocalCluster, clients: Clients, exclude: str = "") -> str:
    """The leader's client address once every node (but ``exclude``) answers the admin's
    signed Metadata (so the initial user was created and applied everywhere)."""
    deadline = time.monotonic() + 20
    while time.monotonic() < deadline:
        roles = {}
        for n in cluster.nodes:
            if n.node_id == exclude:
                continue
            try:
                md = clients(n.client_addr, ADMIN)[1].Metadata(dpb.MetadataRequest(), timeout=0.5)
            except grpc.RpcError:
                continue
            roles[n.client_addr] = md.role
        leaders = [addr for addr, role in roles.items() if role == "LEADER"]
        if len(roles) == len(cluster.nodes) - bool(exclude) and leaders:
            return leaders[0]
        time.sleep(0.05)
    raise AssertionError("not every node answered the admin's signed Metadata")


def refused(method: Callable[..., object], request: object) -> tuple[grpc.StatusCode, str]:
    """``method(request)`` fails: its status and the ErrorInfo's code."""
    with pytest.raises(grpc.RpcError) as info:
        method(request, timeout=RPC_S)
    exc = info.value
    error = read_error(exc)
    assert error is not None, exc
    return exc.code(), error.code


def refusals(clients: Clients, addr: str) -> dict[str, int]:
    return dict(clients(addr, ADMIN)[1].Metadata(dpb.MetadataRequest(), timeout=RPC_S).refusals)


def setup_users(admin: pb_grpc.BrokerStub) -> None:
    for topic in ("t-pub", "t-other"):
        admin.CreateTopic(
            pb.CreateTopicRequest(topic=pb.TopicConfig(topic_name=topic)), timeout=RPC_S
        )
    for c in (ALICE, BOB, CAROL):
        admin.CreateUser(
            pb.CreateUserRequest(username=c.access_key, password=c.secret_key), timeout=RPC_S
        )
    admin.CreateAcl(
        pb.CreateAclRequest(subject="User:alice", resources=["Topic:t-pub"], actions=["Pub"]),
        timeout=RPC_S,
    )
    admin.CreateAcl(
        pb.CreateAclRequest(
            subject="User:bob", resources=["Topic:t-pub", "Group:g-bob"], actions=["Sub"]
        ),
        timeout=RPC_S,
    )
    admin.UpdateConsumerOffset(
        pb.UpdateConsumerOffsetRequest(
            consumer_group="g-bob", topic="t-pub", queue_id=0, queue_offset=0, sync=True
        ),
        timeout=RPC_S,
    )


def attacks(clients: Clients, addr: str, target: str) -> None:
    """DeleteTopic, ResetConsumerOffset, TransferLeadership and raw Append, each without
    credentials, with wrong ones and as a user without the permission."""
    for creds, status in [
        (None, grpc.StatusCode.UNAUTHENTICATED),
        (WRONG, grpc.StatusCode.UNAUTHENTICATED),
        (CAROL, grpc.StatusCode.PERMISSION_DENIED),
    ]:
        broker, log = clients(addr, creds)
        calls = [
            (broker.DeleteTopic, pb.DeleteTopicRequest(topic="t-other")),
            (
                broker.ResetConsumerOffset,
                pb.ResetConsumerOffsetRequest(
                    consumer_group="g-bob", topic="t-pub", queue_id=0, queue_offset=7
                ),
            ),
            (log.TransferLeadership, dpb.TransferLeadershipRequest(target_id=target)),
            (log.Append, dpb.AppendEntriesRequest(bodies=[b"raw"], type=0)),
        ]
        for method, request in calls:
            assert refused(method, request) == (status, status.name)


def test_attacks_refused_users_limited_changes_everywhere_and_after_failover(
    local_group: Callable[..., LocalCluster], tmp_path: Path, clients: Clients
) -> None:
    cluster = secure_group(local_group, tmp_path)
    leader = leader_addr(cluster, clients)
    admin, admin_log = clients(leader, ADMIN)
    setup_users(admin)
    before_md = admin_log.Metadata(dpb.MetadataRequest(), timeout=RPC_S)
    before = refusals(clients, leader)
    other_id = next(n.node_id for n in cluster.nodes if n.client_addr != leader)

    attacks(clients, leader, other_id)

    after = refusals(clients, leader)
    assert after["authentication"] - before["authentication"] == 8
    assert after["authorization"] - before["authorization"] == 4
    # Nothing changed: the topic, the offset, the leader, the log (but the Metadata reads).
    admin.GetTopic(pb.GetTopicRequest(topic="t-other"), timeout=RPC_S)
    q = pb.QueryConsumerOffsetRequest(consumer_group="g-bob", topic="t-pub", queue_id=0)
    assert admin.QueryConsumerOffset(q, timeout=RPC_S).queue_offset == 0
    md = admin_log.Metadata(dpb.MetadataRequest(), timeout=RPC_S)
    assert (md.role, md.term, md.last_index) == ("LEADER", before_md.term, before_md.last_index)

    check_pub_and_sub(clients, leader)
    check_send_back(clients, leader)

    # An ACL change is enforced by every node within a second.
    for n in cluster.nodes:
        carol = clients(n.client_addr, CAROL)[0]
        assert refused(carol.GetTopic, pb.GetTopicRequest(topic="t-pub"))[1] == "PERMISSION_DENIED"
    admin.CreateAcl(
        pb.CreateAclRequest(subject="User:carol", resources=["Topic:t-*"], actions=["Get"]),
        timeout=RPC_S,
    )
    changed_at = time.monotonic()
    for n in cluster.nodes:
        carol = clients(n.client_addr, CAROL)[0]
        while True:
            try:
                carol.GetTopic(pb.GetTopicRequest(topic="t-pub"), timeout=RPC_S)
                break
            except grpc.RpcError:
                assert time.monotonic() - changed_at < ACL_PROPAGATION_S, n.node_id
                time.sleep(0.01)

    # kill -9 the leader: the users and rules hold on the new leader.
    old = next(n for n in cluster.nodes if n.client_addr == leader)
    cluster.signal(old.node_id, signal.SIGKILL)
    new_leader = leader_addr(cluster, clients, exclude=old.node_id)
    check_pub_and_sub(clients, new_leader)
    clients(new_leader, CAROL)[0].GetTopic(pb.GetTopicRequest(topic="t-other"), timeout=RPC_S)
    users = clients(new_leader, ADMIN)[0].ListUser(pb.ListUserRequest(), timeout=RPC_S).users
    assert [(u.username, u.user_type) for u in users] == [
        ("admin", "Super"),
        ("alice", "Normal"),
        ("bob", "Normal"),
        ("carol", "Normal"),
    ]
    # A signed call to a follower is authenticated there and redirected: the same signature
    # scheme follows the caller to the leader.
    follower = next(
        n.client_addr for n in cluster.nodes if n.client_addr not in (leader, new_leader)
    )
    create = pb.CreateTopicRequest(topic=pb.TopicConfig(topic_name="t-new"))
    _, code = refused(clients(follower, ADMIN)[0].CreateTopic, create)
    assert code == "NOT_LEADER"
    clients(new_leader, ADMIN)[0].CreateTopic(create, timeout=RPC_S)

    cluster.down(grace_s=5.0)  # final snapshots written
    secrets = [c.secret_key.encode() for c in (ADMIN, ALICE, BOB, CAROL)]
    files = [p for p in cluster.base.rglob("*") if p.is_file() and not p.name.endswith(".conf")]
    assert any(p.name == "snapshot.json" for p in files)
    for path in files:
        data = path.read_bytes()
        assert not any(s in data for s in secrets), path


def check_pub_and_sub(clients: Clients, addr: str) -> None:
    alice = clients(addr, ALICE)[0]
    msg = pb.Message(topic="t-pub", body=b"hello")
    alice.SendMessage(pb.SendMessageRequest(topic="t-pub", messages=[msg]), timeout=RPC_S)
    other = pb.SendMessageRequest(
        topic="t-other", messages=[pb.Message(topic="t-other", body=b"x")]
    )
    assert refused(alice.SendMessage, other)[1] == "PERMISSION_DENIED"
    bob = clients(addr, BOB)[0]
    pull = pb.PullMessageRequest(consumer_group="g-bob", topic="t-pub", queue_id=0, no_suspend=True)
    bob.PullMessage(pull, timeout=RPC_S)
    commit = pb.UpdateConsumerOffsetRequest(
        consumer_group="g-bob", topic="t-pub", queue_id=0, queue_offset=0, sync=True
    )
    bob.UpdateConsumerOffset(commit, timeout=RPC_S)
    for request in (
        pb.PullMessageRequest(consumer_group="g-other", topic="t-pub", queue_id=0, no_suspend=True),
        pb.PullMessageRequest(consumer_group="g-bob", topic="t-other", queue_id=0, no_suspend=True),
    ):
        assert refused(bob.PullMessage, request)[1] == "PERMISSION_DENIED"
    commit_other = pb.UpdateConsumerOffsetRequest(
        consumer_group="g-other", topic="t-pub", queue_id=0, queue_offset=0, sync=True
    )
    assert refused(bob.UpdateConsumerOffset, commit_other)[1] == "PERMISSION_DENIED"
    send = pb.SendMessageRequest(topic="t-pub", messages=[msg])
    assert refused(bob.SendMessage, send)[1] == "PERMISSION_DENIED"


def mqadmin(namesrv: str, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "client.mqadmin", "-n", namesrv, "--json", *args],
        capture_output=True,
        text=True,
        timeout=60,
    )


def test_mqadmin_user_and_acl_commands(
    local_group: Callable[..., LocalCluster], tmp_path: Path
) -> None:
    """The eight commands on a group that stores users (authentication off: mqadmin's
    credential options are another change)."""
    key = tmp_path / "acl.key"
    generate_key_file(str(key))
    cluster = local_group(1, namesrv=True, aclEncryptionKeyPath=str(key))
    assert cluster.namesrv is not None
    ns = cluster.namesrv.addr

    def ok(*args: str) -> list[dict[str, object]]:
        deadline = time.monotonic() + 15
        while True:
            done = mqadmin(ns, *args)
            if done.returncode == 0:
                rows: list[dict[str, object]] = json.loads(done.stdout)
                return rows
            # The group registers with the NameServer a moment after it elects.
            assert (
                "NO_BROKER" in done.stderr or "NO_LEADER" in done.stderr
            ) and time.monotonic() < deadline, done.stderr
            time.sleep(0.2)

    rows = ok("createUser", "-u", "dave", "-p", "dave-secret-001", "-t", "Normal")
    assert rows == [
        {"broker": "broker-a", "username": "dave", "type": "Normal", "status": "enable"}
    ]
    assert "dave-secret-001" not in json.dumps(ok("listUser"))
    assert ok("updateUser", "-u", "dave", "-s", "disable")[0]["status"] == "disable"
    rows = ok(
        "createAcl",
        "-s",
        "User:dave",
        "-r",
        "Topic:t1,Group:g1",
        "-a",
        "Pub,Sub",
        "-i",
        "10.0.0.0/8",
    )
    assert [(r["resource"], r["actions"], r["decision"], r["sourceIps"]) for r in rows] == [
        ("Topic:t1", ["Pub", "Sub"], "Allow", ["10.0.0.0/8"]),
        ("Group:g1", ["Pub", "Sub"], "Allow", ["10.0.0.0/8"]),
    ]
    rows = ok("updateAcl", "-s", "User:dave", "-r", "Topic:t1", "-a", "Sub", "-d", "Deny")
    assert {(r["resource"], r["decision"]) for r in rows} == {
        ("Topic:t1", "Deny"),
        ("Group:g1", "Allow"),
    }
    assert [r["resource"] for r in ok("listAcl", "-r", "Group")] == ["Group:g1"]
    ok("deleteAcl", "-s", "User:dave", "-r", "Group:g1")
    assert [r["resource"] for r in ok("listAcl", "-s", "dave")] == ["Topic:t1"]
    dup = mqadmin(ns, "createUser", "-u", "dave", "-p", "dave-secret-001")
    assert dup.returncode == 1 and "ALREADY_EXISTS" in dup.stderr
    bad = mqadmin(ns, "createAcl", "-s", "User:dave", "-r", "Queue:x", "-a", "Pub")
    assert bad.returncode == 1 and "INVALID_REQUEST" in bad.stderr
    ok("deleteUser", "-u", "dave")
    assert ok("listUser") == [] and ok("listAcl") == []


def check_send_back(clients: Clients, addr: str) -> None:
    """Bob (Sub on t-pub and g-bob) may send back a t-pub message to his retry topic, not a
    t-other one (he could then read it there)."""
    admin = clients(addr, ADMIN)[0]
    positions = {}
    for topic in ("t-pub", "t-other"):
        sent = admin.SendMessage(
            pb.SendMessageRequest(topic=topic, messages=[pb.Message(topic=topic, body=b"m")]),
            timeout=RPC_S,
        )
        positions[topic] = sent.packed_positions[0]
    bob = clients(addr, BOB)[0]

    def back(topic: str) -> pb.ConsumerSendMsgBackRequest:
        item = pb.SendBackItem(commitlog_position=positions[topic])
        return pb.ConsumerSendMsgBackRequest(consumer_group="g-bob", messages=[item], delay_level=1)

    assert refused(bob.ConsumerSendMsgBack, back("t-other"))[1] == "PERMISSION_DENIED"
    done = bob.ConsumerSendMsgBack(back("t-pub"), timeout=RPC_S)
    assert done.results[0].topic == "%RETRY%g-bob"
