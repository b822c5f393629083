"""The Raft reserve (docs/STORAGE.md "Disk full"): the arithmetic of the files a batch needs,
the leader's admission of application entries against the log's room, the next-allocation
count the disk watermark uses, and the node-side bookkeeping of accepted but unstored
entries. Full disks are faked (posix_fallocate raising ENOSPC, statvfs answering a fixed free
size) so that every number is exact."""

from __future__ import annotations

import errno
import os
from collections.abc import Iterator
from pathlib import Path

import pytest

from broker.components.disk import DiskGuard, Watermarks
from dledger.log import Entry, EntryType
from dledger.server.logroom import LogRoom
from dledger.storage import DiskFullError
from dledger.storage import admission as admission_mod
from dledger.storage.codec import ENTRY_HEADER_SIZE, INDEX_RECORD_SIZE
from dledger.storage.files import SegmentAllocator
from dledger.storage.store import (
    RAFT_RESERVE_BYTES,
    SegmentedLogStore,
    StoreConfig,
    files_needed,
)

SEG = 1 << 20  # 1 MiB segments: the reserve is 1/8 of one (128 KiB), headroom up to 256 KiB
IDX = 64 * 1024  # 2,048 index records per file
CFG = StoreConfig(
    segment_size_bytes=SEG, index_segment_size_bytes=IDX, preallocate=False, reserve_bytes=0
)
BODY = 8 * 1024
ENTRY = ENTRY_HEADER_SIZE + BODY
GIB = 1 << 30


# ---------------------------------------------------------------- files_needed


@pytest.mark.parametrize(
    ("write_offset", "batch", "largest", "keep", "expected"),
    [
        (0, 0, 0, 0, 0),  # nothing
        (0, 500, 100, 500, 0),  # fits with the reserve
        (0, 0, 0, 1000, 0),  # the reserve is the whole file: still the active file
        (1, 0, 0, 1000, 1),  # the reserve reaches past the end
        (900, 50, 50, 100, 1),  # the batch fits, the reserve does not
        # The batch crosses the end: the entry that did not fit (at most 100 bytes) leaves
        # at most 99 bytes blank; 950 + 100 + 99 = 1149, + 100 kept: one more file.
        (950, 100, 100, 100, 1),
        # Many files: each end crossed loses at most 99 bytes: 3 rolls, 3000 + 297 + 0.
        (0, 3000, 100, 0, 3),
        (1000, 0, 0, 2001, 3),  # a reserve of two files and a byte
    ],
)
def test_files_needed(
    write_offset: int, batch: int, largest: int, keep: int, expected: int
) -> None:
    got = files_needed(
        write_offset=write_offset,
        segment_bytes=1000,
        batch_bytes=batch,
        largest_entry_bytes=largest,
        keep_bytes=keep,
    )
    assert got == expected


def test_files_needed_for_the_issue_case() -> None:
    """32 MiB segments, 256 KiB sends, 4 MiB headroom + 256 KiB reserve: the last send that
    needs no new segment is the one that ends 4.25 MiB before the segment's end."""
    seg = 32 << 20
    send = 256 << 10
    keep = (4 << 20) + RAFT_RESERVE_BYTES
    last_ok = seg - keep - send
    assert (
        files_needed(
            write_offset=last_ok,
            segment_bytes=seg,
            batch_bytes=send,
            largest_entry_bytes=send,
            keep_bytes=keep,
        )
        == 0
    )
    assert (
        files_needed(
            write_offset=last_ok + 1,
            segment_bytes=seg,
            batch_bytes=send,
            largest_entry_bytes=send,
            keep_bytes=keep,
        )
        == 1
    )


# ---------------------------------------------------------------- the store


