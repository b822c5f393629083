"""The attacks of issue #18 ("Must show"), shared by the tests that run them against a group:
tests/integration/test_security_transport.py (TLS and member certificates, no users) and
tests/integration/test_secure_default.py (all of it, as `mqcluster up` starts a group); the
signed-stub helpers serve tests/integration/test_security_acl.py too.

Each attack function runs its attacks and asserts what the issue asks of every one: refused
with a clear status (the structured error's code), nothing changed, and the refusal counted
(``Metadata.refusals`` on a node, ``GetClusterInfo.refusals`` on the NameServer).
"""

from __future__ import annotations

import contextlib
import socket
import ssl
import time
from collections.abc import Callable
from dataclasses import dataclass

import grpc
import pytest
from raftmq.broker.v1 import broker_pb2 as pb
from raftmq.broker.v1 import broker_pb2_grpc as pb_grpc
from raftmq.dledger.v1 import dledger_pb2 as dpb
from raftmq.dledger.v1 import dledger_pb2_grpc as dpb_grpc
from raftmq.nameserver.v1 import nameserver_pb2 as npb
from raftmq.nameserver.v1 import nameserver_pb2_grpc as npb_grpc
from support import wait_for

from dledger.core import AppendRequest
from dledger.log import Entry
from dledger.server.client import ClientError, LogClient
from dledger.server.convert import to_pb
from mqcluster.cluster import LocalCluster, log_client
from mqsecurity import refusals
from mqsecurity.channels import ClientSecurity, open_channel
from mqsecurity.credentials import Credentials
from mqsecurity.membersig import MemberSigner
from mqsecurity.tls import TlsFiles
from rpckit.status import read_error

RPC_S = 5.0
# Raw TLS connections without a certificate, each one refused handshake the node must count.
RAW_ATTEMPTS = 3
# The node id the stranger's certificate (a member of broker-b) names. A node refuses its own
# id on any certificate, so the attacks aim at other nodes, where only the group check stops it.
STRANGER_ID = "n0"
REGISTER = "/raftmq.nameserver.v1.NameServer/RegisterBroker"
UNREGISTER = "/raftmq.nameserver.v1.NameServer/UnregisterBroker"

# ---------------------------------------------------------------------------------------
# The client port: users and permissions
# ---------------------------------------------------------------------------------------

Stubs = tuple[pb_grpc.BrokerStub, dpb_grpc.DLedgerClientStub]

# What the client-port attacks need in the group: a topic to delete and a consumer group's
# committed offset (0) to reset (`prepare_client_attacks`).
ATTACK_TOPIC = "t-other"
OFFSET_GROUP = "g-bob"
OFFSET_TOPIC = "t-pub"
# The calls `client_attacks` makes per caller (DeleteTopic, ResetConsumerOffset,
# TransferLeadership, Append).
CALLS_PER_CALLER = 4


class Clients:
    """Signed stubs per (address, credentials), over TLS trusting ``tls`` when given; closed
    at the end."""

    def __init__(self, tls: TlsFiles | None = None) -> None:
        self.tls = tls
        self.channels: dict[tuple[str, str], grpc.Channel] = {}

    def __call__(self, addr: str, creds: Credentials | None) -> Stubs:
        key = (addr, creds.access_key + creds.secret_key if creds else "")
        if key not in self.channels:
            security = ClientSecurity(tls=self.tls, credentials=creds)
            self.channels[key] = open_channel(addr, security)
        ch = self.channels[key]
        return pb_grpc.BrokerStub(ch), dpb_grpc.DLedgerClientStub(ch)

    def close(self) -> None:
        for ch in self.channels.values():
            ch.close()


def refused(method: Callable[..., object], request: object) -> tuple[grpc.StatusCode, str]:
    """``method(request)`` fails: its status and the ErrorInfo's code."""
    with pytest.raises(grpc.RpcError) as info:
        method(request, timeout=RPC_S)
    exc = info.value
    error = read_error(exc)
    assert error is not None, exc
    return exc.code(), error.code


def node_refusals(clients: Clients, addr: str, admin: Credentials) -> dict[str, int]:
    """The node's refusal counts (``Metadata.refusals``), asked as ``admin``."""
    return dict(clients(addr, admin)[1].Metadata(dpb.MetadataRequest(), timeout=RPC_S).refusals)


