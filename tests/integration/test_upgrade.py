"""Issue #38, "Must show": a rolling upgrade from the previous release under load.

A secure 3-node group and its NameServer are started from the previous release's tree (built
from the repository's own history, tests/upgrade_support.py) with SYNC_FLUSH. The old group
gets messages, committed consumer offsets, a POP receive left in flight, a timed and a delayed
message, a committed and a pending transaction, and a user with an ACL rule. Then, with a
bounded writer sending throughout, the NameServer and the nodes are upgraded one at a time to
the current tree (followers first, the leader last after a leadership transfer), each stopped
by its PID and started with the current code against the same store and config, and waited for
until it has caught up. Before the feature level is raised, no node may have written a format
the previous release cannot read (checkpoint format 2, ``snapshot.json`` version 2, no
``features`` in any CONFIG body), and one upgraded node is rolled back to the old tree (it
starts and catches up) and upgraded again. Then the feature level is raised with `mqadmin
setFeatureLevel`: refused while a member is down (named), done once it is back; every node then
runs at level 2 and writes checkpoint format 3. Then the checks: every acknowledged message
stored exactly once, the offsets kept, the old POP receipts ack, the timed and delayed messages
delivered, the pending half checked back and committed, the user authenticates, the NameServer
routes to the leader, and the replicas identical (``mqaudit`` CLEAN, in the run's shared
SparkSession). Last, the previous release's store code refuses a copy of a node's store with
the checkpoint format message: after the raise no node can go back.
"""

from __future__ import annotations

import contextlib
import json
import queue
import shutil
import signal
import struct
import subprocess
import sys
import threading
import time
from collections import Counter
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

import grpc
import pytest
from raftmq.broker.v1 import broker_pb2 as pb
from raftmq.broker.v1 import broker_pb2_grpc as pb_grpc
from raftmq.nameserver.v1 import nameserver_pb2 as nspb
from raftmq.nameserver.v1 import nameserver_pb2_grpc as nspb_grpc
from support import pull_all, send_results, wait_for
from upgrade_support import OldTree, build_previous_release

from broker.frontends.v2 import stubs
from broker.state.message import UniqIdGenerator
from dledger.log import EntryType
from dledger.server.client import ClientError, LogClient
from mqcluster.cluster import LocalCluster, NodeInfo
from mqcluster.leader_client import LeaderClient
from mqrelease import FEATURE_LEVEL, RELEASE
from mqsecurity.channels import ClientSecurity, open_channel
from mqsecurity.credentials import Credentials, load_credentials
from mqsecurity.tls import TlsFiles
from rpckit.status import read_error
from spark_audit.__main__ import main as audit_main

if TYPE_CHECKING:
    from pyspark.sql import SparkSession

pytestmark = pytest.mark.integration

v2, v2_service, v2_grpc = stubs.load()

# broker.conf keys of the old group (`mqcluster up --set`), kept across the upgrade: small
# segments and index files as every test group's (tests/conftest.py), SYNC_FLUSH, and a
# transaction check-back every 2 s that never gives up within the test (RocketMQ's 6 s / 30 s /
# 15 would discard the pending half or check it after the test).
SETTINGS = {
    "mappedFileSizeCommitLog": str(4 << 20),
    "mappedFileSizeEntryIndex": str(1 << 20),
    "flushDiskType": "SYNC_FLUSH",
    "transactionTimeOut": "2000",
    "transactionCheckInterval": "2000",
    "transactionCheckMax": "1000",
}
TOPIC = "UpgradeT"  # the writer's
QUEUES = 4
POP_TOPIC, POP_GROUP, POP_MESSAGES = "UpgradePop", "upgrade-pop", 4
# A POP receive stays invisible longer than the test runs: its receipts must still ack after.
POP_INVISIBLE_MS = 300_000
# The second receive, which must find nothing: the shortest invisible time the broker takes.
POP_RECHECK_INVISIBLE_MS = 10_000
TXN_TOPIC = "UpgradeTxn"
TIMER_TOPIC = "UpgradeTimer"
USER_TOPIC, USER = "UpgradeUser", "upgrader"
OFFSET_GROUP = "upgrade-cg"
# The timed message is due this long after it is sent: during the upgrade or just after.
TIMER_DELAY_MS = 25_000
# messageDelayLevel's level 3 is 10 s (the default `1s 5s 10s ...`).
DELAY_LEVEL = 3
# The writer: batches of this many messages, one send at most every PACE_S, at most
# MAX_SENDS sends (a bound, not the expected count: ~1,000 in a run).
BATCH, PACE_S, MAX_SENDS, BODY_BYTES = 8, 0.02, 5000, 64
# One send's deadline, following redirects and retrying through an election.
SEND_DEADLINE_S = 20.0
RPC_S = 10.0
# Seconds for the old `mqcluster up` (a CA, certificates, three nodes and a NameServer).
OLD_UP_S = 120.0
# Seconds a restarted node has to answer and apply what the leader had committed.
CATCH_UP_S = 60.0
STOP_S = 15.0
# Seconds for a check-back, a timed delivery and a failover's aftermath on a loaded machine
# (timed delivery across a failover: p99 0.8-2.0 s, README's row for issue #20).
DELIVERY_S = 60.0
CHECKPOINT_HEAD = struct.Struct(">IH")  # magic, format version (docs/FORMAT.md)
CHECKPOINT_MAGIC = 0x434B5054
# What the previous release writes and reads: checkpoint format 2, snapshot.json version 2.
OLD_CHECKPOINT_FORMAT = 2
OLD_SNAPSHOT_VERSION = 2
# The previous release's store opening a copy of a node's store (in a process of its own, under
# the old tree): the group's segment sizes, no background threads; one JSON line out.
OLD_STORE_PROBE = """
import json, sys
from dledger.storage.store import SegmentedLogStore, StoreConfig
config = StoreConfig(
    segment_size_bytes=int(sys.argv[2]),
    index_segment_size_bytes=int(sys.argv[3]),
    preallocate=False,
    warm_segments=False,
)
try:
    store = SegmentedLogStore(sys.argv[1], config)
except Exception as exc:
    print(json.dumps({"refused": type(exc).__name__, "message": str(exc)}))
else:
    print(json.dumps({"last_index": store.last_index()}))
    store.close()
"""
OLD_STORE_PROBE_S = 60.0
# What a raised group's stores write: the checkpoint that carries the level (docs/FORMAT.md).
NEW_CHECKPOINT_FORMAT = 3
# Seconds for one mqadmin run (a cold interpreter, a raise committed through the group).
MQADMIN_S = 60.0


