"""Issue #18, items 1 and 2, on real processes: a group with TLS on every port, mutual TLS
between members, and a NameServer that takes (un)registrations only from the group's members.

Each attack is refused with a clear status, changes nothing (leader, term, routes), and is
counted where the server shows it (Metadata.refusals, GetClusterInfo.refusals); then the group
still commits. The last test kills the leader: the TLS group fails over and the new leader's
signed registration reaches the NameServer.
"""

from __future__ import annotations

import contextlib
import signal
import socket
import ssl
import subprocess
import sys
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import grpc
import pytest
from raftmq.broker.v1 import broker_pb2 as bpb
from raftmq.dledger.v1 import dledger_pb2 as dpb
from raftmq.dledger.v1 import dledger_pb2_grpc as dpb_grpc
from raftmq.nameserver.v1 import nameserver_pb2 as npb
from raftmq.nameserver.v1 import nameserver_pb2_grpc as npb_grpc
from support import pulled, wait_for

from broker.cluster import LocalCluster, _free_port
from broker.leader_client import LeaderClient
from broker.message import UniqIdGenerator
from dledger.core import AppendRequest
from dledger.log import Entry
from dledger.server.client import ClientError, LogClient
from dledger.server.convert import to_pb
from mqsecurity import pki, refusals
from mqsecurity.channels import ClientSecurity, open_channel
from mqsecurity.membersig import MemberSigner
from mqsecurity.tls import TlsFiles

pytestmark = pytest.mark.integration

GROUP = "broker-a"
# Raw TLS connections without a certificate, each one refused handshake the node must count.
RAW_ATTEMPTS = 3
HOSTS = ["127.0.0.1", "localhost"]
REGISTER = "/raftmq.nameserver.v1.NameServer/RegisterBroker"
UNREGISTER = "/raftmq.nameserver.v1.NameServer/UnregisterBroker"
# Frequent registrations (the tests wait for them); Raft keeps its default timers, which hold
# up on a loaded machine.
FAST = {
    "registerBrokerPeriod": "1000",
    "mappedFileSizeCommitLog": str(4 << 20),
    "maxHashSlotNum": "1000",
    "maxIndexNum": "4000",
}


class TlsCluster(LocalCluster):
    """A LocalCluster whose own calls (wait_leader, status) speak TLS."""

    security = ClientSecurity()

    def client(self) -> LogClient:
        return LogClient(self.client_addrs, group=self.group, security=self.security)


@dataclass
class Group:
    cluster: TlsCluster
    ca: pki.Authority
    members: dict[str, TlsFiles]
    stranger: TlsFiles  # a member certificate of broker-b, same CA
    foreign: TlsFiles  # a member certificate of broker-a issued by another CA
    plain_ports: dict[str, int]

    @property
    def tls(self) -> ClientSecurity:
        """A client with TLS and no certificate (what applications are)."""
        return ClientSecurity(tls=TlsFiles(ca_path=self.ca.cert_path))

    @property
    def namesrv_addr(self) -> str:
        assert self.cluster.namesrv is not None
        return self.cluster.namesrv.addr

    def log_client(self) -> LogClient:
        return LogClient(self.cluster.client_addrs, group=GROUP, security=self.tls)

    def refused(self, node_id: str) -> dict[str, int]:
        with self.log_client() as client:
            return dict(client.metadata(self.cluster.node(node_id).client_addr).refusals)

    def cluster_info(self) -> npb.GetClusterInfoResponse:
        with open_channel(self.namesrv_addr, self.tls) as ch:
            info: npb.GetClusterInfoResponse = npb_grpc.NameServerStub(ch).GetClusterInfo(
                npb.GetClusterInfoRequest(), timeout=5
            )
            return info

    def routes(self) -> dict[str, tuple[str, str]]:
        """node id -> (role, client address) of broker-a as the NameServer has it."""
        groups = [g for c in self.cluster_info().clusters for g in c.groups]
        return {
            m.node_id: (npb.BrokerRole.Name(m.role), m.client_addr)
            for g in groups
            if g.broker_name == GROUP
            for m in g.members
        }


