"""The disk faults the nemesis injects do what they say, on a real store: a torn tail is cut
off at open (the store starts with every entry), a flipped bit in a committed entry is cut at
open. The storage nemesis's faults damage committed data in any segment (the open or a full
check finds it, never a clean read), the hard state, a ConsumeQueue record, and put a store
back to an older copy of itself, leaving the promise file alone."""

from __future__ import annotations

import random
from collections.abc import Callable
from pathlib import Path

import pytest

from dledger.log import CorruptLogError, Entry, HardState
from dledger.storage import codec
from dledger.storage.store import SegmentedLogStore, StoreConfig
from jepsen_like import disk

CFG = StoreConfig(segment_size_bytes=64 * 1024, index_segment_size_bytes=64 * 1024)
ENTRIES = 200


def _store(root: Path) -> None:
    s = SegmentedLogStore(root, CFG)
    s.append([Entry(1, i, f"body-{i}".encode() * 10) for i in range(1, ENTRIES + 1)])
    s.flush()
    s.write_checkpoint(ENTRIES, ENTRIES)
    s.close()


def test_torn_tail_is_recovered(tmp_path: Path) -> None:
    _store(tmp_path)
    what = disk.tear_tail(tmp_path, random.Random(1))
    assert f"after index {ENTRIES}" in what
    s = SegmentedLogStore(tmp_path, CFG)
    try:
        assert s.last_index() == ENTRIES
        assert s.read(ENTRIES).body == f"body-{ENTRIES}".encode() * 10
    finally:
        s.close()


def test_flipped_bit_in_committed_entry_is_cut_at_open(tmp_path: Path) -> None:
    """Damage inside what the checkpoint says is durable is told from a torn tail: the store
    opens, reports it and cuts the log at the damaged entry, whose copies its node then takes
    from the quorum (docs/STORAGE.md "Damage and repair"); it is never served."""
    _store(tmp_path)
    what = disk.flip_bit(tmp_path, random.Random(2))
    assert "committed entry" in what
    s = SegmentedLogStore(tmp_path, CFG)
    try:
        assert s.damage is not None
        assert s.last_index() < ENTRIES
        for i in range(s.first_index(), s.last_index() + 1):
            assert s.read(i).body == f"body-{i}".encode() * 10
    finally:
        s.close()


def test_empty_store_has_nothing_to_damage(tmp_path: Path) -> None:
    SegmentedLogStore(tmp_path, CFG).close()
    with pytest.raises(disk.DiskFaultError):
        disk.tear_tail(tmp_path, random.Random(1))
    with pytest.raises(disk.DiskFaultError):
        disk.flip_bit(tmp_path, random.Random(1))


# Entries whose bodies fill several 64 KiB segments: damage can land in any of them.
MANY = 3000


def _big_store(root: Path) -> None:
    s = SegmentedLogStore(root, CFG)
    s.append([Entry(1, i, f"body-{i}".encode() * 10) for i in range(1, MANY + 1)])
    s.flush()
    s.write_checkpoint(MANY, MANY)
    s.close()


def _found(root: Path) -> str:
    """How the damage shows: cut at open, or (an older segment, which the open does not
    scan) a CorruptLogError from a full check; never a store that reads clean."""
    s = SegmentedLogStore(root, CFG)
    try:
        if s.damage is not None:
            return "open"
        with pytest.raises(CorruptLogError):
            s.verify()
        return "verify"
    finally:
        s.close()


@pytest.mark.parametrize("fault", [disk.flip_committed_bit, disk.cut_committed])
def test_damage_to_committed_data_of_any_segment_is_found(
    tmp_path: Path, fault: Callable[[Path, random.Random], disk.Damage]
) -> None:
    segments = set()
    for seed in range(8):
        root = tmp_path / str(seed)
        _big_store(root)
        damage = fault(root, random.Random(seed))
        facts = damage.facts
        assert facts["commit_index"] == MANY and facts["segments"] >= 4, facts
        assert Path(facts["file"]).parent == root / "commitlog"
        first, last = facts["indexes"]
        assert 1 <= first <= last <= MANY
        if fault is disk.cut_committed:
            assert Path(facts["file"]).stat().st_size == facts["offset"] < facts["old_size"]
        segments.add(facts["segment"])
        _found(root)
    assert len(segments) > 1, segments  # not only the last segment


