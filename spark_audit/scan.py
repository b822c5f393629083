"""The work of one task: scan one index range of every replica of a group, check every entry
(header, body CRC, sequence, index record) and compare the replicas index by index.

Pure Python over memory-mapped files and the project's codec (``dledger.storage.codec``); no
Spark here, so the driver's tests and the executors run the same code.
"""

from __future__ import annotations

import logging
from collections import Counter
from collections.abc import Iterator
from dataclasses import dataclass, field
from itertools import combinations

import numpy as np
import numpy.typing as npt
from numpy.lib.stride_tricks import sliding_window_view

from dledger.storage import codec
from dledger.storage.codec import (
    ENTRY_HEADER_SIZE,
    ENTRY_MAGIC,
    FORMAT_VERSION,
    HEADER_CRC_OFFSET,
    INDEX_CRC_OFFSET,
    INDEX_MAGIC,
    INDEX_RECORD_SIZE,
    MAX_ENTRY_BODY_BYTES,
    EntryHeader,
    ItemKind,
    RecordError,
    crc32c,
)
from dledger.storage.files import segment_name
from spark_audit import batch, merkle
from spark_audit.batch import HEADER_DTYPE, INDEX_DTYPE, U64
from spark_audit.errors import AuditError
from spark_audit.fs import MappedView
from spark_audit.model import (
    ORDERED_KEY,
    U64_MASK,
    Finding,
    GroupPlan,
    PartStats,
    ReplicaPlan,
    TaskSpec,
    What,
    entry_digest,
)

log = logging.getLogger(__name__)

# Files a task keeps open at once. Local files are mmaps (cheap); remote ones are read whole
# into memory, so this bounds a task's memory to a few segments.
MAX_OPEN_FILES = 8
# Index records counted past the end of a log before giving up (the count is only reported).
MAX_DANGLING_INDEX_RECORDS = 1 << 20
# An index jump wider than this inside one task is not expanded entry by entry (memory); the
# replica's scan stops there and the rest of the range is reported as missing.
MAX_GAP_FILL_ENTRIES = 1 << 22
# Divergent entries written as rows by one task; the findings still count all of them.
MAX_MISMATCH_ROWS_PER_TASK = 1_000_000
# Findings of one kind per replica and task; beyond it they are merged into the last one.
MAX_FINDINGS_PER_KIND = 1000
# Entries the fast path checks per batch: enough that numpy's per-call cost is spread thin
# (a few hundred calls per batch), small enough that a batch's arrays stay a few MB.
FAST_BATCH_ENTRIES = 16384
# After the fast path flags an entry, the careful reader walks on for a while before the
# fast path is tried again: 1 entry after a batch that went well, doubling (up to this) while
# the fast path keeps taking nothing, so a store whose index is useless costs little extra.
MAX_CAREFUL_RUN_ENTRIES = 4096

_ZERO_RECORD = bytes(INDEX_RECORD_SIZE)


class FileCache:
    """Open files of one task, least recently used closed first."""

    def __init__(self, max_open: int = MAX_OPEN_FILES) -> None:
        self._max_open = max_open
        self._views: dict[str, MappedView] = {}

    def buf(self, uri: str) -> bytes | memoryview:
        view = self._views.pop(uri, None)
        if view is None:
            view = MappedView(uri)
            while len(self._views) >= self._max_open:
                oldest = next(iter(self._views))
                self._views.pop(oldest).close()
        self._views[uri] = view  # most recently used last
        buf = view.buf
        return buf if isinstance(buf, bytes) else memoryview(buf)

    def close(self) -> None:
        for view in self._views.values():
            view.close()
        self._views.clear()


@dataclass(slots=True)
class Span:
    """Indexes ``[first, last]`` (``last == -1``: open-ended) at a place in a file."""

    first: int
    last: int
    file: str
    path: str
    offset: int
    reason: str