def _configure(base: Path) -> Group:
    tls_dir = str(base / "tls")
    ca = pki.create_authority(tls_dir)
    members = {n: pki.issue_member(ca, tls_dir, GROUP, n, HOSTS) for n in ("n0", "n1", "n2")}
    stranger = pki.issue_member(ca, tls_dir, "broker-b", "n0", HOSTS)
    other_ca = pki.create_authority(str(base / "other-ca"))
    foreign = pki.issue_member(other_ca, str(base / "other-ca"), GROUP, "n1", HOSTS)
    ns = pki.issue_server(ca, tls_dir, "nameserver", HOSTS)
    cluster = TlsCluster(base / "group")
    cluster.configure(
        3,
        group=GROUP,
        auto_ports=True,
        extra={"tlsEnable": "true", "tlsServerTrustCertPath": ca.cert_path, **FAST},
        namesrv=True,
        namesrv_conf={
            "tlsEnable": "true",
            "tlsServerCertPath": str(ns.cert_path),
            "tlsServerKeyPath": str(ns.key_path),
            "tlsServerTrustCertPath": ca.cert_path,
            "brokerAuthenticationEnabled": "true",
        },
    )
    # The per-node keys LocalCluster's `extra` cannot vary: each node's certificate and its
    # plaintext side port.
    plain_ports = {}
    for n in cluster.nodes:
        files = members[n.node_id]
        plain_ports[n.node_id] = _free_port()
        with open(n.conf, "a") as f:
            f.write(
                f"tlsServerCertPath={files.cert_path}\ntlsServerKeyPath={files.key_path}\n"
                f"tlsPlaintextListenPort={plain_ports[n.node_id]}\n"
            )
    TlsCluster.security = ClientSecurity(tls=TlsFiles(ca_path=ca.cert_path))
    return Group(cluster, ca, members, stranger, foreign, plain_ports)


@pytest.fixture(scope="module")
def group(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Group]:
    g = _configure(tmp_path_factory.mktemp("tls"))
    try:
        g.cluster.up(wait_s=20)
        wait_for(lambda: len(g.routes()) == 3, 15, "every node registered (signed)")
        yield g
    finally:
        g.cluster.down(grace_s=5.0)


def _append_ok(g: Group, body: bytes) -> bool:
    try:
        with g.log_client() as client:
            client.append([body])
    except ClientError:
        return False
    return True


def _state(g: Group) -> tuple[str, int]:
    with g.log_client() as client:
        leader = client.find_leader()
        assert leader is not None
        md = client.metadata(leader)
        return md.self_id, md.term


def test_a_tls_group_replicates_and_serves_clients_over_tls(group: Group) -> None:
    g = group
    for i in range(5):
        wait_for(lambda i=i: _append_ok(g, b"tls-%d" % i), 10, "append over TLS")
    with g.log_client() as client:
        for n in g.cluster.nodes:
            wait_for(
                lambda a=n.client_addr: {b"tls-4"} <= {e.body for e in client.read_all(a)},
                10,
                f"{n.node_id} to hold the appends",
            )
    # The broker API over TLS: create a topic, send, pull (through any node's redirect).
    leader_client = LeaderClient(lambda: g.cluster.client_addrs, g.tls)
    try:
        leader_client.call(
            lambda s: s.CreateTopic(
                bpb.CreateTopicRequest(
                    topic=bpb.TopicConfig(topic_name="T", read_queue_nums=1, write_queue_nums=1)
                ),
                timeout=5,
            )
        )
        msg = bpb.Message(queue_id=0, body=b"over tls", msg_id=UniqIdGenerator().next_id())
        leader_client.call(
            lambda s: s.SendMessage(bpb.SendMessageRequest(topic="T", messages=[msg]), timeout=5)
        )
        resp = leader_client.call(
            lambda s: s.PullMessage(
                bpb.PullMessageRequest(
                    consumer_group="g", topic="T", queue_id=0, queue_offset=0, no_suspend=True
                ),
                timeout=5,
            )
        )
        assert [m.body for m in pulled(resp)] == [b"over tls"]
    finally:
        leader_client.close()
    # The plaintext side port answers on 127.0.0.1; the TLS port refuses plaintext.
    n0 = g.cluster.node("n0")
    with LogClient([f"127.0.0.1:{g.plain_ports['n0']}"], group=GROUP) as plain:
        assert plain.metadata(plain.addrs[0]).self_id == "n0"
    with LogClient([n0.client_addr], group=GROUP) as plain, pytest.raises(ClientError) as err:
        plain.metadata(n0.client_addr, timeout_s=2)
    assert err.value.status == "UNAVAILABLE"


