"""The Raft reserve of a store (docs/STORAGE.md "Disk full"): before a leader accepts
application entries, :class:`RaftReserve` checks that after them the log still has room for Raft's
own entries in files already allocated (or certain to be), allocating the next data segment
and index file early when the file system is short of space. It owns its rate limits and
counters; the store calls it under its ``_lock`` with the log's current end."""

from __future__ import annotations

import errno
import os
import time
from collections.abc import Callable
from pathlib import Path

from dledger.storage.codec import ENTRY_HEADER_SIZE, INDEX_RECORD_SIZE
from dledger.storage.errors import DiskFullError, short_path
from dledger.storage.files import SegmentAllocator, is_disk_full
from dledger.storage.index import IndexFiles
from dledger.storage.segments import SegmentSet

# Log room kept for Raft's own entries: a leader admits application entries only if, after
# them, the log still has this much room in files already allocated (or certain to be), so
# that a new term's no-op (a 48-byte header, empty body) and membership entries (at most
# 16 KiB each) are written without allocating anything. 256 KiB holds 5,000 no-ops or 15
# membership entries of the largest size; next to a 1 GiB segment it is nothing.
RAFT_RESERVE_BYTES = 256 << 10
# The reserve takes at most this fraction of a segment (and of an index file), and the
# caller's extra headroom at most RESERVE_HEADROOM_MAX_FRACTION: tiny test segments (64 KiB)
# must still take application entries.
RAFT_RESERVE_MAX_FRACTION = 8
RESERVE_HEADROOM_MAX_FRACTION = 4
# Admitting entries on free file-system space rather than allocated files needs this many
# spare allocations beyond the need (one data segment and one index file each): other writers
# on the file system (the application's files) may take space before the append allocates.
ALLOCATION_SLACK_COUNT = 1
# After the next segment could not be allocated for lack of space, admission tries again at
# most this often (each try is an fallocate that fails; sends are refused meanwhile).
ALLOCATE_RETRY_S = 1.0
# Distinct headroom values whose reserve sizes are cached (callers use one or two).
KEEP_CACHE_MAX = 8


