"""The key index: RocketMQ's IndexFile, a hash table on disk from message keys to commitlog
positions (docs/FORMAT.md, "Broker: Key index").

Files live in ``{root}/index/``; each is one mmap'ed file of a header, ``hash_slots`` slots and
``max_records`` linked records::

    header (64 bytes) | slot[0..hash_slots) u32 | record[0..max_records] 20 bytes each

A slot holds the number of the newest record whose key hash falls in it (0: none; record 0 is
never used); a record is ``key hash i32 | position i64 | time diff s i32 | previous record
u32``, ``previous`` chaining the older records of the same slot. A file is full after
``max_records`` records (RocketMQ: 5,000,000 slots, 20,000,000 records, about 420 MB); the next
put starts a new file. Keys are indexed as RocketMQ does: ``topic#key`` for every key of a
message and ``topic#uniqId`` (:meth:`IndexStore.put_message`).

The key hash is ``CRC32C(utf-8 key) & 0x7fffffff`` rather than RocketMQ's ``abs(hashCode())``:
computed in C, and without ``hashCode``'s structured collisions ("Aa" == "BB"). Either way two
keys may share a hash, so a query returns *candidate* positions: the caller checks the keys of
the messages it reads (as RocketMQ's clients do).

Guarantees
----------
- **Ordered.** Positions put are non-decreasing (several keys of one message share a position);
  a lower one raises :class:`PositionOrderError`. Queries return positions newest first
  (descending), deduplicated, across files.
- **Time filter to the second.** A record keeps its store time as whole seconds since the
  file's base (the first record's store time), as RocketMQ does; a record matches
  ``[begin_ms, end_ms]`` when its second overlaps the range.
- **Deterministic.** File names and bytes depend only on what was put: a file is named by the
  store timestamp of its first record (``yyyyMMddHHmmssSSS`` UTC; made later than the previous
  file's name if need be), not by the wall clock. Members that put the same keys have
  byte-identical files after :meth:`IndexStore.flush` or :meth:`IndexStore.close` (the header
  records whether it was flushed since the last put).
- **Crash safety.** The header (with its CRC) is rewritten on :meth:`IndexStore.flush`, after
  the slots and records are synced. After a crash everything put after the last flushed header
  may be lost: on open a file whose header is not marked clean is repaired (slots pointing past
  the header's record count are walked back along their chains, or rebuilt from the records;
  bytes past the count are zeroed) and a file whose header was never written is deleted. All
  keys of one :meth:`IndexStore.put_message` land in one file and are covered by the same
  header, so :meth:`IndexStore.max_position` is the position of the last message whose keys are
  all durable (-1 for none): the broker re-indexes messages after it from the commitlog.
- :meth:`IndexStore.truncate_after_position` drops records at or beyond a position (Raft
  truncation, rebuild), durably.
"""

from __future__ import annotations

import array
import datetime as _dt
import logging
import mmap
import os
import re
import struct
import sys
import threading
from collections.abc import Sequence
from pathlib import Path

import crc32c as _crc32c

from broker.state.errors import (
    CorruptStoreError,
    FormatTooNewError,
    PositionOrderError,
    QueueStoreClosedError,
)
from mqrelease import too_new_message

logger = logging.getLogger(__name__)

INDEX_MAGIC = 0x52495831  # b"RIX1"
INDEX_VERSION = 1
# magic, version, flags, begin_ts, end_ts, begin_position, end_position, base_ts, hash_slots,
# max_records, record_count (next record number; starts at 1), then crc
INDEX_HEADER_NO_CRC = struct.Struct(">IHHqqqqqIII")
INDEX_HEADER_SIZE = 64
INDEX_HEADER_CRC_OFFSET = 60
assert INDEX_HEADER_NO_CRC.size == INDEX_HEADER_CRC_OFFSET
SLOT = struct.Struct(">I")
SLOT_SIZE = 4
INDEX_RECORD = struct.Struct(">iqiI")  # key hash, position, time diff (s), previous record
INDEX_RECORD_SIZE = 20
assert INDEX_RECORD.size == INDEX_RECORD_SIZE