def prepare_client_attacks(admin: pb_grpc.BrokerStub) -> None:
    """The topics and the committed offset the client-port attacks aim at."""
    for topic in (OFFSET_TOPIC, ATTACK_TOPIC):
        admin.CreateTopic(
            pb.CreateTopicRequest(topic=pb.TopicConfig(topic_name=topic)), timeout=RPC_S
        )
    admin.UpdateConsumerOffset(
        pb.UpdateConsumerOffsetRequest(
            consumer_group=OFFSET_GROUP, topic=OFFSET_TOPIC, queue_id=0, queue_offset=0, sync=True
        ),
        timeout=RPC_S,
    )


def client_attacks(
    clients: Clients, addr: str, target: str, wrong: Credentials, lacking: Credentials
) -> None:
    """DeleteTopic, ResetConsumerOffset, TransferLeadership (to ``target``) and raw Append on
    ``addr``, each without credentials, with ``wrong`` ones and as ``lacking`` (a user without
    the permission): UNAUTHENTICATED twice, then PERMISSION_DENIED, in the status and as the
    structured error's code."""
    for creds, status in [
        (None, grpc.StatusCode.UNAUTHENTICATED),
        (wrong, grpc.StatusCode.UNAUTHENTICATED),
        (lacking, grpc.StatusCode.PERMISSION_DENIED),
    ]:
        broker, log = clients(addr, creds)
        calls = [
            (broker.DeleteTopic, pb.DeleteTopicRequest(topic=ATTACK_TOPIC)),
            (
                broker.ResetConsumerOffset,
                pb.ResetConsumerOffsetRequest(
                    consumer_group=OFFSET_GROUP, topic=OFFSET_TOPIC, queue_id=0, queue_offset=7
                ),
            ),
            (log.TransferLeadership, dpb.TransferLeadershipRequest(target_id=target)),
            (log.Append, dpb.AppendEntriesRequest(bodies=[b"raw"], type=0)),
        ]
        for method, request in calls:
            assert refused(method, request) == (status, status.name), (creds, method)


def client_attacks_refused(
    clients: Clients, leader: str, target: str, admin: Credentials, wrong: Credentials,
    lacking: Credentials,
) -> None:  # fmt: skip
    """`client_attacks` on the leader ``leader`` (after `prepare_client_attacks`): each one
    counted (authentication, authorization), and nothing changed: the topic, the offset, the
    leader, its term and its log (the Metadata reads append nothing)."""
    admin_broker, admin_log = clients(leader, admin)
    before_md = admin_log.Metadata(dpb.MetadataRequest(), timeout=RPC_S)
    before = node_refusals(clients, leader, admin)

    client_attacks(clients, leader, target, wrong, lacking)

    after = node_refusals(clients, leader, admin)
    assert after[refusals.AUTHENTICATION] - before[refusals.AUTHENTICATION] == 2 * CALLS_PER_CALLER
    assert after[refusals.AUTHORIZATION] - before[refusals.AUTHORIZATION] == CALLS_PER_CALLER
    admin_broker.GetTopic(pb.GetTopicRequest(topic=ATTACK_TOPIC), timeout=RPC_S)
    q = pb.QueryConsumerOffsetRequest(consumer_group=OFFSET_GROUP, topic=OFFSET_TOPIC, queue_id=0)
    assert admin_broker.QueryConsumerOffset(q, timeout=RPC_S).queue_offset == 0
    md = admin_log.Metadata(dpb.MetadataRequest(), timeout=RPC_S)
    assert (md.role, md.term, md.last_index) == ("LEADER", before_md.term, before_md.last_index)


# ---------------------------------------------------------------------------------------
# The peer port and the NameServer: certificates
# ---------------------------------------------------------------------------------------


