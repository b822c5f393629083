"""/metrics of a live 3-node group and its NameServer, checked against the group's own state
(issue #22): the commit index under load, every queue's max offset, a consumer group's lag
after a known number of unconsumed messages, a paused follower's lag on the leader."""

from __future__ import annotations

import signal
import threading
import urllib.request
from collections.abc import Callable

import pytest
from prometheus_client.parser import text_string_to_metric_families
from raftmq.broker.v1 import broker_pb2 as pb
from support import create_topic, wait_for

from broker.state.message import UniqIdGenerator
from client import Message, MQClientError, Producer
from mqcluster.cluster import LocalCluster
from mqcluster.leader_client import LeaderClient

pytestmark = pytest.mark.integration

TOPIC = "MetricsT"
QUEUES = 4
GROUP = "lag-cg"
# Messages sent to queue 0 after GROUP committed its offset there: the lag to find.
UNCONSUMED = 7
# Entries written while a follower is stopped: its lag on the leader is at least this.
WHILE_PAUSED = 12
# The background load: sends until told to stop, at most this many (bounded whatever happens).
LOAD_MAX_MESSAGES = 3000
DEADLINE_S = 20.0
IDS = UniqIdGenerator(ip="10.0.0.2", pid=5, instance_hash=3)

# The constant labels of every series of a node (docs/METRICS.md "Labels").
IDENTITY = ("cluster", "broker", "node")
Samples = dict[tuple[str, tuple[tuple[str, str], ...]], float]


# The NameServer's families whose own labels are a cluster and a broker group.
NAMESERVER_GROUP_FAMILIES = ("raftmq_nameserver_cluster_groups", "raftmq_nameserver_group_brokers")


def scrape(cluster: LocalCluster, url: str) -> Samples:
    """Every sample of one /metrics answer of ``cluster``'s process at ``url``, by (name,
    sorted labels); over HTTPS checked with the group's CA when the group has TLS. A node's
    samples each carry its cluster, broker and node labels (checked, then left out of the
    keys); the NameServer's carry none of them, but for its per-cluster and per-group gauges,
    whose own labels are the cluster and the broker group."""
    with urllib.request.urlopen(url, timeout=5, context=cluster.metrics_ssl_context()) as resp:
        assert resp.status == 200
        text = resp.read().decode()
    node = next((n.node_id for n in cluster.nodes if n.metrics_url == url), None)
    identity = (
        {"cluster": "DefaultCluster", "broker": cluster.group, "node": node}
        if node is not None
        else {}
    )
    out: Samples = {}
    for f in text_string_to_metric_families(text):
        for s in f.samples:
            labels = dict(s.labels)
            if node is None and s.name in NAMESERVER_GROUP_FAMILIES:
                out[(s.name, tuple(sorted(labels.items())))] = s.value
                continue
            own = {k: labels.pop(k) for k in IDENTITY if k in labels}
            assert own == identity, (s, identity)
            out[(s.name, tuple(sorted(labels.items())))] = s.value
    return out


def value(samples: Samples, name: str, **labels: str) -> float:
    return samples[(name, tuple(sorted(labels.items())))]


def found(samples: Samples, name: str, **labels: str) -> float | None:
    """The sample, or None while the series is not there yet (a condition waits for it)."""
    return samples.get((name, tuple(sorted(labels.items()))))


class Load:
    """A producer sending to TOPIC from a thread until stopped (bounded in count)."""

    def __init__(self, namesrv: str) -> None:
        self.acked = 0
        self.error: BaseException | None = None
        self._stop = threading.Event()
        self._producer = Producer("metrics-pg", namesrv, send_msg_timeout_s=3.0)
        self._thread = threading.Thread(target=self._run, name="metrics-load", daemon=True)

    def __enter__(self) -> Load:
        self._producer.start()
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join(DEADLINE_S)
        self._producer.shutdown()
        assert not self._thread.is_alive()

    def _run(self) -> None:
        try:
            while not self._stop.is_set() and self.acked < LOAD_MAX_MESSAGES:
                try:
                    self._producer.send(Message(TOPIC, b"m" * 100))
                except MQClientError:
                    continue  # a re-election under load: the producer's retries ran out
                self.acked += 1
        except BaseException as exc:
            self.error = exc
            raise

    def running(self, at_least: int) -> bool:
        """Whether ``at_least`` sends were acknowledged (raises what stopped the load)."""
        if self.error is not None:
            raise AssertionError(f"the load stopped: {self.error!r}")
        return self.acked >= at_least


