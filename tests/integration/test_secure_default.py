"""Issue #18, "Must show", against ONE group started as `mqcluster up` starts it by default
(`mqcluster up` itself, as a process: TLS on every port, member certificates between peers,
users and ACLs with an admin user, a NameServer that takes registrations from members only).

- The attacks of the issue (tests/security_attacks.py, the same ones the transport and ACL
  tests run on their narrower groups): peer streams without a certificate, with another
  group's and with a member's claiming another id; a Join; RegisterBroker / UnregisterBroker
  from non-members; DeleteTopic, ResetConsumerOffset, TransferLeadership and raw Append
  without credentials, with wrong ones and as a user lacking the permission. Each refused
  with the structured error's code, nothing changed, the refusal counted.
- `mqadmin`, as a user types it with the two exports `mqcluster up` printed: the eight
  user/ACL commands; a user with Pub on one topic sends there and nowhere else; disabling
  the user, deleting its rule and deleting it reach every node within a second (before and
  after a kill -9 of the leader, on the new leader and the remaining follower).
- `mqaudit --connect` over TLS: its options and the fetch of every node's store and commit
  index (what precedes the Spark job; the audit itself is tests/audit's).
- `/metrics` over HTTPS at the addresses `up` printed, checked with the CA it printed.
"""

from __future__ import annotations

import http.client
import json
import os
import signal
import ssl
import subprocess
import sys
import time
import urllib.request
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import grpc
import pytest
from prometheus_client.parser import text_string_to_metric_families
from raftmq.broker.v1 import broker_pb2 as pb
from raftmq.broker.v1 import broker_pb2_grpc as pb_grpc
from raftmq.dledger.v1 import dledger_pb2 as dpb
from security_attacks import (
    STRANGER_ID,
    Clients,
    Target,
    client_attacks_refused,
    join_attacks,
    namesrv_plaintext_counted,
    peer_stream_attacks,
    prepare_client_attacks,
    refused,
    registration_attacks,
)
from support import wait_for

from mqcluster.cluster import LocalCluster
from mqcluster.localsecurity import LOCAL_HOSTS, SecureLayout
from mqsecurity import pki
from mqsecurity.credentials import Credentials, load_credentials
from mqsecurity.options import ENV_CREDENTIALS, ENV_TLS_CA
from mqsecurity.tls import TlsFiles
from rpckit.status import read_error
from spark_audit.__main__ import _parser as audit_parser
from spark_audit.__main__ import plan as audit_plan
from spark_audit.plan import InputError

pytestmark = pytest.mark.integration

BIN = Path(sys.executable).parent  # the venv's console scripts, as a user runs them


RPC_S = 5.0
# docs/SECURITY.md: deleting a user or a rule reaches every node within a second.
ACL_PROPAGATION_S = 1.0
# Small segments and index files, as every test group (tests/conftest.py): `mqcluster up
# --set`, the option a user has for broker.conf keys.
SETTINGS = {"mappedFileSizeCommitLog": str(4 << 20), "mappedFileSizeEntryIndex": str(1 << 20)}
ALICE = Credentials("alice", "alice-secret-0001")
ALICE_NEW = Credentials("alice", "alice-secret-0002")  # after updateUser -p
CAROL = Credentials("carol", "carol-secret-0001")  # no rules: lacks every permission
# Past the guard: the leader serves, a follower redirects (the guard runs before either).
PASSES = {"OK", "NOT_LEADER"}


def tool(name: str, module: str) -> list[str]:
    """The console script ``name`` beside this Python (tests run from the venv), else its
    module (both import the tree PYTHONPATH names first)."""
    script = BIN / name
    return [str(script)] if script.exists() else [sys.executable, "-m", module]


@dataclass
class Default:
    """The group `mqcluster up` started, what it printed, and the attacker's certificates."""

    target: Target
    exports: dict[str, str]  # RAFTMQ_CREDENTIALS, RAFTMQ_TLS_CA as printed
    printed: str  # what `mqcluster up` printed
    admin: Credentials
    clients: Clients  # TLS trusting the printed CA

    @property
    def cluster(self) -> LocalCluster:
        return self.target.cluster

    def leader(self) -> str:
        """The leader's client address."""
        return self.cluster.node(self.target.state()[0]).client_addr


