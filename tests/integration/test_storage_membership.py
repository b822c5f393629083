"""A damaged membership.json on real processes (issue 31; docs/FORMAT.md "Membership file").

A follower's membership.json is damaged while it is down (a zero-length file after a power
cut, garbled bytes, an index beyond its log). Before, the member refused to start until a
person acted. Now its start repairs the file (from its settings when its log starts at index
1; from the other members' committed configuration when retention deleted its log's start),
it serves, votes again within 60 s by itself, and every member's committed log is the same."""

from __future__ import annotations

import json
import os
import signal
import time
from collections.abc import Callable
from pathlib import Path

import pytest
from log_writer import append_until_acked
from support import node_metric, retention_keys, wait_for

from dledger.server.client import ClientError, LogClient
from mqcluster.cluster import LocalCluster

pytestmark = pytest.mark.integration

BATCH = 10
# What the brief promises: voting again within 60 s of the restart, with no manual step.
VOTES_AGAIN_S = 60.0
LEADER_AFTER_KILL_S = 10.0
# Small segments for the retention case: ~60 entries of 1 KiB fill one.
RETENTION_SEGMENT_BYTES = 64 << 10
BODY_PAD = b"m" * 1000
AGED_S = 2 * 3600  # older than retention's hour (fileReservedTime=1)

DAMAGE: dict[str, Callable[[Path], None]] = {
    "zero-length": lambda p: p.write_bytes(b""),
    "garbled": lambda p: p.write_bytes(p.read_bytes()[:-7] + b"\x00\xff}"),
    "index-beyond-the-log": lambda p: p.write_text(
        json.dumps({**json.loads(p.read_text()), "index": 10**12})
    ),
}


def _conf_path(cluster: LocalCluster, node_id: str) -> Path:
    return cluster.base / node_id / f"dledger-{node_id}" / "membership.json"


def _append(client: LogClient, acked: list[bytes], start: int, count: int) -> None:
    for i in range(start, start + count, BATCH):
        values = [b"acked-%05d-" % (i + k) + BODY_PAD for k in range(BATCH)]
        client.append(values)
        acked.extend(values)


def _converged(cluster: LocalCluster, client: LogClient) -> bool:
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


def _read(client: LogClient, addr: str, first: int, upto: int) -> list[tuple[object, ...]]:
    """The committed entries ``first .. upto`` that ``addr`` holds (index, term, type, body)."""
    out: list[tuple[object, ...]] = []
    index = first
    while index <= upto:
        entries, _ = client.get(addr, index, max_count=5000)
        got = [(e.index, e.term, e.type, e.body) for e in entries if e.index <= upto]
        assert got, f"{addr} holds nothing at {index} (up to {upto})"
        out.extend(got)
        index = entries[-1].index + 1
    return out


def _committed_bodies(cluster: LocalCluster, client: LogClient) -> list[bytes]:
    """Every member's committed log, entry by entry from the first index all still hold, is
    the same: its entries' bodies."""
    mds = {n.node_id: client.metadata(n.client_addr, timeout_s=2.0) for n in cluster.nodes}
    first = max(md.first_index for md in mds.values())
    upto = min(md.applied_index for md in mds.values())
    logs = {n.node_id: _read(client, n.client_addr, first, upto) for n in cluster.nodes}
    one = next(iter(logs.values()))
    for nid, log in logs.items():
        assert log == one, f"{nid}'s committed log differs"
    return [body for (_, _, typ, body) in one if typ == 0 and isinstance(body, bytes)]


def _stop(cluster: LocalCluster, node_id: str) -> None:
    cluster.signal(node_id, signal.SIGTERM)
    wait_for(lambda: cluster.pid(cluster.node(node_id)) is None, 20, f"{node_id} to stop")


def _votes_again(cluster: LocalCluster, client: LogClient, leader: str, acked: list[bytes]) -> None:
    """With the leader down, the repaired member and the third must elect one of them."""
    cluster.signal(leader, signal.SIGKILL)
    killed = time.monotonic()
    append_until_acked(client, b"after-leader-killed", LEADER_AFTER_KILL_S)
    assert time.monotonic() - killed <= LEADER_AFTER_KILL_S
    acked.append(b"after-leader-killed")
    cluster.start(leader)


def _expect_repaired(
    cluster: LocalCluster, client: LogClient, victim: str, source: str, restarted: float
) -> None:
    wait_for(
        lambda: _converged(cluster, client),
        VOTES_AGAIN_S - (time.monotonic() - restarted),
        f"{victim} to serve and hold the group's log again",
    )
    print(f"\n{victim} repaired from {source} and caught up {time.monotonic() - restarted:.1f} s")
    found = "raftmq_corruption_found_total"
    assert node_metric(cluster, victim, found, found_by="membership") == 1
    repairs = "raftmq_corruption_membership_repairs_total"
    assert node_metric(cluster, victim, repairs, source=source) == 1
    text = Path(cluster.node(victim).log).read_text(errors="replace")
    assert "DAMAGE found by start in membership.json" in text
    assert f"REPAIRED from {source}" in text
    json.loads(_conf_path(cluster, victim).read_text())  # rewritten whole