@dataclass
class Target:
    """A running group with TLS on (and a NameServer), and the certificates an attacker may
    hold. ``security`` is how the test itself reads the group (TLS trusting ``ca_path``, and
    the admin's credentials when the group checks users)."""

    cluster: LocalCluster
    security: ClientSecurity
    ca_path: str
    members: dict[str, TlsFiles]  # this group's member certificates, by node id
    stranger: TlsFiles  # a member certificate of broker-b (node STRANGER_ID), same CA
    foreign: TlsFiles  # a member certificate of this group issued by another CA

    @property
    def group(self) -> str:
        return self.cluster.group

    @property
    def tls(self) -> ClientSecurity:
        """A client with TLS, no certificate and no credentials (what an application is)."""
        return ClientSecurity(tls=TlsFiles(ca_path=self.ca_path))

    @property
    def namesrv_addr(self) -> str:
        assert self.cluster.namesrv is not None
        return self.cluster.namesrv.addr

    def log_client(self) -> LogClient:
        return log_client(self.cluster.client_addrs, self.group, self.security)

    def refused(self, node_id: str) -> dict[str, int]:
        with self.log_client() as client:
            return dict(client.metadata(self.cluster.node(node_id).client_addr).refusals)

    def state(self) -> tuple[str, int]:
        """The leader's id and term."""
        with self.log_client() as client:
            leader = client.find_leader()
            assert leader is not None
            md = client.metadata(leader)
            return md.self_id, md.term

    def append_ok(self, body: bytes) -> bool:
        try:
            with self.log_client() as client:
                client.append([body])
        except ClientError:
            return False
        return True

    def cluster_info(self) -> npb.GetClusterInfoResponse:
        with open_channel(self.namesrv_addr, self.tls) as ch:
            info: npb.GetClusterInfoResponse = npb_grpc.NameServerStub(ch).GetClusterInfo(
                npb.GetClusterInfoRequest(), timeout=RPC_S
            )
            return info

    def routes(self) -> dict[str, tuple[str, str]]:
        """node id -> (role, client address) of the group as the NameServer has it."""
        groups = [g for c in self.cluster_info().clusters for g in c.groups]
        return {
            m.node_id: (npb.BrokerRole.Name(m.role), m.client_addr)
            for g in groups
            if g.broker_name == self.group
            for m in g.members
        }

    def heartbeat_ages_ms(self) -> list[int]:
        info = self.cluster_info()
        groups = [gr for c in info.clusters for gr in c.groups if gr.broker_name == self.group]
        return [m.last_heartbeat_age_ms for gr in groups for m in gr.members]


def forged_stream(t: Target, target: str, security: ClientSecurity, claimed: str) -> grpc.RpcError:
    """A peer stream to ``target`` claiming to come from ``claimed``, carrying entries beyond
    the leader's log with a commit index covering them; the error it ends with."""
    leader_id, term = t.state()
    with t.log_client() as client:
        last = client.metadata(t.cluster.node(leader_id).client_addr).last_index
    forged = AppendRequest(
        claimed,
        target,
        term,
        last,
        term,
        (Entry(term, last + 1, b"forged"),),
        last + 1,
    )
    metadata = (("x-raftmq-group", t.group), ("x-raftmq-from", claimed))
    addr = f"127.0.0.1:{t.cluster.node(target).peer_port}"
    with open_channel(addr, security) as ch, pytest.raises(grpc.RpcError) as err:
        dpb_grpc.DLedgerPeerStub(ch).Stream(
            iter([to_pb(forged, t.group)]), metadata=metadata, timeout=RPC_S
        )
    return err.value


def nothing_changed(t: Target, before: tuple[str, int], what: str) -> None:
    """The leader and term as ``before``, the group still commits, no node holds the forged
    entry."""
    assert t.state() == before, what
    wait_for(lambda: t.append_ok(f"after {what}".encode()), 10, f"a commit after {what}")
    with t.log_client() as client:
        for n in t.cluster.nodes:
            bodies = {e.body for e in client.read_all(n.client_addr)}
            assert b"forged" not in bodies, (n.node_id, what)


def raw_tls(addr: tuple[str, int], ca_path: str, cert: TlsFiles | None) -> None:
    """One TLS connection to ``addr`` (trusting ``ca_path``, showing ``cert`` if any); the
    server's refusal arrives as an alert or a close once the handshake is over."""
    context = ssl.create_default_context(cafile=ca_path)
    if cert is not None:
        assert cert.cert_path is not None and cert.key_path is not None
        context.load_cert_chain(cert.cert_path, cert.key_path)
    with socket.create_connection(addr, timeout=5) as raw:
        try:
            with context.wrap_socket(raw, server_hostname=addr[0]) as tls:
                assert tls.recv(1) == b""  # TLS 1.3: the refusal follows the handshake
        except (ssl.SSLError, ConnectionError):
            pass