def files_needed(
    *,
    write_offset: int,
    segment_bytes: int,
    batch_bytes: int,
    largest_entry_bytes: int,
    keep_bytes: int,
) -> int:
    """How many files after the active one the log needs to take ``batch_bytes`` (encoded
    entries, the largest ``largest_entry_bytes``; 0 for fixed-size records such as the
    index's) at ``write_offset`` of its active file of ``segment_bytes`` and still have
    ``keep_bytes`` of room after them. Entries never straddle two files: each file end crossed
    loses less than the largest entry to the blank record that closes the file."""
    assert 0 <= write_offset <= segment_bytes and batch_bytes >= 0 and keep_bytes >= 0
    assert 0 <= largest_entry_bytes <= segment_bytes
    end = write_offset + batch_bytes
    if end > segment_bytes and largest_entry_bytes > 1:
        waste = largest_entry_bytes - 1  # per file end crossed, at most
        rolls = -(-(end - segment_bytes) // (segment_bytes - waste))
        end += rolls * waste
    need = end + keep_bytes - segment_bytes
    return max(0, -(-need // segment_bytes))


def free_bytes(root: Path) -> int:
    """Bytes of the file system holding ``root`` that this process may still allocate (-1
    when it cannot be read, which admits nothing that needs space)."""
    try:
        st = os.statvfs(root)
    except OSError:
        return -1
    return int(st.f_bavail * st.f_frsize)


class RaftReserve:
    """Admission by log room for the store in ``root`` with data ``segments`` and ``index``
    files. ``request_next()`` asks the allocator for the next data segment at once."""

    def __init__(
        self,
        root: Path,
        segments: SegmentSet,
        index: IndexFiles,
        request_next: Callable[[], None],
    ) -> None:
        self.root = root
        self._segs = segments
        self._index = index
        self._request_next = request_next
        self._seg_size = segments.segment_bytes
        self._idx_size = index.file_bytes
        self.refusals = 0  # application entries refused to keep the Raft reserve
        self._allocate_tried_s = -ALLOCATE_RETRY_S  # last allocation ahead that failed
        self._keep_cache: dict[int, tuple[int, int]] = {}  # headroom -> reserve_bytes_for
        self._forced_request_s = -ALLOCATE_RETRY_S  # last early request of the next segment

    def reserve_bytes_for(self, headroom_bytes: int = 0) -> tuple[int, int]:
        """(data bytes, index bytes) of room the log keeps after application entries: the
        Raft reserve plus the caller's ``headroom_bytes``, each capped to a share of a file."""
        raft = min(RAFT_RESERVE_BYTES, self._seg_size // RAFT_RESERVE_MAX_FRACTION)
        extra = min(max(0, headroom_bytes), self._seg_size // RESERVE_HEADROOM_MAX_FRACTION)
        # Every entry takes one index record and at least a header of data.
        records = min(
            (raft + extra) // ENTRY_HEADER_SIZE,
            self._idx_size // INDEX_RECORD_SIZE // RAFT_RESERVE_MAX_FRACTION,
        )
        return raft + extra, records * INDEX_RECORD_SIZE

    def admit(
        self,
        allocator: SegmentAllocator,
        end: tuple[int, int],
        batch: tuple[int, int, int],
        headroom_bytes: int,
    ) -> None:
        """Admit a batch (bytes, count, largest entry bytes) onto the log ending at ``end``
        (write position, last index), or raise DiskFullError (see
        :meth:`dledger.storage.store.SegmentedLogStore.admit_application_entries`)."""
        write_pos, last_index = end
        batch_bytes, batch_count, _largest = batch
        if self._fits_in_active_files(
            write_pos, last_index, batch_bytes, batch_count, headroom_bytes
        ):
            return
        missing, need = self._room_needed(allocator, end, batch, headroom_bytes)
        if not missing:
            return
        free = free_bytes(self.root)
        slack = ALLOCATION_SLACK_COUNT * (self._seg_size + self._idx_size)
        if free >= need + slack:
            now = time.monotonic()
            data_missing = any(kind == "data" for kind, _start in missing)
            if data_missing and now - self._forced_request_s >= ALLOCATE_RETRY_S:
                # At most this often: a quota (EDQUOT) that statvfs does not show would
                # otherwise have the allocator fail once per proposal.
                self._forced_request_s = now
                self._request_next()
            return
        if self._allocate_ahead(allocator, missing):
            missing, need = self._room_needed(allocator, end, batch, headroom_bytes)
            free = free_bytes(self.root)
            if not missing or free >= need + slack:
                return
        self.refusals += 1
        keep, _ = self.reserve_bytes_for(headroom_bytes)
        raise DiskFullError(
            f"path={short_path(self.root)} reason=log_room need_bytes={need} "
            f"free_bytes={free} reserve_bytes={keep}"
        )

    def _fits_in_active_files(
        self, write_pos: int, last_index: int, batch_bytes: int, batch_count: int, headroom: int
    ) -> bool:
        """The common case, cheaply (a few microseconds per proposal): the batch and the
        reserve fit in the active segment and index file."""
        cached = self._keep_cache.get(headroom)
        if cached is None:
            if len(self._keep_cache) >= KEEP_CACHE_MAX:
                self._keep_cache.clear()
            cached = self._keep_cache[headroom] = self.reserve_bytes_for(headroom)
        keep, keep_index = cached
        record = (last_index + 1) * INDEX_RECORD_SIZE
        number, offset = divmod(record, self._idx_size)
        return (
            write_pos + batch_bytes + keep <= self._segs.active.end
            and offset + batch_count * INDEX_RECORD_SIZE + keep_index <= self._idx_size
            and number in self._index
        )

    def _room_needed(
        self,
        allocator: SegmentAllocator,
        end: tuple[int, int],
        batch: tuple[int, int, int],
        headroom_bytes: int,
    ) -> tuple[list[tuple[str, int]], int]:
        """The files the log lacks for the batch plus the reserve (("data"|"index", start)),
        and their bytes."""
        write_pos, last_index = end
        batch_bytes, batch_count, largest_entry_bytes = batch
        keep, keep_index = self.reserve_bytes_for(headroom_bytes)
        seg = self._segs.active
        n_data = files_needed(
            write_offset=write_pos - seg.start,
            segment_bytes=self._seg_size,
            batch_bytes=batch_bytes,
            largest_entry_bytes=min(largest_entry_bytes, self._seg_size),
            keep_bytes=keep,
        )
        missing: list[tuple[str, int]] = []
        for k in range(n_data):
            start = seg.end + k * self._seg_size
            if k > 0 or not allocator.is_ready(start):
                missing.append(("data", start))
        record = (last_index + 1) * INDEX_RECORD_SIZE
        first_file = record // self._idx_size
        n_index = files_needed(
            write_offset=record - first_file * self._idx_size,
            segment_bytes=self._idx_size,
            batch_bytes=batch_count * INDEX_RECORD_SIZE,
            largest_entry_bytes=0,
            keep_bytes=keep_index,
        )
        for number in range(first_file, first_file + n_index + 1):
            if number not in self._index:
                missing.append(("index", number * self._idx_size))
        sizes = {"data": self._seg_size, "index": self._idx_size}
        return missing, sum(sizes[kind] for kind, _start in missing)

    def _allocate_ahead(self, allocator: SegmentAllocator, missing: list[tuple[str, int]]) -> bool:
        """Allocate the next data segment and the index files of ``missing`` now; False when
        the disk refused (tried again at most every ALLOCATE_RETRY_S; meanwhile a segment the
        background allocator is making is waited for)."""
        now = time.monotonic()
        # Between tries only the background allocator's work in flight is waited for.
        create = now - self._allocate_tried_s >= ALLOCATE_RETRY_S
        next_segment = self._segs.active.end
        try:
            for kind, start in missing:
                if kind == "data" and start == next_segment:
                    allocator.prepare(start, create=create)
                elif kind == "index" and create:
                    self._index.file(start // self._idx_size, create=True)
        except OSError as e:
            if e.errno == errno.EBUSY:  # the background allocator is stuck: refuse for now
                return False
            if not is_disk_full(e):
                raise
            self._allocate_tried_s = now
            return False
        return True

    def next_allocation_bytes(self, allocator: SegmentAllocator, last_index: int) -> int:
        """Bytes the log must still allocate before it can grow past its active files (see
        :meth:`dledger.storage.store.SegmentedLogStore.next_allocation_bytes`)."""
        need = 0 if allocator.is_ready(self._segs.active.end) else self._seg_size
        record = (last_index + 1) * INDEX_RECORD_SIZE
        if record // self._idx_size + 1 not in self._index:
            need += self._idx_size
        return need