# ---------------------------------------------------------------------------------------
# The writer under the upgrade
# ---------------------------------------------------------------------------------------


@dataclass
class Writer:
    """One thread sending numbered batches to the leader until stopped; a failed send is
    retried with the same message ids (the broker deduplicates), so that every batch is
    acknowledged once at most. ``acked``: msg id -> queue id of every acknowledged message."""

    client: LeaderClient
    ids: UniqIdGenerator = field(default_factory=lambda: UniqIdGenerator(ip="127.0.0.1"))
    acked: dict[str, int] = field(default_factory=dict)
    failures: Counter[str] = field(default_factory=Counter)
    stop: threading.Event = field(default_factory=threading.Event)
    error: list[BaseException] = field(default_factory=list)

    def run(self) -> None:
        try:
            for seq in range(MAX_SENDS):
                if self.stop.is_set():
                    return
                self._send_until_acked(self._batch(seq))
                self.stop.wait(PACE_S)
        except BaseException as exc:  # reported by the test, not lost in the thread
            self.error.append(exc)

    def _batch(self, seq: int) -> list[pb.Message]:
        return [
            pb.Message(
                topic=TOPIC,
                queue_id=(seq * BATCH + i) % QUEUES,
                body=f"{seq:06d}-{i}".encode().ljust(BODY_BYTES, b"."),
                msg_id=self.ids.next_id(),
            )
            for i in range(BATCH)
        ]

    def _send_until_acked(self, batch: list[pb.Message]) -> None:
        request = pb.SendMessageRequest(topic=TOPIC, messages=batch)
        while True:
            try:
                resp = self.client.call(
                    lambda stub: stub.SendMessage(request, timeout=5.0), SEND_DEADLINE_S
                )
            except grpc.RpcError as exc:
                info = read_error(exc)
                self.failures[info.code if info is not None else str(exc.code())] += 1
                if self.stop.is_set():
                    return  # never acknowledged: not counted
                continue
            for r in send_results(resp):
                self.acked[r.msg_id] = r.queue_id
            return


# ---------------------------------------------------------------------------------------
# The group and its nodes
# ---------------------------------------------------------------------------------------