class Disk:
    """Fakes the file system's free space (statvfs) and its refusals (posix_fallocate)."""

    def __init__(self, monkeypatch: pytest.MonkeyPatch) -> None:
        self.full = False
        self.free_bytes = GIB
        real_fallocate = os.posix_fallocate
        real_statvfs = os.statvfs

        def fallocate(fd: int, offset: int, length: int) -> None:
            if self.full:
                raise OSError(errno.ENOSPC, "No space left on device")
            real_fallocate(fd, offset, length)

        def statvfs(path: str | os.PathLike[str]) -> os.statvfs_result:
            st = real_statvfs(path)
            blocks = self.free_bytes // st.f_frsize
            return os.statvfs_result(
                (st.f_bsize, st.f_frsize, st.f_blocks, blocks, blocks, *tuple(st)[5:])
            )

        monkeypatch.setattr(os, "posix_fallocate", fallocate)
        monkeypatch.setattr(os, "statvfs", statvfs)
        monkeypatch.setattr(admission_mod, "ALLOCATE_RETRY_S", 0.0)

    def fill(self) -> None:
        self.full, self.free_bytes = True, 0

    def free(self) -> None:
        self.full, self.free_bytes = False, GIB


@pytest.fixture
def disk(monkeypatch: pytest.MonkeyPatch) -> Disk:
    return Disk(monkeypatch)


@pytest.fixture
def store(tmp_path: Path) -> Iterator[SegmentedLogStore]:
    """A store holding one entry (its first index file exists: a store's first append,
    the first term's no-op, creates it)."""
    s = SegmentedLogStore(tmp_path / "s", CFG)
    try:
        s.append_bodies(1, [b"m" * BODY])
        yield s
    finally:
        s.close()


def _admit(s: SegmentedLogStore, n: int = 1, headroom: int = 0) -> None:
    s.admit_application_entries(n * ENTRY, n, ENTRY, headroom)


def _send(s: SegmentedLogStore, n: int = 1, headroom: int = 0) -> None:
    _admit(s, n, headroom)
    s.append_bodies(1, [b"m" * BODY] * n)


