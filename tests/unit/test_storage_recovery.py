"""Recovery on open: torn tails, damage (bit flips, cut files) cut at the first damaged entry,
interrupted truncation and deletion.

A "crash" is simulated by copying the store directory while the store is open: the copy
holds exactly what the page cache holds (what survives a process crash), including the
``abort`` marker, and nothing the store would do on close.
"""

from __future__ import annotations

import os
import shutil
import time
from pathlib import Path

import pytest

from dledger.log import CorruptLogError, Entry
from dledger.storage import codec
from dledger.storage.codec import ENTRY_HEADER_SIZE
from dledger.storage.damage import DamageMarker, DamageReport, read_marker, write_marker
from dledger.storage.store import SegmentedLogStore, StoreConfig

SEG = 64 * 1024
# Checkpoints only when asked (write_checkpoint / close), so tests control what it covers.
CFG = StoreConfig(
    segment_size_bytes=SEG, index_segment_size_bytes=SEG, checkpoint_interval_ms=10**9
)
BODY = 100
SIZE = ENTRY_HEADER_SIZE + BODY


def body_of(i: int, size: int = BODY) -> bytes:
    return (i.to_bytes(4, "big") * (size // 4 + 1))[:size]


def crash_copy(store: SegmentedLogStore, dst: Path) -> Path:
    # Skip a segment the allocator is creating right now: it would not exist after a crash
    # either (it is renamed into place only when complete).
    shutil.copytree(store.root, dst, ignore=shutil.ignore_patterns("*.alloc"))
    return dst


def seg_path(root: Path, start: int = 0) -> Path:
    return root / "commitlog" / f"{start:020d}"


def patch(path: Path, offset: int, data: bytes) -> None:
    with open(path, "r+b") as f:
        f.seek(offset)
        f.write(data)


def check_entries(s: SegmentedLogStore, last: int) -> None:
    assert s.last_index() == last
    for i in range(1, last + 1):
        assert s.read(i) == Entry(1, i, body_of(i)), i


@pytest.fixture(scope="module")
def crashed_with_unflushed_tail(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """Entries 1..9 flushed and checkpointed, entry 10 appended but not flushed, crash."""
    base = tmp_path_factory.mktemp("torn")
    s = SegmentedLogStore(base / "live", CFG)
    s.append([Entry(1, i, body_of(i)) for i in range(1, 10)])
    s.flush()
    s.write_checkpoint(0, 0)
    s.append([Entry(1, 10, body_of(10))])
    snap = crash_copy(s, base / "snap")
    s.close()
    return snap


@pytest.mark.parametrize("how", ["zero", "cut", "garbage"])
def test_every_torn_tail_length_loses_only_the_last_entry(
    crashed_with_unflushed_tail: Path, tmp_path: Path, how: str
) -> None:
    pos = 9 * SIZE  # position of entry 10
    for kept in range(SIZE + 1):
        root = tmp_path / f"{how}-{kept}"
        shutil.copytree(crashed_with_unflushed_tail, root)
        seg = seg_path(root)
        if how == "zero":
            patch(seg, pos + kept, bytes(SIZE - kept))
        elif how == "garbage":
            patch(seg, pos + kept, bytes((7 * k + 13) % 256 for k in range(SIZE - kept)))
        else:
            with open(seg, "r+b") as f:
                f.truncate(pos + kept)
        s = SegmentedLogStore(root, CFG)
        assert s.recovered_from_crash
        expect = 10 if kept == SIZE else 9
        check_entries(s, expect)
        if kept in (0, 1, 3, 4, 5, 47, 48, 49, SIZE - 1, SIZE):
            # The log continues cleanly from the repaired tail, and survives a reopen.
            s.append([Entry(1, expect + 1, body_of(expect + 1))])
            s.close()
            s = SegmentedLogStore(root, CFG)
            check_entries(s, expect + 1)
        s.close()
        shutil.rmtree(root)


def test_clean_and_crash_are_told_apart(tmp_path: Path) -> None:
    s = SegmentedLogStore(tmp_path / "a", CFG)
    assert not s.recovered_from_crash
    s.append([Entry(1, 1, body_of(1))])
    snap = crash_copy(s, tmp_path / "b")
    s.close()
    s = SegmentedLogStore(tmp_path / "a", CFG)
    assert not s.recovered_from_crash
    s.close()
    s = SegmentedLogStore(snap, CFG)
    assert s.recovered_from_crash
    check_entries(s, 1)  # a process crash keeps the page cache: nothing lost
    s.close()


# Offsets inside an entry to flip: magic, size, index, term, position, type, version,
# body size, body CRC, header CRC, first/middle/last body byte.
FLIP_OFFSETS = [0, 5, 15, 23, 31, 32, 33, 38, 41, 46, 48, 48 + BODY // 2, SIZE - 1]


def _store_with_entries(root: Path, n: int, *, clean: bool, tmp: Path) -> Path:
    s = SegmentedLogStore(root, CFG)
    s.append([Entry(1, i, body_of(i)) for i in range(1, n + 1)])
    if clean:
        s.close()
        return root
    snap = crash_copy(s, tmp)  # the checkpoint still says position 0: nothing trusted
    s.close()
    return snap


@pytest.mark.parametrize("clean", [True, False], ids=["after-clean-close", "after-crash"])
@pytest.mark.parametrize("flip", FLIP_OFFSETS)
def test_flipped_bit_in_non_tail_entry_is_damage_cut_at_that_entry(
    tmp_path: Path, clean: bool, flip: int
) -> None:
    root = _store_with_entries(tmp_path / "s", 20, clean=clean, tmp=tmp_path / "snap")
    victim = 7  # entry 7 of 20: not the tail
    pos = (victim - 1) * SIZE
    seg = seg_path(root)
    data = bytearray(seg.read_bytes())
    data[pos + flip] ^= 0x04
    seg.write_bytes(bytes(data))
    cuts: list[DamageReport] = []
    s = SegmentedLogStore(root, CFG, before_damage_cut=cuts.append)
    # Damage, not a torn tail: reported (file, offset, the indexes lost) and cut there.
    assert s.damage is not None and cuts == [s.damage]
    assert (s.damage.path, s.damage.offset) == (str(seg), pos)
    assert (s.damage.first_index, s.damage.last_index) == (victim, 20)
    assert s.damage.entries_lost == 20 - victim + 1
    check_entries(s, victim - 1)
    s.append([Entry(1, victim, b"from the leader")])  # the log goes on from the cut
    s.close()
    # The cut is durable and complete: the next open finds a clean log.
    s = SegmentedLogStore(root, CFG)
    assert s.damage is None and s.last_index() == victim
    assert s.read(victim).body == b"from the leader"
    s.close()


def test_torn_entry_below_checkpoint_is_damage(tmp_path: Path) -> None:
    root = _store_with_entries(tmp_path / "s", 10, clean=True, tmp=tmp_path / "x")
    # The last entry is durable per the checkpoint: tearing it is damage, not a torn tail.
    patch(seg_path(root), 9 * SIZE + 60, bytes(SIZE - 60))
    s = SegmentedLogStore(root, CFG)
    assert s.damage is not None and s.damage.offset == 9 * SIZE
    assert "checkpoint" in s.damage.reason
    assert (s.damage.first_index, s.damage.last_index) == (10, 10)
    check_entries(s, 9)
    s.close()


def test_cut_file_inside_committed_data_is_damage(tmp_path: Path) -> None:
    root = tmp_path / "s"
    s = SegmentedLogStore(root, CFG)
    s.append([Entry(1, i, body_of(i)) for i in range(1, 801)])
    s.close()
    seg = seg_path(root, SEG)  # the second (last) segment, cut to a third
    os.truncate(seg, SEG // 3)
    s = SegmentedLogStore(root, CFG)
    assert s.damage is not None and s.damage.path == str(seg)
    assert s.damage.last_index == 800
    assert s.last_index() == s.damage.first_index - 1
    check_entries(s, s.last_index())
    s.close()


def test_corruption_in_an_older_segment(tmp_path: Path) -> None:
    root = tmp_path / "s"
    s = SegmentedLogStore(root, CFG)
    n = 2000  # about 5 segments of 64 KiB
    s.append([Entry(1, i, body_of(i)) for i in range(1, n + 1)])
    s.close()
    patch(seg_path(root), 3 * SIZE + 50, b"\xff")  # body of entry 4, in segment 0
    # Open checks the tail segments only; reads check every entry they serve.
    s = SegmentedLogStore(root, CFG)
    assert s.read(3).body == body_of(3)
    with pytest.raises(CorruptLogError) as e:
        s.read(4)
    assert (e.value.path, e.value.offset) == (str(seg_path(root)), 3 * SIZE)
    with pytest.raises(CorruptLogError):
        s.read_range(1, 10**6)
    with pytest.raises(CorruptLogError):
        s.read_raw(1, 10**6)
    with pytest.raises(CorruptLogError):
        s.verify()
    with pytest.raises(CorruptLogError) as e:
        s.verify_entries(1, 10**9)
    assert e.value.index == 4
    s.close()
    # A damage marker (what a node writes when a read or the scrubber found damage) makes
    # the next open check every segment and cut the log at the damaged entry.
    write_marker(root, DamageMarker(verify=True, restarts=1, since_s=time.time()))
    s = SegmentedLogStore(root, CFG)
    assert s.damage is not None and s.damage.offset == 3 * SIZE
    assert (s.damage.first_index, s.damage.last_index) == (4, n)
    check_entries(s, 3)
    s.close()
    marker = read_marker(root)
    assert marker is not None and not marker.verify and marker.restarts == 1


def test_missing_middle_segment_refuses(tmp_path: Path) -> None:
    root = tmp_path / "s"
    s = SegmentedLogStore(root, CFG)
    s.append([Entry(1, i, body_of(i)) for i in range(1, 2000)])
    s.close()
    seg_path(root, SEG).unlink()
    with pytest.raises(CorruptLogError, match="missing"):
        SegmentedLogStore(root, CFG)


def test_lost_index_is_rebuilt_after_crash(tmp_path: Path) -> None:
    s = SegmentedLogStore(tmp_path / "s", CFG)
    s.append([Entry(1, i, body_of(i)) for i in range(1, 1500)])
    snap = crash_copy(s, tmp_path / "snap")
    s.close()
    for f in (snap / "index").iterdir():
        f.write_bytes(bytes(f.stat().st_size))
    s = SegmentedLogStore(snap, CFG)
    check_entries(s, 1499)
    s.close()


def test_truncated_entries_never_reappear_after_crash(tmp_path: Path) -> None:
    s = SegmentedLogStore(tmp_path / "s", CFG)
    s.append([Entry(1, i, body_of(i)) for i in range(1, 1000)])
    s.flush()
    s.truncate_suffix(500)
    snap1 = crash_copy(s, tmp_path / "snap1")
    s.append([Entry(1, 500, b"short")])  # shorter than what was there: no stale bytes left
    snap2 = crash_copy(s, tmp_path / "snap2")
    s.close()
    s = SegmentedLogStore(snap1, CFG)
    check_entries(s, 499)
    s.close()
    s = SegmentedLogStore(snap2, CFG)
    assert s.last_index() == 500 and s.read(500).body == b"short"
    s.close()


def test_interrupted_truncation_is_completed(tmp_path: Path) -> None:
    s = SegmentedLogStore(tmp_path / "s", CFG)
    s.append([Entry(1, i, body_of(i)) for i in range(1, 1000)])
    snap = crash_copy(s, tmp_path / "snap")
    s.close()
    # The crash came right after truncate_suffix(500) made its intent durable.
    ckpt = codec.Checkpoint(truncate_pending_position=499 * SIZE)
    (snap / "checkpoint").write_bytes(codec.encode_checkpoint(ckpt))
    s = SegmentedLogStore(snap, CFG)
    check_entries(s, 499)
    assert s.read_checkpoint().truncate_pending_position == codec.NO_TRUNCATE_PENDING
    s.append([Entry(2, 500, b"new")])
    s.close()
    s = SegmentedLogStore(snap, CFG)
    assert s.last_index() == 500 and s.read(500) == Entry(2, 500, b"new")
    s.close()


def test_interrupted_delete_prefix_is_completed(tmp_path: Path) -> None:
    s = SegmentedLogStore(tmp_path / "s", CFG)
    s.append([Entry(1 + i // 100, i, body_of(i)) for i in range(1, 2000)])
    first_of_seg1 = s.segment_infos()[1].first_index
    snap = crash_copy(s, tmp_path / "snap")
    s.close()
    # The crash came after delete_prefix wrote its checkpoint, before it removed files.
    base = first_of_seg1 - 1
    ckpt = codec.Checkpoint(base_index=base, base_term=1 + base // 100)
    (snap / "checkpoint").write_bytes(codec.encode_checkpoint(ckpt))
    s = SegmentedLogStore(snap, CFG)
    assert s.first_index() == first_of_seg1
    assert s.term_at(base) == 1 + base // 100
    assert not seg_path(snap).exists()
    assert s.read(1999).body == body_of(1999)
    s.close()


def test_valid_entry_after_a_gap_is_corruption_not_a_torn_tail(tmp_path: Path) -> None:
    s = SegmentedLogStore(tmp_path / "s", CFG)
    s.append([Entry(1, i, body_of(i)) for i in range(1, 11)])
    snap = crash_copy(s, tmp_path / "snap")
    s.close()
    patch(seg_path(snap), 4 * SIZE, bytes(SIZE))  # entry 5 wiped, 6..10 intact
    s = SegmentedLogStore(snap, CFG)
    assert s.damage is not None
    assert s.damage.offset == 4 * SIZE and "follows" in s.damage.reason
    check_entries(s, 4)
    s.close()


def test_search_for_valid_entries_is_bounded_but_finds_them(tmp_path: Path) -> None:
    # A segment much larger than one entry: open reads the written bytes plus one maximum
    # entry of zeros, not the whole file, and still sees entries after a damaged one.
    big = StoreConfig(
        segment_size_bytes=128 << 20,
        index_segment_size_bytes=SEG,
        checkpoint_interval_ms=10**9,
    )
    root = tmp_path / "s"
    s = SegmentedLogStore(root, big)
    s.append([Entry(1, i, body_of(i)) for i in range(1, 11)])
    snap = crash_copy(s, tmp_path / "snap")
    s.close()
    patch(seg_path(snap), 4 * SIZE + 8, b"\xee")  # entry 5's index field
    s = SegmentedLogStore(snap, big)
    assert s.damage is not None and s.damage.offset == 4 * SIZE
    s.close()
