"""Issue #18, items 1 and 2, on real processes: a group with TLS on every port, mutual TLS
between members, and a NameServer that takes (un)registrations only from the group's members.

Each attack is refused with a clear status, changes nothing (leader, term, routes), and is
counted where the server shows it (Metadata.refusals, GetClusterInfo.refusals); then the group
still commits. The last test kills the leader: the TLS group fails over and the new leader's
signed registration reaches the NameServer.

The attacks are in tests/security_attacks.py; tests/integration/test_secure_default.py runs
the same ones against a group started as `mqcluster up` starts it (with users too).
"""

from __future__ import annotations

import signal
import subprocess
import sys
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest
from raftmq.broker.v1 import broker_pb2 as bpb
from security_attacks import (
    STRANGER_ID,
    Target,
    join_attacks,
    namesrv_plaintext_counted,
    peer_stream_attacks,
    registration_attacks,
)
from support import pulled, wait_for

from broker.state.message import UniqIdGenerator
from dledger.server.client import ClientError, LogClient
from mqcluster.cluster import LocalCluster, _free_port
from mqcluster.leader_client import LeaderClient
from mqsecurity import pki
from mqsecurity.channels import ClientSecurity
from mqsecurity.tls import TlsFiles

pytestmark = pytest.mark.integration

GROUP = "broker-a"
HOSTS = ["127.0.0.1", "localhost"]
# Frequent registrations (the tests wait for them); Raft keeps its default timers, which hold
# up on a loaded machine.
FAST = {
    "registerBrokerPeriod": "1000",
    "mappedFileSizeCommitLog": str(4 << 20),
    "maxHashSlotNum": "1000",
    "maxIndexNum": "4000",
}
# How recent every member's signed registration is once the attacks are over (period 1 s).
FRESH_MS = 1500


class TlsCluster(LocalCluster):
    """A LocalCluster whose own calls (wait_leader, status) speak TLS."""

    security = ClientSecurity()

    def client(self) -> LogClient:
        return LogClient(self.client_addrs, group=self.group, security=self.security)


@dataclass
class Group(Target):
    """The TLS group (no users: the test reads it with TLS alone) and the certificates of the
    attacks (tests/security_attacks.py)."""

    ca: pki.Authority
    plain_ports: dict[str, int]


def _configure(base: Path) -> Group:
    tls_dir = str(base / "tls")
    ca = pki.create_authority(tls_dir)
    members = {n: pki.issue_member(ca, tls_dir, GROUP, n, HOSTS) for n in ("n0", "n1", "n2")}
    stranger = pki.issue_member(ca, tls_dir, "broker-b", STRANGER_ID, HOSTS)
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
    tls = ClientSecurity(tls=TlsFiles(ca_path=ca.cert_path))
    TlsCluster.security = tls
    return Group(cluster, tls, ca.cert_path, members, stranger, foreign, ca, plain_ports)


@pytest.fixture(scope="module")
def group(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Group]:
    g = _configure(tmp_path_factory.mktemp("tls"))
    try:
        g.cluster.up(wait_s=20)
        wait_for(lambda: len(g.routes()) == 3, 15, "every node registered (signed)")
        yield g
    finally:
        g.cluster.down(grace_s=5.0)


def test_a_tls_group_replicates_and_serves_clients_over_tls(group: Group) -> None:
    g = group
    for i in range(5):
        wait_for(lambda i=i: g.append_ok(b"tls-%d" % i), 10, "append over TLS")
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


def test_peer_streams_without_a_member_certificate_of_this_group_are_refused(
    group: Group,
) -> None:
    peer_stream_attacks(group)


def test_a_join_without_a_member_certificate_of_this_group_is_refused(group: Group) -> None:
    """Secure by default, DLedgerPeer.Join needs a member certificate of this group naming
    the joiner (docs/SECURITY.md, threat 2): without one, with another CA's, or with another
    group's, nobody is added as a learner and the membership stays as it was."""
    join_attacks(group)


def test_only_a_groups_members_register_or_unregister_it(group: Group) -> None:
    registration_attacks(group, fresh_within_ms=FRESH_MS)


def test_a_client_not_speaking_tls_to_the_nameserver_is_counted(group: Group) -> None:
    namesrv_plaintext_counted(group)


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
    old, term = g.state()
    g.cluster.signal(old, signal.SIGKILL)
    new = g.cluster.wait_leader(timeout_s=15, exclude=old)
    assert new != old
    wait_for(lambda: g.append_ok(b"after failover"), 10, "a commit after the failover")
    wait_for(
        lambda: g.routes().get(new, ("", ""))[0] == "LEADER", 10, "the new leader's registration"
    )
    assert g.state()[1] > term
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