@dataclass
class Group:
    """The group under upgrade: the cluster as mqcluster's state file describes it, the old
    tree, and how the test reaches the nodes (TLS, the admin's credentials)."""

    cluster: LocalCluster
    old: OldTree
    security: ClientSecurity
    broker: LeaderClient

    def log_client(self) -> LogClient:
        return self.cluster.client()

    def stub(self, n: NodeInfo) -> pb_grpc.BrokerStub:
        return self.broker.stub(n.client_addr)

    def leader(self) -> NodeInfo:
        return self.cluster.node(self.cluster.wait_leader())

    def call(self, method: str, request: Any) -> Any:
        """A leader-only Broker RPC, following redirects and retrying through an election."""
        return self.broker.call(
            lambda stub: getattr(stub, method)(request, timeout=RPC_S), SEND_DEADLINE_S
        )

    def runs_old_tree(self, n: NodeInfo) -> bool:
        """Whether node ``n``'s process runs the old tree (its PYTHONPATH names it)."""
        pid = self.cluster.pid(n)
        assert pid is not None, f"{n.node_id} is not running"
        environ = Path(f"/proc/{pid}/environ").read_bytes().split(b"\0")
        paths = [e for e in environ if e.startswith(b"PYTHONPATH=")]
        return bool(paths) and str(self.old.root).encode() in paths[0]

    def stop(self, n: NodeInfo) -> None:
        """SIGTERM node ``n`` by its PID and wait until it is gone."""
        self.cluster.signal(n.node_id, signal.SIGTERM)
        wait_for(lambda: self.cluster.pid(n) is None, STOP_S, f"{n.node_id} to stop")

    def restart(self, n: NodeInfo, *, old: bool) -> None:
        """Stop ``n`` and start it again from the old tree or the current one, against the same
        store and config; return once it has applied what the leader had committed."""
        self.stop(n)
        self.start(n, old=old)

    def start(self, n: NodeInfo, *, old: bool) -> None:
        """Start stopped node ``n`` from the old tree or the current one; return once it has
        applied what the leader had committed."""
        if old:
            self.cluster.node_env[n.node_id] = self.old.node_env()
        else:
            self.cluster.node_env.pop(n.node_id, None)
        self.cluster.start(n.node_id)
        assert self.runs_old_tree(n) == old, n.node_id
        self.wait_caught_up(n)
        # What it says it runs: the previous release predates Metadata.release ("").
        with self.log_client() as client:
            assert client.metadata(n.client_addr).release == ("" if old else RELEASE)

    def wait_caught_up(self, n: NodeInfo) -> None:
        with self.log_client() as client:

            def answers() -> bool:
                if self.cluster.pid(n) is None:
                    raise AssertionError(f"{n.node_id} exited: {self.cluster.exited(n)}")
                try:
                    client.metadata(n.client_addr, timeout_s=1.0)
                except ClientError:
                    return False
                return True

            wait_for(answers, CATCH_UP_S, f"{n.node_id} to answer")
            target = client.metadata(self.leader().client_addr).commit_index

            def applied() -> bool:
                return client.metadata(n.client_addr).applied_index >= target

            wait_for(applied, CATCH_UP_S, f"{n.node_id} to apply index {target}")

    def converged(self) -> bool:
        with self.log_client() as client:
            try:
                metas = [client.metadata(a, timeout_s=2.0) for a in self.cluster.client_addrs]
            except ClientError:
                return False
        return len({(m.last_index, m.commit_index, m.applied_index) for m in metas}) == 1


@pytest.fixture
def group(tmp_path: Path) -> Iterator[Group]:
    """The previous release's tree (step 0: its processes import it), and a secure 3-node
    group with a NameServer started by its own `mqcluster up`. Stopped at the end, pass or
    fail, by the PIDs in its state files."""
    old = build_previous_release(tmp_path / "old")
    old.check_imports()
    base = tmp_path / "cluster"
    sets = [a for k, v in SETTINGS.items() for a in ("--set", f"{k}={v}")]
    argv = ["-m", "mqcluster.cluster", "--base-dir", str(base), "up", "--auto-ports", *sets]
    broker: LeaderClient | None = None
    try:
        done = old.run(argv, OLD_UP_S)
        assert done.returncode == 0, done.stdout + done.stderr
        cluster = LocalCluster(base)
        assert cluster.secure and cluster.namesrv is not None
        security = cluster.client_security()
        broker = LeaderClient(lambda: cluster.client_addrs, security)
        g = Group(cluster, old, security, broker)
        assert all(g.runs_old_tree(n) for n in cluster.nodes)
        yield g
    finally:
        if broker is not None:
            broker.close()
        LocalCluster(base).down(grace_s=10.0)


# ---------------------------------------------------------------------------------------
# State made on the old group
# ---------------------------------------------------------------------------------------


@dataclass
class Seeded:
    """What the old group was given, to be found again after the upgrade."""

    offsets: dict[int, int]  # OFFSET_GROUP's committed offset of TOPIC, by queue
    pop_handles: list[str]
    pop_ids: list[str]
    timed_id: str
    delayed_id: str
    committed_txn_id: str
    pending_txn: tuple[str, str]  # (msg id, transaction id) of the half left open
    user: Credentials


def _create_topics(g: Group) -> None:
    for name, queues in (
        (TOPIC, QUEUES),
        (POP_TOPIC, 1),
        (TXN_TOPIC, 1),
        (TIMER_TOPIC, 1),
        (USER_TOPIC, 1),
    ):
        config = pb.TopicConfig(topic_name=name, read_queue_nums=queues, write_queue_nums=queues)
        g.call("CreateTopic", pb.CreateTopicRequest(topic=config))


