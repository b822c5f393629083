"""Derived state against the commitlog (broker.derived): the open-time check, the check on
read and the scrubber find wrong ConsumeQueue and key index records and rebuild them."""

from __future__ import annotations

import struct
from pathlib import Path

import pytest
from broker_world import MemoryLog

from broker import derived
from broker.consumequeue import CQ_RECORD, CQ_RECORD_SIZE
from broker.message import Message, UniqIdGenerator, encode_batch
from broker.state import ENTRY_MESSAGES, BrokerStateMachine
from dledger.core import Role

IDS = UniqIdGenerator(ip="10.0.0.1", pid=9, instance_hash=3)


def _sm(root: Path, log: MemoryLog) -> BrokerStateMachine:
    sm = BrokerStateMachine(root, hash_slots=1000, max_index_records=5000, cq_records_per_file=50)
    sm.attach(log)
    sm.on_role_change(Role.LEADER, 1, "n0")
    return sm


def _filled(root: Path, entries: int = 10, per_entry: int = 6, queues: int = 2) -> MemoryLog:
    """A log of message batches over ``queues`` queues of topic T, applied and snapshotted."""
    log = MemoryLog()
    n = 0
    for e in range(entries):
        ms = [
            Message(
                topic="T",
                queue_id=i % queues,
                body=f"body-{n + i}".encode() * (1 + (n + i) % 3),
                tags=f"Tag{(n + i) % 3}",
                keys=(f"k{n + i}",),
                store_timestamp_ms=1_000_000 + e,
                uniq_id=IDS.next_id(),
            )
            for i in range(per_entry)
        ]
        n += per_entry
        log.add(encode_batch(ms)[0], ENTRY_MESSAGES)
    sm = _sm(root, log)
    sm.applied_index()
    sm.apply(log.entries)
    sm.close()
    return log


def _cq_file(root: Path, queue_id: int = 0) -> Path:
    return root / "consumequeue" / "T" / str(queue_id) / "00000000000000000000"


def _records(root: Path, queue_id: int = 0) -> list[tuple[int, int, int]]:
    raw = _cq_file(root, queue_id).read_bytes()
    return [r for r in CQ_RECORD.iter_unpack(raw) if r[1]]


def _poke(root: Path, offset: int, record: tuple[int, int, int], queue_id: int = 0) -> None:
    path = _cq_file(root, queue_id)
    raw = bytearray(path.read_bytes())
    CQ_RECORD.pack_into(raw, offset * CQ_RECORD_SIZE, *record)
    path.write_bytes(bytes(raw))


@pytest.mark.parametrize(
    "change",
    [
        "size_smaller",  # the case: a pull answered DATA_LOSS "truncated message"
        "size_larger",
        "position",
        "tag",
        "points_at_a_later_message_of_the_queue",
    ],
)
def test_a_changed_record_behind_the_snapshot_is_rebuilt_at_open(
    tmp_path: Path, change: str
) -> None:
    log = _filled(tmp_path)
    good = _records(tmp_path)
    assert len(good) == 30
    position, size, tag = good[7]
    bad = {
        "size_smaller": (position, size - 5, tag),
        "size_larger": (position, size + 5, tag),
        "position": (position + 3, size, tag),
        "tag": (position, size, tag ^ 1),
        "points_at_a_later_message_of_the_queue": good[9],
    }[change]
    _poke(tmp_path, 7, bad)
    sm = _sm(tmp_path, log)
    sm.applied_index()
    try:
        assert sm.cqs.find("T", 0).read(0, 30).raw == b"".join(CQ_RECORD.pack(*r) for r in good)
        assert sm.derived.total_wrong("consumequeue") >= 1 and sm.derived.rebuilt >= 1
        assert sm.last_applied == len(log.entries)  # rebuilt in place, not from the start
    finally:
        sm.close()
    assert _records(tmp_path) == good


def test_several_wrong_records_in_a_row_and_in_two_queues(tmp_path: Path) -> None:
    log = _filled(tmp_path)
    good0, good1 = _records(tmp_path, 0), _records(tmp_path, 1)
    for offset in (3, 4, 5):
        _poke(tmp_path, offset, (0, 0xFFFF, 0))
    _poke(tmp_path, 0, (good1[0][0] + 1, 9, 9), queue_id=1)  # the queue's first record
    sm = _sm(tmp_path, log)
    sm.applied_index()
    sm.close()
    assert _records(tmp_path, 0) == good0
    assert _records(tmp_path, 1) == good1


def test_a_wrong_key_index_record_makes_the_open_rebuild_from_the_log(tmp_path: Path) -> None:
    log = _filled(tmp_path)
    index_file = next((tmp_path / "index").iterdir())
    raw = bytearray(index_file.read_bytes())
    # Record 5's position (records follow the 64-byte header and 1000 slots of 4 bytes).
    at = 64 + 4 * 1000 + 20 * 5 + 4
    (position,) = struct.unpack_from(">q", raw, at)
    struct.pack_into(">q", raw, at, position + 1)
    index_file.write_bytes(bytes(raw))
    sm = _sm(tmp_path, log)
    assert sm.applied_index() == 0  # rebuilt: the whole log is applied again
    sm.apply(log.entries)
    try:
        assert sm.derived.mismatches == {("index", "open"): 1}
        assert derived.check_index(sm, "test", None)[1] == ""
    finally:
        sm.close()
