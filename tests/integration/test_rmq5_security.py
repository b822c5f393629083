"""RocketMQ 5's protocol on a SECURE 3-node group (what `mqcluster up` makes: TLS, member
certificates, users and permissions; issues #18 and #19, docs/SECURITY.md "RocketMQ 5 clients"):
the official Python and Node.js clients, over TLS verifying the group's CA, signed with a user's
AccessKey/SecretKey, send through a FOLLOWER's v2 port (forwarded over the members' TLS to the
leader, as the caller) and every message is stored once; wrong credentials get UNAUTHORIZED, a
user without Pub gets FORBIDDEN, nothing of theirs is stored and each refusal is counted; a
plaintext client cannot talk to the TLS port."""

from __future__ import annotations

import json
import os
import socket
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import grpc
import pytest
from integration.test_rmq5_producers import DISK_CONF, RMQ5, SCRIPTS
from raftmq.dledger.v1 import dledger_pb2 as dpb
from raftmq.dledger.v1 import dledger_pb2_grpc as dpb_grpc
from rmq5_support import ClientProcess
from support import create_topic_on, pull_all, wait_for

from broker.frontends.v2 import stubs
from client.admin import MQAdmin
from mqcluster.cluster import LocalCluster
from mqcluster.localsecurity import SecureLayout as Layout
from mqsecurity.channels import ClientSecurity, open_channel
from mqsecurity.credentials import Credentials, load_credentials
from mqsecurity.refusals import AUTHENTICATION, AUTHORIZATION
from mqsecurity.tls import TlsFiles

pytestmark = [pytest.mark.integration]

v2, v2_service, v2_grpc = stubs.load()

TOPIC = "RMQ5SEC"
QUEUES = 2
SENDS = 8
CLIENT_TIMEOUT_S = 40
CALL_TIMEOUT_S = 5
PUBLISHER = Credentials("rmq5-pub", "rmq5-pub-secret-1")  # Pub on TOPIC
READER = Credentials("rmq5-sub", "rmq5-sub-secret-1")  # Sub on TOPIC only
STRANGER = Credentials("rmq5-none", "rmq5-none-secret")  # no rules


@pytest.fixture(scope="module")
def group(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LocalCluster]:
    cluster = LocalCluster(tmp_path_factory.mktemp("rmq5sec"))
    cluster.configure(
        3,
        auto_ports=True,
        namesrv=True,
        secure=True,
        extra={"mappedFileSizeCommitLog": str(4 << 20), **DISK_CONF},
    )
    # One node also serves a plaintext v2 port (127.0.0.1 only; a per-node key).
    with open(cluster.nodes[0].conf, "a") as f:
        f.write(f"grpcServerPlaintextPort={_free_port()}\n")
    try:
        cluster.up()
        assert cluster.namesrv is not None
        create_topic_on([cluster], [cluster.namesrv.addr], TOPIC, QUEUES)
        admin = MQAdmin(cluster.namesrv.addr, cluster.client_security())
        for user, actions in ((PUBLISHER, ["Pub"]), (READER, ["Sub"]), (STRANGER, [])):
            admin.create_user(user.access_key, user.secret_key)
            if actions:
                admin.put_acl(f"User:{user.access_key}", [f"Topic:{TOPIC}"], actions)
        for n in cluster.nodes:  # every member applied the users and serves the route
            ask = v2_service.QueryRouteRequest(topic=v2.Resource(name=TOPIC))
            stub = v2_grpc.MessagingServiceStub(_v2_channel(cluster, n.grpc_addr, READER))
            wait_for(lambda s=stub, a=ask: _route_ok(s, a), 10, f"v2 route on {n.node_id}")
        yield cluster
    finally:
        cluster.down(grace_s=5.0)


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _plaintext_addr(cluster: LocalCluster) -> str:
    text = Path(cluster.nodes[0].conf).read_text()
    return "127.0.0.1:" + text.rsplit("grpcServerPlaintextPort=", 1)[1].split()[0]


_channels: dict[tuple[str, str], grpc.Channel] = {}