def _damage_while_down_and_check(
    cluster: LocalCluster, client: LogClient, acked: list[bytes], damage: str, source: str
) -> None:
    """A follower stopped, its file damaged, restarted while sends go on: it serves, holds the
    group's log and votes again within VOTES_AGAIN_S, repaired from ``source``; every
    acknowledged entry is in every member's identical committed log, once."""
    leader = cluster.wait_leader()
    victim = next(n.node_id for n in cluster.nodes if n.node_id != leader)
    _stop(cluster, victim)
    DAMAGE[damage](_conf_path(cluster, victim))
    restarted = time.monotonic()
    cluster.start(victim)
    _append(client, acked, len(acked), 200)  # sends go on meanwhile
    _expect_repaired(cluster, client, victim, source, restarted)
    _votes_again(cluster, client, leader, acked)
    print(f"voted again {time.monotonic() - restarted:.1f} s after its restart")
    assert time.monotonic() - restarted <= VOTES_AGAIN_S
    wait_for(lambda: _converged(cluster, client), 30, "the group to converge")


def _all_once(acked: list[bytes], bodies: list[bytes]) -> None:
    missing = sorted(set(acked) - set(bodies))
    assert not missing, f"{len(missing)} acknowledged entries lost, e.g. {missing[:3]}"
    assert len(bodies) == len(set(bodies)), "an entry was applied twice"


@pytest.mark.parametrize("damage", list(DAMAGE))
def test_a_damaged_membership_file_is_repaired_and_the_member_votes_again(
    local_group: Callable[..., LocalCluster], damage: str
) -> None:
    """A static group: the log from index 1 holds no CONFIG entry, the settings decide."""
    cluster = local_group(3, flushDiskType="SYNC_FLUSH")
    acked: list[bytes] = []
    with cluster.client() as client:
        _append(client, acked, 0, 200)
        wait_for(lambda: _converged(cluster, client), 20, "the group to converge")
        _damage_while_down_and_check(cluster, client, acked, damage, "settings")
        _all_once(acked, _committed_bodies(cluster, client))


def test_a_damaged_file_after_a_config_entry_is_repaired_from_the_log(
    local_group: Callable[..., LocalCluster],
) -> None:
    """The group raised its feature level (a CONFIG entry the followers applied and saved):
    the log's CONFIG entry decides, and the repaired file says the raised level."""
    cluster = local_group(3, flushDiskType="SYNC_FLUSH")
    acked: list[bytes] = []
    with cluster.client() as client:
        _append(client, acked, 0, 100)
        raised: list[int] = []

        def raise_level() -> bool:
            """Refused while the leader has not heard a member recently (a loaded host)."""
            try:
                raised.append(client.set_feature_level(timeout_s=5.0).level)
            except ClientError as exc:
                assert exc.code == "FEATURE_LEVEL_UNSUPPORTED", exc
                return False
            return True

        wait_for(raise_level, 30, "the group to raise its feature level")
        _append(client, acked, 100, 100)
        wait_for(lambda: _converged(cluster, client), 20, "the group to converge")
        _damage_while_down_and_check(cluster, client, acked, "garbled", "log")
        _all_once(acked, _committed_bodies(cluster, client))
    for n in cluster.nodes:
        saved = json.loads(_conf_path(cluster, n.node_id).read_text())
        assert saved["config"].get("features") == raised[0] > 1, (n.node_id, saved)


def _age_segments(cluster: LocalCluster, node_id: str) -> None:
    old = time.time() - AGED_S
    root = cluster.base / node_id / f"dledger-{node_id}"
    for p in root.rglob("*"):
        if p.is_file() and p.name.isdigit():
            os.utime(p, (old, old))


def test_a_damaged_file_with_the_log_s_start_deleted_is_repaired_from_the_quorum(
    local_group: Callable[..., LocalCluster],
) -> None:
    """Retention deleted the start of every log: neither the log nor the settings know the
    configuration; the other members' committed one does (their Holdings answers)."""
    cluster = local_group(3, flushDiskType="SYNC_FLUSH", **retention_keys(RETENTION_SEGMENT_BYTES))
    acked: list[bytes] = []
    with cluster.client() as client:
        _append(client, acked, 0, 400)
        wait_for(lambda: _converged(cluster, client), 20, "the group to converge")
        for n in cluster.nodes:
            _age_segments(cluster, n.node_id)

        def trimmed() -> bool:
            try:
                return all(
                    client.metadata(n.client_addr, timeout_s=1.0).first_index > 1
                    for n in cluster.nodes
                )
            except ClientError:
                return False

        wait_for(trimmed, 30, "retention to delete the start of every log")
        before = len(acked)
        _damage_while_down_and_check(cluster, client, acked, "zero-length", "quorum")
        bodies = _committed_bodies(cluster, client)  # from the first index all still hold
    kept = set(bodies)
    assert all(a in kept for a in acked[before:]), "an acknowledged entry after the restart lost"
    assert len(bodies) == len(kept), "an entry was applied twice"
