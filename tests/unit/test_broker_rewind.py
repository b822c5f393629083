"""A content repair the broker cannot roll back in place (docs/RAFT.md section 13): entries
it applied (messages stored in its queues) were a forged or damaged copy, replaced by the
leader's. The broker marks its state for a replay of the repaired log at the next open, or,
when the log's start was deleted, asks for a snapshot; the node restarts itself to carry it
out (dledger.server.rewinds). Before, such a rewind raised CorruptStoreError: the node
ended, and a person had to restore the member."""

from __future__ import annotations

from pathlib import Path

from broker_world import MemoryLog

from broker.state import derived
from broker.state.machine import BrokerStateMachine
from broker.state.message import Message, UniqIdGenerator, encode_batch
from broker.state.records import ENTRY_MESSAGES
from dledger.core import Role
from dledger.log import EntryType
from dledger.rewind import RewindOutcome

IDS = UniqIdGenerator(ip="10.0.0.2", pid=9, instance_hash=2)
QUEUES = 2


def _messages(tag: str, n: int) -> list[Message]:
    return [
        Message(
            topic="T",
            queue_id=i % QUEUES,
            body=f"{tag}-{i}".encode(),
            tags=tag,
            keys=(f"{tag}{i}",),
            store_timestamp_ms=1_000_000 + i,
            uniq_id=IDS.next_id(),
        )
        for i in range(n)
    ]


def _log(batches: list[list[Message]]) -> MemoryLog:
    log = MemoryLog()
    for ms in batches:
        log.add(encode_batch(ms)[0], ENTRY_MESSAGES)
    return log


def _sm(root: Path, log: MemoryLog) -> BrokerStateMachine:
    sm = BrokerStateMachine(root, hash_slots=1000, max_index_records=5000, cq_records_per_file=50)
    sm.attach(log)
    sm.on_role_change(Role.FOLLOWER, 1, "n1")
    return sm


def test_a_rewind_over_stored_messages_replays_the_repaired_log_at_the_next_open(
    tmp_path: Path,
) -> None:
    good = [_messages(f"good{e}", 4) for e in range(3)]
    forged = [_messages(f"forged{e}", 3) for e in range(2)]
    leader = [_messages(f"leader{e}", 5) for e in range(2)]
    bad_log = _log(good + forged)
    sm = _sm(tmp_path, bad_log)
    assert sm.applied_index() == 0
    sm.apply(bad_log.entries)
    assert sm.rewind(3) is RewindOutcome.REPLAY_AT_START
    marker = tmp_path / "config" / derived.REBUILD_MARKER
    assert b"entries 4..5 were replaced" in marker.read_bytes()
    # The worst case: a snapshot written after the rewind, claiming the forged entries (the
    # node restarts at once; a snapshot thread may still finish one).
    sm.close()
    # The next run: the log holds the leader's entries 4 and 5 now.
    repaired = _log(good + leader)
    again = _sm(tmp_path, repaired)
    assert again.applied_index() == 0  # rebuilt: everything is applied again
    assert not marker.exists()
    again.apply(repaired.entries)
    want = [m.uniq_id for ms in good + leader for m in ms]
    assert all(again.find_uniq(uid) is not None for uid in want)
    for ms in forged:
        for m in ms:
            assert again.find_uniq(m.uniq_id) is None, "a forged message is still known"
    held = sum(cq.max_offset for q in range(QUEUES) if (cq := again.cqs.find("T", q)))
    assert held == len(want)
    again.close()


def test_a_rewind_over_entries_that_changed_nothing_rolls_back_in_place(tmp_path: Path) -> None:
    log = _log([_messages("good", 4)])
    log.add(b"raw-1", int(EntryType.NORMAL))  # dledger's own: the broker passes over them
    log.add(b"raw-2", int(EntryType.NORMAL))
    sm = _sm(tmp_path, log)
    sm.applied_index()
    sm.apply(log.entries)
    assert sm.rewind(1) is RewindOutcome.ROLLED_BACK
    assert sm.last_applied == 1
    assert not (tmp_path / "config" / derived.REBUILD_MARKER).exists()
    sm.close()


class _TrimmedLog(MemoryLog):
    """A log whose retention deleted entry 1 (the broker keeps what it made; no replay can)."""

    def first_index(self) -> int:
        return 2


def test_a_rewind_when_the_log_start_was_deleted_asks_for_a_snapshot(tmp_path: Path) -> None:
    log = _TrimmedLog()
    for ms in [_messages("good", 2), _messages("good", 2), _messages("forged", 2)]:
        log.add(encode_batch(ms)[0], ENTRY_MESSAGES)
    sm = _sm(tmp_path, MemoryLog())
    sm.applied_index()
    sm.attach(log)
    sm.apply(log.entries)
    assert sm.rewind(2) is RewindOutcome.NEEDS_SNAPSHOT
    # Nothing marked: the node drops its log and a leader's snapshot replaces this state.
    assert not (tmp_path / "config" / derived.REBUILD_MARKER).exists()
    sm.close()