def _send(g: Group, topic: str, message: pb.Message) -> pb.SendResult:
    request = pb.SendMessageRequest(topic=topic, messages=[message])
    results: list[pb.SendResult] = send_results(g.call("SendMessage", request))
    (result,) = results
    return result


def _seed_offsets(g: Group) -> dict[int, int]:
    """Commit OFFSET_GROUP's offsets of TOPIC at what the writer has stored so far."""
    offsets = {}
    for q in range(QUEUES):
        asked = pb.GetQueueOffsetsRequest(topic=TOPIC, queue_id=q)
        top = g.call("GetQueueOffsets", asked).max_offset
        assert top > 0, f"the writer has stored nothing in queue {q} yet"
        request = pb.UpdateConsumerOffsetRequest(
            consumer_group=OFFSET_GROUP, topic=TOPIC, queue_id=q, queue_offset=top, sync=True
        )
        g.call("UpdateConsumerOffset", request)
        offsets[q] = top
    return offsets


def _seed_pop(g: Group, ids: UniqIdGenerator) -> tuple[list[str], list[str]]:
    """POP_MESSAGES messages, all received by POP_GROUP and left in flight."""
    sent = [
        _send(g, POP_TOPIC, pb.Message(topic=POP_TOPIC, body=b"pop %d" % i, msg_id=ids.next_id()))
        for i in range(POP_MESSAGES)
    ]
    request = pb.PopMessageRequest(
        group=POP_GROUP,
        topic=POP_TOPIC,
        queue_id=0,
        max_msgs=POP_MESSAGES,
        invisible_ms=POP_INVISIBLE_MS,
        subscription="*",
    )
    popped = g.call("PopMessage", request).messages
    assert sorted(p.message.msg_id for p in popped) == sorted(r.msg_id for r in sent)
    return [p.receipt_handle for p in popped], [r.msg_id for r in sent]


def _seed_transactions(g: Group, ids: UniqIdGenerator) -> tuple[str, tuple[str, str]]:
    """One half committed at once, one left pending (its producer never answers)."""
    halves = []
    for i in range(2):
        m = pb.Message(
            topic=TXN_TOPIC,
            body=b"txn %d" % i,
            msg_id=ids.next_id(),
            properties={"TRAN_MSG": "true"},
        )
        r = _send(g, TXN_TOPIC, m)
        halves.append((m.msg_id, f"{r.commitlog_position:016X}"))
    (committed, txn_id), pending = halves
    end = pb.EndTransactionRequest(
        topic=TXN_TOPIC, msg_id=committed, transaction_id=txn_id, commit=True
    )
    assert g.call("EndTransaction", end).outcome == "COMMITTED"
    return committed, pending


def _seed_user(g: Group) -> Credentials:
    """A user made by the old release's `mqcluster add-user`, allowed to publish USER_TOPIC."""
    base = str(g.cluster.base)
    done = g.old.run(["-m", "mqcluster.cluster", "--base-dir", base, "add-user", USER], RPC_S * 6)
    assert done.returncode == 0, done.stdout + done.stderr
    user = load_credentials(str(g.cluster.base / "users" / f"{USER}.json"))
    acl = pb.CreateAclRequest(
        subject=f"User:{USER}", resources=[f"Topic:{USER_TOPIC}"], actions=["Pub"]
    )
    g.call("CreateAcl", acl)
    return user


def seed(g: Group, writer: Writer) -> Seeded:
    ids = UniqIdGenerator(ip="127.0.0.1")
    now_ms = int(time.time() * 1000)
    timed = _send(
        g,
        TIMER_TOPIC,
        pb.Message(
            topic=TIMER_TOPIC,
            body=b"timed",
            msg_id=ids.next_id(),
            properties={"TIMER_DELIVER_MS": str(now_ms + TIMER_DELAY_MS)},
        ),
    )
    delayed = _send(
        g,
        TIMER_TOPIC,
        pb.Message(
            topic=TIMER_TOPIC,
            body=b"delayed",
            msg_id=ids.next_id(),
            properties={"DELAY": str(DELAY_LEVEL)},
        ),
    )
    wait_for(lambda: len(writer.acked) >= QUEUES * BATCH, RPC_S, "the writer's first sends")
    handles, pop_ids = _seed_pop(g, ids)
    committed, pending = _seed_transactions(g, ids)
    return Seeded(
        offsets=_seed_offsets(g),
        pop_handles=handles,
        pop_ids=pop_ids,
        timed_id=timed.msg_id,
        delayed_id=delayed.msg_id,
        committed_txn_id=committed,
        pending_txn=pending,
        user=_seed_user(g),
    )