def test_hard_state_damage_is_never_read_as_a_hard_state(tmp_path: Path) -> None:
    seen = set()
    for seed in range(12):
        meta = tmp_path / str(seed) / disk.HARD_STATE_FILE
        meta.parent.mkdir()
        meta.write_bytes(codec.encode_hard_state(HardState(7, "n2")))
        damage = disk.damage_hard_state(meta.parent, random.Random(seed))
        seen.add(damage.facts["how"])
        if damage.facts["how"] == "deleted":
            assert not meta.exists()
            continue
        with pytest.raises(codec.RecordError):
            codec.decode_hard_state(meta.read_bytes())
    assert seen == set(disk.HARD_STATE_DAMAGES)
    with pytest.raises(disk.DiskFaultError):
        disk.damage_hard_state(tmp_path / "none", random.Random(1))


def _cq_file(root: Path, records: int) -> Path:
    path = root / "consumequeue" / "jepsen" / "2" / ("0" * 20)
    path.parent.mkdir(parents=True)
    rows = [disk.CQ_RECORD.pack(1000 + 200 * i, 150, 0) for i in range(records)]
    path.write_bytes(b"".join(rows) + bytes(disk.CQ_RECORD.size * 10))  # zero-filled rest
    return path


def test_a_consumequeue_record_is_changed_and_only_it(tmp_path: Path) -> None:
    changes = set()
    for seed in range(12):
        root = tmp_path / str(seed)
        path = _cq_file(root, 50)
        before = path.read_bytes()
        damage = disk.damage_cq_record(root, "jepsen", random.Random(seed))
        after = path.read_bytes()
        n = damage.facts["queue_offset"]
        assert damage.facts["queue"] == "jepsen/2" and 0 <= n < 50
        size = disk.CQ_RECORD.size
        assert after[: n * size] == before[: n * size]
        assert after[(n + 1) * size :] == before[(n + 1) * size :]
        assert damage.facts["old"] == [1000 + 200 * n, 150, 0] != damage.facts["new"]
        assert list(disk.read_cq_record(path, n)) == damage.facts["new"]
        changes.add(damage.facts["change"])
    assert changes == {"shortened", *disk.CQ_FIELDS}
    with pytest.raises(disk.DiskFaultError):
        disk.damage_cq_record(tmp_path / "0", "other-topic", random.Random(1))


def test_a_store_put_back_to_its_copy_keeps_the_promise_file(tmp_path: Path) -> None:
    root = tmp_path / "n1"
    _big_store(root / "dledger-n1")
    (root / "dledger-n1.promise").write_bytes(b"promise 1")
    (root / "config").mkdir()
    (root / "config" / "snapshot.json").write_text("old")
    old_last = disk.last_entry_index(root / "dledger-n1")
    assert old_last == MANY
    keep = ("dledger-n1.promise",)
    disk.copy_store(root, tmp_path / "copy", keep)
    assert not (tmp_path / "copy" / "dledger-n1.promise").exists()
    s = SegmentedLogStore(root / "dledger-n1", CFG)
    s.append([Entry(1, i, b"later") for i in range(MANY + 1, MANY + 101)])
    s.close()
    (root / "dledger-n1.promise").write_bytes(b"promise 2")
    (root / "config" / "snapshot.json").write_text("new")
    (root / "index").mkdir()
    assert disk.last_entry_index(root / "dledger-n1") == MANY + 100
    disk.restore_store(tmp_path / "copy", root, keep)
    assert disk.last_entry_index(root / "dledger-n1") == old_last
    assert (root / "config" / "snapshot.json").read_text() == "old"
    assert not (root / "index").exists()
    assert (root / "dledger-n1.promise").read_bytes() == b"promise 2"