def peer_stream_attacks(t: Target) -> None:
    """Peer streams to a follower without a certificate (and plaintext), with another CA's,
    with another group's and with a member's own certificate claiming the leader's id: each
    refused (UNAVAILABLE at the handshake; NOT_A_MEMBER, PEER_IDENTITY), counted
    (tls_handshake, peer_certificate, peer_identity), and nothing changed."""
    before = t.state()
    leader_id = before[0]
    target = next(n.node_id for n in t.cluster.nodes if n.node_id not in (leader_id, STRANGER_ID))
    other = next(n.node_id for n in t.cluster.nodes if n.node_id not in (leader_id, target))
    counted = t.refused(target)

    # No certificate at all, or plaintext: the TLS handshake itself refuses, the caller sees
    # UNAVAILABLE, and the node counts the failed handshake (mqsecurity.handshakes).
    err = forged_stream(t, target, t.tls, leader_id)
    assert err.code() is grpc.StatusCode.UNAVAILABLE
    err = forged_stream(t, target, ClientSecurity(), leader_id)
    assert err.code() is grpc.StatusCode.UNAVAILABLE
    tls = refusals.TLS_HANDSHAKE
    wait_for(lambda: t.refused(target)[tls] >= counted[tls] + 2, 10, "both handshakes counted")
    # Exactly one count per refused connection: raw TLS connections (one handshake each, no
    # reconnects), without a certificate and with one from another CA.
    start = t.refused(target)
    addr = ("127.0.0.1", t.cluster.node(target).peer_port)
    for cert in [None] * RAW_ATTEMPTS + [t.foreign]:
        raw_tls(addr, t.ca_path, cert)
    want = start[tls] + RAW_ATTEMPTS + 1
    wait_for(lambda: t.refused(target)[tls] >= want, 10, "every raw handshake counted")
    assert t.refused(target) == {**start, tls: want}
    counted = t.refused(target)
    nothing_changed(t, before, "streams without a certificate")

    # Another group's member certificate, same CA: handshake passes, the node refuses.
    err = forged_stream(t, target, ClientSecurity(tls=t.stranger), leader_id)
    assert err.code() is grpc.StatusCode.PERMISSION_DENIED
    assert (err.details() or "").startswith("NOT_A_MEMBER")
    assert "broker-b" in (err.details() or "")
    after = t.refused(target)
    assert after[refusals.PEER_CERTIFICATE] == counted[refusals.PEER_CERTIFICATE] + 1
    nothing_changed(t, before, "a stream with broker-b's certificate")

    # A member's own certificate claiming the leader's id in the stream's headers.
    err = forged_stream(t, target, ClientSecurity(tls=t.members[other]), leader_id)
    assert err.code() is grpc.StatusCode.PERMISSION_DENIED
    assert (err.details() or "").startswith("PEER_IDENTITY")
    final = t.refused(target)
    assert final[refusals.PEER_IDENTITY] == after[refusals.PEER_IDENTITY] + 1
    assert final[refusals.PEER_CERTIFICATE] == after[refusals.PEER_CERTIFICATE]
    nothing_changed(t, before, "a member claiming the leader's id")


def join_attacks(t: Target) -> None:
    """DLedgerPeer.Join without a member certificate of this group naming the joiner (none,
    another CA's, another group's): refused, and nobody is added as a learner."""
    with t.log_client() as client:
        before = client.list_members()
    # The leader, which adds learners; a follower when the leader has the stranger's id.
    leader = t.state()[0]
    node = next(
        n
        for n in t.cluster.nodes
        if n.node_id != STRANGER_ID and (n.node_id == leader or leader == STRANGER_ID)
    )
    addr = f"127.0.0.1:{node.peer_port}"
    foreign = TlsFiles(t.foreign.cert_path, t.foreign.key_path, t.ca_path)
    cases = [
        ("n9", t.tls, grpc.StatusCode.UNAVAILABLE, ""),  # no certificate: handshake refused
        ("n1", foreign, grpc.StatusCode.UNAVAILABLE, ""),  # another CA: handshake refused
        (STRANGER_ID, t.stranger, grpc.StatusCode.PERMISSION_DENIED, "NOT_A_MEMBER"),  # broker-b's
    ]
    for node_id, files, status, code in cases:
        request = dpb.JoinRequest(
            group=t.group, node_id=node_id, peer_addr="127.0.0.1:9", client_addr="127.0.0.1:9"
        )
        metadata = (("x-raftmq-group", t.group), ("x-raftmq-from", node_id))
        security = files if isinstance(files, ClientSecurity) else ClientSecurity(tls=files)
        with open_channel(addr, security) as ch, pytest.raises(grpc.RpcError) as err:
            dpb_grpc.DLedgerPeerStub(ch).Join(request, metadata=metadata, timeout=RPC_S)
        assert err.value.code() is status, (node_id, err.value)
        assert (err.value.details() or "").startswith(code), (node_id, err.value.details())
    with t.log_client() as client:
        after = client.list_members()
    assert [(m.id, m.role) for m in after.members] == [(m.id, m.role) for m in before.members]
    assert after.config_index == before.config_index


def namesrv_call(t: Target, method: str, request: object, metadata: tuple = ()) -> grpc.RpcError:
    """``method`` on the NameServer over TLS, expected to fail: its error."""
    with open_channel(t.namesrv_addr, t.tls) as ch, pytest.raises(grpc.RpcError) as err:
        getattr(npb_grpc.NameServerStub(ch), method)(request, metadata=metadata, timeout=RPC_S)
    return err.value