def _printed_exports(stdout: str) -> dict[str, str]:
    """The ``export A=.. B=..`` line `mqcluster up` printed for the tools."""
    line = next(ln for ln in stdout.splitlines() if ln.strip().startswith("for mqadmin"))
    words = line.split("export ", 1)[1].split()
    return dict(w.split("=", 1) for w in words)


@pytest.fixture(scope="module")
def default(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Default]:
    base = tmp_path_factory.mktemp("secure-default") / "cluster"
    sets = [a for k, v in SETTINGS.items() for a in ("--set", f"{k}={v}")]
    up = [
        *tool("mqcluster", "mqcluster.cluster"),
        "--base-dir",
        str(base),
        "up",
        "--auto-ports",
        *sets,
    ]
    clients: Clients | None = None
    try:
        done = subprocess.run(up, capture_output=True, text=True, timeout=120)
        assert done.returncode == 0, done.stdout + done.stderr
        exports = _printed_exports(done.stdout)
        assert set(exports) == {ENV_CREDENTIALS, ENV_TLS_CA}, exports
        cluster = LocalCluster(base)
        assert cluster.secure and cluster.namesrv is not None
        layout = SecureLayout(base)
        assert exports[ENV_TLS_CA] == str(layout.ca_cert)
        # The attacker's certificates: another group's member from this very CA (as if a
        # second group shared it), and this group's member id from a CA of its own.
        attacker = base.parent / "attacker"
        attacker.mkdir(mode=0o700)
        stranger = pki.issue_member(
            pki.load_authority(str(layout.tls_dir)),
            str(attacker),
            "broker-b",
            STRANGER_ID,
            LOCAL_HOSTS,
        )
        other_ca = pki.create_authority(str(attacker / "other-ca"))
        foreign = pki.issue_member(
            other_ca, str(attacker / "other-ca"), cluster.group, "n1", LOCAL_HOSTS
        )
        target = Target(
            cluster,
            cluster.client_security(),
            exports[ENV_TLS_CA],
            {n.node_id: layout.member(cluster.group, n.node_id) for n in cluster.nodes},
            stranger,
            foreign,
        )
        clients = Clients(TlsFiles(ca_path=exports[ENV_TLS_CA]))
        admin = load_credentials(exports[ENV_CREDENTIALS])
        g = Default(target, exports, done.stdout, admin, clients)
        # `up` returns once a leader is elected: wait until every node answers the admin and
        # every one registered (signed) with the NameServer.
        wait_for(lambda: len(target.routes()) == len(cluster.nodes), 20, "every node registered")
        wait_for(lambda: all(_answers(g, n.client_addr) for n in cluster.nodes), 20, "every node")
        yield g
    finally:
        if clients is not None:
            clients.close()
        LocalCluster(base).down(grace_s=5.0)


def _answers(g: Default, addr: str) -> bool:
    try:
        g.clients(addr, g.admin)[1].Metadata(dpb.MetadataRequest(), timeout=0.5)
    except grpc.RpcError:
        return False
    return True


# ---------------------------------------------------------------------------------------
# The attacks
# ---------------------------------------------------------------------------------------


def test_peer_streams_and_joins_without_a_member_certificate_are_refused(default: Default) -> None:
    peer_stream_attacks(default.target)
    join_attacks(default.target)


def test_only_members_register_and_the_nameserver_speaks_only_tls(default: Default) -> None:
    # mqcluster's registration period is RocketMQ's 30 s: no fresh registration to wait for.
    registration_attacks(default.target)
    namesrv_plaintext_counted(default.target)


def test_client_port_attacks_are_refused_and_counted(default: Default) -> None:
    g = default
    leader = g.leader()
    admin = g.clients(leader, g.admin)[0]
    prepare_client_attacks(admin)
    admin.CreateUser(
        pb.CreateUserRequest(username=CAROL.access_key, password=CAROL.secret_key), timeout=RPC_S
    )
    target = next(n.node_id for n in g.cluster.nodes if n.client_addr != leader)
    wrong = Credentials(g.admin.access_key, "not-the-secret-1")
    client_attacks_refused(g.clients, leader, target, g.admin, wrong, CAROL)
    # Nor may a user lacking the permission give it to itself.
    carol = g.clients(leader, CAROL)[0]
    grant = pb.CreateAclRequest(subject="User:carol", resources=["Topic:*"], actions=["Pub"])
    assert refused(carol.CreateAcl, grant)[1] == "PERMISSION_DENIED"
    superuser = pb.UpdateUserRequest(username="carol", user_type="Super")
    assert refused(carol.UpdateUser, superuser)[1] == "PERMISSION_DENIED"
    rules = admin.ListAcl(pb.ListAclRequest(subject_filter="carol"), timeout=RPC_S)
    assert not rules.acls
    assert _usernames(admin) == {"admin", "carol"}