class Columns:
    """What a replica holds at consecutive indexes, as numpy columns: term, entry digest,
    held (False: not readable) and absolute data position (-1: none). The careful path adds
    one entry at a time (kept in lists until the next batch), the fast path whole arrays."""

    def __init__(self) -> None:
        self._chunks: list[tuple[U64, U64, npt.NDArray[np.bool_], npt.NDArray[np.int64]]] = []
        self._terms: list[int] = []
        self._digests: list[int] = []
        self._held: list[bool] = []
        self._positions: list[int] = []
        self.length = 0

    def add(self, term: int, digest: int, position: int) -> None:
        self._terms.append(term)
        self._digests.append(digest)
        self._held.append(True)
        self._positions.append(position)
        self.length += 1

    def _flush(self) -> None:
        if self._terms:
            self._chunks.append(
                (
                    np.array(self._terms, dtype=np.uint64),
                    np.array(self._digests, dtype=np.uint64),
                    np.array(self._held, dtype=np.bool_),
                    np.array(self._positions, dtype=np.int64),
                )
            )
            self._terms, self._digests, self._held, self._positions = [], [], [], []

    def extend(self, terms: U64, digests: U64, positions: npt.NDArray[np.int64]) -> None:
        self._flush()
        self._chunks.append((terms, digests, np.ones(len(terms), dtype=np.bool_), positions))
        self.length += len(terms)

    def fill(self, n: int) -> None:
        """``n`` indexes this replica does not hold (readably)."""
        self._flush()
        self._chunks.append(
            (
                np.zeros(n, dtype=np.uint64),
                np.zeros(n, dtype=np.uint64),
                np.zeros(n, dtype=np.bool_),
                np.full(n, -1, dtype=np.int64),
            )
        )
        self.length += n

    def arrays(self) -> tuple[U64, U64, npt.NDArray[np.bool_], npt.NDArray[np.int64]]:
        """(terms, digests, held, positions), joined."""
        self._flush()
        if len(self._chunks) != 1:
            joined = tuple(np.concatenate(c) for c in zip(*self._chunks, strict=True))
            self._chunks = [joined] if self._chunks else []  # type: ignore[list-item]
        if not self._chunks:
            return _EMPTY_U64, _EMPTY_U64, np.zeros(0, dtype=np.bool_), np.zeros(0, np.int64)
        return self._chunks[0]


_EMPTY_U64: U64 = np.zeros(0, dtype=np.uint64)


@dataclass(slots=True)
class ReplicaScan:
    replica: str
    start: int  # index of the first column value
    cols: Columns = field(default_factory=Columns)
    gaps: list[Span] = field(default_factory=list)  # indexes this replica does not hold
    corrupt: list[Span] = field(default_factory=list)  # records that fail a check
    index_bad: list[Span] = field(default_factory=list)  # runs of index records that disagree
    parts: dict[str, PartStats] = field(default_factory=dict)
    end: tuple[int, str, str, int] | None = None  # (last index, file, path, offset)

    def get(self, index: int) -> int | None:
        """``(term << 64) | digest`` of the entry at ``index``; None: not held."""
        terms, digests, held, _ = self.cols.arrays()
        i = index - self.start
        if 0 <= i < len(held) and held[i]:
            return (int(terms[i]) << 64) | int(digests[i])
        return None

    def position(self, index: int) -> int:
        _, _, _, positions = self.cols.arrays()
        return int(positions[index - self.start])

    @property
    def stop(self) -> int:
        """One past the last index covered by the columns."""
        return self.start + self.cols.length


def _prefix(ok: npt.NDArray[np.bool_]) -> int:
    """Length of the leading run of True."""
    if ok.all():
        return len(ok)
    return int(np.argmin(ok))


class _Stop(AuditError):
    """The scan of a replica reached the end of its range."""