def _leader_sandwich(cluster: LocalCluster) -> Callable[[], bool]:
    """A condition: one scrape of the leader lies between two Metadata answers (the collector
    may answer from its last half second: then the next try is fresh)."""

    def check() -> bool:
        leader = cluster.node(cluster.wait_leader())
        with cluster.client() as client:
            before = client.metadata(leader.client_addr)
            got = scrape(cluster, leader.metrics_url)
            after = client.metadata(leader.client_addr)
        commit = value(got, "raftmq_raft_commit_index")
        return (
            before.role == after.role == "LEADER"
            and before.commit_index <= commit <= after.commit_index
            and value(got, "raftmq_raft_term") == after.term
            and value(got, "raftmq_raft_role", role="leader") == 1
            and all(
                (found(got, "raftmq_raft_follower_match_index", peer=p.id) or 0) <= after.last_index
                for p in after.peers
            )
        )

    return check


def _queues_agree(cluster: LocalCluster, broker: LeaderClient, acked: int) -> Callable[[], bool]:
    """A condition: the leader's scraped queue max offsets are what it answers, and add up to
    ``acked``; the followers export none (leader-only figures, docs/METRICS.md)."""

    def check() -> bool:
        expected = [
            broker.call(
                lambda s, q=q: s.GetQueueOffsets(
                    pb.GetQueueOffsetsRequest(topic=TOPIC, queue_id=q), timeout=5
                )
            ).max_offset
            for q in range(QUEUES)
        ]
        if sum(expected) != acked:
            return False
        leader = cluster.wait_leader()
        for n in cluster.nodes:
            got = scrape(cluster, n.metrics_url)
            offsets = [
                found(got, "raftmq_broker_queue_max_offset", topic=TOPIC, queue=str(q))
                for q in range(QUEUES)
            ]
            if offsets != (expected if n.node_id == leader else [None] * QUEUES):
                return False
        return True

    return check


def _send_to_queue0(broker: LeaderClient, count: int) -> None:
    msgs = [
        pb.Message(topic=TOPIC, queue_id=0, body=b"u", msg_id=IDS.next_id()) for _ in range(count)
    ]
    broker.call(
        lambda s: s.SendMessage(pb.SendMessageRequest(topic=TOPIC, messages=msgs), timeout=5),
        DEADLINE_S,
    )


def test_metrics_of_a_live_group_match_its_own_state(
    local_group: Callable[..., LocalCluster],
) -> None:
    cluster = local_group(3, namesrv=True)
    assert cluster.namesrv is not None and cluster.namesrv.metrics_port
    assert all(n.metrics_port for n in cluster.nodes)
    create_topic(cluster, TOPIC, QUEUES)
    broker = LeaderClient(lambda: [n.client_addr for n in cluster.nodes])
    try:
        with Load(cluster.namesrv.addr) as load:
            wait_for(lambda: load.running(200), DEADLINE_S, "200 sends acknowledged")
            for _ in range(3):  # under load: each scrape between two Metadata answers
                wait_for(_leader_sandwich(cluster), DEADLINE_S, "a scrape in between")
        acked = load.acked
        wait_for(_queues_agree(cluster, broker, acked), DEADLINE_S, "queue offsets everywhere")
        _check_commit_index_and_counters(cluster, acked)
        _check_consumer_lag(cluster, broker)
        _check_paused_follower(cluster, broker)
        ns = scrape(cluster, cluster.namesrv.metrics_url)
        assert value(ns, "raftmq_nameserver_brokers_registered") == 3
        group = {"cluster": "DefaultCluster", "broker": cluster.group}
        assert value(ns, "raftmq_nameserver_group_brokers", **group) == 3
        assert value(ns, "raftmq_nameserver_cluster_groups", cluster="DefaultCluster") == 1
        assert value(ns, "raftmq_nameserver_route_queries_total", result="found") >= 1
        assert value(ns, "raftmq_security_refusals_total", reason="registration") == 0
    finally:
        broker.close()