# ---------------------------------------------------------------------------------------
# The invariant before the raise: the previous release can read everything
# ---------------------------------------------------------------------------------------


def checkpoint_format(store: Path) -> int:
    """The format version in a store's checkpoint header (0: no checkpoint written yet)."""
    path = store / "checkpoint"
    if not path.exists():
        return 0
    magic, version = CHECKPOINT_HEAD.unpack_from(path.read_bytes())
    assert magic == CHECKPOINT_MAGIC, path
    return int(version)


def _store(cluster: LocalCluster, n: NodeInfo) -> Path:
    return cluster.base / n.node_id / f"dledger-{n.node_id}"


def _config_bodies(g: Group) -> list[dict[str, Any]]:
    """Every CONFIG entry's body the leader holds (the group's membership changes)."""
    with g.log_client() as client:
        entries = client.read_all(g.leader().client_addr)
    return [json.loads(e.body) for e in entries if e.type == EntryType.CONFIG]


def assert_old_release_reads_everything(g: Group) -> None:
    """Before the raise no node wrote a format the previous release cannot read: checkpoint
    format 2, snapshot.json version 2, no feature level in membership.json or any CONFIG."""
    for n in g.cluster.nodes:
        store = _store(g.cluster, n)
        assert checkpoint_format(store) in (0, OLD_CHECKPOINT_FORMAT), n.node_id
        snapshot = g.cluster.base / n.node_id / "config" / "snapshot.json"
        if snapshot.exists():
            assert json.loads(snapshot.read_bytes())["version"] == OLD_SNAPSHOT_VERSION, n
        membership = store / "membership.json"
        if membership.exists():
            assert "features" not in membership.read_text(), n.node_id
    assert all("features" not in body for body in _config_bodies(g))
    # Every node stopped once by now, so every one has written a checkpoint.
    assert all(checkpoint_format(_store(g.cluster, n)) for n in g.cluster.nodes)


# ---------------------------------------------------------------------------------------
# The rolling upgrade
# ---------------------------------------------------------------------------------------


def upgrade_nameserver(g: Group) -> None:
    """The NameServer first (it stores nothing): stopped by its PID, started from this tree."""
    ns = g.cluster.namesrv
    assert ns is not None
    pid = g.cluster.signal_namesrv(signal.SIGTERM)
    wait_for(lambda: g.cluster.namesrv_pid() is None, STOP_S, f"NameServer {pid} to stop")
    g.cluster.start_namesrv()
    g.cluster.wait_namesrv()


def transfer_leadership(g: Group, to: NodeInfo) -> None:
    """Hand leadership to ``to``, asking again while a transfer is refused or in flight (the
    target catching up under the writer's load)."""
    with g.log_client() as client:

        def moved() -> bool:
            if g.cluster.wait_leader() == to.node_id:
                return True
            with contextlib.suppress(ClientError):
                client.transfer_leadership(to.node_id)
            return False

        wait_for(moved, CATCH_UP_S, f"leadership to move to {to.node_id}")


def rolling_upgrade(g: Group, writer: Writer) -> list[str]:
    """Followers first, then the leader after handing leadership to an upgraded follower;
    the invariant after each step. Returns the order."""
    upgrade_nameserver(g)
    leader = g.leader()
    followers = [n for n in g.cluster.nodes if n is not leader]
    for n in followers:
        g.restart(n, old=False)
        assert_old_release_reads_everything(g)
    transfer_leadership(g, followers[0])
    g.restart(leader, old=False)
    assert_old_release_reads_everything(g)
    sent = len(writer.acked)
    wait_for(lambda: len(writer.acked) > sent, CATCH_UP_S, "sends to the upgraded group")
    return [n.node_id for n in (*followers, leader)]


def open_with_old_store(g: Group, n: NodeInfo, dest: Path) -> dict[str, Any]:
    """The previous release's store code opening a copy of stopped node ``n``'s store:
    ``{"last_index": ...}`` or ``{"refused": <exception class>, "message": ...}``."""
    assert g.cluster.pid(n) is None, f"{n.node_id} runs: its store is not at rest"
    copy = dest / f"dledger-{n.node_id}"
    shutil.copytree(_store(g.cluster, n), copy, ignore=shutil.ignore_patterns("lock"))
    argv = [
        "-c",
        OLD_STORE_PROBE,
        str(copy),
        SETTINGS["mappedFileSizeCommitLog"],
        SETTINGS["mappedFileSizeEntryIndex"],
    ]
    done = g.old.run(argv, OLD_STORE_PROBE_S)
    assert done.returncode == 0, done.stderr[-3000:]
    result: dict[str, Any] = json.loads(done.stdout.strip().splitlines()[-1])
    return result


