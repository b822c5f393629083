"""Issue 21: a member added at run time to a group whose leader's log no longer starts at
index 1 is caught up by an InstallSnapshot, not by replaying the log; promoted, it replaces an
original member and serves every message the group still holds, at the same offsets.

tests/audit/test_snapshot_catch_up.py covers members of the original configuration that come
back (down too long, disk lost); this one covers the operator's path: ``mqcluster add`` (a
node started empty with the group's address joins as a learner), ``mqadmin promoteMember``,
``mqadmin removeMember`` of a dead original.
"""

from __future__ import annotations

import signal
import urllib.request
from collections.abc import Callable
from pathlib import Path

import pytest
from prometheus_client.parser import text_string_to_metric_families
from support import (
    age_segments,
    converged,
    create_topic,
    metadata_now,
    own_labels,
    pull_all,
    queue_min_offsets,
    retention_keys,
    wait_for,
    wait_trimmed,
)

from client import Message, Producer
from client.mqadmin import main as mqadmin
from mqcluster.cluster import LocalCluster

pytestmark = [pytest.mark.integration, pytest.mark.usefixtures("no_client_threads_left")]

SEGMENT_BYTES = 64 * 1024  # 1 KiB messages fill one segment in ~60 sends
TOPIC = "JoinSnapT"
QUEUES = 2
BODY_PAD = b"x" * 1000
CATCH_UP_S = 60.0
# Sends before the new member joins (several segments, most deleted by retention) and after
# it replaced an original member (replicated to it as log entries).
BEFORE, AFTER = 240, 40
BATCH = 4

# (queue id, queue offset) -> body
Served = dict[tuple[int, int], bytes]


def metric(cluster: LocalCluster, url: str, name: str) -> float:
    """One unlabelled sample of a node's /metrics (asking again while it does not answer;
    over HTTPS checked with the group's CA when the group has TLS)."""
    pages: list[str] = []
    context = cluster.metrics_ssl_context()

    def scraped() -> bool:
        try:
            with urllib.request.urlopen(url, timeout=5, context=context) as resp:
                pages.append(resp.read().decode())
        except OSError:
            return False
        return True

    wait_for(scraped, CATCH_UP_S, f"{url}")
    text = pages[-1]
    for family in text_string_to_metric_families(text):
        for s in family.samples:
            if s.name == name and not own_labels(s.labels):
                return float(s.value)
    raise AssertionError(f"{name} not in {url}")


def send(producer: Producer, first: int, count: int, sent: Served) -> None:
    """Batches of BATCH (one entry each, a queue per batch): fewer round trips on a busy
    machine, and still many entries over several segments."""
    for start in range(first, first + count, BATCH):
        bodies = [b"j%05d" % i + BODY_PAD for i in range(start, min(start + BATCH, first + count))]
        results = producer.send_batch([Message(TOPIC, b) for b in bodies])
        for r, body in zip(results, bodies, strict=True):
            sent[(r.message_queue.queue_id, r.queue_offset)] = body


def served(addr: str) -> Served:
    """Every message of the topic the node at ``addr`` serves, from each queue's min offset
    (retention deleted the messages below it)."""
    mins = queue_min_offsets(addr, TOPIC, QUEUES)
    return {
        (q, m.queue_offset): m.body
        for q in range(QUEUES)
        for m in pull_all(addr, TOPIC, q, start_offset=mins[q])
    }


def test_added_member_is_caught_up_by_snapshot_and_replaces_an_original(
    local_group: Callable[..., LocalCluster],
) -> None:
    cluster = local_group(
        3,
        namesrv=True,
        **retention_keys(SEGMENT_BYTES),
        slaveReadEnable="true",
        maxHashSlotNum=4096,  # small key index files: a default one is ~400 MiB (sparse)
        maxIndexNum=16384,
    )
    assert cluster.namesrv is not None
    ns = cluster.namesrv.addr
    create_topic(cluster, TOPIC, QUEUES)
    sent: Served = {}
    with Producer("join-snap-pg", ns) as producer:
        send(producer, 0, BEFORE, sent)
        leader = cluster.wait_leader()
        lmd = metadata_now(cluster.node(leader).client_addr)
        # Retention (as the product runs it: expired segments at a deleteWhen hour, every
        # member holding them) moves every member's first index past most of the sends.
        originals = [n.node_id for n in cluster.nodes]
        for n in cluster.nodes:
            age_segments(Path(metadata_now(n.client_addr).store_path))
        beyond = lmd.last_index // 2
        wait_trimmed(cluster, originals, beyond)
        # mqcluster add: a node started empty joins as a learner, caught up by the leader.
        new = cluster.add_node(promote=False, timeout_s=CATCH_UP_S)
        wait_for(converged(cluster), CATCH_UP_S, f"{new.node_id} caught up")
        nmd, lmd = metadata_now(new.client_addr), metadata_now(cluster.node(leader).client_addr)
        # By an InstallSnapshot: the new member counts one, and its log starts where the
        # leader's does (a replay from index 1 would have found no entries to replay).
        assert metric(cluster, new.metrics_url, "raftmq_raft_snapshots_installed_total") == 1
        assert nmd.first_index == lmd.first_index > beyond
        sent_by = sum(
            metric(cluster, cluster.node(n).metrics_url, "raftmq_raft_snapshots_sent_total")
            for n in originals
        )
        assert sent_by >= 1
        group = ["-n", ns, "-b", cluster.group]
        assert mqadmin(["promoteMember", *group, "-i", new.node_id]) == 0
        # An original member dies and is removed; the new one takes its place.
        dead = next(n for n in originals if n != cluster.wait_leader())
        cluster.signal(dead, signal.SIGKILL)
        assert mqadmin(["removeMember", *group, "-i", dead]) == 0
        cluster.nodes = [n for n in cluster.nodes if n.node_id != dead]
        cluster.removed.append(dead)
        send(producer, BEFORE, AFTER, sent)
    wait_for(converged(cluster), CATCH_UP_S, "every member applied the last sends")
    held = served(cluster.node(cluster.wait_leader()).client_addr)
    first = {q: min(o for qq, o in held if qq == q) for q in range(QUEUES)}
    by_node = {n.node_id: served(n.client_addr) for n in cluster.nodes}
    # Every message the group still holds, at the offset its send was acknowledged with.
    assert held and all(sent[k] == body for k, body in held.items())
    assert {k for k in sent if k[1] >= first[k[0]]} == set(held)
    assert any(k not in held for k in sent), "retention deleted none of the first sends"
    # The new member serves all of them, including sends it received in the snapshot.
    for nid, got in by_node.items():
        assert got == held, nid
    before_join = {k for k, body in held.items() if int(body[1:6]) < BEFORE}
    assert before_join, "no message of the snapshot's log is left to compare"