def _forged_stream(g: Group, target: str, security: ClientSecurity, claimed: str) -> grpc.RpcError:
    """A peer stream to ``target`` claiming to come from ``claimed``, carrying entries beyond
    the leader's log with a commit index covering them."""
    leader_id, term = _state(g)
    with g.log_client() as client:
        last = client.metadata(g.cluster.node(leader_id).client_addr).last_index
    forged = AppendRequest(
        claimed,
        target,
        term,
        last,
        term,
        (Entry(term, last + 1, b"forged"),),
        last + 1,
    )
    metadata = (("x-raftmq-group", GROUP), ("x-raftmq-from", claimed))
    addr = f"127.0.0.1:{g.cluster.node(target).peer_port}"
    with open_channel(addr, security) as ch, pytest.raises(grpc.RpcError) as err:
        dpb_grpc.DLedgerPeerStub(ch).Stream(
            iter([to_pb(forged, GROUP)]), metadata=metadata, timeout=5
        )
    return err.value


def _nothing_changed(g: Group, before: tuple[str, int], what: str) -> None:
    assert _state(g) == before, what
    wait_for(lambda: _append_ok(g, f"after {what}".encode()), 10, f"a commit after {what}")
    with g.log_client() as client:
        for n in g.cluster.nodes:
            bodies = {e.body for e in client.read_all(n.client_addr)}
            assert b"forged" not in bodies, (n.node_id, what)


def _raw_tls(addr: tuple[str, int], ca_path: str, cert: TlsFiles | None) -> None:
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


def test_peer_streams_without_a_member_certificate_of_this_group_are_refused(
    group: Group,
) -> None:
    g = group
    before = _state(g)
    leader_id = before[0]
    target = next(n.node_id for n in g.cluster.nodes if n.node_id != leader_id)
    other = next(n.node_id for n in g.cluster.nodes if n.node_id not in (leader_id, target))
    counted = g.refused(target)

    # No certificate at all, or plaintext: the TLS handshake itself refuses, the caller sees
    # UNAVAILABLE, and the node counts the failed handshake (mqsecurity.handshakes).
    err = _forged_stream(g, target, g.tls, leader_id)
    assert err.code() is grpc.StatusCode.UNAVAILABLE
    err = _forged_stream(g, target, ClientSecurity(), leader_id)
    assert err.code() is grpc.StatusCode.UNAVAILABLE
    tls = refusals.TLS_HANDSHAKE
    wait_for(lambda: g.refused(target)[tls] >= counted[tls] + 2, 10, "both handshakes counted")
    # Exactly one count per refused connection: raw TLS connections (one handshake each, no
    # reconnects), without a certificate and with one from another CA.
    start = g.refused(target)
    addr = ("127.0.0.1", g.cluster.node(target).peer_port)
    for cert in [None] * RAW_ATTEMPTS + [g.foreign]:
        _raw_tls(addr, g.ca.cert_path, cert)
    want = start[tls] + RAW_ATTEMPTS + 1
    wait_for(lambda: g.refused(target)[tls] >= want, 10, "every raw handshake counted")
    assert g.refused(target) == {**start, tls: want}
    counted = g.refused(target)
    _nothing_changed(g, before, "streams without a certificate")

    # Another group's member certificate, same CA: handshake passes, the node refuses.
    err = _forged_stream(g, target, ClientSecurity(tls=g.stranger), leader_id)
    assert err.code() is grpc.StatusCode.PERMISSION_DENIED
    assert (err.details() or "").startswith("NOT_A_MEMBER")
    assert "broker-b" in (err.details() or "")
    after = g.refused(target)
    assert after[refusals.PEER_CERTIFICATE] == counted[refusals.PEER_CERTIFICATE] + 1
    _nothing_changed(g, before, "a stream with broker-b's certificate")

    # A member's own certificate claiming the leader's id in the stream's headers.
    err = _forged_stream(g, target, ClientSecurity(tls=g.members[other]), leader_id)
    assert err.code() is grpc.StatusCode.PERMISSION_DENIED
    assert (err.details() or "").startswith("PEER_IDENTITY")
    final = g.refused(target)
    assert final[refusals.PEER_IDENTITY] == after[refusals.PEER_IDENTITY] + 1
    assert final[refusals.PEER_CERTIFICATE] == after[refusals.PEER_CERTIFICATE]
    _nothing_changed(g, before, "a member claiming the leader's id")