def rollback_one_node(g: Group, tmp_path: Path) -> None:
    """Before the raise a node can go back: the old store code opens a copy of an upgraded
    follower's store, and the follower started from the old tree against the store the current
    release wrote starts and catches up; then it is upgraded again."""
    leader = g.leader()
    n = next(x for x in g.cluster.nodes if x is not leader)
    g.stop(n)
    opened = open_with_old_store(g, n, tmp_path / "before-raise")
    assert "last_index" in opened, opened
    g.start(n, old=True)
    assert_old_release_reads_everything(g)
    g.restart(n, old=False)


# ---------------------------------------------------------------------------------------
# Raising the feature level (the point of no return)
# ---------------------------------------------------------------------------------------


def mqadmin(g: Group, *args: str) -> subprocess.CompletedProcess[str]:
    """``mqadmin --json ARGS`` of this tree as an operator runs it, reaching the group as its
    admin (TLS, the admin's credentials file)."""
    assert g.cluster.namesrv is not None
    argv = [sys.executable, "-m", "client.mqadmin", *g.cluster.tool_argv()]
    argv += ["-n", g.cluster.namesrv.addr, "--json", *args]
    return subprocess.run(argv, capture_output=True, text=True, timeout=MQADMIN_S, check=False)


def _members_support(g: Group, level: int) -> bool:
    """Whether the leader has heard every member report support for ``level`` this term."""
    with g.log_client() as client:
        try:
            members = client.list_members().members
        except ClientError:
            return False
    return all(m.supported_feature_level >= level for m in members)


def _heard_recently(g: Group, n: NodeInfo) -> bool:
    """Whether the leader heard from member ``n`` within its last election timeout."""
    with g.log_client() as client:
        members = client.list_members().members
    return any(m.id == n.node_id and m.recent_active for m in members)


def _levels(g: Group) -> dict[str, tuple[int, int, str]]:
    """Each node's (feature level, checkpoint format, release) as it answers now."""
    out = {}
    with g.log_client() as client:
        for n in g.cluster.nodes:
            md = client.metadata(n.client_addr, timeout_s=2.0)
            out[n.node_id] = (md.feature_level, checkpoint_format(_store(g.cluster, n)), md.release)
    return out


def raise_feature_level(g: Group) -> None:
    """`mqadmin setFeatureLevel` is refused while a member is down (it could come back on the
    old release), naming it, and changes nothing; once the member is back and has reported, it
    raises the group to this release's level: every node then runs at it and writes checkpoint
    format 3, which the previous release refuses to open."""
    leader = g.leader()
    down = next(n for n in g.cluster.nodes if n is not leader)
    g.stop(down)
    # A member counts as reporting until the leader has not heard from it for an election
    # timeout (recent_active): only then is the raise certain to find it down.
    wait_for(lambda: not _heard_recently(g, down), CATCH_UP_S, f"the leader to miss {down.node_id}")
    refused = mqadmin(g, "setFeatureLevel", "-a", leader.client_addr, "--level", str(FEATURE_LEVEL))
    assert refused.returncode != 0, refused.stdout
    assert "FEATURE_LEVEL_UNSUPPORTED" in refused.stderr and down.node_id in refused.stderr, (
        refused.stderr
    )
    g.start(down, old=False)
    assert_old_release_reads_everything(g)
    wait_for(
        lambda: _members_support(g, FEATURE_LEVEL), CATCH_UP_S, "every member's support report"
    )
    done = mqadmin(g, "setFeatureLevel", "-a", leader.client_addr)
    assert done.returncode == 0, done.stderr
    want = {n.node_id: (FEATURE_LEVEL, NEW_CHECKPOINT_FORMAT, RELEASE) for n in g.cluster.nodes}
    wait_for(lambda: _levels(g) == want, CATCH_UP_S, f"every node at {want}")
    # What an operator checks: replicaStatus flags nothing, every member on this release at
    # the group's new level.
    status = mqadmin(g, "replicaStatus", "-a", leader.client_addr)
    assert status.returncode == 0, status.stdout + status.stderr
    rows = json.loads(status.stdout)["rows"]
    assert {(r["node"], r["release"], r["feature_level"]) for r in rows} == {
        (n.node_id, RELEASE, FEATURE_LEVEL) for n in g.cluster.nodes
    }, rows
    # The invariant's check sees the raise: it is the guard of the steps before.
    with pytest.raises(AssertionError):
        assert_old_release_reads_everything(g)


def assert_old_release_refuses(g: Group, tmp_path: Path) -> str:
    """After the raise no node can go back: the previous release's store code refuses a copy
    of a stopped node's store with the checkpoint format message, naming both versions."""
    n = g.cluster.nodes[0]
    refused = open_with_old_store(g, n, tmp_path / "after-raise")
    assert refused.get("refused") == "FormatTooNewError", refused
    message = refused["message"]
    assert "checkpoint" in message and "format version 3 is newer than 2" in message, message
    return str(message)