FLAG_CLEAN = 0x1  # slots and records agree with this header (set on flush, cleared on a put)
FLAG_FULL = 0x2  # sealed: the store moved on to a newer file

# RocketMQ's maxHashSlotNum and maxIndexNum.
DEFAULT_HASH_SLOTS = 5_000_000
DEFAULT_MAX_RECORDS = 20_000_000
# Slots and record numbers are u32 and record 0 is reserved.
MAX_RECORDS_LIMIT = (1 << 32) - 2
# File name: creation time yyyyMMddHHmmssSSS (RocketMQ's UtilAll.timeMillisToHumanString).
_FILE_NAME = re.compile(r"[0-9]{17}")
KEY_SEPARATOR = "#"  # RocketMQ's buildKey: topic + "#" + key
_I32_MIN = -(1 << 31)
_I32_MAX = (1 << 31) - 1
_I64_MAX = (1 << 63) - 1
_REPAIR_CHUNK_BYTES = 1 << 20
_BIG_ENDIAN = sys.byteorder == "big"


def key_hash(key: str) -> int:
    """The key hash stored in a record: CRC32C of the UTF-8 key, as a non-negative i32."""
    return int(_crc32c.crc32c(key.encode("utf-8", "surrogatepass"))) & 0x7FFFFFFF


def build_key(topic: str, key: str) -> str:
    """RocketMQ's index key of a message key (or uniq id) in a topic."""
    return f"{topic}{KEY_SEPARATOR}{key}"


