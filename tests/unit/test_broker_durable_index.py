"""Retention and the broker's state on disk: the broker saves its state (config/snapshot.json)
at most every few seconds and only after an apply, so on a broker idle since a burst the state
on disk can be far behind what it applied in memory. A restart opens the state on disk and
applies the log from the entry after it: dledger's retention must keep those entries
(``durable_index()``), and an open that finds them gone asks for a snapshot rather than
rebuilding from the entries left (which would serve a state without the topics, offsets and
users the deleted entries made)."""

from __future__ import annotations

from pathlib import Path
from types import SimpleNamespace

import pytest
from broker_world import MemoryLog

from broker.state.machine import BrokerStateMachine
from broker.state.message import Message, UniqIdGenerator, encode_batch
from broker.state.records import (
    ENTRY_MESSAGES,
    ENTRY_TOPIC,
    TOPIC_UPSERT,
    TopicConfig,
    encode_topic_record,
)
from dledger.core import Role
from dledger.rewind import NeedsSnapshotError
from dledger.server.node import DLedgerNode

IDS = UniqIdGenerator(ip="10.0.0.3", pid=7, instance_hash=1)
BURST_ENTRIES = 12


def new_sm(root: Path, log: MemoryLog, **kw: int) -> BrokerStateMachine:
    sm = BrokerStateMachine(
        root, hash_slots=1000, max_index_records=5000, cq_records_per_file=50, **kw
    )
    sm.attach(log)
    sm.on_role_change(Role.LEADER, 1, "n0")
    return sm


class TrimmedLog(MemoryLog):
    """A log whose entries below ``first`` retention deleted."""

    def __init__(self) -> None:
        super().__init__()
        self.first = 1

    def first_index(self) -> int:
        return self.first


def _burst_then_crash(root: Path) -> tuple[TrimmedLog, int, int]:
    """A topic and a snapshot, then a burst applied but not saved, then a crash: the log,
    the durable index and the applied index."""
    log = TrimmedLog()
    log.add(encode_topic_record(TOPIC_UPSERT, TopicConfig("T", 4, 4, 6)), ENTRY_TOPIC)
    for n in range(BURST_ENTRIES):
        m = Message(topic="T", queue_id=n % 4, body=b"b%d" % n, uniq_id=IDS.next_id())
        log.add(encode_batch([m])[0], ENTRY_MESSAGES)
    sm = new_sm(root, log, snapshot_interval_ms=0)
    sm.applied_index()
    sm.apply(log.entries[:3])
    sm.wait_snapshot()
    sm._snapshot_interval_s = 3600  # no more snapshots: an idle broker after the burst
    sm.apply(log.entries[3:])
    durable, applied = sm.durable_index(), sm.last_applied
    sm._snapshot_pool.shutdown()
    sm.cqs.close()  # a crash (kill -9): nothing more is saved
    sm.index.close()
    return log, durable, applied


def test_the_durable_index_is_the_saved_state_not_the_applied_one(tmp_path: Path) -> None:
    _, durable, applied = _burst_then_crash(tmp_path)
    assert (durable, applied) == (3, BURST_ENTRIES + 1)


def test_retention_kept_above_the_durable_index_restarts_exactly(tmp_path: Path) -> None:
    log, durable, applied = _burst_then_crash(tmp_path)
    log.first = durable + 1  # what retention may delete now
    again = new_sm(tmp_path, log)
    assert again.applied_index() == durable
    again.apply(log.entries[durable:])
    assert again.last_applied == applied and "T" in again.topics
    assert again.cqs.find("T", 0) is not None
    again.wait_snapshot()
    assert again.durable_index() == applied
    again.close()


def test_entries_above_the_saved_state_deleted_ask_for_a_snapshot(tmp_path: Path) -> None:
    """What retention at the applied index did: the open found the snapshot outside the log
    and rebuilt from the entries left, with no topic (now: it asks the node for a snapshot
    from its leader, naming the cause)."""
    log, _, applied = _burst_then_crash(tmp_path)
    log.first = applied - 1
    again = new_sm(tmp_path, log)
    with pytest.raises(NeedsSnapshotError, match=f"deleted the entries before index {applied - 1}"):
        again.applied_index()


def test_the_node_keeps_retention_at_the_state_machines_durable_index() -> None:
    saved = SimpleNamespace(durable_index=lambda: 3)
    node = SimpleNamespace(_applied=13, sm=saved)
    assert DLedgerNode._retention_applied(node) == 3  # type: ignore[arg-type]
    node = SimpleNamespace(_applied=2, sm=saved)
    assert DLedgerNode._retention_applied(node) == 2  # type: ignore[arg-type]
    plain = SimpleNamespace(_applied=13, sm=object())  # no durable_index(): the applied one
    assert DLedgerNode._retention_applied(plain) == 13  # type: ignore[arg-type]


def test_save_state_brings_an_idle_brokers_state_on_disk_up_to_date(tmp_path: Path) -> None:
    """Retention asks an idle broker to save (its snapshot interval is not up, and no apply
    comes to take one): the state on disk catches up, and the log above it can go."""
    log = TrimmedLog()
    log.add(encode_topic_record(TOPIC_UPSERT, TopicConfig("T", 4, 4, 6)), ENTRY_TOPIC)
    log.add(encode_topic_record(TOPIC_UPSERT, TopicConfig("U", 4, 4, 6)), ENTRY_TOPIC)
    sm = new_sm(tmp_path, log, snapshot_interval_ms=3_600_000)
    sm.applied_index()
    sm.apply(log.entries[:1])  # the first apply takes a snapshot
    sm.wait_snapshot()
    sm.apply(log.entries[1:])
    assert (sm.durable_index(), sm.last_applied) == (1, 2)
    sm.save_state()
    sm.wait_snapshot()
    assert sm.durable_index() == 2
    sm.save_state()  # nothing behind: nothing written
    assert sm.durable_index() == 2
    sm.close()