class ReplicaScanner:
    """Scans entries ``[lo, hi)`` (``hi == 0``: to the end) of one replica."""

    def __init__(
        self,
        rp: ReplicaPlan,
        lo: int,
        hi: int,
        committed: bool,
        cache: FileCache,
        *,
        fast: bool = True,
    ) -> None:
        self.rp = rp
        self.fast = fast  # False: the careful reader alone (what the fast path is tested against)
        self.hi = hi
        self.committed = committed
        self.cache = cache
        self.e = max(lo, rp.first_index)  # the next index expected
        self.last_term = 0
        self.out = ReplicaScan(rp.replica, self.e)
        # False while the scan stands past the end of a log that ended before this range
        # (that end belongs to the task whose range holds it).
        self.end_is_ours = True
        self._part: PartStats | None = None  # the piece the last entry went to
        # (start byte, end byte, name, uri, buffer) of the index file last used
        self._cur_index: tuple[int, int, str, str, bytes | memoryview] | None = None

    # ------------------------------------------------------------------ index records

    def _index_slot(self, index: int) -> tuple[str, str, bytes | memoryview, int] | None:
        byte = index * INDEX_RECORD_SIZE
        cur = self._cur_index
        if cur is not None and cur[0] <= byte < cur[1]:  # the file of the previous record
            off = byte - cur[0]
            if off + INDEX_RECORD_SIZE > len(cur[4]):
                return None
            return cur[2], cur[3], cur[4], off
        f = self.rp.index_file_for(index)
        if f is None:
            return None
        off = byte - f.start
        buf = self.cache.buf(f.uri)
        self._cur_index = (f.start, f.start + self.rp.index_segment_size_bytes, f.name, f.uri, buf)
        if off + INDEX_RECORD_SIZE > len(buf):
            return None
        return f.name, f.uri, buf, off

    def _index_record(self, index: int) -> codec.IndexRecord | None:
        slot = self._index_slot(index)
        if slot is None:
            return None
        _, _, buf, off = slot
        try:
            return codec.decode_index_record(buf, off)
        except RecordError:
            return None

    def _check_index(self, index: int, size: int, position: int, term: int, typ: int) -> None:
        slot = self._index_slot(index)
        if slot is None:
            byte = index * INDEX_RECORD_SIZE
            start = byte - byte % self.rp.index_segment_size_bytes
            self._index_problem(index, segment_name(start), "", byte - start, "no index file")
            return
        name, uri, buf, off = slot
        try:
            rec = codec.decode_index_record(buf, off)
        except RecordError as exc:
            reason = "no index record" if buf[off : off + 4] == b"\0\0\0\0" else exc.reason
        else:
            # (The record's chain value is the store's to check: it needs the whole prefix.)
            if (rec.size, rec.position, rec.term, rec.type) == (size, position, term, typ):
                return
            reason = (
                f"index record says position={rec.position} size={rec.size} term={rec.term} "
                f"type={rec.type}; the entry is at position={position} size={size} "
                f"term={term} type={typ}"
            )
        self._index_problem(index, name, uri, off, reason)

    def _index_problem(self, index: int, name: str, uri: str, off: int, reason: str) -> None:
        runs = self.out.index_bad
        if runs and runs[-1].last == index - 1 and runs[-1].file == name:
            runs[-1].last = index
            return
        if len(runs) >= MAX_FINDINGS_PER_KIND:
            runs[-1].last = index
            return
        runs.append(Span(index, index, name, uri, off, reason))

    def _check_dangling(self) -> None:
        """Index records past the end of the data (the store would have cleaned them)."""
        first = self.e
        n = 0
        while n < MAX_DANGLING_INDEX_RECORDS:
            slot = self._index_slot(first + n)
            if slot is None or slot[2][slot[3] : slot[3] + INDEX_RECORD_SIZE] == _ZERO_RECORD:
                break
            n += 1
        if n:
            name, uri, _, off = self._index_slot(first)  # type: ignore[misc]
            self.out.index_bad.append(
                Span(
                    first,
                    first + n - 1,
                    name,
                    uri,
                    off,
                    f"{n} index record(s) past the end of the data (last entry {first - 1})",
                )
            )

    # ------------------------------------------------------------------ recording

    def _fill(self, first: int, last: int) -> None:
        """Mark indexes ``[first, last]`` as not readable in ``vals``."""
        n = last - first + 1
        if n > MAX_GAP_FILL_ENTRIES:
            raise _Stop
        self.out.cols.fill(n)

    def _gap(self, first: int, last: int, file: str, path: str, offset: int, reason: str) -> None:
        if self.hi and last >= self.hi:
            last = self.hi - 1
        if last >= first:
            self.out.gaps.append(Span(first, last, file, path, offset, reason))
            self._fill(first, last)

    def _entry(self, h: EntryHeader, seg_name: str, position: int) -> None:
        index = self.e
        term = h.term
        self._check_index(index, h.total_size, position, term, h.type)
        digest = entry_digest(term, h.type, h.body_size, h.body_crc)
        self.out.cols.add(term, digest, position)
        part = self._part
        if part is None or part.file != seg_name:
            part = self.out.parts.get(seg_name)
            if part is None:
                part = PartStats(
                    self.rp.replica,
                    seg_name,
                    first_index=index,
                    min_term=term,
                    max_term=term,
                    committed=self.committed,
                )
                self.out.parts[seg_name] = part
            self._part = part
        part.last_index = index
        part.count += 1
        part.bytes += h.total_size
        if term != self.last_term:
            part.max_term = max(part.max_term, term)
            part.min_term = min(part.min_term, term)
        part.unordered = (part.unordered + digest) & U64_MASK
        part.ordered = crc32c(ORDERED_KEY.pack(index, term, h.type, h.body_size, h.body_crc),
                              part.ordered)  # fmt: skip
        self.e = index + 1
        self.last_term = term
        self.end_is_ours = True

    def _end(self, file: str, path: str, offset: int) -> None:
        if self.end_is_ours:
            self.out.end = (self.e - 1, file, path, offset)
        if self.hi:
            self._gap(
                self.e, self.hi - 1, file, path, offset, f"the log ends at index {self.e - 1}"
            )
        self._check_dangling()

    # ------------------------------------------------------------------ navigation

    def _header_at(self, k: int, off: int, *, verify: bool) -> EntryHeader | None:
        seg = self.rp.segments[k]
        buf = self.cache.buf(seg.uri)
        try:
            if verify:
                return codec.verify_entry(buf, off, expected_position=seg.start + off)
            h = codec.decode_header(buf, off)
        except RecordError:
            return None
        return h if h.position == seg.start + off else None

    def _next_nonempty(self, k: int) -> int:
        """First segment at or after ``k`` that holds any record, or -1 (pre-allocated empty
        segments follow the active one)."""
        segs = self.rp.segments
        for j in range(k, len(segs)):
            buf = self.cache.buf(segs[j].uri)
            if len(buf) >= 4 and buf[0:4] != b"\0\0\0\0":
                return j
        return -1

    def _seek(self, index: int) -> tuple[int, int]:
        """Where to start scanning for ``index``: (segment, offset)."""
        segs = self.rp.segments
        rec = self._index_record(index)
        if rec is not None:
            k = self.rp.segment_at(rec.position)
            if k >= 0:
                off = rec.position - segs[k].start
                h = self._header_at(k, off, verify=False)
                if h is not None and h.index == index:
                    return k, off
        # No record for ``index`` (it is past the end of the log?): the record before it
        # tells where it would start.
        prev = self._index_record(index - 1) if index > self.rp.first_index else None
        if prev is not None:
            k = self.rp.segment_at(prev.position)
            if k >= 0:
                off = prev.position - segs[k].start
                h = self._header_at(k, off, verify=False)
                if h is not None and h.index == index - 1 and h.total_size == prev.size:
                    return k, off + prev.size
        # The index cannot be trusted here: walk from the start of the right segment.
        known = [k for k, s in enumerate(segs) if 0 < s.first_index <= index]
        k = known[-1] if known else 0
        off = 0
        expected = segs[k].first_index or index
        while k < len(segs):
            seg = segs[k]
            buf = self.cache.buf(seg.uri)
            nxt: tuple[int, int] | None = None
            for item in codec.iter_segment(buf, seg.start, start_offset=off, verify_body=False):
                if item.kind is ItemKind.ENTRY:
                    assert item.header is not None
                    if item.header.index >= index:
                        return k, item.offset
                    expected = item.header.index + 1
                    continue
                if item.kind in (ItemKind.BLANK, ItemKind.PADDING):
                    short = len(buf) < self.rp.segment_size_bytes
                    if k + 1 >= len(segs) or (short and self._next_nonempty(k + 1) < 0):
                        self.end_is_ours = expected >= index
                        return k, item.offset
                    nxt = (k + 1, 0)
                elif item.kind is ItemKind.END:
                    j = self._next_nonempty(k + 1)
                    if j < 0 or expected >= index:
                        # the scan meets the end (or a hole) here
                        self.end_is_ours = expected >= index
                        return k, item.offset
                    nxt = (j, 0)
                else:  # a bad record below ``index``: skip to the next valid entry
                    if expected >= index:
                        return k, item.offset
                    found = self._search(k, item.offset + 1, expected)
                    if found is None:
                        self.end_is_ours = False
                        return k, item.offset
                    nxt = (found[0], found[1])
                break
            if nxt is None:
                return k, len(buf)
            k, off = nxt
        return len(segs) - 1, segs[-1].size_bytes if segs else 0

    def _search(self, k: int, off: int, at_least: int) -> tuple[int, int, EntryHeader] | None:
        """The next fully valid entry with index >= ``at_least`` at or after (k, off)."""
        segs = self.rp.segments
        while k < len(segs):
            seg = segs[k]
            buf = self.cache.buf(seg.uri)
            while True:
                found = codec.find_valid_entry(buf, seg.start, off)
                if found < 0:
                    break
                h = codec.decode_header(buf, found)
                if h.index >= at_least:
                    return k, found, h
                off = found + 1
            k += 1
            off = 0
        return None

    def _resync(self, k: int, off: int) -> tuple[int, int, EntryHeader] | None:
        """After a bad record at (k, off) where entry ``self.e`` was expected: the next valid
        entry, through the index record of ``e + 1`` when it is right, else by search."""
        segs = self.rp.segments
        rec = self._index_record(self.e + 1)
        if rec is not None:
            k2 = self.rp.segment_at(rec.position)
            if k2 >= 0:
                off2 = rec.position - segs[k2].start
                if (k2, off2) > (k, off):
                    h = self._header_at(k2, off2, verify=True)
                    if h is not None and h.index == self.e + 1:
                        return k2, off2, h
        return self._search(k, off + 1, self.e)

    def _corrupt(self, k: int, off: int, reason: str) -> tuple[int, int] | None:
        """Record the bad record at (k, off); return where the scan goes on, or None."""
        seg = self.rp.segments[k]
        found = self._resync(k, off)
        first = self.e
        if found is None:
            last = self.hi - 1 if self.hi else -1
            self.out.corrupt.append(
                Span(first, last, seg.name, seg.uri, off, f"{reason}; no valid entry follows")
            )
            if self.hi:
                self._fill(first, last)
            self.out.end = (first - 1, seg.name, seg.uri, off)
            return None
        k2, off2, h = found
        last = h.index - 1
        if self.hi and last >= self.hi:
            last = self.hi - 1
        self.out.corrupt.append(Span(first, last, seg.name, seg.uri, off, reason))
        if last >= first:
            self._fill(first, last)
        self.e = h.index
        if self.hi and self.e >= self.hi:
            return None
        return k2, off2

    # ------------------------------------------------------------------ the fast path

    def _fast(self, k: int, off: int) -> int:
        """Take, a batch at a time, the entries from (k, off) on that pass every check the
        careful reader makes (the index record of each entry tells where it is; the chain
        of positions, the header, the index record and both CRCs are then checked as
        arrays). Stops before the first entry any check flags, at the end of the segment or
        of the range. Returns the offset after the last entry taken (``off``: none)."""
        seg = self.rp.segments[k]
        buf = self.cache.buf(seg.uri)
        while not (self.hi and self.e >= self.hi):
            want = FAST_BATCH_ENTRIES if not self.hi else min(FAST_BATCH_ENTRIES, self.hi - self.e)
            taken, nxt = self._fast_batch(seg.name, seg.start, buf, off, want)
            off = nxt
            if taken < want:
                break
        return off

    def _fast_batch(
        self, seg_name: str, seg_start: int, buf: bytes | memoryview, off: int, want: int
    ) -> tuple[int, int]:
        """One batch of at most ``want`` entries from ``off``; returns (entries, offset)."""
        e = self.e
        f = self.rp.index_file_for(e)
        if f is None or len(buf) < ENTRY_HEADER_SIZE:
            return 0, off
        ibuf = self.cache.buf(f.uri)
        byte = e * INDEX_RECORD_SIZE - f.start
        room = min(len(ibuf), self.rp.index_segment_size_bytes) - byte
        n = min(want, room // INDEX_RECORD_SIZE)
        if n <= 0:
            return 0, off
        recs = np.frombuffer(ibuf, dtype=INDEX_DTYPE, count=n, offset=byte)
        # Where the index says each entry is; the entries must follow one another from off.
        size = recs["size"].astype(np.uint64)
        rel = recs["position"].astype(np.uint64) - np.uint64(seg_start)  # wraps if below
        limit = np.uint64(len(buf))
        ok = (rel + size <= limit) & (size >= ENTRY_HEADER_SIZE) & (rel < limit)
        ok[0] &= bool(rel[0] == off)
        ok[1:] &= rel[1:] == rel[:-1] + size[:-1]
        ok &= (recs["magic"] == INDEX_MAGIC) & (recs["pad0"] == 0) & (recs["pad1"] == 0)
        ok &= (recs["pad2"] == 0) & (recs["pad3"] == 0)
        n = _prefix(ok)
        if n == 0:
            return 0, off
        offs = rel[:n].astype(np.intp)
        raw = np.frombuffer(buf, dtype=np.uint8)
        heads = sliding_window_view(raw, ENTRY_HEADER_SIZE)[offs]  # (n, 48), a copy
        h = heads.view(HEADER_DTYPE).reshape(n)
        recs = recs[:n]
        body_size = h["body_size"].astype(np.uint64)
        ok = (h["magic"] == ENTRY_MAGIC) & (h["version"] == FORMAT_VERSION)
        ok &= h["index"] == np.arange(e, e + n, dtype=np.uint64)
        ok &= h["position"] == recs["position"]
        ok &= (h["total"] == recs["size"]) & (h["total"] == body_size + ENTRY_HEADER_SIZE)
        ok &= body_size <= MAX_ENTRY_BODY_BYTES
        ok &= (h["term"] == recs["term"]) & (h["type"] == recs["type"])
        ok &= h["header_crc"] == batch.crc32c_rows(heads[:, :HEADER_CRC_OFFSET])
        rec_raw = np.frombuffer(ibuf, dtype=np.uint8, count=n * INDEX_RECORD_SIZE, offset=byte)
        rec_raw = rec_raw.reshape(n, INDEX_RECORD_SIZE)
        ok &= recs["crc"] == batch.crc32c_rows(rec_raw[:, :INDEX_CRC_OFFSET])
        n = _prefix(ok)
        if n == 0:
            return 0, off
        body_crc = h["body_crc"][:n].astype(np.uint64)
        hcrc = h["header_crc"][:n].astype(np.uint64)
        n = _prefix(batch.bodies_ok(buf, offs[:n], size[:n], hcrc, body_crc))
        if n == 0:
            return 0, off
        terms = h["term"][:n].astype(np.uint64)
        types = h["type"][:n]
        body_size, body_crc, size = body_size[:n], body_crc[:n], size[:n]
        digests = batch.content_digests(terms, types, body_size, body_crc)
        positions = recs["position"][:n].astype(np.int64)
        self.out.cols.extend(terms, digests, positions)
        part = self._part
        first_term, last_term = int(terms[0]), int(terms[-1])
        if part is None or part.file != seg_name:
            part = self.out.parts.get(seg_name)
            if part is None:
                part = PartStats(
                    self.rp.replica,
                    seg_name,
                    first_index=e,
                    min_term=first_term,
                    max_term=first_term,
                    committed=self.committed,
                )
                self.out.parts[seg_name] = part
            self._part = part
        part.last_index = e + n - 1
        part.count += n
        part.bytes += int(size.sum())
        part.min_term = min(part.min_term, int(terms.min()))
        part.max_term = max(part.max_term, int(terms.max()))
        part.unordered = (part.unordered + int(digests.sum(dtype=np.uint64))) & U64_MASK
        part.ordered = batch.ordered_crc(e, terms, types, body_size, body_crc, part.ordered)
        self.e = e + n
        self.last_term = last_term
        self.end_is_ours = True
        return n, int(offs[n - 1]) + int(size[n - 1])

    # ------------------------------------------------------------------ the scan

    def run(self) -> ReplicaScan:
        segs = self.rp.segments
        if self.hi and self.e >= self.hi:
            return self.out
        if not segs:
            self._gap(
                self.e, self.hi - 1 if self.hi else self.e - 1, "", self.rp.root, 0, "no data"
            )
            return self.out
        try:
            k, off = self._seek(self.e)
            self._scan(k, off)
        except _Stop:
            pass
        return self.out

    def _scan(self, k: int, off: int) -> None:
        segs = self.rp.segments
        hole: tuple[str, str, int] | None = None  # where a run of zeros the log skips began
        careful_run = 1  # entries the careful reader takes before the fast path is tried again
        while k < len(segs):
            seg = segs[k]
            buf = self.cache.buf(seg.uri)
            nxt: tuple[int, int] | None = None
            if self.fast:
                taken_to = self._fast(k, off)
                if taken_to != off:
                    hole = None
                    off = taken_to
                    careful_run = 1
                else:
                    careful_run = min(careful_run * 2, MAX_CAREFUL_RUN_ENTRIES)
                if self.hi and self.e >= self.hi:
                    return
            careful_left = careful_run
            for item in codec.iter_segment(buf, seg.start, start_offset=off):
                if item.kind is ItemKind.ENTRY:
                    h = item.header
                    assert h is not None
                    if h.index != self.e:
                        if h.index > self.e and h.term >= self.last_term:
                            file, path, at = hole or (seg.name, seg.uri, item.offset)
                            self._gap(
                                self.e,
                                h.index - 1,
                                file,
                                path,
                                at,
                                f"the log jumps from index {self.e - 1} to {h.index}",
                            )
                            self.e = h.index
                        else:
                            nxt = self._corrupt(
                                k,
                                item.offset,
                                f"entry index={h.index} term={h.term} does not follow "
                                f"index={self.e - 1} term={self.last_term}",
                            )
                            if nxt is None:
                                return
                            break
                    if self.hi and self.e >= self.hi:
                        return
                    hole = None
                    self._entry(h, seg.name, item.position)
                    if self.hi and self.e >= self.hi:
                        return
                    careful_left -= 1
                    if self.fast and careful_left <= 0:
                        nxt = (k, item.offset + item.size)  # the fast path takes over again
                        break
                    continue
                if item.kind in (ItemKind.BLANK, ItemKind.PADDING):
                    short = len(buf) < self.rp.segment_size_bytes
                    if k + 1 >= len(segs) or (short and self._next_nonempty(k + 1) < 0):
                        # the last file, or a short (cut) one after which nothing holds data
                        self._end(seg.name, seg.uri, len(buf))
                        return
                    if short:
                        hole = hole or (seg.name, seg.uri, len(buf))
                    nxt = (k + 1, 0)
                elif item.kind is ItemKind.END:
                    j = self._next_nonempty(k + 1)
                    if j < 0:
                        self._end(seg.name, seg.uri, item.offset)
                        return
                    hole = hole or (seg.name, seg.uri, item.offset)
                    nxt = (j, 0)
                else:
                    nxt = self._corrupt(k, item.offset, item.reason)
                    if nxt is None:
                        return
                break
            if nxt is None:
                return
            k, off = nxt


# ---------------------------------------------------------------------------------------
# Comparing the replicas of one range
# ---------------------------------------------------------------------------------------


@dataclass(slots=True)
class TaskResult:
    findings: list[Finding] = field(default_factory=list)
    mismatches: list[dict[str, object]] = field(default_factory=list)
    pairs: list[dict[str, object]] = field(default_factory=list)  # first divergence per pair
    parts: list[PartStats] = field(default_factory=list)
    ends: list[tuple[str, int, str, int]] = field(default_factory=list)  # replica, last, file, off
    # (replica, leaf, count, sum): the replica's digest of the leaf's indexes in this range
    leaves: list[tuple[str, int, int, int]] = field(default_factory=list)
    # (replica, "consumequeue" or "key_index", files, records) a derived-state task checked
    derived: list[tuple[str, str, int, int]] = field(default_factory=list)
    scanned_bytes: int = 0


def _locate(rp: ReplicaPlan, position: int) -> tuple[str, int]:
    k = rp.segment_at(position)
    if k < 0:
        return "", -1
    seg = rp.segments[k]
    return seg.name, position - seg.start


def run_task(plan: GroupPlan, task: TaskSpec, *, fast: bool = True) -> TaskResult:
    """Scan ``task``'s range on every replica of ``plan`` and compare them. ``fast=False``:
    the careful per-entry reader alone (the reference the fast path is tested against)."""
    committed = bool(task.hi) and task.hi - 1 <= plan.audited_index
    cache = FileCache()
    try:
        scans = {
            rp.replica: ReplicaScanner(rp, task.lo, task.hi, committed, cache, fast=fast).run()
            for rp in plan.replicas
        }
    finally:
        cache.close()
    result = TaskResult()
    by_name = {rp.replica: rp for rp in plan.replicas}
    for name, scan in scans.items():
        rp = by_name[name]
        _replica_findings(plan, rp, scan, committed, result)
        result.parts.extend(scan.parts.values())
        result.scanned_bytes += sum(p.bytes for p in scan.parts.values())
        if scan.end is not None:
            last, file, _path, off = scan.end
            result.ends.append((name, last, file, off))
        if committed:
            result.leaves.extend(
                (name, *leaf) for leaf in _leaf_sums(scan, task, plan.leaf_entries)
            )
    _compare(plan, task, scans, committed, result)
    return result


def _leaf_sums(scan: ReplicaScan, task: TaskSpec, leaf_entries: int) -> list[tuple[int, int, int]]:
    """The replica's leaf digests over the indexes of ``task`` it scanned (a committed
    range: every index in it is at or below the audited index)."""
    terms, digests, held, _ = scan.cols.arrays()
    lo = max(task.lo, scan.start)
    hi = min(task.hi, scan.stop)
    if hi <= lo:
        return []
    a, b = lo - scan.start, hi - scan.start
    return merkle.leaf_sums(lo, terms[a:b], digests[a:b], held[a:b], leaf_entries)


def _replica_findings(
    plan: GroupPlan, rp: ReplicaPlan, scan: ReplicaScan, committed: bool, out: TaskResult
) -> None:
    g, r = plan.group, rp.replica
    for s in scan.corrupt:
        count = s.last - s.first + 1 if s.last >= 0 else 0
        # A bad record above the audited index is what a crash or a write in progress leaves.
        what = What.CORRUPT_ENTRY if s.first <= plan.audited_index else What.TAIL_CORRUPT
        out.findings.append(Finding(what, g, r, s.file, s.path, s.first, s.last, s.offset,
                                    s.reason, count=max(count, 0)))  # fmt: skip
    for s in scan.index_bad:
        what = What.INDEX_MISMATCH if s.first <= plan.audited_index else What.TAIL_INDEX_MISMATCH
        out.findings.append(
            Finding(what, g, r, s.file, s.path, s.first, s.last, s.offset, s.reason,
                    count=s.last - s.first + 1)
        )  # fmt: skip
    if not committed:
        return
    for s in scan.gaps:
        first, last = s.first, min(s.last, plan.audited_index)
        claimed_last = min(last, rp.commit_index)
        if first <= claimed_last:
            out.findings.append(
                Finding(
                    What.MISSING_ENTRIES, g, r, s.file, s.path, first, claimed_last, s.offset,
                    f"{s.reason}; the replica's commit index is {rp.commit_index}",
                    count=claimed_last - first + 1,
                )
            )  # fmt: skip
        behind_first = max(first, rp.commit_index + 1)
        if behind_first <= last:
            out.findings.append(
                Finding(
                    What.BEHIND, g, r, s.file, s.path, behind_first, last, s.offset,
                    f"not yet replicated here (its commit index is {rp.commit_index})",
                    count=last - behind_first + 1,
                )
            )  # fmt: skip


def _aligned(scan: ReplicaScan, lo: int, hi: int) -> tuple[U64, U64, npt.NDArray[np.bool_]]:
    """(terms, digests, held) of ``scan`` over indexes ``[lo, hi)`` (not held outside it)."""
    terms, digests, held, _ = scan.cols.arrays()
    n = hi - lo
    t = np.zeros(n, dtype=np.uint64)
    d = np.zeros(n, dtype=np.uint64)
    h = np.zeros(n, dtype=np.bool_)
    at = scan.start - lo
    t[at : at + len(terms)] = terms
    d[at : at + len(digests)] = digests
    h[at : at + len(held)] = held
    return t, d, h


def _differing(scans: dict[str, ReplicaScan]) -> list[int]:
    """Indexes where two replicas hold different entries (a replica that holds nothing at
    an index agrees with everyone there), compared as arrays."""
    first = scans[next(iter(scans))]
    t0, d0, h0, _ = first.cols.arrays()
    if all(
        s.start == first.start
        and np.array_equal(s.cols.arrays()[2], h0)
        and np.array_equal(s.cols.arrays()[0], t0)
        and np.array_equal(s.cols.arrays()[1], d0)
        for s in scans.values()
    ):
        return []  # the common case: every replica holds the same entries
    lo = min(s.start for s in scans.values())
    hi = max(s.stop for s in scans.values())
    cols = [_aligned(s, lo, hi) for s in scans.values()]
    differ = np.zeros(hi - lo, dtype=np.bool_)
    for (ta, da, ha), (tb, db, hb) in combinations(cols, 2):
        differ |= ha & hb & ((ta != tb) | (da != db))
    return (np.flatnonzero(differ) + lo).tolist()


def _compare(
    plan: GroupPlan,
    task: TaskSpec,
    scans: dict[str, ReplicaScan],
    committed: bool,
    out: TaskResult,
) -> None:
    names = list(scans)
    if len(names) < 2:
        return
    differing = _differing(scans)
    if not differing:
        return
    by_name = {rp.replica: rp for rp in plan.replicas}
    pair_first: dict[tuple[str, str], int] = {}
    pair_count: Counter[tuple[str, str]] = Counter()
    rep_first: dict[str, tuple[int, str, int, str, int]] = {}  # index, file, off, peer, value
    rep_count: Counter[str] = Counter()
    for index in differing:
        present = {n: v for n in names if (v := scans[n].get(index)) is not None}
        if len(present) < 2:
            continue
        values = Counter(present.values())
        if len(values) == 1:
            continue
        for a, b in combinations(sorted(present), 2):
            if present[a] != present[b]:
                key = (a, b)
                pair_first.setdefault(key, index)
                pair_count[key] += 1
        top, top_n = values.most_common(1)[0]
        majority = top if top_n * 2 > len(present) else None
        peer = next((n for n in sorted(present) if present[n] == majority), "")
        for n, v in sorted(present.items()):
            if majority is not None and v == majority:
                continue
            scan = scans[n]
            file, off = _locate(by_name[n], scan.position(index))
            rep_count[n] += 1
            if n not in rep_first:
                rep_first[n] = (index, file, off, peer, majority if majority is not None else -1)
            if committed and len(out.mismatches) < MAX_MISMATCH_ROWS_PER_TASK:
                ref = majority if majority is not None else 0
                out.mismatches.append(
                    {
                        "index": index,
                        "replica": n,
                        "term": v >> 64,
                        "digest": v & U64_MASK,
                        "peer": peer,
                        "peer_term": ref >> 64 if majority is not None else -1,
                        "peer_digest": ref & U64_MASK if majority is not None else 0,
                        "file": file,
                        "offset": off,
                    }
                )
    what = What.DIVERGENT_ENTRY if committed else What.UNCOMMITTED_TAIL
    for n, (index, file, off, peer, ref) in sorted(rep_first.items()):
        v = scans[n].get(index)
        assert v is not None
        theirs = (
            f"the majority ({peer}...) has term={ref >> 64} digest={ref & U64_MASK:016x}"
            if ref >= 0
            else "no majority agrees on it"
        )
        out.findings.append(
            Finding(
                what, plan.group, n, file, by_name[n].root, index, index, off,
                f"term={v >> 64} digest={v & U64_MASK:016x}; {theirs}",
                peer=peer, count=rep_count[n],
            )
        )  # fmt: skip
    for (a, b), index in sorted(pair_first.items()):
        out.pairs.append(
            {
                "replica": a,
                "peer": b,
                "index": index,
                "count": pair_count[(a, b)],
                "committed": committed,
            }
        )


def iter_rows(plan: GroupPlan, task: TaskSpec, result: TaskResult) -> Iterator[dict[str, object]]:
    """The task's output as flat rows (see ``job.OUTPUT_SCHEMA``)."""
    g = plan.group
    base: dict[str, object] = {"group": g, "task": task.task_id}
    for f in result.findings:
        yield {
            **base,
            "kind": "finding",
            "what": f.what.value,
            "replica": f.replica,
            "peer": f.peer,
            "file": f.file,
            "path": f.path,
            "index": f.index,
            "index_end": f.index_end,
            "offset": f.offset,
            "count": f.count,
            "detail": f.detail,
        }
    for m in result.mismatches:
        yield {**base, "kind": "mismatch", "what": What.DIVERGENT_ENTRY.value, **m}
    for p in result.pairs:
        committed = bool(p.pop("committed"))
        what = What.DIVERGENT_ENTRY if committed else What.UNCOMMITTED_TAIL
        yield {**base, "kind": "pair", "what": what.value, **p}
    for part in result.parts:
        yield {
            **base,
            "kind": "part",
            "what": "committed" if part.committed else "tail",
            "replica": part.replica,
            "file": part.file,
            "index": part.first_index,
            "index_end": part.last_index,
            "count": part.count,
            "bytes": part.bytes,
            "min_term": part.min_term,
            "max_term": part.max_term,
            "unordered": part.unordered,
            "ordered": part.ordered,
        }
    for replica, state, files, records in result.derived:
        yield {
            **base,
            "kind": "derived",
            "what": state,
            "replica": replica,
            "index": files,
            "count": records,
        }
    for replica, leaf, count, total in result.leaves:
        yield {
            **base,
            "kind": "leaf",
            "replica": replica,
            "index": leaf,
            "count": count,
            "digest": total,
        }
    for replica, last, file, off in result.ends:
        yield {
            **base,
            "kind": "end",
            "replica": replica,
            "index": last,
            "file": file,
            "offset": off,
        }