def test_reserve_sizes_are_capped_to_a_share_of_a_file(tmp_path: Path) -> None:
    big = StoreConfig(segment_size_bytes=1 << 30, index_segment_size_bytes=64 << 20)
    with SegmentedLogStore(tmp_path / "big", big) as s:
        data, index = s.reserve_bytes_for(4 << 20)
        # 256 KiB + 4 MiB; one record for every header-sized entry that fits in it.
        assert data == RAFT_RESERVE_BYTES + (4 << 20)
        assert index == data // ENTRY_HEADER_SIZE * INDEX_RECORD_SIZE
    with SegmentedLogStore(tmp_path / "small", CFG) as s:
        data, index = s.reserve_bytes_for(4 << 20)
        assert data == SEG // 8 + SEG // 4  # 128 KiB reserve + 256 KiB of headroom at most
        assert index == IDX // 8  # an eighth of an index file at most
        assert s.reserve_bytes_for(-5) == (SEG // 8, IDX // 8)


def test_a_full_disk_refuses_application_entries_before_the_reserve(
    store: SegmentedLogStore, disk: Disk
) -> None:
    disk.fill()
    keep, _ = store.reserve_bytes_for(0)
    fits = (SEG - keep) // ENTRY  # entries that leave the reserve untouched
    for _ in range(fits - 1):  # the fixture's entry is the first
        _send(store)
    with pytest.raises(DiskFullError) as info:
        _admit(store)
    text = str(info.value)
    assert info.value.code == "DISK_FULL" and "reason=log_room" in text, text
    assert f"need_bytes={SEG}" in text and f"reserve_bytes={keep}" in text, text
    assert store.log_room_refusals == 1 and store.segment_count == 1
    room = SEG - store.write_position
    assert keep <= room < keep + ENTRY
    # Raft's own entries still fit: a term's no-op and membership entries of the largest
    # size (16 KiB), written without allocating anything.
    last = store.last_index()
    store.append([Entry(2, last + 1, b"", int(EntryType.NOOP))])
    store.append([Entry(2, last + 2 + k, b"c" * 16384, int(EntryType.CONFIG)) for k in range(4)])
    assert store.last_index() == last + 5 and store.segment_count == 1
    store.flush()


def test_headroom_refuses_earlier_and_leaves_room_for_smaller_entries(
    store: SegmentedLogStore, disk: Disk
) -> None:
    disk.fill()
    headroom = 64 * 1024
    while True:
        try:
            _send(store, headroom=headroom)
        except DiskFullError:
            break
    assert SEG - store.write_position >= store.reserve_bytes_for(headroom)[0]
    _send(store)  # without the headroom: still admitted, into the headroom
    assert store.segment_count == 1


def test_the_next_segment_is_allocated_when_the_disk_is_short_and_admission_goes_on(
    store: SegmentedLogStore, disk: Disk
) -> None:
    disk.free_bytes = SEG + IDX  # enough for the next files, not for the slack as well
    keep, _ = store.reserve_bytes_for(0)
    for _ in range((SEG - keep) // ENTRY):  # the last one reaches into the reserve
        _send(store)
    assert store.segment_count == 1 and store.next_allocation_bytes() == IDX
    assert store._allocator is not None and store._allocator.is_ready(SEG)
    disk.fill()
    # The segment allocated ahead is the room now: the sends go on into it, and stop at
    # its reserve.
    sent = 0
    with pytest.raises(DiskFullError):
        for _ in range(2 * SEG // ENTRY):
            _send(store)
            sent += 1
    assert store.segment_count == 2 and sent > 0
    assert 2 * SEG - store.write_position >= keep


def test_sends_resume_by_themselves_once_space_returns(
    store: SegmentedLogStore, disk: Disk
) -> None:
    disk.fill()
    with pytest.raises(DiskFullError):
        for _ in range(SEG // ENTRY):
            _send(store)
    pos = store.write_position
    disk.free()
    for _ in range(SEG // ENTRY):  # across the end of the segment the refusals stopped at
        _send(store)
    assert store.write_position > pos and store.segment_count == 2
    store.flush()


def test_an_index_file_is_allocated_before_the_reserve_is_reached(
    tmp_path: Path, disk: Disk
) -> None:
    """Small entries: the index file runs out before the data segment does."""
    with SegmentedLogStore(tmp_path / "s", CFG) as s:
        _, keep_index = s.reserve_bytes_for(0)
        s.append_bodies(1, [b"i"])
        disk.fill()
        records = IDX // INDEX_RECORD_SIZE
        with pytest.raises(DiskFullError) as info:
            for _ in range(records):
                s.admit_application_entries(ENTRY_HEADER_SIZE + 1, 1, ENTRY_HEADER_SIZE + 1)
                s.append_bodies(1, [b"i"])
        assert f"need_bytes={IDX}" in str(info.value)
        assert (records - (s.last_index() + 1)) * INDEX_RECORD_SIZE >= keep_index
        last = s.last_index()
        s.append([Entry(2, last + 1 + k, b"", int(EntryType.NOOP)) for k in range(10)])
        disk.free()
        s.admit_application_entries(ENTRY_HEADER_SIZE + 1, 1, ENTRY_HEADER_SIZE + 1)
        assert s.log_room_refusals == 1


def test_next_allocation_counts_the_next_segment_and_index_file(
    store: SegmentedLogStore, disk: Disk
) -> None:
    assert store.next_allocation_bytes() == SEG + IDX
    assert store._allocator is not None
    store._allocator.prepare(SEG)
    assert store.next_allocation_bytes() == IDX


def test_admission_on_a_comfortable_disk_needs_no_allocation(
    store: SegmentedLogStore, disk: Disk
) -> None:
    """Plenty of free space: a batch larger than what is allocated is admitted (the append
    allocates), so a leader with many proposals in flight is not refused."""
    store.admit_application_entries(5 * SEG, 5 * SEG // ENTRY, ENTRY)
    assert store.log_room_refusals == 0


# ---------------------------------------------------------------- the allocator


def test_prepare_creates_the_segment_once_and_take_hands_it_over(tmp_path: Path) -> None:
    alloc = SegmentAllocator(tmp_path, SEG, enabled=False)
    alloc.prepare(SEG)
    assert alloc.is_ready(SEG) and not alloc.is_ready(2 * SEG)
    alloc.prepare(SEG)  # already there: nothing new
    f = alloc.take(SEG)
    assert f.start == SEG and not alloc.is_ready(SEG)
    alloc.prepare(2 * SEG, create=False)  # only waits: nothing made
    assert not alloc.is_ready(2 * SEG)
    f.close()
    alloc.close()


def test_prepare_on_a_full_disk_leaves_nothing(tmp_path: Path, disk: Disk) -> None:
    alloc = SegmentAllocator(tmp_path, SEG, enabled=False)
    disk.fill()
    with pytest.raises(OSError) as info:
        alloc.prepare(SEG)
    assert info.value.errno == errno.ENOSPC and not alloc.is_ready(SEG)
    assert list(tmp_path.iterdir()) == []
    alloc.close()


# ---------------------------------------------------------------- the node's bookkeeping


class FakeStore:
    def __init__(self) -> None:
        self.last = 0
        self.asked: list[tuple[int, int, int, int]] = []
        self.refuse = False

    def last_index(self) -> int:
        return self.last

    def admit_application_entries(
        self, batch_bytes: int, batch_count: int, largest_entry_bytes: int, headroom_bytes: int = 0
    ) -> None:
        self.asked.append((batch_bytes, batch_count, largest_entry_bytes, headroom_bytes))
        if self.refuse:
            raise DiskFullError("path=/s reason=log_room need_bytes=1 free_bytes=0")


def test_log_room_counts_accepted_entries_until_the_store_holds_them() -> None:
    room = LogRoom("n0")
    s = FakeStore()
    h = ENTRY_HEADER_SIZE
    room.check(s, [b"a" * 100], term=3, headroom_bytes=7)
    assert s.asked[-1] == (h + 100, 1, h + 100, 7)
    room.accepted([b"a" * 100], last_index=1, term=3)
    room.check(s, [b"b" * 10, b"c" * 20], term=3, headroom_bytes=0)
    assert s.asked[-1] == (3 * h + 130, 3, h + 100, 0)  # the unstored one counts
    room.accepted([b"b" * 10, b"c" * 20], last_index=3, term=3)
    s.last = 1  # the store appended the first proposal
    room.check(s, [b"d"], term=3, headroom_bytes=0)
    assert s.asked[-1][:2] == (3 * h + 31, 3)
    room.check(s, [b"d"], term=4, headroom_bytes=0)  # a new term: the old ones are not ours
    assert s.asked[-1] == (h + 1, 1, h + 1, 0)


def test_log_room_refusal_names_the_node() -> None:
    s = FakeStore()
    s.refuse = True
    with pytest.raises(DiskFullError) as info:
        LogRoom("n7").check(s, [b"x"], term=1, headroom_bytes=0)
    assert str(info.value).startswith("node=n7 path=/s reason=log_room ")


# ---------------------------------------------------------------- the watermark


class FakeFs:
    def __init__(self, free_bytes: int, total_bytes: int = 100 * GIB) -> None:
        self.free_bytes = free_bytes
        self.total_bytes = total_bytes
        self.now = 0.0

    def statvfs(self, path: str) -> os.statvfs_result:
        blocks, free = self.total_bytes // 4096, self.free_bytes // 4096
        return os.statvfs_result((4096, 4096, blocks, free, free, 100, 50, 50, 0, 255))


def test_the_watermark_counts_the_next_allocation() -> None:
    fs = FakeFs(free_bytes=50 * GIB)  # 50 % used: far below the marks
    need = [GIB + (32 << 20)]  # the next 1 GiB segment and 32 MiB index file
    guard = DiskGuard(
        "n0",
        "/s",
        Watermarks(max_used_percent=90, resume_percent=85, check_interval_ms=10),
        statvfs=fs.statvfs,
        clock=lambda: fs.now,
        next_allocation=lambda: need[0],
    )
    guard.check()
    # A 2 GiB file system half used: below the marks, but 1 GiB free < the next allocation.
    fs.free_bytes, fs.total_bytes, fs.now = GIB, 2 * GIB, 1.0
    with pytest.raises(DiskFullError) as info:
        guard.check()
    assert f"next_allocation_bytes={need[0]}" in str(info.value)
    need[0], fs.now = 32 << 20, 2.0  # the next segment got allocated: only the index counts
    guard.check()
    assert not guard.full
