"""A disk that forgets, on real processes (issue 31, docs/RAFT.md section 11).

A follower's store is put back to an older copy of itself after it acknowledged entries that
committed while the third member was down; the leader is killed. Without promises the
forgetful follower and the third member elect a leader that lacks those entries, and they are
gone. With them the forgetful member is repairing: no vote, until the old leader's log brought
it back; nothing acknowledged is lost and it votes again by itself."""

from __future__ import annotations

import signal
import time
from collections.abc import Callable
from pathlib import Path

import pytest
from log_writer import append_until_acked
from support import node_metric, wait_for

from dledger.log import HardState
from dledger.server.client import ClientError, LogClient
from dledger.storage.codec import decode_hard_state
from dledger.storage.promise import PromiseDamagedError, promise_path, read_promise
from jepsen_like.disk import copy_store, restore_store
from mqcluster.cluster import LocalCluster

pytestmark = pytest.mark.integration

ACKED_WHILE_DOWN = 1_000  # entries that commit on two members while the third is down
BATCH = 10
LEADER_AFTER_RESTART_S = 10.0
REPAIRED_WITHIN_S = 60.0


def _store_dir(cluster: LocalCluster, node_id: str) -> Path:
    return cluster.base / node_id / f"dledger-{node_id}"


def _committed_logs_identical(cluster: LocalCluster, client: LogClient) -> list[tuple]:  # type: ignore[type-arg]
    """Every member's committed log, entry by entry (index, term, type, body): the same."""
    logs = {}
    for n in cluster.nodes:
        md = client.metadata(n.client_addr, timeout_s=2.0)
        logs[n.node_id] = [
            (e.index, e.term, e.type, e.body)
            for e in client.read_all(n.client_addr, md.applied_index)
        ]
    first = next(iter(logs.values()))
    for nid, log in logs.items():
        assert log == first, f"{nid}'s committed log differs"
    return first


def _converged(cluster: LocalCluster, client: LogClient) -> Callable[[], bool]:
    def check() -> bool:
        seen = set()
        for n in cluster.nodes:
            try:
                md = client.metadata(n.client_addr, timeout_s=1.0)
            except ClientError:
                return False
            if md.applied_index != md.last_index:
                return False
            seen.add(md.applied_index)
        return len(seen) == 1

    return check


def test_a_follower_whose_store_went_back_loses_nothing_and_votes_again(
    local_group: Callable[..., LocalCluster], tmp_path: Path
) -> None:
    cluster = local_group(3, flushDiskType="SYNC_FLUSH")
    leader = cluster.wait_leader()
    forgetful, third = [n.node_id for n in cluster.nodes if n.node_id != leader]
    with cluster.client() as client:
        client.append([b"before"])
        wait_for(_converged(cluster, client), 20, "the group to converge")
        # The old copy of the follower's store (a volume snapshot, say).
        cluster.signal(forgetful, signal.SIGTERM)
        wait_for(lambda: cluster.pid(cluster.node(forgetful)) is None, 20, "the follower to stop")
        old_copy = tmp_path / "old-copy"
        copy_store(_store_dir(cluster, forgetful), old_copy)
        cluster.start(forgetful)
        wait_for(_converged(cluster, client), 30, "the follower to catch up")
        # The third member is down while entries commit on the leader and the follower.
        cluster.signal(third, signal.SIGKILL)
        acked: list[bytes] = []
        seq = 0
        deadline = time.monotonic() + 60
        while len(acked) < ACKED_WHILE_DOWN:
            values = [b"acked-%05d" % (seq + k) for k in range(BATCH)]
            seq += BATCH  # a failed append (outcome unknown) is never retried as it was
            try:
                client.append(values)  # two members of three: they commit
            except ClientError:
                assert time.monotonic() < deadline, "the two members stopped committing"
                time.sleep(0.05)
                continue
            acked.extend(values)
        # The follower's store goes back to the old copy; the leader dies.
        cluster.signal(forgetful, signal.SIGKILL)
        restore_store(old_copy, _store_dir(cluster, forgetful))
        cluster.signal(leader, signal.SIGKILL)
        restarted = time.monotonic()
        for nid in (forgetful, third, leader):
            cluster.start(nid)
        append_until_acked(client, b"after-restart", LEADER_AFTER_RESTART_S)
        assert time.monotonic() - restarted <= LEADER_AFTER_RESTART_S
        repaired = _repaired(cluster, forgetful)
        wait_for(
            lambda: repaired() and _converged(cluster, client)(),
            REPAIRED_WITHIN_S - (time.monotonic() - restarted),
            "the forgetful member to be repaired and the group to converge",
        )
        client.append([b"after-repair"])
        wait_for(_converged(cluster, client), 30, "the group to converge")
        log = _committed_logs_identical(cluster, client)
    bodies = [body for (_, _, typ, body) in log if typ == 0]
    missing = sorted(set(acked) - set(bodies))
    assert not missing, f"{len(missing)} acknowledged entries lost, e.g. {missing[:3]}"
    assert len(bodies) == len(set(bodies)), "an entry was applied twice"
    assert {b"before", b"after-restart", b"after-repair"} <= set(bodies)
    # The member had promised what it forgot, and it knew: it repaired once, by itself.
    promise = read_promise(promise_path(cluster.base / forgetful, forgetful))
    assert promise is not None and promise.promised_index >= len(bodies)
    assert node_metric(cluster, forgetful, "raftmq_raft_repairs_completed_total") == 1
    assert "repairing: log ends at" in Path(cluster.node(forgetful).log).read_text()