# ---------------------------------------------------------------------------------------
# mqaudit --connect over TLS
# ---------------------------------------------------------------------------------------


def test_mqaudit_connect_reaches_every_node_over_tls(default: Default) -> None:
    """What `mqaudit --connect` does before its Spark job: read the security options, ask
    every node over TLS (signed) for its store and commit index, and plan the audit."""
    g = default
    addrs = ",".join(g.cluster.client_addrs)
    printed = ["--tls-ca", g.exports[ENV_TLS_CA], "--credentials", g.exports[ENV_CREDENTIALS]]
    (plan,) = audit_plan(audit_parser().parse_args(["--connect", addrs, *printed]))
    assert plan.group == g.cluster.group and plan.audited_from == "metadata"
    assert {(r.replica, r.root) for r in plan.replicas} == {
        (n.node_id, str(g.cluster.base / n.node_id / f"dledger-{n.node_id}"))
        for n in g.cluster.nodes
    }
    assert plan.audited_index >= 1 and not plan.findings
    # Without the CA it speaks plaintext to TLS ports; without credentials, it is refused.
    for argv, code in (
        (["--credentials", g.exports[ENV_CREDENTIALS]], "UNAVAILABLE"),
        (["--tls-ca", g.exports[ENV_TLS_CA]], "UNAUTHENTICATED"),
    ):
        with pytest.raises(InputError) as err:
            audit_plan(audit_parser().parse_args(["--connect", addrs, *argv]))
        assert code in str(err.value), err.value


# ---------------------------------------------------------------------------------------
# mqadmin: users and ACLs, and revoking them everywhere
# ---------------------------------------------------------------------------------------


def _tool_env(exports: dict[str, str]) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if k not in (ENV_CREDENTIALS, ENV_TLS_CA)}
    return {**env, **exports}


def mqadmin(
    g: Default, *args: str, exports: dict[str, str] | None = None
) -> subprocess.CompletedProcess[str]:
    """``mqadmin -n <namesrv> --json ARGS`` as a user runs it, after the exports (default: the
    ones `mqcluster up` printed)."""
    assert g.cluster.namesrv is not None
    argv = [*tool("mqadmin", "client.mqadmin"), "-n", g.cluster.namesrv.addr, "--json", *args]
    env = _tool_env(g.exports if exports is None else exports)
    return subprocess.run(argv, capture_output=True, text=True, timeout=60, env=env)


def ok(g: Default, *args: str) -> list[dict[str, object]]:
    done = mqadmin(g, *args)
    assert done.returncode == 0, (args, done.stderr)
    rows: list[dict[str, object]] = json.loads(done.stdout)
    return rows


def send_as(g: Default, addr: str, creds: Credentials, topic: str) -> str:
    """``creds`` sends one message to ``topic`` through node ``addr``: OK, or the structured
    error's code (NOT_LEADER from a follower: the guard let it through)."""
    stub = g.clients(addr, creds)[0]
    request = pb.SendMessageRequest(topic=topic, messages=[pb.Message(topic=topic, body=b"a")])
    try:
        stub.SendMessage(request, timeout=RPC_S)
    except grpc.RpcError as exc:
        error = read_error(exc)
        assert error is not None, exc
        return error.code
    return "OK"


def everywhere(
    g: Default, addrs: list[str], creds: Credentials, topic: str, want: set[str], since: float
) -> None:
    """Every node of ``addrs`` answers ``creds``' send to ``topic`` with one of ``want``
    within `ACL_PROPAGATION_S` of ``since`` (when the change was acknowledged)."""
    for addr in addrs:
        while (got := send_as(g, addr, creds, topic)) not in want:
            late = time.monotonic() - since
            assert late < ACL_PROPAGATION_S, f"{addr} still answers {got} after {late:.2f} s"
            time.sleep(0.01)


