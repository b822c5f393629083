"""A real DLedger group: processes on 127.0.0.1, real gRPC, real files, real signals."""

from __future__ import annotations

import signal
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path

import grpc
import pytest
from log_writer import Writer, append_until_acked, assert_exactly_once
from raftmq.dledger.v1 import dledger_pb2 as pb
from raftmq.dledger.v1 import dledger_pb2_grpc as pb_grpc
from support import wait_for

from dledger.server.client import ClientError, LogClient
from mqcluster.cluster import LocalCluster

pytestmark = pytest.mark.integration


def live_nodes(cluster: LocalCluster) -> list[str]:
    return [n.client_addr for n in cluster.nodes if cluster.pid(n) is not None]


def wait_converged(cluster: LocalCluster, client: LogClient, timeout_s: float = 20.0) -> int:
    """Wait until every live node has applied the same last index; return it."""
    state: dict[str, int] = {}

    def converged() -> bool:
        state.clear()
        for addr in live_nodes(cluster):
            try:
                md = client.metadata(addr, timeout_s=1.0)
            except ClientError:
                return False
            state[addr] = md.applied_index if md.applied_index == md.last_index else -1
        values = set(state.values())
        return len(values) == 1 and -1 not in values

    wait_for(converged, timeout_s, f"nodes to converge ({state})")
    return next(iter(state.values()))


def bodies_of(client: LogClient, addr: str) -> list[bytes]:
    return [e.body for e in client.read_all(addr) if e.type == 0]


def test_10k_entries_read_back_identically_from_every_node(
    local_group: Callable[..., LocalCluster],
) -> None:
    cluster = local_group(3)
    with cluster.client() as client:
        expected = [f"entry-{i:05d}".encode() * 3 for i in range(10_000)]
        for i in range(0, len(expected), 100):
            result = client.append(expected[i : i + 100])
            assert result.last_index - result.first_index == 99
        wait_converged(cluster, client)
        for addr in cluster.client_addrs:
            assert bodies_of(client, addr) == expected, addr


def test_sigkill_leader_under_load(local_group: Callable[..., LocalCluster]) -> None:
    cluster = local_group(3)
    with cluster.client() as client:
        writer = Writer(cluster.client()).start()
        try:
            writer.wait_acks(300, 30)
            leader = cluster.wait_leader()
            cluster.signal(leader, signal.SIGKILL)
            killed_at = time.monotonic()
            writer.wait_acks(300, 30)
            failover_s = next(t for t in writer.ack_times if t > killed_at) - killed_at
            print(f"\nfailover (SIGKILL of leader -> next acknowledged append): {failover_s:.3f} s")
            cluster.start(leader)
            writer.wait_acks(300, 30)
        finally:
            writer.stop()
        wait_converged(cluster, client, timeout_s=30)
        logs = {addr: bodies_of(client, addr) for addr in cluster.client_addrs}
        assert_exactly_once(writer.acked, logs)
        assert failover_s < 10.0  # generous bound for a loaded CI box; the figure is printed


def test_sigstop_leader_steps_down_and_loses_nothing(
    local_group: Callable[..., LocalCluster],
) -> None:
    cluster = local_group(3, raftElectionTimeoutMs=500)
    with cluster.client() as client:
        writer = Writer(cluster.client()).start()
        try:
            writer.wait_acks(200, 30)
            old = cluster.wait_leader()
            old_addr = cluster.node(old).client_addr
            old_term = client.metadata(old_addr).term
            cluster.signal(old, signal.SIGSTOP)
            # A request that reaches the paused leader (raw stub: no redirect). When the node
            # resumes it may append this as an uncommitted tail, which the new leader's log must
            # truncate; it can never be acknowledged.
            channel = grpc.insecure_channel(old_addr)
            stale = pb_grpc.DLedgerClientStub(channel).Append.future(
                pb.AppendEntriesRequest(bodies=[b"stale-tail"]), timeout=20
            )
            new = cluster.wait_leader(timeout_s=15, exclude=old)
            writer.wait_acks(200, 30)
            cluster.signal(old, signal.SIGCONT)
            with pytest.raises(grpc.RpcError) as refused:
                stale.result(timeout=20)
            channel.close()
            wait_for(
                lambda: (
                    client.metadata(old_addr).role == "FOLLOWER"
                    and client.metadata(old_addr).term > old_term
                ),
                15,
                "the old leader to step down",
            )
            writer.wait_acks(100, 30)
        finally:
            writer.stop()
        assert new != old
        detail = refused.value.details() or ""
        assert detail.split()[0] in ("NOT_LEADER", "LEADERSHIP_LOST"), detail
        wait_converged(cluster, client, timeout_s=30)
        logs = {addr: bodies_of(client, addr) for addr in cluster.client_addrs}
        assert_exactly_once(writer.acked, logs)
        assert b"stale-tail" not in next(iter(logs.values()))


