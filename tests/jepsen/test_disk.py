"""The disk faults the nemesis injects do what they say, on a real store: a torn tail is cut
off at open (the store starts with every entry), a flipped bit in a committed entry makes the
store refuse to open with an error naming the file."""

from __future__ import annotations

import random
from pathlib import Path

import pytest

from dledger.log import Entry
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