def file_name_for(timestamp_ms: int) -> str:
    """``yyyyMMddHHmmssSSS`` of a timestamp, UTC."""
    t = _dt.datetime.fromtimestamp(timestamp_ms // 1000, tz=_dt.UTC)
    return f"{t:%Y%m%d%H%M%S}{timestamp_ms % 1000:03d}"


def timestamp_of_name(name: str) -> int:
    """Inverse of :func:`file_name_for`."""
    t = _dt.datetime.strptime(name[:14], "%Y%m%d%H%M%S").replace(tzinfo=_dt.UTC)
    return int(t.timestamp()) * 1000 + int(name[14:17])


def mark_file_unclean(path: Path) -> None:
    """Clear a closed file's clean flag, so that opening it repairs slots and records against
    its header: a copy made while the file was being written (a snapshot transfer) may hold
    slots and records newer than its header."""
    with path.open("r+b") as f:
        head = f.read(INDEX_HEADER_SIZE)
        if len(head) < INDEX_HEADER_SIZE or head.count(0) == len(head):
            return  # never written: opening deletes it
        fields = list(INDEX_HEADER_NO_CRC.unpack_from(head, 0))
        fields[2] &= ~FLAG_CLEAN
        new = INDEX_HEADER_NO_CRC.pack(*fields)
        f.seek(0)
        f.write(new + struct.pack(">I", _crc32c.crc32c(new)))


def file_size_bytes(hash_slots: int, max_records: int) -> int:
    return INDEX_HEADER_SIZE + hash_slots * SLOT_SIZE + (max_records + 1) * INDEX_RECORD_SIZE


class IndexFile:
    """One index file. Not thread safe: :class:`IndexStore` serializes access."""

    def __init__(
        self,
        path: Path,
        mm: mmap.mmap,
        *,
        hash_slots: int,
        max_records: int,
        flags: int,
        begin_ts: int,
        end_ts: int,
        begin_position: int,
        end_position: int,
        base_ts: int,
        count: int,
    ) -> None:
        self.path = path
        self.mm = mm
        self.hash_slots = hash_slots
        self.max_records = max_records
        self.flags = flags
        self.begin_ts = begin_ts  # store time of the oldest record, to the second (see module)
        self.end_ts = end_ts  # last ms of the second of the newest record
        self.begin_position = begin_position  # -1 when empty
        self.end_position = end_position  # -1 when empty
        self.base_ts = base_ts  # store time of record 1: origin of the time diffs
        self.count = count  # next record number; record numbers start at 1
        self.dirty = False  # changed since the header was last written
        self._records_at = INDEX_HEADER_SIZE + hash_slots * SLOT_SIZE

    # -- creation / opening -------------------------------------------------------------------

    @classmethod
    def create(cls, path: Path, hash_slots: int, max_records: int, base_ts: int) -> IndexFile:
        size = file_size_bytes(hash_slots, max_records)
        fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_EXCL, 0o644)
        try:
            os.ftruncate(fd, size)
            mm = mmap.mmap(fd, size)
        finally:
            os.close(fd)
        f = cls(
            path,
            mm,
            hash_slots=hash_slots,
            max_records=max_records,
            flags=FLAG_CLEAN,
            begin_ts=0,
            end_ts=0,
            begin_position=-1,
            end_position=-1,
            base_ts=base_ts,
            count=1,
        )
        f._write_header()
        mm.flush()
        return f

    @classmethod
    def open(cls, path: Path) -> IndexFile | None:
        """Open and, if it was not closed cleanly, repair a file. None when the file's header
        was never written (created by a crash before its first flush): the caller deletes it."""
        fd = os.open(path, os.O_RDWR)
        try:
            size = os.fstat(fd).st_size
            head = os.pread(fd, INDEX_HEADER_SIZE, 0) if size >= INDEX_HEADER_SIZE else b""
            if head.count(0) == len(head):
                return None
            (
                magic,
                version,
                flags,
                begin_ts,
                end_ts,
                begin_pos,
                end_pos,
                base_ts,
                slots,
                max_records,
                count,
            ) = INDEX_HEADER_NO_CRC.unpack_from(head, 0)
            (crc,) = struct.unpack_from(">I", head, INDEX_HEADER_CRC_OFFSET)
            if magic != INDEX_MAGIC:
                raise CorruptStoreError(f"bad index magic {magic:#010x}", path=str(path), offset=0)
            if crc != _crc32c.crc32c(head[:INDEX_HEADER_CRC_OFFSET]):
                raise CorruptStoreError("index header CRC mismatch", path=str(path), offset=0)
            if version > INDEX_VERSION:  # after the CRC: see _newer_header
                raise FormatTooNewError(too_new_message("key index", path, version, INDEX_VERSION))
            if version != INDEX_VERSION:
                raise CorruptStoreError(f"unknown index version {version}", path=str(path))
            if not (
                slots >= 1
                and 1 <= max_records <= MAX_RECORDS_LIMIT
                and 1 <= count <= max_records + 1
            ):
                raise CorruptStoreError(
                    f"index header out of range: slots={slots} max_records={max_records}"
                    f" count={count}",
                    path=str(path),
                )
            expected = file_size_bytes(slots, max_records)
            if size != expected:
                raise CorruptStoreError(
                    f"index file is {size} bytes, its header says {expected}", path=str(path)
                )
            mm = mmap.mmap(fd, size)
        finally:
            os.close(fd)
        f = cls(
            path,
            mm,
            hash_slots=slots,
            max_records=max_records,
            flags=flags,
            begin_ts=begin_ts,
            end_ts=end_ts,
            begin_position=begin_pos,
            end_position=end_pos,
            base_ts=base_ts,
            count=count,
        )
        if not flags & FLAG_CLEAN:
            f._repair()
        return f

    # -- header -------------------------------------------------------------------------------

    def _write_header(self) -> None:
        head = INDEX_HEADER_NO_CRC.pack(
            INDEX_MAGIC,
            INDEX_VERSION,
            self.flags,
            self.begin_ts,
            self.end_ts,
            self.begin_position,
            self.end_position,
            self.base_ts,
            self.hash_slots,
            self.max_records,
            self.count,
        )
        self.mm[0:INDEX_HEADER_SIZE] = head + struct.pack(">I", _crc32c.crc32c(head))

    def _mark_unclean(self) -> None:
        """Before the first change after a flush: the on-disk header stops promising that slots
        and records agree with it."""
        if self.flags & FLAG_CLEAN:
            self.flags &= ~FLAG_CLEAN
            self._write_header()
            self.mm.flush(0, INDEX_HEADER_SIZE)
        self.dirty = True

    def flush(self) -> None:
        """Sync slots and records, then write and sync the header (marked clean)."""
        if not self.dirty and self.flags & FLAG_CLEAN:
            return
        self.mm.flush()
        self.flags |= FLAG_CLEAN
        self._write_header()
        self.mm.flush(0, INDEX_HEADER_SIZE)
        self.dirty = False

    def close(self) -> None:
        self.flush()
        self.mm.close()

    # -- records ------------------------------------------------------------------------------

    @property
    def records(self) -> int:
        """Number of records held."""
        return self.count - 1

    def has_room(self, n: int) -> bool:
        return not self.flags & FLAG_FULL and self.count - 1 + n <= self.max_records

    def _slot_at(self, key_hash_value: int) -> int:
        return INDEX_HEADER_SIZE + (key_hash_value % self.hash_slots) * SLOT_SIZE

    def _record_at(self, number: int) -> int:
        return self._records_at + number * INDEX_RECORD_SIZE

    def record(self, number: int) -> tuple[int, int, int, int]:
        """``(key hash, position, time diff s, previous)`` of record ``number``."""
        r: tuple[int, int, int, int] = INDEX_RECORD.unpack_from(self.mm, self._record_at(number))
        return r

    def time_diff_fits(self, timestamp_ms: int) -> bool:
        return _I32_MIN <= (timestamp_ms - self.base_ts) // 1000 <= _I32_MAX

    def put(self, hash_value: int, position: int, timestamp_ms: int) -> None:
        """Add one record. The caller checked room, order and :meth:`time_diff_fits`."""
        assert self.count <= self.max_records and 0 <= hash_value <= _I32_MAX
        assert position >= self.end_position
        self._mark_unclean()
        diff_s = (timestamp_ms - self.base_ts) // 1000
        slot_at = self._slot_at(hash_value)
        (previous,) = SLOT.unpack_from(self.mm, slot_at)
        number = self.count
        assert previous < number
        INDEX_RECORD.pack_into(
            self.mm, self._record_at(number), hash_value, position, diff_s, previous
        )
        SLOT.pack_into(self.mm, slot_at, number)
        second_ms = self.base_ts + diff_s * 1000
        if number == 1:
            self.begin_ts, self.end_ts = second_ms, second_ms + 999
            self.begin_position = position
        else:
            self.begin_ts = min(self.begin_ts, second_ms)
            self.end_ts = max(self.end_ts, second_ms + 999)
        self.end_position = position
        self.count = number + 1

    def put_many(self, items: Sequence[tuple[int, int, int]]) -> None:
        """:meth:`put` for ``(hash, position, timestamp_ms)`` items in position order, all of
        which fit (the dispatcher's batch path: one header update, locals in the loop)."""
        if not items:
            return
        assert self.count + len(items) <= self.max_records + 1
        assert items[0][1] >= self.end_position
        self._mark_unclean()
        mm, base_ts, slots = self.mm, self.base_ts, self.hash_slots
        records_at = self._records_at
        slot_unpack, slot_pack, record_pack = (
            SLOT.unpack_from,
            SLOT.pack_into,
            INDEX_RECORD.pack_into,
        )
        number = self.count
        begin_ts, end_ts = self.begin_ts, self.end_ts
        for hash_value, position, timestamp_ms in items:
            diff_s = (timestamp_ms - base_ts) // 1000
            slot_at = INDEX_HEADER_SIZE + (hash_value % slots) * SLOT_SIZE
            (previous,) = slot_unpack(mm, slot_at)
            record_pack(
                mm, records_at + number * INDEX_RECORD_SIZE, hash_value, position, diff_s, previous
            )
            slot_pack(mm, slot_at, number)
            second_ms = base_ts + diff_s * 1000
            if number == 1:
                begin_ts, end_ts = second_ms, second_ms + 999
                self.begin_position = position
            else:
                if second_ms < begin_ts:
                    begin_ts = second_ms
                if second_ms + 999 > end_ts:
                    end_ts = second_ms + 999
            number += 1
        self.begin_ts, self.end_ts = begin_ts, end_ts
        self.end_position = items[-1][1]
        self.count = number

    def query(
        self, hash_value: int, begin_ms: int, end_ms: int, max_results: int, out: list[int]
    ) -> None:
        """Append matching positions to ``out`` (newest first, no repeats of ``out[-1]``)."""
        (number,) = SLOT.unpack_from(self.mm, self._slot_at(hash_value))
        while number and len(out) < max_results:
            if number >= self.count:  # never after open (repair), defensive
                logger.warning("index slot points past count file=%s", self.path.name)
                return
            h, position, diff_s, previous = INDEX_RECORD.unpack_from(
                self.mm, self._record_at(number)
            )
            if h == hash_value:
                second_ms = self.base_ts + diff_s * 1000
                if (
                    second_ms <= end_ms
                    and second_ms + 999 >= begin_ms
                    and (not out or out[-1] != position)
                ):
                    out.append(position)
            if previous >= number:
                raise CorruptStoreError(
                    f"index chain goes forward ({number} -> {previous})",
                    path=str(self.path),
                    offset=self._record_at(number),
                )
            number = previous

    def _first_record_at_or_after(self, position: int) -> int:
        low, high = 1, self.count
        while low < high:
            mid = (low + high) // 2
            if self.record(mid)[1] < position:
                low = mid + 1
            else:
                high = mid
        return low

    def _recompute_times(self) -> None:
        if self.count == 1:
            self.begin_ts = self.end_ts = 0
            self.begin_position = self.end_position = -1
            return
        records = self.mm[self._record_at(1) : self._record_at(self.count)]
        diffs = [r[2] for r in INDEX_RECORD.iter_unpack(records)]
        self.begin_ts = self.base_ts + min(diffs) * 1000
        self.end_ts = self.base_ts + max(diffs) * 1000 + 999
        self.begin_position = self.record(1)[1]
        self.end_position = self.record(self.count - 1)[1]

    def _zero_records_from(self, number: int) -> None:
        """Zero every non-zero byte from record ``number`` to the end of the file."""
        zero = bytes(_REPAIR_CHUNK_BYTES)
        at = self._record_at(number)
        end = len(self.mm)
        while at < end:
            stop = min(end, at + _REPAIR_CHUNK_BYTES)
            if self.mm[at:stop] != zero[: stop - at]:
                self.mm[at:stop] = zero[: stop - at]
            at = stop

    def truncate_after_position(self, position: int) -> None:
        """Drop records whose position is ``>= position`` and flush."""
        cut = self._first_record_at_or_after(position)
        if cut == self.count:
            return
        self._mark_unclean()
        for number in range(self.count - 1, cut - 1, -1):
            slot_at = self._slot_at(self.record(number)[0])
            (head,) = SLOT.unpack_from(self.mm, slot_at)
            while head >= cut:
                previous = self.record(head)[3] if head < self.count else head
                if previous >= head:
                    # A chain that does not go back (a damaged or planted file) would loop
                    # here forever: stop with the place named instead.
                    raise CorruptStoreError(
                        f"index chain does not go back ({head} -> {previous})",
                        path=str(self.path),
                        offset=self._record_at(head),
                    )
                head = previous
            SLOT.pack_into(self.mm, slot_at, head)
        start = self._record_at(cut)
        self.mm[start : self._record_at(self.count)] = bytes(self._record_at(self.count) - start)
        self.count = cut
        self.flags &= ~FLAG_FULL
        self._recompute_times()
        self.flush()

    def _repair(self) -> None:
        """Make slots and records agree with the header after a crash (module docstring)."""
        slots_bytes = self.mm[INDEX_HEADER_SIZE : self._records_at]
        slots = array.array("I", slots_bytes)
        assert slots.itemsize == SLOT_SIZE
        if not _BIG_ENDIAN:
            slots.byteswap()
        count = self.count
        fixed = 0
        rebuild = False
        if slots and max(slots) >= count:
            for s, head in enumerate(slots):
                if head < count:
                    continue
                while head >= count:
                    if head > self.max_records:
                        rebuild = True
                        break
                    h, _position, _diff, previous = self.record(head)
                    if h < 0 or h % self.hash_slots != s or previous >= head:
                        rebuild = True
                        break
                    head = previous
                if rebuild:
                    break
                slots[s] = head
                fixed += 1
        if rebuild:
            slots = array.array("I", bytes(len(slots_bytes)))
            for number in range(1, count):
                slots[self.record(number)[0] % self.hash_slots] = number
        logger.warning(
            "index file not closed cleanly, repaired file=%s records=%d slots_fixed=%d rebuilt=%s",
            self.path.name,
            count - 1,
            fixed,
            rebuild,
        )
        if not _BIG_ENDIAN:
            slots.byteswap()
        self.mm[INDEX_HEADER_SIZE : self._records_at] = slots.tobytes()
        self._zero_records_from(count)
        self.dirty = True
        self.flush()