# An election among the three left (pre-vote, vote, a first commit) takes a few election
# timeouts; 30 s covers several on a 2-core machine running another test session.
TWO_DOWN_COMMIT_S = 30.0


def test_five_nodes_tolerate_two_down_and_refuse_with_three_down(
    local_group: Callable[..., LocalCluster],
) -> None:
    cluster = local_group(5, rpcTimeoutMs=2000)
    with cluster.client() as client:
        client.append([b"before"])
        leader = cluster.wait_leader()
        followers = [n.node_id for n in cluster.nodes if n.node_id != leader]
        for node_id in followers[:2]:
            cluster.signal(node_id, signal.SIGKILL)
        # Three of five still commit. The stall of killing two on a loaded machine may cost
        # the leader its term (an attempt then ends LEADERSHIP_LOST, outcome unknown): the
        # group must still take the value, under whichever leader the three elect.
        assert append_until_acked(client, b"two-down", TWO_DOWN_COMMIT_S) > 0
        cluster.signal(followers[2], signal.SIGKILL)
        started = time.monotonic()
        with pytest.raises(ClientError) as err:
            client.timeout_s = 10
            client.append([b"three-down"])
        elapsed = time.monotonic() - started
        assert err.value.status == "UNAVAILABLE", err.value
        assert elapsed < 8, f"refusal took {elapsed:.1f} s"


def test_write_to_follower_redirects_to_leader(local_group: Callable[..., LocalCluster]) -> None:
    cluster = local_group(3)
    leader = cluster.wait_leader()
    follower = next(n for n in cluster.nodes if n.node_id != leader)
    with LogClient([follower.client_addr]) as client:
        # A follower learns the leader (and its client address) from the first append it gets.
        wait_for(
            lambda: client.metadata(follower.client_addr).leader_client_addr != "",
            10,
            "the follower to learn the leader's address",
        )
        md = client.metadata(follower.client_addr)
        assert md.role == "FOLLOWER" and md.leader_id == leader
        assert md.leader_client_addr == cluster.node(leader).client_addr
        result = client.append([b"via-follower"])
        assert result.node == cluster.node(leader).client_addr


def test_mqcluster_cli_up_status_kill_start_down(tmp_path: Path) -> None:
    base = tmp_path / "cli"

    def cli(*args: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            [sys.executable, "-m", "mqcluster.cluster", "--base-dir", str(base), *args],
            capture_output=True,
            text=True,
            timeout=90,
        )

    # --insecure: the plaintext path end to end (test_nameserver.py starts the secure default).
    up = cli("up", "--auto-ports", "--insecure", "--set", "mappedFileSizeCommitLog=4194304")
    try:
        assert up.returncode == 0, up.stderr
        assert "security: none (--insecure)" in up.stdout
        assert "LEADER" in up.stdout and "n0" in up.stdout
        cluster = LocalCluster(base)
        pids = [cluster.pid(n) for n in cluster.nodes]
        assert all(pids)
        assert cli("kill", "n1").returncode == 0
        status = cli("status")
        assert "DOWN" in status.stdout
        assert cli("start", "n1").returncode == 0
        bad = cli("kill", "n9")
        assert bad.returncode == 1 and "unknown node 'n9'" in bad.stderr
    finally:
        down = cli("down")
    assert down.returncode == 0, down.stderr
    cluster = LocalCluster(base)
    assert all(cluster.pid(n) is None for n in cluster.nodes)


