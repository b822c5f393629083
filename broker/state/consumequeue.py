"""ConsumeQueues: per topic/queue indexes of commitlog positions, RocketMQ's format.

A ConsumeQueue lives in ``{root}/consumequeue/{topic}/{queueId}/`` as a sequence of mmap'ed
files of fixed 20-byte records (docs/FORMAT.md, "Broker: ConsumeQueue")::

    commitlog position u64 | message size u32 | tag hash i64      (big-endian)

Record ``n`` (the message with *queue offset* ``n``) is at byte ``n * 20`` of the queue's byte
space; a file holds ``records_per_file`` records (300,000 like RocketMQ) and is named by the
20-digit zero-padded byte offset of its first record (``00000000000000000000``,
``00000000000006000000``, ...). Files are created full size (zero filled) on first use.

Guarantees
----------
- **Deterministic.** The bytes depend only on the appended records: every member that applies
  the same committed entries gets byte-identical files (retention may delete different numbers
  of whole files on different members; never bytes inside the files).
- **Ordered.** Positions are strictly increasing and records never overlap; :meth:`append`
  refuses a position below the end of the last record (:class:`PositionOrderError`), so a
  replay starts with :meth:`ConsumeQueue.truncate_after_position`.
- **Crash safe.** A record with size 0 is empty. Recovery on open scans the last non-empty
  file and keeps the longest prefix of records that are non-empty and increasing; anything
  after it (a torn half-record, a record whose bytes reached the disk while an earlier one's
  did not) is zeroed. Appends are durable after :meth:`flush`; what was appended after the
  last flush may or may not survive a crash, always as a valid prefix. The broker therefore
  resumes dispatching from :meth:`last_position` (or truncates to its checkpoint first).
- **Never points at garbage** in the sense above; whether the commitlog still holds a position
  is the broker's business (:meth:`delete_files_before` drops files it deleted).

``records_per_file`` must not change for an existing store (the file names encode it).
"""

from __future__ import annotations

import itertools
import logging
import mmap
import os
import re
import shutil
import struct
import threading
from collections.abc import Iterable, Iterator
from pathlib import Path

from broker.state.errors import (
    ConfigError,
    CorruptStoreError,
    OffsetOutOfRangeError,
    PositionOrderError,
    QueueStoreClosedError,
)
from broker.state.names import is_valid_topic_name, validate_topic_name

logger = logging.getLogger(__name__)

CQ_RECORD = struct.Struct(">QIq")  # commitlog position, size, tag hash
CQ_RECORD_SIZE = 20
assert CQ_RECORD.size == CQ_RECORD_SIZE
# RocketMQ's mappedFileSizeConsumeQueue / 20: 6,000,000-byte files, few enough files per queue
# and small enough to map lazily.
DEFAULT_RECORDS_PER_FILE = 300_000
# File names: the start byte offset, zero padded to 20 digits (RocketMQ's offset2FileName).
FILE_NAME_DIGITS = 20
_FILE_NAME = re.compile(r"[0-9]{20}")
_I64_MAX = (1 << 63) - 1
_I64_MIN = -(1 << 63)
# Java int: RocketMQ's ConsumeQueue size field is an int; a message is far smaller anyway.
_MAX_SIZE_BYTES = (1 << 31) - 1
# Bound on find()'s cache of absent queues (a client probing random topics cannot grow it).
MAX_ABSENT_CACHED = 10_000
# Queue ids are Java ints (RocketMQ's queueId); a queue's directory is named by its id.
MAX_QUEUE_ID = (1 << 31) - 1
# Stray directories under consumequeue/ are reported once each, up to this many names (a
# snapshot lists the queues every second: one warning per stray per second would flood).
MAX_STRAYS_REPORTED = 100
_EMPTY_RECORD = bytes(CQ_RECORD_SIZE)


