"""No good copy among the members (issue 31 item 2, docs/STORAGE.md "When it cannot repair").

Two members of three are damaged at the same committed entry, one the third never received:
no member holds it. Before, both cut their logs there and waited repairing for ever, with no
leader. Now each asks every member what it holds and, once all answered and none can supply
the entry, stops with ``FATAL component=repair cause=NO_GOOD_COPY``. A damaged member whose
peers are unreachable does not stop: it waits, and is repaired once they are back."""

from __future__ import annotations

import signal
import time
from collections.abc import Callable

import pytest
from integration.test_storage_damage import (
    BODY_PAD,
    REPAIRED_S,
    entries_of,
    flip,
    group,
    leader_id,
    log_text,
    padded_writer,
    segments,
)
from support import wait_for

from dledger.server.goodcopy import GOOD_COPY_INTERVAL_MS, ROUNDS_TO_STOP, STOP_GRACE_ROUNDS
from mqcluster.cluster import LocalCluster

pytestmark = pytest.mark.integration

# The rounds a stop takes and its grace, plus the start of three processes on a loaded
# machine.
STOP_WITHIN_S = (ROUNDS_TO_STOP + STOP_GRACE_ROUNDS) * GOOD_COPY_INTERVAL_MS / 1000 + 40
# How long a member with unreachable peers is watched: twice the rounds a stop would take.
WATCH_S = 2 * ROUNDS_TO_STOP * GOOD_COPY_INTERVAL_MS / 1000 + 4


def _last_entries(cluster: LocalCluster, node_id: str) -> list[int]:
    """The indexes in the last segment holding entries (where the open's scan looks; a
    segment allocated ahead may be empty)."""
    for path in reversed(segments(cluster, node_id)):
        found = [i.header.index for i in entries_of(path) if i.header is not None]
        if found:
            return found
    return []


def _last_index(cluster: LocalCluster, node_id: str) -> int:
    found = _last_entries(cluster, node_id)
    return found[-1] if found else 0


def _in_last_segment(cluster: LocalCluster, node_id: str) -> int:
    """An entry in the middle of the last segment (where the open's scan looks)."""
    found = _last_entries(cluster, node_id)
    assert len(found) > 4
    return found[len(found) // 2]


def _damage_entry(cluster: LocalCluster, node_id: str, index: int) -> None:
    """Flip a byte in the body of entry ``index`` (valid entries follow it: damage, not a
    torn tail, so the open cuts the log there)."""
    for path in segments(cluster, node_id):
        for item in entries_of(path):
            if item.header is not None and item.header.index == index:
                flip(path, item.offset + item.size - 8)
                return
    raise AssertionError(f"{node_id} does not hold entry {index}")


def _stopped(cluster: LocalCluster, node_id: str) -> bool:
    return cluster.pid(cluster.node(node_id)) is None


def test_a_majority_damaged_at_an_entry_no_member_holds_stops_with_no_good_copy(
    local_group: Callable[..., LocalCluster],
) -> None:
    cluster = group(local_group)
    with cluster.client() as client:
        writer = padded_writer(client).start()
        try:
            writer.wait_acks(300, 60)
            leader = leader_id(cluster)
            third = next(n.node_id for n in cluster.nodes if n.node_id != leader)
            cluster.signal(third, signal.SIGKILL)
            writer.wait_acks(300, 60)  # committed on the two others only
        finally:
            writer.stop()
        # Enough entries in the last segment to damage one with valid entries after it
        # (where the open's scan looks), whatever the segment layout: a segment may have just
        # begun. Checked with the writer stopped (a check while it ran could be overtaken by a
        # new segment before the kill: CI saw 1 entry there), topping up one entry at a time.
        others = [n.node_id for n in cluster.nodes if n.node_id != third]

        def enough_in_last_segment() -> bool:
            if all(len(_last_entries(cluster, n)) > 4 for n in others):
                return True
            client.append([b"top-up " + BODY_PAD])
            return False

        wait_for(enough_in_last_segment, 60, "entries in the last segment of the two")
    damaged = [n.node_id for n in cluster.nodes if n.node_id != third]
    for nid in damaged:
        cluster.signal(nid, signal.SIGKILL)
    wait_for(lambda: all(_stopped(cluster, n) for n in damaged), 20, "the two to stop")
    entry = _in_last_segment(cluster, damaged[0])
    assert entry > _last_index(cluster, third)  # committed, and the third never had it
    for nid in damaged:
        assert entry in _last_entries(cluster, nid)
        _damage_entry(cluster, nid, entry)
    started = time.monotonic()
    for n in cluster.nodes:
        cluster.start(n.node_id)
    wait_for(
        lambda: all(_stopped(cluster, n) for n in damaged),
        STOP_WITHIN_S,
        "both damaged members to stop",
    )
    took_s = time.monotonic() - started
    for nid in damaged:
        text = log_text(cluster, nid)
        assert "FATAL component=repair cause=NO_GOOD_COPY" in text, nid
        line = next(x for x in text.splitlines() if "NO_GOOD_COPY" in x and "FATAL" in x)
        assert f"indexes={entry}.." in line and "Restore a good copy" in line, line
        assert all(n.node_id + ": log" in line for n in cluster.nodes), line
    assert not _stopped(cluster, third)  # it holds what it has, and waits for a leader
    print(f"both stopped {took_s:.1f} s after the start")


def test_a_damaged_member_whose_peers_are_unreachable_does_not_stop(
    local_group: Callable[..., LocalCluster],
) -> None:
    cluster = group(local_group)
    with cluster.client() as client:
        writer = padded_writer(client).start()
        try:
            writer.wait_acks(400, 60)
        finally:
            writer.stop()
        victim = next(n.node_id for n in cluster.nodes if n.node_id != leader_id(cluster))
    for n in cluster.nodes:
        cluster.signal(n.node_id, signal.SIGKILL)
    wait_for(lambda: all(_stopped(cluster, n.node_id) for n in cluster.nodes), 20, "all down")
    _damage_entry(cluster, victim, _in_last_segment(cluster, victim))
    cluster.start(victim)
    wait_for(
        lambda: "waiting: no answer from" in log_text(cluster, victim),
        30,
        "the victim to wait for unreachable members",
    )
    deadline = time.monotonic() + WATCH_S
    while time.monotonic() < deadline:  # watched for twice what a stop would take
        assert not _stopped(cluster, victim), "it stopped although its peers were unreachable"
        assert "NO_GOOD_COPY" not in log_text(cluster, victim)
        time.sleep(0.5)
    healed = time.monotonic()
    for n in cluster.nodes:
        if n.node_id != victim:
            cluster.start(n.node_id)
    wait_for(
        lambda: "repair_done" in log_text(cluster, victim),
        REPAIRED_S,
        "the victim to be repaired once its peers are back",
    )
    assert not _stopped(cluster, victim)
    print(f"repaired {time.monotonic() - healed:.1f} s after the peers came back")