# The start of a header: magic and version, what :func:`check_formats` reads of each file.
INDEX_VERSION_HEAD = struct.Struct(">IH")


def _newer_header(head: bytes) -> int:
    """The version of a whole header newer than INDEX_VERSION, else 0. Every version of the
    header keeps its CRC32C at INDEX_HEADER_CRC_OFFSET over the bytes before it
    (docs/FORMAT.md, "Format versions"), so a newer release's header checks out, while a
    flipped bit in the version field does not: that is damage, which the open reports
    (CORRUPT_STORE) as it reports any damaged header."""
    if len(head) < INDEX_HEADER_SIZE:
        return 0
    magic, version = INDEX_VERSION_HEAD.unpack_from(head, 0)
    (crc,) = struct.unpack_from(">I", head, INDEX_HEADER_CRC_OFFSET)
    whole = crc == _crc32c.crc32c(head[:INDEX_HEADER_CRC_OFFSET])
    return version if magic == INDEX_MAGIC and version > INDEX_VERSION and whole else 0


def check_formats(directory: Path) -> None:
    """FormatTooNewError when a key index file in ``directory`` has a header version newer
    than INDEX_VERSION (reads only: called before the store opens, which may repair or delete
    files). Anything else wrong is left to :class:`IndexStore`'s open."""
    if not directory.is_dir():
        return
    for path in sorted(directory.iterdir()):
        if not _FILE_NAME.fullmatch(path.name):
            continue
        with path.open("rb") as f:
            version = _newer_header(f.read(INDEX_HEADER_SIZE))
        if version:
            raise FormatTooNewError(too_new_message("key index", path, version, INDEX_VERSION))


