"""Users and permissions on a real 3-node group (issue #18, item 3; docs/SECURITY.md "Users and
permissions"): a Pub user and a Sub user limited to their topic and group, a signed call
redirected by a follower, and secrets never in the store files or logs.

The attacks (refused, nothing changed, counted), ACL changes and revocations on every node
within a second and after a kill -9 of the leader, and the eight mqadmin commands run against
the secure default group in tests/integration/test_secure_default.py.
"""

from __future__ import annotations

import json
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import grpc
import pytest
from raftmq.broker.v1 import broker_pb2 as pb
from raftmq.broker.v1 import broker_pb2_grpc as pb_grpc
from raftmq.dledger.v1 import dledger_pb2 as dpb
from security_attacks import Clients, refused

from broker.state.auth.secrets import generate_key_file
from mqcluster.cluster import LocalCluster
from mqsecurity.credentials import Credentials

pytestmark = pytest.mark.integration

ADMIN = Credentials("admin", "admin-secret-0001")
ALICE = Credentials("alice", "alice-secret-0001")  # Pub on t-pub
BOB = Credentials("bob", "bob-secret-00001")  # Sub on t-pub, group g-bob
RPC_S = 5.0


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


def leader_addr(cluster: LocalCluster, clients: Clients) -> str:
    """The leader's client address once every node answers the admin's signed Metadata (so
    the initial user was created and applied everywhere)."""
    deadline = time.monotonic() + 20
    while time.monotonic() < deadline:
        roles = {}
        for n in cluster.nodes:
            try:
                md = clients(n.client_addr, ADMIN)[1].Metadata(dpb.MetadataRequest(), timeout=0.5)
            except grpc.RpcError:
                continue
            roles[n.client_addr] = md.role
        leaders = [addr for addr, role in roles.items() if role == "LEADER"]
        if len(roles) == len(cluster.nodes) and leaders:
            return leaders[0]
        time.sleep(0.05)
    raise AssertionError("not every node answered the admin's signed Metadata")


def setup_users(admin: pb_grpc.BrokerStub) -> None:
    for topic in ("t-pub", "t-other"):
        admin.CreateTopic(
            pb.CreateTopicRequest(topic=pb.TopicConfig(topic_name=topic)), timeout=RPC_S
        )
    for c in (ALICE, BOB):
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


def test_users_limited_to_their_topic_and_group_and_secrets_never_stored(
    local_group: Callable[..., LocalCluster], tmp_path: Path, clients: Clients
) -> None:
    cluster = secure_group(local_group, tmp_path)
    leader = leader_addr(cluster, clients)
    setup_users(clients(leader, ADMIN)[0])

    check_pub_and_sub(clients, leader)
    check_send_back(clients, leader)

    # A signed call to a follower is authenticated there and redirected: the same signature
    # scheme follows the caller to the leader.
    follower = next(n.client_addr for n in cluster.nodes if n.client_addr != leader)
    create = pb.CreateTopicRequest(topic=pb.TopicConfig(topic_name="t-new"))
    _, code = refused(clients(follower, ADMIN)[0].CreateTopic, create)
    assert code == "NOT_LEADER"
    clients(leader, ADMIN)[0].CreateTopic(create, timeout=RPC_S)

    cluster.down(grace_s=5.0)  # final snapshots written
    secrets = [c.secret_key.encode() for c in (ADMIN, ALICE, BOB)]
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