# ---------------------------------------------------------------------------------------
# The checks after the upgrade
# ---------------------------------------------------------------------------------------


def _ids_on(g: Group, n: NodeInfo, topic: str, queues: int) -> list[list[str]]:
    return [
        [m.msg_id for m in pull_all(n.client_addr, topic, q, g.security)] for q in range(queues)
    ]


def check_messages(g: Group, writer: Writer) -> None:
    """Every acknowledged message stored exactly once, in the queue it was acknowledged in,
    and every node serves the same queues."""
    wait_for(g.converged, CATCH_UP_S, "every node to apply the last entry")
    served = {n.node_id: _ids_on(g, n, TOPIC, QUEUES) for n in g.cluster.nodes}
    first = next(iter(served.values()))
    assert all(s == first for s in served.values()), "the nodes serve different queues"
    where = {mid: q for q, ids in enumerate(first) for mid in ids}
    counts = Counter(mid for ids in first for mid in ids)
    lost = [mid for mid in writer.acked if mid not in where]
    assert not lost, f"{len(lost)} of {len(writer.acked)} acknowledged messages lost"
    assert all(c == 1 for c in counts.values()), "a message stored twice"
    assert all(where[mid] == q for mid, q in writer.acked.items())


def check_offsets(g: Group, seeded: Seeded) -> None:
    for n in g.cluster.nodes:
        for q, want in seeded.offsets.items():
            got = g.stub(n).QueryConsumerOffset(
                pb.QueryConsumerOffsetRequest(consumer_group=OFFSET_GROUP, topic=TOPIC, queue_id=q),
                timeout=RPC_S,
            )
            assert got.queue_offset == want, (n.node_id, q, got.queue_offset, want)


def check_pop(g: Group, seeded: Seeded) -> None:
    """The receipts the old leader handed out ack on the upgraded group; then nothing of the
    topic is left to receive."""
    ack = pb.AckPopRequest(group=POP_GROUP, topic=POP_TOPIC, receipt_handles=seeded.pop_handles)
    codes = g.call("AckPop", ack).codes
    assert list(codes) == [""] * POP_MESSAGES, codes
    again = pb.PopMessageRequest(
        group=POP_GROUP,
        topic=POP_TOPIC,
        queue_id=0,
        max_msgs=POP_MESSAGES,
        invisible_ms=POP_RECHECK_INVISIBLE_MS,
    )
    assert not g.call("PopMessage", again).messages


def check_timers(g: Group, seeded: Seeded) -> None:
    """The timed and the delayed message, sent to the old group, each delivered once."""
    want = sorted([seeded.timed_id, seeded.delayed_id])
    addr = g.leader().client_addr
    wait_for(
        lambda: sorted(m.msg_id for m in pull_all(addr, TIMER_TOPIC, 0, g.security)) == want,
        DELIVERY_S,
        "the timed and the delayed message",
    )


def _answer_check_back(g: Group, msg_id: str, txn_id: str) -> None:
    """Open a RocketMQ 5 producer's Telemetry stream on the leader for TXN_TOPIC, wait for the
    group to check the pending half back, and commit it as the producer's checker would."""
    leader = g.leader()
    settings = v2.Settings(
        client_type=v2.PRODUCER,
        publishing=v2.Publishing(topics=[v2.Resource(name=TXN_TOPIC)]),
        user_agent=v2.UA(language=v2.PYTHON, version="5"),
    )
    commands: queue.Queue[Any] = queue.Queue()
    commands.put(v2_service.TelemetryCommand(settings=settings))

    def outgoing() -> Iterator[Any]:
        while (command := commands.get()) is not None:
            yield command

    with open_channel(leader.grpc_addr, g.security) as ch:
        replies = v2_grpc.MessagingServiceStub(ch).Telemetry(
            outgoing(), metadata=[("x-mq-client-id", "upgrade-checker")], timeout=DELIVERY_S
        )
        try:
            for reply in replies:
                if reply.HasField("recover_orphaned_transaction_command"):
                    asked = reply.recover_orphaned_transaction_command
                    if asked.transaction_id == txn_id:
                        break
            else:
                raise AssertionError("the Telemetry stream ended without a check-back")
        finally:
            commands.put(None)
            replies.cancel()
    assert asked.message.system_properties.message_id == "01" + msg_id
    end = pb.EndTransactionRequest(
        topic=TXN_TOPIC, msg_id=msg_id, transaction_id=txn_id, commit=True
    )
    assert g.call("EndTransaction", end).outcome == "COMMITTED"