def _check_commit_index_and_counters(cluster: LocalCluster, acked: int) -> None:
    """Idle now: every node's scraped commit index is what its Metadata says."""

    def commits_agree() -> bool:
        with cluster.client() as client:
            return all(
                value(scrape(cluster, n.metrics_url), "raftmq_raft_commit_index")
                == client.metadata(n.client_addr).commit_index
                for n in cluster.nodes
            )

    wait_for(commits_agree, DEADLINE_S, "scraped commit index == Metadata's on every node")
    leader = cluster.node(cluster.wait_leader())
    got = scrape(cluster, leader.metrics_url)
    assert value(got, "raftmq_broker_sent_messages_total", topic=TOPIC) >= acked
    assert value(got, "raftmq_broker_send_duration_seconds_count") >= 1
    assert value(got, "raftmq_raft_fsync_duration_seconds_count") >= 1
    assert value(got, "raftmq_raft_append_entries_count") >= 1
    assert value(got, "raftmq_raft_elections_won_total") >= 1
    assert value(got, "raftmq_security_refusals_total", reason="authentication") == 0
    assert value(got, "raftmq_store_disk_free_bytes") > 0


def _check_consumer_lag(cluster: LocalCluster, broker: LeaderClient) -> None:
    """GROUP commits queue 0's max offset, then UNCONSUMED messages arrive there."""
    high = broker.call(
        lambda s: s.GetQueueOffsets(pb.GetQueueOffsetsRequest(topic=TOPIC, queue_id=0), timeout=5)
    ).max_offset
    broker.call(
        lambda s: s.UpdateConsumerOffset(
            pb.UpdateConsumerOffsetRequest(
                consumer_group=GROUP, topic=TOPIC, queue_id=0, queue_offset=high, sync=True
            ),
            timeout=5,
        )
    )
    _send_to_queue0(broker, UNCONSUMED)
    lag = broker.call(
        lambda s: s.GetConsumerLag(
            pb.GetConsumerLagRequest(consumer_group=GROUP, topic=TOPIC), timeout=5
        )
    )
    assert [q.lag for q in lag.queues if q.queue_id == 0] == [UNCONSUMED]

    def the_leader_alone_says_so() -> bool:
        leader = cluster.wait_leader()
        lags = {
            n.node_id: found(
                scrape(cluster, n.metrics_url),
                "raftmq_broker_consumer_lag_messages",
                group=GROUP,
                topic=TOPIC,
                queue="0",
            )
            for n in cluster.nodes
        }
        return lags == {
            n.node_id: UNCONSUMED if n.node_id == leader else None for n in cluster.nodes
        }

    wait_for(
        the_leader_alone_says_so, DEADLINE_S, f"lag {UNCONSUMED} of {GROUP} on the leader only"
    )


def _check_paused_follower(cluster: LocalCluster, broker: LeaderClient) -> None:
    """SIGSTOP a follower: the leader's scraped lag of it is its Metadata lag, >= the entries
    written meanwhile; after SIGCONT it falls to 0."""
    first_leader = cluster.wait_leader()
    follower = next(n for n in cluster.nodes if n.node_id != first_leader)
    cluster.signal(follower.node_id, signal.SIGSTOP)
    try:
        for _ in range(WHILE_PAUSED):  # one entry per send
            _send_to_queue0(broker, 1)

        def lag_matches() -> bool:
            leader = cluster.node(cluster.wait_leader(exclude=follower.node_id))
            with cluster.client() as client:
                md = client.metadata(leader.client_addr)
            peer = next(p for p in md.peers if p.id == follower.node_id)
            got = scrape(cluster, leader.metrics_url)
            lag = found(got, "raftmq_raft_follower_lag_entries", peer=follower.node_id)
            match = found(got, "raftmq_raft_follower_match_index", peer=follower.node_id)
            return (
                match == peer.match_index
                and lag == md.last_index - peer.match_index
                and lag is not None
                and lag >= WHILE_PAUSED
            )

        wait_for(lag_matches, DEADLINE_S, f"the leader's lag of paused {follower.node_id}")
    finally:
        cluster.signal(follower.node_id, signal.SIGCONT)

    def caught_up() -> bool:
        got = scrape(cluster, cluster.node(cluster.wait_leader()).metrics_url)
        return found(got, "raftmq_raft_follower_lag_entries", peer=follower.node_id) == 0

    wait_for(caught_up, DEADLINE_S, f"{follower.node_id} caught up after SIGCONT")