def _v2_channel(cluster: LocalCluster, addr: str, creds: Credentials | None) -> grpc.Channel:
    """A TLS channel trusting the group's CA, signed as ``creds`` (None: unsigned)."""
    key = (addr, creds.access_key if creds else "")
    if key not in _channels:
        tls = TlsFiles(None, None, str(Layout(cluster.base).ca_cert))
        _channels[key] = open_channel(addr, ClientSecurity(tls=tls, credentials=creds))
    return _channels[key]


def _route_ok(stub: Any, ask: Any) -> bool:
    try:
        return bool(stub.QueryRoute(ask, timeout=CALL_TIMEOUT_S).status.code == v2.OK)
    except grpc.RpcError:
        return False


def _follower(cluster: LocalCluster) -> Any:
    leader = cluster.wait_leader()
    return next(n for n in cluster.nodes if n.node_id != leader)


def _refusals(cluster: LocalCluster, node: Any) -> dict[str, int]:
    with open_channel(node.client_addr, cluster.client_security()) as ch:
        md = dpb_grpc.DLedgerClientStub(ch).Metadata(dpb.MetadataRequest(), timeout=CALL_TIMEOUT_S)
    return dict(md.refusals)


def _stored(cluster: LocalCluster, prefix: str) -> list[str]:
    """The uniq ids of the stored messages a client of ``prefix`` sent, read on the leader."""
    addr = cluster.node(cluster.wait_leader()).client_addr
    security = cluster.client_security()
    return [
        m.msg_id
        for q in range(QUEUES)
        for m in pull_all(addr, TOPIC, q, security)
        if m.properties.get("origin") == prefix
    ]


def _home(cluster: LocalCluster, prefix: str) -> Path:
    home = cluster.base / f"home-{prefix}"
    home.mkdir(exist_ok=True)
    return home


def _run(
    cluster: LocalCluster, lang: str, addr: str, creds: Credentials, prefix: str, tls: bool = True
) -> Any:
    """One official client's secure producer; its JSON lines (or its one error line)."""
    env = {
        "PATH": os.environ.get("PATH", ""),
        "HOME": str(_home(cluster, prefix)),  # both clients log under ~/logs (*.log)
        "GRPC_DEFAULT_SSL_ROOTS_FILE_PATH": str(Layout(cluster.base).ca_cert),
        "RMQ5_ACCESS_KEY": creds.access_key,
        "RMQ5_SECRET_KEY": creds.secret_key,
        "RMQ5_TLS": "1" if tls else "0",
    }
    if lang == "py":
        python = RMQ5 / "pyclient" / "bin" / "python"
        assert python.exists(), "build/rmq5/pyclient missing: run 'make venv'"
        argv = [str(python), str(SCRIPTS / "py_secure_producer.py")]
    else:
        modules = RMQ5 / "node" / "node_modules"
        assert (modules / "rocketmq-client-nodejs").exists(), "build/rmq5/node: run 'make venv'"
        env["NODE_PATH"] = str(modules)
        argv = ["node", str(SCRIPTS / "node_secure_producer.js")]
    home = _home(cluster, prefix)
    with ClientProcess([*argv, addr, TOPIC, str(SENDS), prefix], home, env) as client:
        code = client.wait(CLIENT_TIMEOUT_S)
        lines = client.lines()
        assert code in (0, 3) and lines, f"{lang}: exit {code}\n{client.tail(3000)}"
    return lines


@pytest.mark.parametrize("lang", ["py", "node"])
def test_official_client_with_credentials_over_tls_through_a_follower(
    group: LocalCluster, lang: str
) -> None:
    follower = _follower(group)
    admin = load_credentials(str(Layout(group.base).admin_credentials))
    for who, creds in (("admin", admin), ("pub", PUBLISHER)):
        prefix = f"{lang}-{who}"
        lines = _run(group, lang, follower.grpc_addr, creds, prefix)
        assert lines[-1] == {"done": SENDS}, lines
        stored = _stored(group, prefix)
        assert sorted(stored) == sorted(r["message_id"][2:] for r in lines[:-1])
        assert len(set(stored)) == SENDS  # each stored once