class ConsumeQueueRecords:
    """Records returned by :meth:`ConsumeQueue.read`: a copy of the raw bytes, decoded on
    demand (no per-record object until one is asked for).

    ``records[i]`` and iteration give ``(position, size, tag_hash)`` tuples; queue offset of
    ``records[i]`` is ``start_offset + i``.
    """

    __slots__ = ("raw", "start_offset")

    def __init__(self, start_offset: int, raw: bytes) -> None:
        assert len(raw) % CQ_RECORD_SIZE == 0
        self.start_offset = start_offset
        self.raw = raw

    def __len__(self) -> int:
        return len(self.raw) // CQ_RECORD_SIZE

    def __getitem__(self, i: int) -> tuple[int, int, int]:
        n = len(self)
        if i < 0:
            i += n
        if not 0 <= i < n:
            raise IndexError("record index out of range")
        record: tuple[int, int, int] = CQ_RECORD.unpack_from(self.raw, i * CQ_RECORD_SIZE)
        return record

    def __iter__(self) -> Iterator[tuple[int, int, int]]:
        return CQ_RECORD.iter_unpack(self.raw)

    @property
    def end_offset(self) -> int:
        """The queue offset after the last record (the next offset to pull)."""
        return self.start_offset + len(self)

    def positions(self) -> list[int]:
        return [r[0] for r in CQ_RECORD.iter_unpack(self.raw)]


def file_name(start_byte_offset: int) -> str:
    """RocketMQ's file name for a file whose first byte is at ``start_byte_offset``."""
    assert 0 <= start_byte_offset < 10**FILE_NAME_DIGITS
    return f"{start_byte_offset:020d}"