def _repaired(cluster: LocalCluster, node_id: str) -> Callable[[], bool]:
    def check() -> bool:
        return (
            node_metric(cluster, node_id, "raftmq_raft_repairing") == 0
            and node_metric(cluster, node_id, "raftmq_raft_repairs_completed_total") == 1
        )

    return check


def test_a_deleted_meta_file_is_recovered_from_the_promise_file(
    local_group: Callable[..., LocalCluster],
) -> None:
    cluster = local_group(3, flushDiskType="SYNC_FLUSH")
    leader = cluster.wait_leader()
    with cluster.client() as client:
        client.append([b"x"])
        wait_for(_converged(cluster, client), 20, "the group to converge")
        # A follower that voted for the leader in this term.
        voter = next(
            n.node_id
            for n in cluster.nodes
            if n.node_id != leader
            and decode_hard_state((_store_dir(cluster, n.node_id) / "meta").read_bytes()).voted_for
        )
        meta = _store_dir(cluster, voter) / "meta"
        cluster.signal(voter, signal.SIGTERM)
        wait_for(lambda: cluster.pid(cluster.node(voter)) is None, 20, "the member to stop")
        before = decode_hard_state(meta.read_bytes())
        assert before.term > 0
        meta.unlink()
        cluster.start(voter)
        wait_for(_converged(cluster, client), 20, "the group to converge")
        # The term and the vote came back from the promise file, not "term 0, no vote".
        after = decode_hard_state(meta.read_bytes())
        assert before.voted_for is not None
        assert after == before or after.term > before.term, (before, after)
        assert after != HardState(before.term, None)
        client.append([b"y"])


def _damage_both_slots(path: Path) -> None:
    """Flip a byte inside each slot's record head (the sequence number): both CRCs fail."""
    data = bytearray(path.read_bytes())
    assert len(data) == 2048
    for slot in range(2):
        data[slot * 1024 + 10] ^= 0xFF
    path.write_bytes(bytes(data))


def _rewritten(path: Path) -> bool:
    try:
        promise = read_promise(path)
    except PromiseDamagedError:
        return False
    return promise is not None and promise.promised_index > 0


def test_a_promise_file_damaged_in_both_slots_repairs_and_votes_again(
    local_group: Callable[..., LocalCluster],
) -> None:
    """Before, the member refused to start until a person acted. Now it starts repairing with
    its vote counted as lost, is repaired by the leader and votes again by itself."""
    cluster = local_group(3, flushDiskType="SYNC_FLUSH")
    leader = cluster.wait_leader()
    follower, third = [n.node_id for n in cluster.nodes if n.node_id != leader]
    acked: list[bytes] = []
    with cluster.client() as client:
        for i in range(0, 200, BATCH):
            values = [b"acked-%05d" % (i + k) for k in range(BATCH)]
            client.append(values)
            acked.extend(values)
        wait_for(_converged(cluster, client), 20, "the group to converge")
        # Both slots (one written, and the other written or empty) damaged while it is down.
        cluster.signal(follower, signal.SIGTERM)
        wait_for(lambda: cluster.pid(cluster.node(follower)) is None, 20, "the follower to stop")
        path = promise_path(cluster.base / follower, follower)
        _damage_both_slots(path)
        restarted = time.monotonic()
        cluster.start(follower)
        # Sends go on meanwhile (leader + third); the follower repairs with no manual step.
        for i in range(200, 400, BATCH):
            values = [b"acked-%05d" % (i + k) for k in range(BATCH)]
            client.append(values)
            acked.extend(values)
        wait_for(
            lambda: _repaired(cluster, follower)() and _converged(cluster, client)(),
            REPAIRED_WITHIN_S - (time.monotonic() - restarted),
            "the member with the damaged promise file to be repaired",
        )
        found = "raftmq_corruption_found_total"
        assert node_metric(cluster, follower, found, found_by="promise") == 1
        text = Path(cluster.node(follower).log).read_text()
        assert f"promise file {path} damaged" in text and "vote counted as lost" in text
        # Rewritten once the repair ended: at its next promise, or its next checkpoint (1 s).
        wait_for(lambda: _rewritten(path), 10, "the promise file to be rewritten")
        # It votes again: with the leader down, it and the third member elect one of them.
        cluster.signal(leader, signal.SIGKILL)
        killed = time.monotonic()
        append_until_acked(client, b"after-leader-killed", LEADER_AFTER_RESTART_S)
        assert time.monotonic() - killed <= LEADER_AFTER_RESTART_S
        acked.append(b"after-leader-killed")
        cluster.start(leader)
        wait_for(_converged(cluster, client), 30, "the group to converge")
        log = _committed_logs_identical(cluster, client)
    bodies = [body for (_, _, typ, body) in log if typ == 0]
    missing = sorted(set(acked) - set(bodies))
    assert not missing, f"{len(missing)} acknowledged entries lost, e.g. {missing[:3]}"
    assert len(bodies) == len(set(bodies)), "an entry was applied twice"
    assert third  # (the member that stayed up throughout)