class IndexStore:
    """Every index file under ``{root}/index/``. Thread safe."""

    def __init__(
        self,
        root: str | os.PathLike[str],
        *,
        hash_slots: int = DEFAULT_HASH_SLOTS,
        max_records: int = DEFAULT_MAX_RECORDS,
    ) -> None:
        if hash_slots < 1 or not 1 <= max_records <= MAX_RECORDS_LIMIT:
            raise ValueError(f"hash_slots={hash_slots} max_records={max_records} out of range")
        self.directory = Path(root) / "index"
        self.hash_slots = hash_slots
        self.max_records = max_records
        self._lock = threading.RLock()
        self._files: list[IndexFile] = []
        self._closed = False
        self.directory.mkdir(parents=True, exist_ok=True)
        self._load()

    def _load(self) -> None:
        names = sorted(p.name for p in self.directory.iterdir() if _FILE_NAME.fullmatch(p.name))
        for name in names:
            path = self.directory / name
            try:
                timestamp_of_name(name)  # the next file's name is made from the last one's
            except ValueError:
                # Not a file this store made (17 digits but no date): left alone, and its
                # name never reaches the apply path, where a ValueError means a bad record.
                logger.warning("index ignoring a file whose name is not a time file=%s", name)
                continue
            f = IndexFile.open(path)
            if f is None:
                logger.warning("index deleting a file whose header was never written file=%s", name)
                path.unlink()
                continue
            if f.count == 1:
                f.mm.close()
                path.unlink()
                continue
            if self._files and f.begin_position < self._files[-1].end_position:
                raise CorruptStoreError(
                    f"index file starts at position {f.begin_position}, below the end"
                    f" {self._files[-1].end_position} of {self._files[-1].path.name}",
                    path=str(path),
                )
            self._files.append(f)
        logger.info("index opened files=%d max_position=%d", len(self._files), self._max_position())

    def _check_open(self) -> None:
        if self._closed:
            raise QueueStoreClosedError("index store is closed")

    def _max_position(self) -> int:
        return self._files[-1].end_position if self._files else -1

    def max_position(self) -> int:
        """Position of the last message indexed (-1 for none). After a crash, the last message
        whose keys were all flushed: re-index messages at positions above it."""
        with self._lock:
            return self._max_position()

    @property
    def files(self) -> list[Path]:
        with self._lock:
            return [f.path for f in self._files]

    def index_files(self) -> list[IndexFile]:
        """The open files, oldest first (for the derived-state checks, broker.state.derived)."""
        with self._lock:
            self._check_open()
            return list(self._files)

    def _writable(self, n: int, timestamp_ms: int) -> IndexFile:
        if self._files:
            last = self._files[-1]
            if last.has_room(n) and last.time_diff_fits(timestamp_ms):
                return last
            last.flags |= FLAG_FULL
            last.dirty = True
            last.flush()
        name_ms = timestamp_ms
        if self._files:
            name_ms = max(name_ms, timestamp_of_name(self._files[-1].path.name) + 1)
        path = self.directory / file_name_for(name_ms)
        f = IndexFile.create(path, self.hash_slots, self.max_records, timestamp_ms)
        fd = os.open(self.directory, os.O_RDONLY)
        try:
            os.fsync(fd)
        finally:
            os.close(fd)
        logger.info("index new file file=%s", path.name)
        self._files.append(f)
        return f

    def put_keys(self, keys: Sequence[str], position: int, store_timestamp_ms: int) -> None:
        """Index ``keys`` (full index keys, e.g. ``topic#key``) of one message. All land in one
        file. Duplicates are indexed once."""
        if not 0 <= position <= _I64_MAX:
            raise ValueError(f"position {position} is outside [0, 2^63)")
        if not 0 <= store_timestamp_ms <= _I64_MAX:
            raise ValueError(f"store_timestamp_ms {store_timestamp_ms} is outside [0, 2^63)")
        unique = list(dict.fromkeys(keys))
        if not unique:
            return
        if len(unique) > self.max_records:
            raise ValueError(f"{len(unique)} keys do not fit in a file of {self.max_records}")
        with self._lock:
            self._check_open()
            if position < self._max_position():
                raise PositionOrderError(
                    f"index: position {position} is below the last indexed"
                    f" {self._max_position()} (truncate_after_position before replaying)"
                )
            f = self._writable(len(unique), store_timestamp_ms)
            for key in unique:
                f.put(key_hash(key), position, store_timestamp_ms)

    def put(self, key: str, position: int, store_timestamp_ms: int) -> None:
        """Index one full key (e.g. ``build_key(topic, key)``)."""
        self.put_keys((key,), position, store_timestamp_ms)

    def put_message(
        self,
        topic: str,
        keys: Sequence[str],
        uniq_id: str,
        position: int,
        store_timestamp_ms: int,
    ) -> None:
        """Index a message as RocketMQ does: ``topic#uniqId`` and ``topic#key`` per key."""
        full = [build_key(topic, uniq_id)] if uniq_id else []
        full.extend(build_key(topic, k) for k in keys if k)
        self.put_keys(full, position, store_timestamp_ms)

    def put_messages(self, messages: Sequence[tuple[str, Sequence[str], str, int, int]]) -> None:
        """:meth:`put_message` for ``(topic, keys, uniq_id, position, store_timestamp_ms)`` of
        many messages in position order, under one lock (the dispatcher's batch path)."""
        with self._lock:
            self._check_open()
            if self._put_batch_fast(messages):
                return
            last = self._max_position()
            for topic, keys, uniq_id, position, timestamp_ms in messages:
                if not 0 <= position <= _I64_MAX or not 0 <= timestamp_ms <= _I64_MAX:
                    raise ValueError(f"position {position} or time {timestamp_ms} out of range")
                if position < last:
                    raise PositionOrderError(
                        f"index: position {position} is below the last indexed {last}"
                        " (truncate_after_position before replaying)"
                    )
                prefix = topic + KEY_SEPARATOR
                full = [prefix + uniq_id] if uniq_id else []
                full.extend(prefix + k for k in keys if k)
                unique = list(dict.fromkeys(full))
                if not unique:
                    continue
                if len(unique) > self.max_records:
                    raise ValueError(
                        f"{len(unique)} keys do not fit in a file of {self.max_records}"
                    )
                f = self._writable(len(unique), timestamp_ms)
                for key in unique:
                    f.put(key_hash(key), position, timestamp_ms)
                last = position

    def _put_batch_fast(self, messages: Sequence[tuple[str, Sequence[str], str, int, int]]) -> bool:
        """The common case of :meth:`put_messages` in one pass: every key of the batch fits in
        the current file. False (nothing written) when it does not, or an item is unusual."""
        if not self._files or not messages:
            return False
        f = self._files[-1]
        last = f.end_position
        items: list[tuple[int, int, int]] = []
        crc = _crc32c.crc32c
        for topic, keys, uniq_id, position, timestamp_ms in messages:
            if position < last or not 0 <= position <= _I64_MAX or timestamp_ms < 0:
                return False  # the slow path raises the precise error
            prefix = topic + KEY_SEPARATOR
            unique: tuple[str, ...]
            if len(keys) == 1 and keys[0] and keys[0] != uniq_id and uniq_id:
                unique = (prefix + uniq_id, prefix + keys[0])
            else:
                full = [prefix + uniq_id] if uniq_id else []
                full.extend(prefix + k for k in keys if k)
                unique = tuple(dict.fromkeys(full))
            for key in unique:
                h = int(crc(key.encode("utf-8", "surrogatepass"))) & 0x7FFFFFFF
                items.append((h, position, timestamp_ms))
            last = position
        if not items:
            return True
        stamps = [m[4] for m in messages]
        if not (
            f.has_room(len(items))
            and f.time_diff_fits(min(stamps))
            and f.time_diff_fits(max(stamps))
        ):
            return False
        f.put_many(items)
        return True

    def query(
        self, key: str, max_results: int, begin_ms: int = 0, end_ms: int = _I64_MAX
    ) -> list[int]:
        """Positions of messages indexed under ``key`` (a full key) whose store second
        overlaps ``[begin_ms, end_ms]``, newest first, at most ``max_results``. Candidates:
        different keys may share a hash."""
        hash_value = key_hash(key)
        out: list[int] = []
        if max_results <= 0:
            return out
        with self._lock:
            self._check_open()
            for f in reversed(self._files):
                if len(out) >= max_results:
                    break
                if f.count > 1 and f.begin_ts <= end_ms and f.end_ts >= begin_ms:
                    f.query(hash_value, begin_ms, end_ms, max_results, out)
        return out

    def query_key(
        self, topic: str, key: str, max_results: int, begin_ms: int = 0, end_ms: int = _I64_MAX
    ) -> list[int]:
        """:meth:`query` for a message key or uniq id of a topic."""
        return self.query(build_key(topic, key), max_results, begin_ms, end_ms)

    def truncate_after_position(self, position: int) -> None:
        """Drop every record at or beyond ``position``; durable when it returns."""
        with self._lock:
            self._check_open()
            while self._files and self._files[-1].begin_position >= position:
                f = self._files.pop()
                logger.info("index truncate deletes file=%s", f.path.name)
                f.mm.close()
                f.path.unlink()
            if self._files:
                self._files[-1].truncate_after_position(position)

    def delete_files_before(self, commitlog_min_position: int) -> int:
        """Retention: delete files (never the newest) whose records all point below
        ``commitlog_min_position``. Returns how many."""
        with self._lock:
            self._check_open()
            deleted = 0
            while len(self._files) > 1 and self._files[0].end_position < commitlog_min_position:
                f = self._files.pop(0)
                f.mm.close()
                f.path.unlink()
                deleted += 1
            return deleted

    def flush(self) -> None:
        with self._lock:
            self._check_open()
            for f in self._files:
                f.flush()

    def close(self) -> None:
        """Flush and close every file. Idempotent."""
        with self._lock:
            if self._closed:
                return
            for f in self._files:
                f.close()
            self._files.clear()
            self._closed = True