def signed(files: TlsFiles, method: str, request: object, **kw: int) -> tuple:
    """The member signature of ``files`` over ``request`` (a registration's metadata)."""
    assert files.cert_path and files.key_path
    body = request.SerializeToString(deterministic=True)  # type: ignore[attr-defined]
    return MemberSigner(files.cert_path, files.key_path).metadata(method, body, **kw)


def registration_attacks(t: Target, *, fresh_within_ms: int | None = None) -> None:
    """RegisterBroker / UnregisterBroker of this group from a non-member: unsigned, signed by
    another group's member, signed ten minutes ago, signed by another member of the group,
    and replayed: each refused (REGISTRATION_UNAUTHENTICATED, NOT_A_MEMBER), counted
    (registration), the routes unchanged. With ``fresh_within_ms`` (a group registering
    often), the members' own signed registrations are seen to keep going through."""
    routes = t.routes()
    counted = dict(t.cluster_info().refusals)
    hijack = npb.RegisterBrokerRequest(
        cluster="DefaultCluster",
        broker_name=t.group,
        node_id="n0",
        role=npb.LEADER,
        client_addr="203.0.113.66:10911",
        term=10_000,
        heartbeat_period_ms=1000,
    )
    drop = npb.UnregisterBrokerRequest(cluster="DefaultCluster", broker_name=t.group, node_id="n0")
    stale_ms = int(time.time() * 1000) - 600_000
    attacks = [
        ("RegisterBroker", hijack, (), grpc.StatusCode.UNAUTHENTICATED),
        ("UnregisterBroker", drop, (), grpc.StatusCode.UNAUTHENTICATED),
        (
            "RegisterBroker",
            hijack,
            signed(t.stranger, REGISTER, hijack),
            grpc.StatusCode.PERMISSION_DENIED,
        ),
        (
            "UnregisterBroker",
            drop,
            signed(t.stranger, UNREGISTER, drop),
            grpc.StatusCode.PERMISSION_DENIED,
        ),
        # The right member's signature, ten minutes old.
        (
            "UnregisterBroker",
            drop,
            signed(t.members["n0"], UNREGISTER, drop, now_ms=stale_ms),
            grpc.StatusCode.UNAUTHENTICATED,
        ),
        # n1's signature on a request about n0.
        (
            "UnregisterBroker",
            drop,
            signed(t.members["n1"], UNREGISTER, drop),
            grpc.StatusCode.PERMISSION_DENIED,
        ),
    ]
    for method, request, metadata, code in attacks:
        err = namesrv_call(t, method, request, metadata)
        assert err.code() is code, (method, err.details())
        assert (err.details() or "").split(" ")[0] in (
            "REGISTRATION_UNAUTHENTICATED",
            "NOT_A_MEMBER",
        )
    # A replay: broker-b's member unregisters itself (not registered: nothing changes), and
    # the very same call is sent again.
    own = npb.UnregisterBrokerRequest(
        cluster="DefaultCluster", broker_name="broker-b", node_id="n0"
    )
    own_signed = signed(t.stranger, UNREGISTER, own)
    with open_channel(t.namesrv_addr, t.tls) as ch:
        stub = npb_grpc.NameServerStub(ch)
        assert not stub.UnregisterBroker(own, metadata=own_signed, timeout=RPC_S).removed
    err = namesrv_call(t, "UnregisterBroker", own, own_signed)
    assert err.code() is grpc.StatusCode.UNAUTHENTICATED and "replayed" in (err.details() or "")

    assert t.routes() == routes
    after = dict(t.cluster_info().refusals)
    assert after[refusals.REGISTRATION] == counted[refusals.REGISTRATION] + len(attacks) + 1
    if fresh_within_ms is not None:
        wait_for(
            lambda: all(age < fresh_within_ms for age in t.heartbeat_ages_ms()),
            10,
            "fresh signed registrations",
        )
        assert t.routes() == routes


def namesrv_plaintext_counted(t: Target) -> None:
    """A client not speaking TLS to the NameServer: one refused handshake, counted once."""
    tls = refusals.TLS_HANDSHAKE
    before = t.cluster_info().refusals[tls]
    host, port = t.namesrv_addr.rsplit(":", 1)
    with socket.create_connection((host, int(port)), timeout=5) as raw:
        raw.sendall(b"GET / HTTP/1.1\r\nHost: x\r\n\r\n")
        with contextlib.suppress(OSError):
            raw.recv(100)  # the server answers with an alert, or closes
    wait_for(lambda: t.cluster_info().refusals[tls] >= before + 1, 10, "the handshake counted")
    assert t.cluster_info().refusals[tls] == before + 1