def check_transactions(g: Group, seeded: Seeded) -> None:
    """The pending half is checked back by the upgraded group and committed; both committed
    messages are visible once."""
    _answer_check_back(g, *seeded.pending_txn)
    want = sorted([seeded.committed_txn_id, seeded.pending_txn[0]])
    addr = g.leader().client_addr
    wait_for(
        lambda: sorted(m.msg_id for m in pull_all(addr, TXN_TOPIC, 0, g.security)) == want,
        DELIVERY_S,
        "both transactions' messages",
    )


def check_user(g: Group, seeded: Seeded) -> None:
    """The user the old release created still authenticates (its send is allowed) and a
    wrong secret is still refused, on the leader."""
    assert g.security.tls is not None
    tls = TlsFiles(ca_path=g.security.tls.ca_path)
    leader = g.leader()
    request = pb.SendMessageRequest(
        topic=USER_TOPIC, messages=[pb.Message(topic=USER_TOPIC, body=b"from the user")]
    )
    with open_channel(leader.client_addr, ClientSecurity(tls=tls, credentials=seeded.user)) as ch:
        pb_grpc.BrokerStub(ch).SendMessage(request, timeout=RPC_S)
    wrong = Credentials(seeded.user.access_key, seeded.user.secret_key + "x")
    with (
        open_channel(leader.client_addr, ClientSecurity(tls=tls, credentials=wrong)) as ch,
        pytest.raises(grpc.RpcError) as refused,
    ):
        pb_grpc.BrokerStub(ch).SendMessage(request, timeout=RPC_S)
    info = read_error(refused.value)
    assert info is not None and info.code == "UNAUTHENTICATED", refused.value


def check_routes(g: Group) -> None:
    """The upgraded NameServer routes the writer's topic to the group's leader: every node
    registered again (each registers as it starts; the NameServer stores nothing)."""
    ns = g.cluster.namesrv
    assert ns is not None
    leader = g.leader().client_addr

    def routed() -> bool:
        with open_channel(ns.addr, g.security) as ch:
            try:
                route = nspb_grpc.NameServerStub(ch).GetRouteInfoByTopic(
                    nspb.GetRouteInfoByTopicRequest(topic=TOPIC), timeout=RPC_S
                )
            except grpc.RpcError:
                return False
        return [r.leader_addr for r in route.groups] == [leader]

    wait_for(routed, CATCH_UP_S, f"the NameServer to route {TOPIC} to {leader}")


def check_audit(g: Group, spark: SparkSession, tmp_path: Path) -> None:
    """Stop the group cleanly and audit its replicas: CLEAN (exit code 0)."""
    killed = g.cluster.down(grace_s=STOP_S)
    report = tmp_path / "audit.json"
    code = audit_main(
        [str(g.cluster.base), "--json", str(report), "-q", *g.cluster.tool_argv()], spark=spark
    )
    assert code == 0, report.read_text()
    assert not killed, f"needed SIGKILL to stop: {killed}"


@dataclass
class Phases:
    """How long each phase took (printed at the end: the test's budget is about a minute)."""

    took: dict[str, float] = field(default_factory=dict)
    last: float = field(default_factory=time.monotonic)

    def done(self, name: str) -> None:
        now = time.monotonic()
        self.took[name] = round(now - self.last, 1)
        self.last = now


def test_rolling_upgrade_from_the_previous_release_under_load(
    group: Group, spark: SparkSession, tmp_path: Path
) -> None:
    g = group
    phases = Phases()
    _create_topics(g)
    writer = Writer(LeaderClient(lambda: g.cluster.client_addrs, g.security))
    thread = threading.Thread(target=writer.run, name="upgrade-writer")
    thread.start()
    try:
        seeded = seed(g, writer)
        phases.done("seed")
        order = rolling_upgrade(g, writer)
        phases.done("upgrade")
        rollback_one_node(g, tmp_path)
        assert_old_release_reads_everything(g)
        phases.done("rollback")
        raise_feature_level(g)
        phases.done("raise")
    finally:
        writer.stop.set()
        thread.join(SEND_DEADLINE_S * 2)
        writer.client.close()
    assert not thread.is_alive() and not writer.error, writer.error
    assert not any(g.runs_old_tree(n) for n in g.cluster.nodes)
    check_messages(g, writer)
    check_offsets(g, seeded)
    check_pop(g, seeded)
    check_timers(g, seeded)
    check_transactions(g, seeded)
    check_user(g, seeded)
    check_routes(g)
    phases.done("checks")
    check_audit(g, spark, tmp_path)
    phases.done("audit")
    refusal = assert_old_release_refuses(g, tmp_path)
    print(
        f"\nupgraded {order} (leader last), rolled one back and forth, under load: "
        f"{len(writer.acked)} messages acknowledged; calls retried on another node "
        f"{dict(writer.client.retries)}, sends given up and sent again {dict(writer.failures)}; "
        f"seconds {phases.took}; after the raise the previous release says: {refusal}"
    )