def test_mqadmin_users_and_acls_revoked_on_every_node_and_after_failover(default: Default) -> None:
    g = default
    admin = g.clients(g.leader(), g.admin)[0]
    for topic in ("t-pub", "t-two", "t-other"):
        admin.CreateTopic(
            pb.CreateTopicRequest(topic=pb.TopicConfig(topic_name=topic)), timeout=RPC_S
        )
    nodes = g.cluster.client_addrs

    rows = ok(g, "createUser", "-u", "alice", "-p", ALICE.secret_key)
    assert rows == [
        {"broker": "broker-a", "username": "alice", "type": "Normal", "status": "enable"}
    ]
    dup = mqadmin(g, "createUser", "-u", "alice", "-p", ALICE.secret_key)
    assert dup.returncode == 1 and "ALREADY_EXISTS" in dup.stderr, dup.stderr
    # Pub on two topics, from 10.0.0.0/8 only: nothing this machine sends is allowed yet.
    rows = ok(
        g,
        "createAcl",
        "-s",
        "User:alice",
        "-r",
        "Topic:t-pub,Topic:t-two",
        "-a",
        "Pub",
        "-i",
        "10.0.0.0/8",
    )
    assert [(r["resource"], r["actions"], r["decision"], r["sourceIps"]) for r in rows] == [
        ("Topic:t-pub", ["Pub"], "Allow", ["10.0.0.0/8"]),
        ("Topic:t-two", ["Pub"], "Allow", ["10.0.0.0/8"]),
    ]
    listed = mqadmin(g, "listUser")
    assert listed.returncode == 0 and ALICE.secret_key not in listed.stdout
    users = {r["username"]: (r["type"], r["status"]) for r in json.loads(listed.stdout)}
    assert users["admin"] == ("Super", "enable") and users["alice"] == ("Normal", "enable")
    assert [r["resource"] for r in ok(g, "listAcl", "-s", "alice", "-r", "t-two")] == [
        "Topic:t-two"
    ]
    everywhere(g, nodes, ALICE, "t-pub", {"PERMISSION_DENIED"}, time.monotonic())

    # Disabled: refused as unknown by every node within a second.
    assert ok(g, "updateUser", "-u", "alice", "-s", "disable")[0]["status"] == "disable"
    everywhere(g, nodes, ALICE, "t-pub", {"UNAUTHENTICATED"}, time.monotonic())
    # Enabled again with a new password: the old one is refused everywhere.
    rows = ok(g, "updateUser", "-u", "alice", "-s", "enable", "-p", ALICE_NEW.secret_key)
    assert rows[0]["status"] == "enable"
    changed = time.monotonic()
    everywhere(g, nodes, ALICE_NEW, "t-pub", {"PERMISSION_DENIED"}, changed)
    everywhere(g, nodes, ALICE, "t-pub", {"UNAUTHENTICATED"}, changed)
    # The rules replaced without the source restriction: every node lets the sends through.
    rows = ok(g, "updateAcl", "-s", "User:alice", "-r", "Topic:t-pub,Topic:t-two", "-a", "Pub")
    assert [(r["resource"], r["decision"], r["sourceIps"]) for r in rows] == [
        ("Topic:t-pub", "Allow", []),
        ("Topic:t-two", "Allow", []),
    ]
    everywhere(g, nodes, ALICE_NEW, "t-pub", PASSES, time.monotonic())
    leader = g.leader()
    assert send_as(g, leader, ALICE_NEW, "t-pub") == "OK"
    assert send_as(g, leader, ALICE_NEW, "t-other") == "PERMISSION_DENIED"
    # A Deny rule (-d reaches the broker); the answer lists all of alice's rules.
    rows = ok(g, "createAcl", "-s", "User:alice", "-r", "Topic:t-other", "-a", "Pub", "-d", "Deny")
    assert {(r["resource"], r["decision"]) for r in rows} == {
        ("Topic:t-pub", "Allow"),
        ("Topic:t-two", "Allow"),
        ("Topic:t-other", "Deny"),
    }
    bad = mqadmin(g, "createAcl", "-s", "User:alice", "-r", "Queue:x", "-a", "Pub")
    assert bad.returncode == 1 and "INVALID_REQUEST" in bad.stderr, bad.stderr

    # deleteAcl of one rule: every node refuses that topic within a second, not the other.
    ok(g, "deleteAcl", "-s", "User:alice", "-r", "Topic:t-pub")
    everywhere(g, nodes, ALICE_NEW, "t-pub", {"PERMISSION_DENIED"}, time.monotonic())
    everywhere(g, nodes, ALICE_NEW, "t-two", PASSES, time.monotonic())

    # kill -9 the leader: the new leader and the remaining follower hold the same rules.
    old = g.target.state()[0]
    g.cluster.signal(old, signal.SIGKILL)
    new = g.cluster.wait_leader(timeout_s=15, exclude=old)
    live = [n.client_addr for n in g.cluster.nodes if n.node_id != old]
    wait_for(
        lambda: g.target.routes().get(new, ("", ""))[0] == "LEADER",
        10,
        "the new leader's registration",
    )
    new_addr = g.cluster.node(new).client_addr
    wait_for(lambda: send_as(g, new_addr, ALICE_NEW, "t-two") == "OK", 10, "a send after failover")
    for addr in live:
        assert send_as(g, addr, ALICE_NEW, "t-pub") == "PERMISSION_DENIED", addr
        assert send_as(g, addr, ALICE_NEW, "t-two") in PASSES, addr

    # deleteUser through the NameServer's new route: refused by both within a second.
    ok(g, "deleteUser", "-u", "alice")
    everywhere(g, live, ALICE_NEW, "t-two", {"UNAUTHENTICATED"}, time.monotonic())
    admin = g.clients(g.cluster.node(new).client_addr, g.admin)[0]
    assert "alice" not in _usernames(admin)
    assert not admin.ListAcl(pb.ListAclRequest(subject_filter="alice"), timeout=RPC_S).acls

    # Without the printed credentials mqadmin is refused (and creates nothing).
    anonymous = {ENV_TLS_CA: g.exports[ENV_TLS_CA]}
    done = mqadmin(g, "createUser", "-u", "mallory", "-p", "mallory-secret-1", exports=anonymous)
    assert done.returncode == 1 and "UNAUTHENTICATED" in done.stderr, done.stderr
    assert "mallory" not in _usernames(admin)