@pytest.mark.parametrize("lang", ["py", "node"])
def test_official_client_refused_and_nothing_stored(group: LocalCluster, lang: str) -> None:
    follower = _follower(group)
    before = _refusals(group, follower)
    wrong = Credentials(PUBLISHER.access_key, "not-the-secret-1")
    expected = {  # who: (credentials, the v2 code the client is answered)
        "wrong": (wrong, v2.UNAUTHORIZED),  # its first call, the route, is refused
        "stranger": (STRANGER, v2.FORBIDDEN),  # neither Pub nor Sub: no route
        "reader": (READER, v2.FORBIDDEN),  # Sub: the route, but no send
    }
    for who, (creds, code) in expected.items():
        prefix = f"{lang}-{who}"
        lines = _run(group, lang, follower.grpc_addr, creds, prefix)
        assert len(lines) == 1 and "error" in lines[0], (who, lines)
        # Node raises the Status's code; Python's startup logs a refused route lookup and its
        # send raises "failed to fetch topic route", a refused send its code.
        logs = "".join(p.read_text() for p in _home(group, prefix).rglob("*.log"))
        assert str(code) in json.dumps(lines[0]) + logs, (who, lines)
        assert _stored(group, prefix) == []
    after = _refusals(group, follower)
    assert after[AUTHENTICATION] > before[AUTHENTICATION]
    assert after[AUTHORIZATION] >= before[AUTHORIZATION] + 2


def test_raw_refusals_are_in_the_body_status(group: LocalCluster) -> None:
    addr = _follower(group).grpc_addr
    route = v2_service.QueryRouteRequest(topic=v2.Resource(name=TOPIC))
    send = v2_service.SendMessageRequest(messages=[v2.Message(topic=v2.Resource(name=TOPIC))])
    unsigned = v2_grpc.MessagingServiceStub(_v2_channel(group, addr, None))
    assert unsigned.QueryRoute(route, timeout=CALL_TIMEOUT_S).status.code == v2.UNAUTHORIZED
    reader = v2_grpc.MessagingServiceStub(_v2_channel(group, addr, READER))
    # Behind TLS as in plaintext every Endpoints of a route holds one address (the clients'
    # certificate check needs it), the one asked among them (docs/RMQ5.md, "Routes and a
    # dying node").
    host, port = addr.rsplit(":", 1)
    asked = v2.Endpoints(scheme=v2.IPv4, addresses=[v2.Address(host=host, port=int(port))])
    routed = reader.QueryRoute(
        v2_service.QueryRouteRequest(topic=v2.Resource(name=TOPIC), endpoints=asked),
        timeout=CALL_TIMEOUT_S,
    )
    assert routed.status.code == v2.OK
    assert all(len(q.broker.endpoints.addresses) == 1 for q in routed.message_queues)
    assert asked.SerializeToString() in {
        q.broker.endpoints.SerializeToString() for q in routed.message_queues
    }
    answer = reader.SendMessage(send, timeout=CALL_TIMEOUT_S)
    assert answer.status.code == v2.FORBIDDEN and "may not Pub" in answer.status.message
    # the port speaks TLS only
    with grpc.insecure_channel(addr) as plain, pytest.raises(grpc.RpcError) as info:
        v2_grpc.MessagingServiceStub(plain).QueryRoute(route, timeout=CALL_TIMEOUT_S)
    assert info.value.code() is grpc.StatusCode.UNAVAILABLE


def test_the_plaintext_port_is_local_and_guarded(group: LocalCluster) -> None:
    addr = _plaintext_addr(group)
    lines = _run(group, "py", addr, PUBLISHER, "py-plain", tls=False)
    assert lines[-1] == {"done": SENDS}, lines
    assert sorted(_stored(group, "py-plain")) == sorted(r["message_id"][2:] for r in lines[:-1])
    lines = _run(group, "py", addr, READER, "py-plain-reader", tls=False)
    assert len(lines) == 1 and "error" in lines[0], lines
    assert _stored(group, "py-plain-reader") == []
    route = v2_service.QueryRouteRequest(topic=v2.Resource(name=TOPIC))
    with grpc.insecure_channel(addr) as plain:
        answer = v2_grpc.MessagingServiceStub(plain).QueryRoute(route, timeout=CALL_TIMEOUT_S)
    assert answer.status.code == v2.UNAUTHORIZED