def test_a_join_without_a_member_certificate_of_this_group_is_refused(group: Group) -> None:
    """Secure by default, DLedgerPeer.Join needs a member certificate of this group naming
    the joiner (docs/SECURITY.md, threat 2): without one, with another CA's, or with another
    group's, nobody is added as a learner and the membership stays as it was."""
    g = group
    with g.log_client() as client:
        before = client.list_members()
    leader = _state(g)[0]
    addr = f"127.0.0.1:{g.cluster.node(leader).peer_port}"
    foreign = TlsFiles(g.foreign.cert_path, g.foreign.key_path, g.ca.cert_path)
    cases = [
        ("n9", g.tls, grpc.StatusCode.UNAVAILABLE, ""),  # no certificate: handshake refused
        ("n1", foreign, grpc.StatusCode.UNAVAILABLE, ""),  # another CA: handshake refused
        ("n0", g.stranger, grpc.StatusCode.PERMISSION_DENIED, "NOT_A_MEMBER"),  # broker-b's
    ]
    for node_id, files, status, code in cases:
        request = dpb.JoinRequest(
            group=GROUP, node_id=node_id, peer_addr="127.0.0.1:9", client_addr="127.0.0.1:9"
        )
        metadata = (("x-raftmq-group", GROUP), ("x-raftmq-from", node_id))
        security = files if isinstance(files, ClientSecurity) else ClientSecurity(tls=files)
        with open_channel(addr, security) as ch, pytest.raises(grpc.RpcError) as err:
            dpb_grpc.DLedgerPeerStub(ch).Join(request, metadata=metadata, timeout=5)
        assert err.value.code() is status, (node_id, err.value)
        assert (err.value.details() or "").startswith(code), (node_id, err.value.details())
    with g.log_client() as client:
        after = client.list_members()
    assert [(m.id, m.role) for m in after.members] == [(m.id, m.role) for m in before.members]
    assert after.config_index == before.config_index


def _call(g: Group, method: str, request: object, metadata: tuple = ()) -> grpc.RpcError:
    with open_channel(g.namesrv_addr, g.tls) as ch, pytest.raises(grpc.RpcError) as err:
        getattr(npb_grpc.NameServerStub(ch), method)(request, metadata=metadata, timeout=5)
    return err.value


def _signed(files: TlsFiles, method: str, request: object, **kw: int) -> tuple:
    assert files.cert_path and files.key_path
    body = request.SerializeToString(deterministic=True)  # type: ignore[attr-defined]
    return MemberSigner(files.cert_path, files.key_path).metadata(method, body, **kw)


def test_only_a_groups_members_register_or_unregister_it(group: Group) -> None:
    g = group
    routes = g.routes()
    counted = dict(g.cluster_info().refusals)
    hijack = npb.RegisterBrokerRequest(
        cluster="DefaultCluster",
        broker_name=GROUP,
        node_id="n0",
        role=npb.LEADER,
        client_addr="203.0.113.66:10911",
        term=10_000,
        heartbeat_period_ms=1000,
    )
    drop = npb.UnregisterBrokerRequest(cluster="DefaultCluster", broker_name=GROUP, node_id="n0")
    attacks = [
        ("RegisterBroker", hijack, (), grpc.StatusCode.UNAUTHENTICATED),
        ("UnregisterBroker", drop, (), grpc.StatusCode.UNAUTHENTICATED),
        (
            "RegisterBroker",
            hijack,
            _signed(g.stranger, REGISTER, hijack),
            grpc.StatusCode.PERMISSION_DENIED,
        ),
        (
            "UnregisterBroker",
            drop,
            _signed(g.stranger, UNREGISTER, drop),
            grpc.StatusCode.PERMISSION_DENIED,
        ),
        # The right member's signature, ten minutes old.
        (
            "UnregisterBroker",
            drop,
            _signed(g.members["n0"], UNREGISTER, drop, now_ms=int(time.time() * 1000) - 600_000),
            grpc.StatusCode.UNAUTHENTICATED,
        ),
        # n1's signature on a request about n0.
        (
            "UnregisterBroker",
            drop,
            _signed(g.members["n1"], UNREGISTER, drop),
            grpc.StatusCode.PERMISSION_DENIED,
        ),
    ]
    for method, request, metadata, code in attacks:
        err = _call(g, method, request, metadata)
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
    signed = _signed(g.stranger, UNREGISTER, own)
    with open_channel(g.namesrv_addr, g.tls) as ch:
        stub = npb_grpc.NameServerStub(ch)
        assert not stub.UnregisterBroker(own, metadata=signed, timeout=5).removed
    err = _call(g, "UnregisterBroker", own, signed)
    assert err.code() is grpc.StatusCode.UNAUTHENTICATED and "replayed" in (err.details() or "")

    assert g.routes() == routes
    after = dict(g.cluster_info().refusals)
    assert after[refusals.REGISTRATION] == counted[refusals.REGISTRATION] + len(attacks) + 1
    # The members' own signed registrations keep going through.
    wait_for(lambda: all(age < 1500 for age in _ages(g)), 10, "fresh signed registrations")
    assert g.routes() == routes