def _usernames(admin: pb_grpc.BrokerStub) -> set[str]:
    return {u.username for u in admin.ListUser(pb.ListUserRequest(), timeout=RPC_S).users}


# ---------------------------------------------------------------------------------------
# /metrics
# ---------------------------------------------------------------------------------------


def test_metrics_over_tls_at_the_printed_addresses_with_the_printed_ca(default: Default) -> None:
    """`up` printed https addresses for every node and the NameServer and how to curl them;
    each answers a scraper trusting the printed CA (Prometheus' `scheme: https` with
    `tls_config.ca_file`); plain HTTP to the same port gets no metrics (docs/METRICS.md)."""
    cluster = default.cluster
    assert cluster.namesrv is not None
    lines = default.printed.splitlines()
    line = next(ln for ln in lines if ln.startswith("metrics ("))
    urls = [w for w in line.split() if w.startswith(("http://", "https://"))]
    assert urls == [n.metrics_url for n in cluster.nodes] + [cluster.namesrv.metrics_url]
    assert all(u.startswith("https://127.0.0.1:") for u in urls), urls
    ca = default.exports[ENV_TLS_CA]
    assert any(f"curl --cacert {ca} {urls[0]}" in ln for ln in lines), line
    # Every process still running (an earlier test of the module may have killed a node).
    live = {n.metrics_url: "raftmq_node_info" for n in cluster.nodes if cluster.pid(n)}
    assert len(live) >= 2
    live[cluster.namesrv.metrics_url] = "raftmq_nameserver_brokers_registered"
    context = ssl.create_default_context(cafile=ca)
    for url, family in live.items():
        with urllib.request.urlopen(url, timeout=RPC_S, context=context) as resp:
            names = {f.name for f in text_string_to_metric_families(resp.read().decode())}
        assert family in names, url
    # What the harness's scrapers pass (tests/integration/test_metrics.py's scrape).
    scraper = cluster.metrics_ssl_context()
    assert scraper is not None
    url = next(iter(live))
    urllib.request.urlopen(url, timeout=RPC_S, context=scraper).close()
    with pytest.raises((OSError, http.client.HTTPException)):  # closed at once, no answer
        urllib.request.urlopen(url.replace("https://", "http://"), timeout=RPC_S)