def test_bad_config_and_busy_port_stop_the_broker_with_one_line(tmp_path: Path) -> None:
    conf = tmp_path / "bad.conf"
    conf.write_text("dLegerPeers=n0-127.0.0.1:40999\ndLegerSelfId=n0\nlistenPortt=1\n")
    run = subprocess.run(
        [sys.executable, "-m", "broker", "-c", str(conf)],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert run.returncode == 2
    assert run.stderr.strip().splitlines() == [
        f"mqbroker: {conf}: unknown key 'listenPortt' (did you mean 'listenPort'?) (mqbroker "
        "--help lists the keys; RocketMQ's other keys are accepted and ignored)"
    ]

    import socket

    with socket.socket() as busy, socket.socket() as free:
        busy.bind(("127.0.0.1", 0))
        busy.listen()
        free.bind(("127.0.0.1", 0))
        port, client_port = busy.getsockname()[1], free.getsockname()[1]
        free.close()
        conf.write_text(
            f"dLegerPeers=n0-127.0.0.1:{port}\ndLegerSelfId=n0\nlistenPort={client_port}\n"
            f"storePathRootDir={tmp_path / 'store'}\nmappedFileSizeCommitLog=1048576\n"
        )
        run = subprocess.run(
            [sys.executable, "-m", "broker", "-c", str(conf)],
            capture_output=True,
            text=True,
            timeout=60,
        )
    assert run.returncode == 1
    assert run.stderr.strip().splitlines() == [
        f"mqbroker: cannot start: port in use or not bindable: 127.0.0.1:{port} "
        "(Address already in use)"
    ]


def test_lying_peers_are_refused_and_the_node_stays_up(
    local_group: Callable[..., LocalCluster],
) -> None:
    cluster = local_group(3)
    leader = cluster.wait_leader()
    victim = next(n for n in cluster.nodes if n.node_id != leader)
    channel = grpc.insecure_channel(f"127.0.0.1:{victim.peer_port}")
    stub = pb_grpc.DLedgerPeerStub(channel)
    # Not a member of the group: refused outright.
    with pytest.raises(grpc.RpcError) as denied:
        stub.Stream(iter([pb.PeerMessage()]), metadata=(("x-raftmq-group", "other"),), timeout=5)
    assert denied.value.code() == grpc.StatusCode.PERMISSION_DENIED
    # A member's identity but garbage content: a huge term with non-contiguous entries, and a
    # message claiming to come from someone else. Both are dropped; nothing changes.
    with cluster.client() as client:
        term_before = client.metadata(victim.client_addr).term
        lies = [
            pb.PeerMessage(
                append_request=pb.AppendRequest(
                    from_id=leader,
                    to_id=victim.node_id,
                    term=10**6,
                    prev_log_index=1,
                    prev_log_term=1,
                    entries=[pb.Entry(term=10**6, index=5, body=b"lie")],
                )
            ),
            pb.PeerMessage(timeout_now=pb.TimeoutNowRequest(from_id="n-fake", to_id="x", term=9)),
        ]
        # The same lies again inside a batch, with a batch nested in it (never sent by a
        # real peer): every one is dropped just the same.
        nested = pb.PeerMessage(batch=pb.PeerBatch(messages=lies))
        batch = pb.PeerMessage(batch=pb.PeerBatch(messages=[*lies, nested]))
        ack = stub.Stream(
            iter([*lies, batch]),
            metadata=(("x-raftmq-group", cluster.group), ("x-raftmq-from", leader)),
            timeout=5,
        )
        assert ack.received == 3
        md = client.metadata(victim.client_addr)
        assert md.term == term_before
        assert client.append([b"still-working"]).last_index > 0
        # A true message inside a batch is acted on: the leader's TimeoutNow makes the
        # victim campaign at once, in a new term.
        hand_over = pb.PeerMessage(
            timeout_now=pb.TimeoutNowRequest(
                group=cluster.group, from_id=leader, to_id=victim.node_id, term=term_before
            )
        )
        stub.Stream(
            iter([pb.PeerMessage(batch=pb.PeerBatch(messages=[hand_over]))]),
            metadata=(("x-raftmq-group", cluster.group), ("x-raftmq-from", leader)),
            timeout=5,
        )
        channel.close()
        deadline = time.monotonic() + 10
        while client.metadata(victim.client_addr).term == term_before:
            assert time.monotonic() < deadline, "the batched TimeoutNow was not acted on"
            time.sleep(0.05)


def test_health_and_reflection_on_both_ports(local_group: Callable[..., LocalCluster]) -> None:
    from grpc_health.v1 import health_pb2, health_pb2_grpc
    from grpc_reflection.v1alpha import reflection_pb2, reflection_pb2_grpc

    cluster = local_group(3)
    node = cluster.nodes[0]
    for port, service in (
        (node.client_port, "raftmq.dledger.v1.DLedgerClient"),
        (node.peer_port, "raftmq.dledger.v1.DLedgerPeer"),
    ):
        with grpc.insecure_channel(f"127.0.0.1:{port}") as channel:
            health = health_pb2_grpc.HealthStub(channel)
            for name in ("", service):
                reply = health.Check(health_pb2.HealthCheckRequest(service=name), timeout=5)
                assert reply.status == health_pb2.HealthCheckResponse.SERVING
            refl = reflection_pb2_grpc.ServerReflectionStub(channel)
            replies = list(
                refl.ServerReflectionInfo(
                    iter([reflection_pb2.ServerReflectionRequest(list_services="")]), timeout=5
                )
            )
            names = {s.name for s in replies[0].list_services_response.service}
            assert service in names and "grpc.health.v1.Health" in names