def test_a_client_not_speaking_tls_to_the_nameserver_is_counted(group: Group) -> None:
    tls = refusals.TLS_HANDSHAKE
    before = group.cluster_info().refusals[tls]
    host, port = group.namesrv_addr.rsplit(":", 1)
    with socket.create_connection((host, int(port)), timeout=5) as raw:
        raw.sendall(b"GET / HTTP/1.1\r\nHost: x\r\n\r\n")
        with contextlib.suppress(OSError):
            raw.recv(100)  # the server answers with an alert, or closes
    wait_for(lambda: group.cluster_info().refusals[tls] >= before + 1, 10, "the handshake counted")
    assert group.cluster_info().refusals[tls] == before + 1


def _ages(g: Group) -> list[int]:
    groups = [gr for c in g.cluster_info().clusters for gr in c.groups if gr.broker_name == GROUP]
    return [m.last_heartbeat_age_ms for gr in groups for m in gr.members]


def test_bad_tls_files_stop_the_start_with_one_line(group: Group, tmp_path: Path) -> None:
    g = group
    n0 = g.cluster.node("n0")
    conf = tmp_path / "bad.conf"
    text = (
        Path(n0.conf)
        .read_text()
        .replace(str(g.members["n0"].key_path), str(g.members["n1"].key_path))
    )
    conf.write_text(text)
    ns_conf = tmp_path / "ns.conf"
    ns_conf.write_text(
        f"listenPort={_free_port()}\nlistenHost=127.0.0.1\ntlsEnable=true\n"
        f"tlsServerCertPath={tmp_path}/missing.crt\ntlsServerKeyPath={g.members['n0'].key_path}\n"
    )
    for argv, key in (
        ([sys.executable, "-m", "broker", "-c", str(conf)], "tlsServerKeyPath"),
        ([sys.executable, "-m", "nameserver", "-c", str(ns_conf)], "tlsServerCertPath"),
    ):
        proc = subprocess.run(argv, capture_output=True, text=True, timeout=30)
        assert proc.returncode == 2, proc.stderr
        lines = proc.stderr.strip().splitlines()
        assert len(lines) == 1 and key in lines[0] and "Traceback" not in proc.stderr, lines


def test_the_tls_group_fails_over_and_the_new_leader_registers(group: Group) -> None:
    g = group
    old, term = _state(g)
    g.cluster.signal(old, signal.SIGKILL)
    new = g.cluster.wait_leader(timeout_s=15, exclude=old)
    assert new != old
    wait_for(lambda: _append_ok(g, b"after failover"), 10, "a commit after the failover")
    wait_for(
        lambda: g.routes().get(new, ("", ""))[0] == "LEADER", 10, "the new leader's registration"
    )
    assert _state(g)[1] > term
    # The old leader rejoins over mutual TLS and catches up.
    g.cluster.start(old)
    addr = g.cluster.node(old).client_addr
    wait_for(lambda: b"after failover" in _bodies(g, addr), 15, f"{old} to catch up")


def _bodies(g: Group, addr: str) -> set[bytes]:
    try:
        with g.log_client() as client:
            return {e.body for e in client.read_all(addr)}
    except ClientError:
        return set()
