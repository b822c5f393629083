"""The data segments of a store (docs/STORAGE.md "Layout"): the ordered list of mapped
segment files under ``commitlog/``, the first entry index of each, and the byte-level work on
them that the store, its recovery and its truncation share (zeroing, syncing, searching for
valid entries). :class:`SegmentSet` owns the list; nothing else appends to or removes from it.

Locking is the store's (``dledger.storage.store``): a ``SegmentSet`` has none of its own.
"""

from __future__ import annotations

import contextlib
import itertools
import logging
import os
from collections.abc import Iterator
from pathlib import Path

from dledger.log import CorruptLogError, DLedgerError
from dledger.storage import codec
from dledger.storage.codec import ENTRY_HEADER_SIZE, ENTRY_MAGIC, HEADER, RecordError
from dledger.storage.files import ALLOC_SUFFIX, SEGMENT_NAME_DIGITS, MappedFile, segment_name

log = logging.getLogger(__name__)

# Recovery reads segments in chunks of this size when it looks for the end of written data.
SCAN_CHUNK_BYTES = 1 << 20


def list_files(directory: Path, unit: int) -> list[int]:
    """The start positions of the segment files in ``directory`` (each ``unit`` bytes at most
    and starting at a multiple of it), sorted; leftovers of interrupted allocations and writes
    are deleted. DLedgerError on any other file."""
    starts = []
    for p in directory.iterdir():
        if p.name.endswith((ALLOC_SUFFIX, ".tmp")):
            p.unlink()  # an allocation or a write that a crash interrupted
            continue
        if len(p.name) != SEGMENT_NAME_DIGITS or not p.name.isdigit():
            raise DLedgerError(f"unexpected file {p} in the store")
        start = int(p.name)
        if start % unit or p.stat().st_size > unit:
            raise DLedgerError(
                f"{p} does not start at a multiple of {unit} bytes or is larger than that: "
                "is the store opened "
                "with a different segment size than it was written with?"
            )
        starts.append(start)
    return sorted(starts)


def peek_first_index(seg: MappedFile) -> int:
    """The index of the entry at the start of ``seg``; 0 if none is readable there."""
    try:
        return codec.decode_header(seg.mm, 0).index
    except RecordError:
        return 0


def corrupt_error(seg: MappedFile, pos: int, reason: str, index: int = 0) -> CorruptLogError:
    """The error for a bad entry at data position ``pos`` of ``seg``."""
    offset = pos - seg.start
    named = f" index {index}" if index else ""
    return CorruptLogError(
        f"corrupt log entry{named} in {seg.path} at byte offset {offset} (position {pos}): "
        f"{reason}",
        path=str(seg.path),
        offset=offset,
        index=index,
    )