class ConsumeQueue:
    """One queue's records. Thread safe (one lock per queue)."""

    def __init__(
        self,
        directory: str | os.PathLike[str],
        *,
        records_per_file: int = DEFAULT_RECORDS_PER_FILE,
        name: str = "",
    ) -> None:
        if records_per_file < 1:
            raise ConfigError(f"records_per_file={records_per_file} must be >= 1")
        self.directory = Path(directory)
        self.name = name or str(self.directory)
        self.records_per_file = records_per_file
        self.file_size_bytes = records_per_file * CQ_RECORD_SIZE
        self._lock = threading.RLock()
        self._maps: dict[int, mmap.mmap] = {}  # file number -> map (lazily mapped)
        self._files: list[int] = []  # file numbers present, ascending, contiguous
        self._dirty: set[int] = set()
        self._dir_dirty = False
        self._closed = False
        self._min_offset = 0
        self._max_offset = 0
        self._last_end = 0  # end (position + size) of the last record, 0 when unknown/empty
        self.directory.mkdir(parents=True, exist_ok=True)
        self._recover()

    # -- files ----------------------------------------------------------------------------

    def _path(self, file_no: int) -> Path:
        return self.directory / file_name(file_no * self.file_size_bytes)

    def _map(self, file_no: int) -> mmap.mmap:
        mm = self._maps.get(file_no)
        if mm is not None:
            return mm
        path = self._path(file_no)
        fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o644)
        try:
            size = os.fstat(fd).st_size
            if size > self.file_size_bytes:
                raise CorruptStoreError(
                    f"file is {size} bytes, more than {self.file_size_bytes}"
                    " (records_per_file changed?)",
                    path=str(path),
                )
            if size < self.file_size_bytes:
                if size:
                    logger.warning(
                        "consumequeue file short, extending queue=%s file=%s size=%d",
                        self.name,
                        path.name,
                        size,
                    )
                else:
                    self._dir_dirty = True
                os.ftruncate(fd, self.file_size_bytes)
            mm = mmap.mmap(fd, self.file_size_bytes)
        finally:
            os.close(fd)
        self._maps[file_no] = mm
        return mm

    def _unlink(self, file_no: int) -> None:
        mm = self._maps.pop(file_no, None)
        if mm is not None:
            mm.close()
        self._dirty.discard(file_no)
        self._path(file_no).unlink(missing_ok=True)
        self._dir_dirty = True

    def _scan_file_names(self) -> list[int]:
        numbers: list[int] = []
        for entry in self.directory.iterdir():
            if not _FILE_NAME.fullmatch(entry.name):
                logger.warning("consumequeue ignoring file queue=%s file=%s", self.name, entry.name)
                continue
            start = int(entry.name)
            if start % self.file_size_bytes:
                raise CorruptStoreError(
                    f"file start {start} is not a multiple of {self.file_size_bytes}"
                    " (records_per_file changed?)",
                    path=str(entry),
                )
            numbers.append(start // self.file_size_bytes)
        numbers.sort()
        for before, after in itertools.pairwise(numbers):
            if after != before + 1:
                raise CorruptStoreError(
                    f"files missing between {file_name(before * self.file_size_bytes)} and"
                    f" {file_name(after * self.file_size_bytes)}",
                    path=str(self.directory),
                )
        return numbers

    def _valid_prefix(self, file_no: int, last_end: int) -> tuple[int, int]:
        """Number of valid records at the start of a file, and the end of the last one."""
        mm = self._map(file_no)
        data = mm[:]
        used = len(data.rstrip(b"\0"))
        count = 0
        end = last_end
        limit = -(-used // CQ_RECORD_SIZE) * CQ_RECORD_SIZE
        for position, size, _tag in CQ_RECORD.iter_unpack(data[:limit]):
            if size == 0 or position < end:
                break
            end = position + size
            count += 1
        if used > count * CQ_RECORD_SIZE:
            logger.warning(
                "consumequeue dropping torn or stray bytes queue=%s file=%s offset=%d bytes=%d",
                self.name,
                self._path(file_no).name,
                count * CQ_RECORD_SIZE,
                used - count * CQ_RECORD_SIZE,
            )
            mm[count * CQ_RECORD_SIZE : used] = bytes(used - count * CQ_RECORD_SIZE)
            self._dirty.add(file_no)
        return count, end

    def _recover(self) -> None:
        self._files = self._scan_file_names()
        if not self._files:
            return
        first = self._files[0]
        while True:
            last = self._files[-1]
            previous_end = 0
            if last > first:
                previous_end = self._record_end(last * self.records_per_file - 1)
            count, end = self._valid_prefix(last, previous_end)
            if count or last == first:
                break
            self._unlink(last)  # an empty trailing file; made again on demand
            self._files.pop()
        self._min_offset = first * self.records_per_file
        self._max_offset = last * self.records_per_file + count
        self._last_end = end
        self.flush()
        logger.info(
            "consumequeue recovered queue=%s min_offset=%d max_offset=%d last_position=%d",
            self.name,
            self._min_offset,
            self._max_offset,
            self._last_end,
        )

    # -- record access (lock held) ----------------------------------------------------------

    def _record(self, offset: int) -> tuple[int, int, int]:
        file_no, slot = divmod(offset, self.records_per_file)
        record: tuple[int, int, int] = CQ_RECORD.unpack_from(
            self._map(file_no), slot * CQ_RECORD_SIZE
        )
        return record

    def _record_end(self, offset: int) -> int:
        position, size, _ = self._record(offset)
        return position + size

    def _first_at_or_after(self, position: int, low: int, high: int) -> int:
        """Smallest queue offset in ``[low, high)`` whose position is ``>= position``."""
        while low < high:
            mid = (low + high) // 2
            if self._record(mid)[0] < position:
                low = mid + 1
            else:
                high = mid
        return low

    def _check_open(self) -> None:
        if self._closed:
            raise QueueStoreClosedError(f"consumequeue {self.name} is closed")

    # -- API --------------------------------------------------------------------------------

    @property
    def min_offset(self) -> int:
        """Smallest queue offset still readable."""
        return self._min_offset

    @property
    def max_offset(self) -> int:
        """The queue offset the next append gets (one past the last record)."""
        return self._max_offset

    def last_position(self) -> int:
        """End (position + size) of the last record: where the dispatcher resumes for this
        queue. 0 when the queue holds no record."""
        return self._last_end

    def _append_locked(self, position: int, size: int, tag_hash: int) -> int:
        if not 0 <= position <= _I64_MAX:
            raise ValueError(f"position {position} is outside [0, 2^63)")
        if not 0 < size <= _MAX_SIZE_BYTES:
            raise ValueError(f"size {size} is outside [1, {_MAX_SIZE_BYTES}]")
        if not _I64_MIN <= tag_hash <= _I64_MAX:
            raise ValueError(f"tag hash {tag_hash} does not fit in i64")
        if position < self._last_end:
            raise PositionOrderError(
                f"consumequeue {self.name}: position {position} is below the end of the last"
                f" record {self._last_end} (truncate_after_position before replaying)"
            )
        offset = self._max_offset
        file_no, slot = divmod(offset, self.records_per_file)
        if file_no not in self._maps and (not self._files or self._files[-1] < file_no):
            assert not self._files or self._files[-1] == file_no - 1
            self._files.append(file_no)
        mm = self._map(file_no)
        CQ_RECORD.pack_into(mm, slot * CQ_RECORD_SIZE, position, size, tag_hash)
        self._dirty.add(file_no)
        self._max_offset = offset + 1
        self._last_end = position + size
        return offset

    def append(self, position: int, size: int, tag_hash: int) -> int:
        """Append a record; return its queue offset."""
        with self._lock:
            self._check_open()
            return self._append_locked(position, size, tag_hash)

    def append_many(self, records: Iterable[tuple[int, int, int]]) -> int:
        """Append ``(position, size, tag_hash)`` records in order; return the queue offset of
        the first one (``max_offset`` when there is none). Stops at the first bad record,
        keeping the ones before it."""
        with self._lock:
            self._check_open()
            first = self._max_offset
            if isinstance(records, list) and self._append_fast(records):
                return first
            for position, size, tag_hash in records:
                self._append_locked(position, size, tag_hash)
            return first

    def _append_fast(self, records: list[tuple[int, int, int]]) -> bool:
        """The dispatcher's common case in one write: records in order, in range, all in the
        current file. False (nothing written) otherwise; the per-record path then checks
        each one and raises the precise error."""
        if not records:
            return True
        offset = self._max_offset
        file_no, slot = divmod(offset, self.records_per_file)
        if slot + len(records) > self.records_per_file or file_no not in self._maps:
            return False
        end = self._last_end
        pack = CQ_RECORD.pack
        parts = []
        for position, size, tag_hash in records:
            if (
                position < end
                or not 0 < size <= _MAX_SIZE_BYTES
                or position > _I64_MAX
                or not _I64_MIN <= tag_hash <= _I64_MAX
            ):
                return False
            parts.append(pack(position, size, tag_hash))
            end = position + size
        at = slot * CQ_RECORD_SIZE
        data = b"".join(parts)
        self._maps[file_no][at : at + len(data)] = data
        self._dirty.add(file_no)
        self._max_offset = offset + len(records)
        self._last_end = end
        return True

    def _check_offset(self, queue_offset: int, allow_end: bool) -> None:
        high = self._max_offset if allow_end else self._max_offset - 1
        if not self._min_offset <= queue_offset <= high:
            raise OffsetOutOfRangeError(
                f"consumequeue {self.name}: offset {queue_offset} is outside"
                f" [{self._min_offset}, {self._max_offset})",
                min_offset=self._min_offset,
                max_offset=self._max_offset,
            )

    def offset_of(self, position: int) -> int | None:
        """The queue offset of the record at commitlog ``position`` (binary search: positions
        increase with offsets), or None when no readable record is there."""
        with self._lock:
            self._check_open()
            lo, hi = self._min_offset, self._max_offset
            while lo < hi:
                mid = (lo + hi) // 2
                if self._record(mid)[0] < position:
                    lo = mid + 1
                else:
                    hi = mid
            if lo < self._max_offset and self._record(lo)[0] == position:
                return lo
            return None

    def get(self, queue_offset: int) -> tuple[int, int, int]:
        """The record at ``queue_offset``: ``(position, size, tag_hash)``."""
        with self._lock:
            self._check_open()
            self._check_offset(queue_offset, allow_end=False)
            return self._record(queue_offset)

    def read(self, queue_offset: int, max_count: int) -> ConsumeQueueRecords:
        """Up to ``max_count`` records from ``queue_offset`` on (across files). Empty at
        ``max_offset``; :class:`OffsetOutOfRangeError` below ``min_offset`` or above
        ``max_offset``."""
        if max_count < 0:
            raise ValueError(f"max_count={max_count} is negative")
        with self._lock:
            self._check_open()
            self._check_offset(queue_offset, allow_end=True)
            end = min(self._max_offset, queue_offset + max_count)
            chunks: list[bytes] = []
            at = queue_offset
            while at < end:
                file_no, slot = divmod(at, self.records_per_file)
                n = min(end - at, self.records_per_file - slot)
                mm = self._map(file_no)
                chunks.append(mm[slot * CQ_RECORD_SIZE : (slot + n) * CQ_RECORD_SIZE])
                at += n
            return ConsumeQueueRecords(queue_offset, b"".join(chunks))

    def file_of(self, queue_offset: int) -> str:
        """The name of the file that holds record ``queue_offset`` (for log lines)."""
        return file_name(queue_offset // self.records_per_file * self.file_size_bytes)

    def rewrite(self, queue_offset: int, records: list[tuple[int, int, int]]) -> None:
        """Overwrite the existing records from ``queue_offset`` on with ``records`` (a repair
        from the commitlog, broker.state.derived), durable when this returns. They must lie inside
        ``[min_offset, max_offset)`` and keep positions increasing and records apart from
        their neighbours' (:class:`PositionOrderError` otherwise; nothing is written)."""
        with self._lock:
            self._check_open()
            end = queue_offset + len(records)
            if not records or queue_offset < self._min_offset or end > self._max_offset:
                raise ValueError(
                    f"consumequeue {self.name}: rewrite of [{queue_offset}, {end}) outside"
                    f" [{self._min_offset}, {self._max_offset})"
                )
            low = self._files[0] * self.records_per_file
            previous_end = self._record_end(queue_offset - 1) if queue_offset > low else 0
            for position, size, _tag in records:
                if position < previous_end or not 0 < size <= _MAX_SIZE_BYTES:
                    raise PositionOrderError(
                        f"consumequeue {self.name}: rewrite record ({position}, {size}) after"
                        f" end {previous_end}"
                    )
                previous_end = position + size
            if end < self._max_offset and self._record(end)[0] < previous_end:
                raise PositionOrderError(
                    f"consumequeue {self.name}: rewrite ends at {previous_end}, past the next"
                    " record"
                )
            for i, (position, size, tag_hash) in enumerate(records):
                file_no, slot = divmod(queue_offset + i, self.records_per_file)
                CQ_RECORD.pack_into(
                    self._map(file_no), slot * CQ_RECORD_SIZE, position, size, tag_hash
                )
                self._dirty.add(file_no)
            if end == self._max_offset:
                self._last_end = previous_end
            self._flush_locked()

    def truncate_after_position(self, commitlog_position: int) -> int:
        """Drop every record whose position is ``>= commitlog_position`` (zeroed, durable when
        this returns). Returns the new ``max_offset``."""
        with self._lock:
            self._check_open()
            if not self._files:
                return self._max_offset
            low = self._files[0] * self.records_per_file
            cut = self._first_at_or_after(commitlog_position, low, self._max_offset)
            if cut == self._max_offset:
                return cut
            logger.info(
                "consumequeue truncate queue=%s position=%d max_offset=%d->%d",
                self.name,
                commitlog_position,
                self._max_offset,
                cut,
            )
            cut_file, cut_slot = divmod(cut, self.records_per_file)
            while self._files and self._files[-1] > cut_file:
                self._unlink(self._files.pop())
            if cut_slot == 0 and cut_file != self._files[0]:
                self._unlink(self._files.pop())
            else:
                last_file, last_slot = divmod(self._max_offset - 1, self.records_per_file)
                stop = last_slot + 1 if last_file == cut_file else self.records_per_file
                mm = self._map(cut_file)
                mm[cut_slot * CQ_RECORD_SIZE : stop * CQ_RECORD_SIZE] = bytes(
                    (stop - cut_slot) * CQ_RECORD_SIZE
                )
                self._dirty.add(cut_file)
            self._max_offset = cut
            self._min_offset = min(self._min_offset, cut)
            self._last_end = self._record_end(cut - 1) if cut > low else 0
            self._flush_locked()
            return cut

    def delete_files_before(self, commitlog_min_position: int) -> int:
        """Retention: delete whole files (never the last one) whose records all point below
        ``commitlog_min_position``, then move ``min_offset`` to the first record at or above
        it. Returns the number of files deleted. Call it after open too (``min_offset`` is
        recomputed from the first file)."""
        with self._lock:
            self._check_open()
            deleted = 0
            while len(self._files) > 1:
                file_no = self._files[0]
                last_in_file = (file_no + 1) * self.records_per_file - 1
                if self._record(last_in_file)[0] >= commitlog_min_position:
                    break
                self._unlink(file_no)
                self._files.pop(0)
                deleted += 1
            if self._files:
                low = max(self._min_offset, self._files[0] * self.records_per_file)
                self._min_offset = self._first_at_or_after(
                    commitlog_min_position, low, self._max_offset
                )
            if deleted:
                logger.info(
                    "consumequeue retention queue=%s files_deleted=%d min_offset=%d",
                    self.name,
                    deleted,
                    self._min_offset,
                )
                self._flush_locked()
            return deleted

    def _flush_locked(self) -> None:
        for file_no in sorted(self._dirty):
            self._maps[file_no].flush()
        self._dirty.clear()
        if self._dir_dirty:
            fd = os.open(self.directory, os.O_RDONLY)
            try:
                os.fsync(fd)
            finally:
                os.close(fd)
            self._dir_dirty = False

    def flush(self) -> int:
        """Make every appended record durable; return ``max_offset``."""
        with self._lock:
            self._check_open()
            self._flush_locked()
            return self._max_offset

    def flush_unless_closed(self) -> bool:
        """:meth:`flush` if still open; False if closed (a close flushed it, a destroy deleted
        it: either way nothing of it is left to make durable)."""
        with self._lock:
            if self._closed:
                return False
            self._flush_locked()
            return True

    def close(self) -> None:
        """Flush and unmap. Idempotent."""
        with self._lock:
            if self._closed:
                return
            self._flush_locked()
            for mm in self._maps.values():
                mm.close()
            self._maps.clear()
            self._closed = True

    def destroy(self) -> None:
        """Close and delete every file of this queue (a rebuild starts from nothing)."""
        with self._lock:
            self.close()
            shutil.rmtree(self.directory, ignore_errors=True)


class ConsumeQueueStore:
    """Every ConsumeQueue under ``{root}/consumequeue/``; queues are opened lazily."""

    def __init__(
        self, root: str | os.PathLike[str], *, records_per_file: int = DEFAULT_RECORDS_PER_FILE
    ) -> None:
        self.directory = Path(root) / "consumequeue"
        self.records_per_file = records_per_file
        self._strays_reported: set[str] = set()
        self._queues: dict[tuple[str, int], ConsumeQueue] = {}
        # Queues find() saw absent on disk: asked again and again (the scheduler polls every
        # delay level), answered without a stat. Only queue() creates queues, and clears it.
        self._absent: set[tuple[str, int]] = set()
        self._lock = threading.RLock()
        self._closed = False
        self.directory.mkdir(parents=True, exist_ok=True)
        # Where every queue must stay: the store's own directory, symlinks resolved once (the
        # data directory itself may be a symlink to the real disk).
        self._resolved = self.directory.resolve(strict=True)

    def _check_open(self) -> None:
        if self._closed:
            raise QueueStoreClosedError("consumequeue store is closed")

    def _topic_dir(self, topic: str, queue_id: int | None = None) -> Path:
        """``consumequeue/{topic}`` (or its queue's directory), for a name that passed
        :func:`validate_topic_name` (InvalidTopicError otherwise) and a queue id in range
        (ValueError), and only when the path stays inside the store. A valid name is one plain
        path component, so only a symlink planted on the disk can lead outside: then
        :class:`CorruptStoreError` (code ``PATH_OUTSIDE_STORE``) refuses to create or delete
        anything there. Called when a queue is opened or a topic dropped, not per record."""
        validate_topic_name(topic)
        path = self.directory / topic
        parts = 1
        if queue_id is not None:
            if not 0 <= queue_id <= MAX_QUEUE_ID:
                raise ValueError(f"queue_id {queue_id} is outside [0, 2^31)")
            path = path / str(queue_id)
            parts = 2
        resolved = path.resolve()
        if resolved.parents[parts - 1] != self._resolved:
            raise CorruptStoreError(
                f"PATH_OUTSIDE_STORE {path.relative_to(self.directory)} resolves outside the"
                f" store {self._resolved}"
            )
        assert resolved.is_relative_to(self._resolved), resolved
        return path

    def _report_stray(self, name: str, why: str) -> None:
        if name in self._strays_reported or len(self._strays_reported) >= MAX_STRAYS_REPORTED:
            return
        self._strays_reported.add(name)
        logger.warning("consumequeue ignoring directory dir=%r reason=%s", name[:200], why)

    def _open(self, topic: str, queue_id: int) -> ConsumeQueue:
        cq = ConsumeQueue(
            self._topic_dir(topic, queue_id),
            records_per_file=self.records_per_file,
            name=f"{topic}/{queue_id}",
        )
        self._queues[(topic, queue_id)] = cq
        self._absent.discard((topic, queue_id))
        return cq

    def queue(self, topic: str, queue_id: int) -> ConsumeQueue:
        """The queue, created when absent."""
        with self._lock:
            self._check_open()
            cq = self._queues.get((topic, queue_id))
            if cq is not None:
                return cq
            validate_topic_name(topic)
            if not 0 <= queue_id <= MAX_QUEUE_ID:
                raise ValueError(f"queue_id {queue_id} is outside [0, 2^31)")
            return self._open(topic, queue_id)

    def find(self, topic: str, queue_id: int) -> ConsumeQueue | None:
        """The queue if it exists (open or on disk), else None."""
        with self._lock:
            self._check_open()
            cq = self._queues.get((topic, queue_id))
            if cq is not None:
                return cq
            if (topic, queue_id) in self._absent:
                return None
            if not is_valid_topic_name(topic) or not 0 <= queue_id <= MAX_QUEUE_ID:
                return None  # no such queue can exist; never a path from an unchecked name
            if (self.directory / topic / str(queue_id)).is_dir():
                return self.queue(topic, queue_id)
            if len(self._absent) < MAX_ABSENT_CACHED:
                self._absent.add((topic, queue_id))
            return None

    def queue_ids(self) -> list[tuple[str, int]]:
        """Every (topic, queue_id) held, open or on disk, sorted."""
        with self._lock:
            self._check_open()
            found = set(self._queues)
            for topic_dir in self.directory.iterdir():
                if not is_valid_topic_name(topic_dir.name):
                    self._report_stray(topic_dir.name, "invalid topic name")
                    continue
                if topic_dir.is_symlink() or not topic_dir.is_dir():
                    self._report_stray(topic_dir.name, "not a directory")
                    continue
                for queue_dir in topic_dir.iterdir():
                    name = queue_dir.name
                    if (
                        name.isascii()
                        and name.isdigit()
                        and int(name) <= MAX_QUEUE_ID
                        and str(int(name)) == name
                        and queue_dir.is_dir()
                        and not queue_dir.is_symlink()
                    ):
                        found.add((topic_dir.name, int(name)))
                    else:
                        self._report_stray(f"{topic_dir.name}/{name}", "not a queue directory")
            return sorted(found)

    def _all(self) -> list[ConsumeQueue]:
        queues = []
        for topic, queue_id in self.queue_ids():
            cq = self.find(topic, queue_id)
            if cq is not None:
                queues.append(cq)
        return queues

    def append(self, topic: str, queue_id: int, position: int, size: int, tag_hash: int) -> int:
        """Append to one queue; return the queue offset."""
        return self.queue(topic, queue_id).append(position, size, tag_hash)

    def last_position(self) -> int:
        """The largest :meth:`ConsumeQueue.last_position` over all queues (0 if none).

        After a process crash every appended record survives (page cache), so this is where
        dispatching resumes. After a power loss each queue keeps some prefix of its records,
        not necessarily the same one: truncate every queue to the broker's flushed dispatch
        checkpoint (:meth:`truncate_after_position`) and replay from there instead.
        """
        with self._lock:
            self._check_open()
            return max((cq.last_position() for cq in self._all()), default=0)

    def truncate_after_position(self, commitlog_position: int) -> None:
        """:meth:`ConsumeQueue.truncate_after_position` on every queue."""
        with self._lock:
            self._check_open()
            for cq in self._all():
                cq.truncate_after_position(commitlog_position)

    def drop_topic(self, topic: str) -> int:
        """Close and delete every queue of ``topic`` (topic deletion). Returns how many."""
        with self._lock:
            self._check_open()
            topic_dir = self._topic_dir(topic)  # validated and inside the store, or raises
            dropped = 0
            for name, queue_id in self.queue_ids():
                if name != topic:
                    continue
                cq = self.find(name, queue_id)
                if cq is not None:
                    cq.destroy()
                self._queues.pop((name, queue_id), None)
                dropped += 1
            shutil.rmtree(topic_dir, ignore_errors=True)
            return dropped

    def delete_files_before(self, commitlog_min_position: int) -> int:
        """:meth:`ConsumeQueue.delete_files_before` on every queue; total files deleted."""
        with self._lock:
            self._check_open()
            return sum(cq.delete_files_before(commitlog_min_position) for cq in self._all())

    def flush(self) -> None:
        """Make every record appended to any queue before the call durable.

        The store lock is held only to list the open queues (a queue that is not open has no
        record waiting: its close flushed it); each is then flushed under its own lock alone.
        Reads, appends and opens of other queues go on meanwhile, so a slow disk stalls a user
        of the store for at most one queue's flush, however many queues there are. A queue
        closed meanwhile (its topic dropped, the store closed) is skipped: its close flushed it.
        """
        with self._lock:
            self._check_open()
            queues = list(self._queues.values())
        for cq in queues:
            cq.flush_unless_closed()

    def close(self) -> None:
        """Close every open queue. Idempotent."""
        with self._lock:
            if self._closed:
                return
            for cq in self._queues.values():
                cq.close()
            self._queues.clear()
            self._closed = True