class SegmentSet:
    """The store's data segments, consecutive, oldest first, the last one active (appended
    to), with the index of the first entry of each (0 while a segment holds none)."""

    def __init__(self, directory: Path, segment_bytes: int, max_entry_bytes: int) -> None:
        self.directory = directory
        self.segment_bytes = segment_bytes
        # the largest encoded entry: bounds the search for valid entries past the log's end
        self._max_entry_bytes = max_entry_bytes
        self._files: list[MappedFile] = []
        self._first: list[int] = []  # first entry index in each segment, 0 when empty
        self.created_first = False  # open created the first segment (an empty store)

    # ---------------------------------------------------------------- the list

    def __len__(self) -> int:
        return len(self._files)

    def __getitem__(self, k: int) -> MappedFile:
        return self._files[k]

    def __iter__(self) -> Iterator[MappedFile]:
        return iter(self._files)

    @property
    def active(self) -> MappedFile:
        """The segment appends go to (the last)."""
        return self._files[-1]

    @property
    def first_indices(self) -> list[int]:
        """A copy of the first entry index of each segment (0: none)."""
        return list(self._first)

    def open_existing(self, base_index: int) -> None:
        """Map the segment files on disk; CorruptLogError if one is missing between two.
        Segments an interrupted prefix deletion left (all their entries ``<= base_index``)
        are deleted."""
        assert not self._files
        starts = list_files(self.directory, self.segment_bytes)
        for a, b in itertools.pairwise(starts):
            if b != a + self.segment_bytes:
                missing = self.directory / segment_name(a + self.segment_bytes)
                raise CorruptLogError(
                    f"data segment {missing} is missing (the log has a hole)",
                    path=str(missing),
                    offset=0,
                )
        for start in starts:
            path = self.directory / segment_name(start)
            self._files.append(MappedFile(path, start, self.segment_bytes, create=False))
        # A crash inside delete_prefix leaves segments whose entries are all <= base_index.
        while len(self._files) >= 2:
            first = peek_first_index(self._files[1])
            if first == 0 or first > base_index + 1:
                break
            log.info("dropping segment left by an interrupted delete path=%s", self._files[0])
            self._files.pop(0).delete()

    def create_first(self, position: int) -> None:
        """An empty store: create the segment holding data ``position``."""
        assert not self._files
        start = position - position % self.segment_bytes
        path = self.directory / segment_name(start)
        self._files.append(MappedFile(path, start, self.segment_bytes, create=True))
        self.created_first = True

    def drop_beyond(self, end_pos: int) -> bool:
        """Delete the (empty) segments that start after ``end_pos``; whether any was."""
        dropped = False
        while len(self._files) > 1 and self._files[-1].start > end_pos:
            self._files.pop().delete()
            dropped = True
        return dropped

    def fill_first_indices(self, write_pos: int) -> None:
        """Read the first entry index of every segment (0 for those at ``write_pos`` or
        after: they hold nothing yet)."""
        self._first = [0 if s.start >= write_pos else peek_first_index(s) for s in self._files]

    def set_active_first(self, index: int) -> None:
        """Record ``index`` as the first entry of the active segment (0: it holds none)."""
        self._first[-1] = index

    def active_first(self) -> int:
        return self._first[-1]

    def roll(self, nxt: MappedFile) -> None:
        """Make ``nxt``, the segment following the active one, active."""
        assert nxt.start == self._files[-1].end
        self._files.append(nxt)
        self._first.append(0)

    def keep_through(self, position: int) -> None:
        """Delete the segments after the one holding data ``position`` (a truncation)."""
        keep = self._files.index(self.segment_at(position)) + 1
        for seg in self._files[keep:]:
            seg.delete()
        del self._files[keep:]
        del self._first[keep:]
        if self._files[-1].start == position:
            self._first[-1] = 0

    def drop_first(self, count: int) -> None:
        """Delete the ``count`` oldest segments (a prefix deletion; never the active one)."""
        assert count < len(self._files)
        for seg in self._files[:count]:
            seg.delete()
        del self._files[:count]
        del self._first[:count]

    def last_indices(self, last_index: int) -> list[int]:
        """The index of the last entry of each segment (0: none), the log ending at
        ``last_index``."""
        out = []
        first = self._first
        n = len(self._files)
        for k in range(n):
            nxt = next((first[j] for j in range(k + 1, n) if first[j]), 0)
            if first[k] == 0:
                out.append(0)
            else:
                out.append(nxt - 1 if nxt else last_index)
        return out

    def overlapping(self, start: int, end: int) -> list[MappedFile]:
        """The segments holding some of data bytes ``[start, end)``."""
        return [s for s in self._files if s.end > start and s.start < end]

    def close(self) -> None:
        for seg in self._files:
            seg.close()
        self._files = []
        self._first = []

    # ---------------------------------------------------------------- positions and bytes

    def segment_at(self, pos: int) -> MappedFile:
        """The segment holding ``pos`` (the last one when ``pos`` is past the end)."""
        segs = self._files
        k = (pos - segs[0].start) // self.segment_bytes
        return segs[max(0, min(k, len(segs) - 1))]

    def floor(self, pos: int) -> int:
        """``pos``, or the start of the first segment if it lies below."""
        return max(self._files[0].start, pos)

    def zero_data(self, start: int, end: int) -> None:
        """Zero data bytes in ``[start, end)`` and sync them (truncation)."""
        for seg in self._files:
            a = max(start, seg.start)
            b = min(end, seg.end)
            if a < b:
                seg.zero(a - seg.start, b - seg.start)
                seg.sync(a - seg.start, b - seg.start)

    def sync_data(self, start: int, end: int, *, whole_file: bool = False) -> None:
        """Make data bytes ``[start, end)`` durable. The caller holds the store's
        ``_flush_lock`` (or is opening): the list only grows at its end meanwhile.
        ``whole_file`` uses fdatasync, which writes back every dirty page of the file (those
        dirtied through the shared mapping too) and releases the GIL while it waits."""
        for seg in list(self._files):
            a = max(start, seg.start)
            b = min(end, seg.end)
            if a < b:
                if whole_file:
                    os.fdatasync(seg.fd)
                else:
                    seg.sync(a - seg.start, b - seg.start)

    def has_nonzero_header(self, pos: int) -> bool:
        """Whether any byte of an entry header's length at ``pos`` is written."""
        seg = self.segment_at(pos)
        off = pos - seg.start
        n = min(ENTRY_HEADER_SIZE, seg.size_bytes - off)
        return n > 0 and any(seg.mm[off : off + n])

    def zero_torn_tail(self, pos: int) -> None:
        """Zero (and sync) the partial entry at ``pos``: its header, and its body when the
        header's length is plausible."""
        seg = self.segment_at(pos)
        off = pos - seg.start
        end = min(seg.size_bytes, off + ENTRY_HEADER_SIZE)
        with contextlib.suppress(RecordError, Exception):
            (magic, total) = HEADER.unpack_from(seg.mm, off)[:2]
            if magic == ENTRY_MAGIC and ENTRY_HEADER_SIZE <= total <= seg.size_bytes - off:
                end = off + total
        seg.zero(off, end)
        seg.sync(off, end)

    def valid_entry_after(self, scan_stop: int) -> str:
        """Where the first valid entry after ``scan_stop`` lies ("<path> offset <n>"), searched
        byte by byte up to the end of the written data; "" if there is none."""
        for seg in self._files:
            if seg.end <= scan_stop:
                continue
            start_off = scan_stop - seg.start if seg.start <= scan_stop else 0
            end_off = self.search_end(seg, start_off)
            found = codec.find_valid_entry(seg.mm, seg.start, start_off, end_off)
            if found >= 0:
                return f"{seg.path} offset {found}"
        return ""

    def search_end(self, seg: MappedFile, start_off: int) -> int:
        """Where the search for valid entries after the end of the log may stop: the start of
        the first run of zero bytes longer than any entry (a run that long cannot lie inside
        written records, since every entry header has a non-zero magic). Bounds the work on
        open to the written bytes plus one maximum entry, not the whole (1 GiB) segment."""
        chunk = SCAN_CHUNK_BYTES
        limit = self._max_entry_bytes + 2 * chunk
        zeros = bytes(chunk)
        mm = seg.mm
        run = 0
        run_start = start_off
        a = start_off
        while a < seg.size_bytes:
            b = min(a + chunk, seg.size_bytes)
            if mm[a:b] == zeros[: b - a]:
                if run == 0:
                    run_start = a
                run += b - a
                if run >= limit:
                    return run_start
            else:
                run = 0
            a = b
        return seg.size_bytes
