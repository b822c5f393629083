"""The DLedger log store of one Raft member: mmap'd data segments, an O(1) index, durable
metadata, group-commit flushing and crash recovery. See docs/STORAGE.md and docs/FORMAT.md.

:class:`SegmentedLogStore` is the facade: it holds the log's end and the locks, appends,
reads, flushes and truncates, and delegates to one collaborator per concern, each owning its
state: :class:`~dledger.storage.segments.SegmentSet` (the data segment files),
:class:`~dledger.storage.index.IndexFiles` (the index files),
:class:`~dledger.storage.recovery.Recovery` (the open-time scan and repair decisions),
:class:`~dledger.storage.meta.MetaFiles` (checkpoint and hard-state files),
:class:`~dledger.storage.reserve.SpaceReserve` (the disk-full space reserve) and
:class:`~dledger.storage.admission.RaftReserve` (the Raft reserve's admission check);
:func:`~dledger.storage.append.encode_run` is the append path's encoder.

Locking: ``_lock`` guards all in-memory state and the mappings; it is never held across an
fsync/msync on the append path. ``_flush_lock`` serialises the things that sync or reshape
files (flush, checkpoint, truncate, delete, close); a thread that holds both takes
``_flush_lock`` first. The collaborators have no locks of their own (but the hard-state
file's, in MetaFiles): the store calls them under its own.
"""

from __future__ import annotations

import contextlib
import enum
import fcntl
import logging
import os
import threading
import time
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from datetime import datetime
from pathlib import Path
from types import TracebackType

from dledger import failpoints
from dledger.chain import CHAIN_ORIGIN
from dledger.log import (
    ENTRY_TYPE_MAX,
    ConfigError,
    Entry,
    FeatureLevelError,
    HardState,
    IndexOutOfRangeError,
    LogCompactedError,
    LogStore,
)
from dledger.storage import codec, damage
from dledger.storage.admission import RAFT_RESERVE_BYTES, RaftReserve, files_needed
from dledger.storage.append import Item, encode_run, segments_filled
from dledger.storage.codec import (
    BLANK_MAGIC_BYTES,
    BLANK_SIZE,
    CHECKPOINT_VERSION_V1,
    ENTRY_HEADER_SIZE,
    ENTRY_MAGIC,
    FORMAT_VERSION,
    HEADER,
    HEADER_CRC_OFFSET,
    INDEX_RECORD_SIZE,
    MAX_ENTRY_BODY_BYTES,
    NO_TRUNCATE_PENDING,
    Checkpoint,
    RecordError,
    crc32c,
)
from dledger.storage.errors import (
    DiskFullError,
    StoreClosedError,
    StoreLockedError,
    short_path,
)
from dledger.storage.files import (
    PAGE_SIZE,
    MappedFile,
    SegmentAllocator,
    fsync_dir,
    is_disk_full,
)
from dledger.storage.index import IndexFiles, sync_records
from dledger.storage.meta import CHECKPOINT_FILE, META_FILE, MetaFiles
from dledger.storage.recovery import Recovered, Recovery, checkpoint_is_current, next_link
from dledger.storage.reserve import DEFAULT_RESERVE_BYTES, RESERVE_FILE, SpaceReserve
from dledger.storage.retention import (
    DEFAULT_DELETE_WHEN,
    DEFAULT_FILE_RESERVED_TIME_HOURS,
    DEFAULT_MAX_LAG_RETENTION_HOURS,
    SegmentInfo,
    segments_to_delete,
)
from dledger.storage.segments import SegmentSet, corrupt_error
from prockit.fatal import fatal, guard_thread

__all__ = [  # the store's API, with the names its users import from here
    "CHECKPOINT_FILE",
    "DATA_DIR",
    "INDEX_DIR",
    "META_FILE",
    "RAFT_RESERVE_BYTES",
    "RESERVE_FILE",
    "DiskFullError",
    "FlushDiskType",
    "LogExtent",
    "SegmentedLogStore",
    "StoreClosedError",
    "StoreConfig",
    "StoreLockedError",
    "files_needed",
    "next_link",
]
from mqrelease import BASELINE_LEVEL, FEATURE_LEVEL, RELEASE

log = logging.getLogger(__name__)

# RocketMQ's commitlog file size: few enough files for a large disk, small enough that
# retention frees space in useful steps.
DEFAULT_SEGMENT_SIZE_BYTES = 1 << 30
# Tests use tiny segments to cross boundaries often; below this the blank-record and
# pre-allocation overheads dominate and nothing realistic fits.
MIN_SEGMENT_SIZE_BYTES = 64 * 1024
# 512 Ki index records of 64 bytes per index file, 32 MiB (DLedger has 5M x 32 B index files;
# ours carry the chain too, and are fewer per file so that a young store does not allocate
# hundreds of MiB of index at start).
DEFAULT_INDEX_SEGMENT_SIZE_BYTES = (1 << 19) * INDEX_RECORD_SIZE
# RocketMQ's flushIntervalCommitLog default.
DEFAULT_FLUSH_INTERVAL_MS = 500
# How stale the checkpoint may get: it bounds how much log recovery re-verifies after a
# crash, and costs two fsyncs each time it is written.
DEFAULT_CHECKPOINT_INTERVAL_MS = 1000

# Group-commit syncs allowed to run at once. Overlapping syncs are correct (see _flush_to)
# but on this machine 2 or 4 only split batches (fewer entries per sync) without raising
# throughput (measured with bench/store.py), so one at a time.
MAX_CONCURRENT_SYNCS = 1

# The next data segment is requested when the active one is this full: early enough that
# the background thread has written its zeros before the roll at any realistic append rate,
# late enough that a short-lived or idle store does not pay for a segment it never uses.
PREALLOCATE_AT_FILL = 0.5

# The appender reserves (keeps the warmer out of) this much beyond what it writes, so that it
# takes the warmer's lock about once per this many bytes, not once per entry.
RESERVE_AHEAD_BYTES = 1 << 20

# Repeated disk-full warnings (periodic checkpoints refused) are logged at most this often.
DISK_FULL_WARN_INTERVAL_S = 10.0

DATA_DIR = "commitlog"
INDEX_DIR = "index"
ABORT_FILE = "abort"
LOCK_FILE = "lock"


class FlushDiskType(enum.Enum):
    """RocketMQ's ``flushDiskType``."""

    SYNC_FLUSH = "SYNC_FLUSH"  # callers flush (group commit) before acknowledging
    ASYNC_FLUSH = "ASYNC_FLUSH"  # a background thread flushes every flush_interval_ms


@dataclass(frozen=True, slots=True)
class StoreConfig:
    segment_size_bytes: int = DEFAULT_SEGMENT_SIZE_BYTES
    index_segment_size_bytes: int = DEFAULT_INDEX_SEGMENT_SIZE_BYTES
    flush_disk_type: FlushDiskType = FlushDiskType.SYNC_FLUSH
    flush_interval_ms: int = DEFAULT_FLUSH_INTERVAL_MS
    checkpoint_interval_ms: int = DEFAULT_CHECKPOINT_INTERVAL_MS
    preallocate: bool = True  # create the next data segment in a background thread
    # write zeros into data segments ahead of the appender in the background (files.MappedFile)
    warm_segments: bool = True
    full_verify_on_open: bool = False  # check every entry's CRCs on open, not just the tail
    # bytes set aside for the hard state and checkpoint on a full disk (0: none)
    reserve_bytes: int = DEFAULT_RESERVE_BYTES

    def __post_init__(self) -> None:
        for name in ("segment_size_bytes", "index_segment_size_bytes"):
            value = getattr(self, name)
            if value < MIN_SEGMENT_SIZE_BYTES or value % PAGE_SIZE:
                raise ConfigError(
                    f"{name}={value} must be >= {MIN_SEGMENT_SIZE_BYTES} and a multiple of "
                    f"the page size {PAGE_SIZE}"
                )
        if self.segment_size_bytes >= 1 << 32:
            # Blank records store the remaining length of a segment in a u32.
            raise ConfigError(f"segment_size_bytes={self.segment_size_bytes} must be < 4 GiB")
        if self.index_segment_size_bytes % INDEX_RECORD_SIZE:
            raise ConfigError(f"index_segment_size_bytes must be a multiple of {INDEX_RECORD_SIZE}")
        if self.flush_interval_ms <= 0 or self.checkpoint_interval_ms <= 0:
            raise ConfigError("flush_interval_ms and checkpoint_interval_ms must be > 0")
        if not 0 <= self.reserve_bytes <= 1 << 30:
            raise ConfigError(f"reserve_bytes={self.reserve_bytes} must be in [0, 1 GiB]")

    @property
    def max_body_bytes(self) -> int:
        """Largest body that fits: an entry never straddles two segment files."""
        return min(MAX_ENTRY_BODY_BYTES, self.segment_size_bytes - ENTRY_HEADER_SIZE)


@dataclass(frozen=True, slots=True)
class LogExtent:
    """The stored log up to one index, as :meth:`SegmentedLogStore.snapshot_extent` gives it:
    entries ``base_index + 1`` onwards, data bytes ``[start_position, end_position)`` (whole
    segments of ``segment_size_bytes``, the first starting at ``start_position``)."""

    base_index: int
    base_term: int
    start_position: int
    base_chain: int
    end_position: int
    segment_size_bytes: int


class SegmentedLogStore:
    """A :class:`dledger.log.LogStore` on disk under ``root_dir`` (see docs/STORAGE.md)."""

    def __init__(
        self,
        root_dir: str | os.PathLike[str],
        config: StoreConfig | None = None,
        *,
        before_damage_cut: Callable[[damage.DamageReport], None] | None = None,
        supported_feature_level: int = FEATURE_LEVEL,
    ):
        """``before_damage_cut``: called when the open found damage, before it cuts the log
        (the node raises its promise to the old last index there); an exception it raises
        stops the open with nothing cut. ``supported_feature_level``: the highest group
        feature level this release supports; a checkpoint written at a higher one is
        refused (FeatureLevelError) before anything is changed."""
        self.config = config if config is not None else StoreConfig()
        self._supported_feature_level = supported_feature_level
        self.root = Path(root_dir)
        self._seg_size = self.config.segment_size_bytes
        self._max_body = self.config.max_body_bytes
        self._prealloc_at = int(self._seg_size * PREALLOCATE_AT_FILL)
        self._next_requested = -1  # start of the segment last asked of the allocator
        self._init_sync_state()
        self._init_log_state()
        self._init_counters()
        self._before_damage_cut = before_damage_cut
        self._stop_flusher = threading.Event()
        self._flusher: threading.Thread | None = None
        self._allocator: SegmentAllocator | None = None
        self._disk_full_warned_s = -DISK_FULL_WARN_INTERVAL_S
        self._init_collaborators()
        self._lock_fd = -1
        self._acquire_lock()
        try:
            self._open()
        except BaseException:
            self._release_files()
            self._unlock()
            raise
        self._closed = False
        if self.config.flush_disk_type is FlushDiskType.ASYNC_FLUSH:
            self._flusher = threading.Thread(
                target=guard_thread("store-flusher", self._flush_loop),
                name=f"flusher-{self.root.name}",
                daemon=True,
            )
            self._flusher.start()

    def _init_sync_state(self) -> None:
        """The locks and the group-commit state (see :meth:`_flush_to`)."""
        self._lock = threading.Lock()
        self._flush_lock = threading.Lock()
        self._sync_done = threading.Condition(self._lock)
        self._syncs_in_flight = 0  # group-commit syncs running now
        self._sync_started_index = 0  # highest index a started sync covers
        self._reshaping = False  # truncate/delete/close waiting for syncs to drain
        self._closed = True

    def _init_log_state(self) -> None:
        """The log's ends, what of it is durable, and the server's indices (the checkpoint's
        content). Set from the checkpoint and recovery at open."""
        self._cur_index: MappedFile | None = None  # index file of the last appended record
        self._base_index = 0
        self._base_term = 0
        self._base_chain = CHAIN_ORIGIN  # dledger.chain value at _base_index
        self._last_index = 0
        self._last_term = 0
        self._last_chain = CHAIN_ORIGIN
        self._write_pos = 0
        self._flushed_pos = 0
        self._flushed_index = 0
        self._index_synced = 0  # index records up to here are msync'ed
        self._commit_index = 0
        self._applied_index = 0
        self._last_checkpoint_s = 0.0
        # The group's feature level the checkpoint is written at (dledger.features): from
        # the checkpoint at open, raised by set_feature_level, never lowered.
        self._feature_level = BASELINE_LEVEL

    def _init_counters(self) -> None:
        """What the store reports (metrics, the node)."""
        self.flush_count = 0  # number of data syncs done (group-commit metric)
        self.sync_seconds = 0.0  # time spent in those syncs (how busy the disk path is)
        # Called with each data sync's seconds, under the store's lock (metrics: the node's
        # fsync histogram); must not block.
        self.on_sync: Callable[[float], None] | None = None
        self.recovered_from_crash = False
        # Damage the last open found and cut (docs/STORAGE.md "Damage and repair"), None if
        # none; and what damage this store found since it opened, by where (metrics).
        self.damage: damage.DamageReport | None = None
        self.damage_found: dict[str, int] = {}
        self.damaged_entries_cut = 0
        self.disk_full_count = 0  # writes refused (or checkpoints skipped) for lack of space

    def _init_collaborators(self) -> None:
        """Create the directories and the objects that own the store's files."""
        self.root.mkdir(parents=True, exist_ok=True)
        self._data_dir = self.root / DATA_DIR
        self._index_dir = self.root / INDEX_DIR
        self._data_dir.mkdir(exist_ok=True)
        self._index_dir.mkdir(exist_ok=True)
        self._segments = SegmentSet(
            self._data_dir, self._seg_size, self._max_body + ENTRY_HEADER_SIZE
        )
        self._index = IndexFiles(self._index_dir, self.config.index_segment_size_bytes)
        self._reserve = SpaceReserve(self.root, self.config.reserve_bytes)
        self._meta = MetaFiles(self.root, self._reserve, self._disk_full)
        self._room = RaftReserve(
            self.root, self._segments, self._index, lambda: self._maybe_preallocate(force=True)
        )

    # ------------------------------------------------------------------ open / recovery

    def _acquire_lock(self) -> None:
        fd = os.open(self.root / LOCK_FILE, os.O_RDWR | os.O_CREAT, 0o644)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            os.close(fd)
            raise StoreLockedError(
                f"store {self.root} is locked by another process or open store"
            ) from None
        self._lock_fd = fd

    def _open(self) -> None:
        t0 = time.monotonic()
        ckpt = self._meta.read_checkpoint()
        if ckpt.feature_level > self._supported_feature_level:
            raise FeatureLevelError(
                f"store {self.root}: written at the group's feature level "
                f"{ckpt.feature_level} (checkpoint format {ckpt.version}); raftmq {RELEASE} "
                f"supports up to {self._supported_feature_level}: run the release that raised it"
            )
        self._feature_level = ckpt.feature_level
        abort = self.root / ABORT_FILE
        self.recovered_from_crash = abort.exists()
        abort.touch()
        fsync_dir(self.root)
        self._base_index = ckpt.base_index
        self._base_term = ckpt.base_term
        self._base_chain = ckpt.base_chain
        self._commit_index = ckpt.commit_index
        self._applied_index = ckpt.applied_index
        self._reserve.arm()
        if ckpt.version == CHECKPOINT_VERSION_V1:
            self._drop_old_index(ckpt)
        self._index.open_existing()
        self._segments.open_existing(self._base_index)
        if not len(self._segments):
            self._segments.create_first(ckpt.flushed_position)
        self._recover(ckpt)
        self._allocator = SegmentAllocator(
            self._data_dir,
            self._seg_size,
            enabled=self.config.preallocate,
            warm=self.config.warm_segments,
        )
        active = self._segments.active
        self._allocator.warm(active, self._write_pos - active.start)
        self._maybe_preallocate()
        log.info(
            "store opened root=%s crashed=%s first_index=%d last_index=%d write_pos=%d "
            "segments=%d elapsed_ms=%.1f",
            self.root,
            self.recovered_from_crash,
            self._base_index + 1,
            self._last_index,
            self._write_pos,
            len(self._segments),
            (time.monotonic() - t0) * 1000,
        )

    def _drop_old_index(self, ckpt: Checkpoint) -> None:
        """A store of an older format (its checkpoint says so): its index records have
        another layout and no chains. The index is derived data: delete it; recovery
        rebuilds it from the data segments (a full scan, once)."""
        log.warning(
            "store root=%s has format %d (this release writes %d or later): rebuilding its "
            "index from the data segments%s",
            self.root,
            ckpt.version,
            ckpt.version + 1,
            ""
            if ckpt.base_index == 0
            else f"; the chain below its first index {ckpt.base_index + 1} is unknown (deleted "
            "before chains): matching falls back to terms until a snapshot is installed",
        )
        self._index.delete_all_on_disk()

    def _recover(self, ckpt: Checkpoint) -> None:
        """Run :class:`Recovery` (a full scan when configured or when a damage marker asks
        for one), take the log's end from it, and write the checkpoint if it changed."""
        marker = damage.read_marker(self.root)
        full = self.config.full_verify_on_open or (marker is not None and marker.verify)
        rebuild = ckpt.version == CHECKPOINT_VERSION_V1  # the index was dropped: scan it all
        base = (self._base_index, self._base_term, self._base_chain)
        recovery = Recovery(
            self.root, self._segments, self._index, ckpt, base, self._before_damage_cut
        )
        got = recovery.run(full=full, rebuild=rebuild)
        self._take_recovered(got)
        exists = self._meta.checkpoint_exists()
        if not checkpoint_is_current(ckpt, got, exists=exists, rebuilt=rebuild):
            self._persist_checkpoint()
        if marker is not None and marker.verify:
            damage.verified(self.root, marker)

    def _take_recovered(self, got: Recovered) -> None:
        """The log's end and durable state as recovery left them."""
        self._last_index = got.last_index
        self._last_term = got.last_term
        self._last_chain = got.last_chain
        self._index_synced = got.index_synced
        self._write_pos = got.end_position
        self._flushed_pos = got.end_position
        self._flushed_index = got.last_index
        if got.damage is not None:
            self.damage = got.damage
            self.damage_found["open"] = self.damage_found.get("open", 0) + 1
            self.damaged_entries_cut += got.damage.entries_lost

    # ------------------------------------------------------------------ LogStore: reads

    def _check_open(self) -> None:
        if self._closed:
            raise StoreClosedError(f"store {self.root} is closed")

    def first_index(self) -> int:
        return self._base_index + 1

    def last_index(self) -> int:
        return self._last_index

    def last_term(self) -> int:
        return self._last_term

    def _check_range(self, index: int) -> None:
        if index <= self._base_index:
            raise LogCompactedError(f"index {index} < first index {self._base_index + 1}")
        if index > self._last_index:
            raise IndexOutOfRangeError(f"index {index} > last index {self._last_index}")

    def term_at(self, index: int) -> int:
        with self._lock:
            self._check_open()
            if index == 0:
                return 0
            if index == self._base_index:
                return self._base_term
            self._check_range(index)
            if index == self._last_index:
                return self._last_term
            return self._index.record(index).term

    def chain_at(self, index: int) -> int:
        with self._lock:
            self._check_open()
            if index == 0:
                return CHAIN_ORIGIN
            if index == self._base_index:
                return self._base_chain
            self._check_range(index)
            if index == self._last_index:
                return self._last_chain
            return self._index.record(index).chain

    def _read_locked(self, index: int) -> Entry:
        seg, off, rec = self._check_entry_locked(index)
        body = seg.mm[off + ENTRY_HEADER_SIZE : off + rec.size]
        return Entry(term=rec.term, index=index, body=body, type=rec.type)

    def _check_entry_locked(self, index: int) -> tuple[MappedFile, int, codec.IndexRecord]:
        """Check entry ``index`` (its index record, header and body CRCs, and that they
        agree); its segment, offset there and index record, or CorruptLogError naming it."""
        rec = self._index.record(index)
        seg = self._segments.segment_at(rec.position)
        off = rec.position - seg.start
        mm = seg.mm
        if not seg.start <= rec.position < seg.end or off + rec.size > seg.size_bytes:
            raise corrupt_error(seg, rec.position, "index record points outside", index)
        (magic, total, idx, term, pos, typ, version, _r, body_size, body_crc, hcrc) = (
            HEADER.unpack_from(mm, off)
        )
        if magic != ENTRY_MAGIC or crc32c(mm[off : off + HEADER_CRC_OFFSET]) != hcrc:
            raise corrupt_error(seg, rec.position, "entry header magic or CRC mismatch", index)
        if (idx, term, pos, total, typ) != (index, rec.term, rec.position, rec.size, rec.type):
            raise corrupt_error(seg, rec.position, "entry does not match its index record", index)
        if version != FORMAT_VERSION or total != ENTRY_HEADER_SIZE + body_size:
            raise corrupt_error(seg, rec.position, "entry version or size mismatch", index)
        with memoryview(mm) as mv:
            if crc32c(mv[off + ENTRY_HEADER_SIZE : off + total]) != body_crc:
                raise corrupt_error(seg, rec.position, "entry body CRC mismatch", index)
        return seg, off, rec

    def verify_entries(self, start: int, max_bytes: int) -> tuple[int, int]:
        """Check entries from ``start`` on (as :meth:`read` does, without copying them), about
        ``max_bytes`` of them but at least one: the scrubber's step. Returns the next index to
        check and the bytes checked; ``(last_index() + 1, 0)`` when ``start`` is past the end.
        A compacted ``start`` moves to the first index. CorruptLogError names the entry."""
        with self._lock:
            self._check_open()
            index = max(start, self._base_index + 1)
            done = 0
            while index <= self._last_index and (done == 0 or done < max_bytes):
                done += self._check_entry_locked(index)[2].size
                index += 1
            return index, done

    def verify_until(self, start: int, end_position: int, last: int) -> int:
        """Check the entries from ``start`` to at most ``last`` whose first byte lies below
        data ``end_position``; the next index to check. For a reader of raw log bytes (the
        snapshot sender) that checks each range before it sends it. CorruptLogError names
        the entry."""
        with self._lock:
            self._check_open()
            index = max(start, self._base_index + 1)
            last = min(last, self._last_index)
            while index <= last and self._index.record(index).position < end_position:
                self._check_entry_locked(index)
                index += 1
            return index

    def index_at_position(self, position: int) -> int:
        """The index of the entry whose bytes hold data ``position``; 0 if no stored entry
        does. A binary search over the index records (O(log n) reads)."""
        with self._lock:
            self._check_open()
            lo, hi = self._base_index + 1, self._last_index
            while lo <= hi:
                mid = (lo + hi) // 2
                rec = self._index.record(mid)
                if position < rec.position:
                    hi = mid - 1
                elif position >= rec.position + rec.size:
                    lo = mid + 1
                else:
                    return mid
            return 0

    def body_position(self, index: int) -> int:
        """Absolute data position of the body of entry ``index``.

        Positions are a function of the log prefix and the segment size only, so every replica
        with the same ``segment_size_bytes`` gives the same answer: applications use it as a
        stable address of bytes inside a committed entry (the broker's commitlog position).
        """
        with self._lock:
            self._check_open()
            self._check_range(index)
            return self._index.record(index).position + ENTRY_HEADER_SIZE

    def snapshot_extent(self, index: int) -> LogExtent:
        """Where the log up to ``index`` lies: what a snapshot at ``index`` ships of the log
        (the data segments from the first one up to the end of entry ``index``), so that the
        receiver's log holds the same entries at the same positions."""
        with self._lock:
            self._check_open()
            if not self._base_index <= index <= self._last_index:
                raise IndexOutOfRangeError(
                    f"index {index} outside [{self._base_index}, {self._last_index}]"
                )
            start = self._segments[0].start
            end = start
            if index > self._base_index:
                rec = self._index.record(index)
                end = rec.position + rec.size
            return LogExtent(
                base_index=self._base_index,
                base_term=self._base_term,
                base_chain=self._base_chain,
                start_position=start,
                end_position=end,
                segment_size_bytes=self._seg_size,
            )

    def read_at(self, position: int, size: int) -> bytes:
        """``size`` bytes at absolute data ``position``, which must lie within one segment and
        below the write position. No CRC check here: callers address bytes inside an entry
        body and verify their own checksums (the broker's messages carry one each)."""
        with self._lock:
            self._check_open()
            if size < 0 or position < 0:
                raise IndexOutOfRangeError(f"bad range position={position} size={size}")
            seg = self._segments.segment_at(position)
            if not (seg.start <= position and position + size <= min(seg.end, self._write_pos)):
                raise IndexOutOfRangeError(
                    f"range [{position}, {position + size}) is not stored "
                    f"(segment {seg.start}..{seg.end}, write position {self._write_pos})"
                )
            off = position - seg.start
            return bytes(seg.mm[off : off + size])

    def read(self, index: int) -> Entry:
        with self._lock:
            self._check_open()
            self._check_range(index)
            return self._read_locked(index)

    def read_range(self, start: int, max_bytes: int, max_count: int = 1 << 30) -> list[Entry]:
        with self._lock:
            self._check_open()
            if start == self._last_index + 1:
                return []
            self._check_range(start)
            out: list[Entry] = []
            total = 0
            index = start
            while index <= self._last_index and len(out) < max_count:
                e = self._read_locked(index)
                total += len(e.body)
                if out and total > max_bytes:
                    break
                out.append(e)
                index += 1
            return out

    def read_raw(self, start: int, max_bytes: int) -> tuple[bytes, int]:
        """Encoded entries (headers + bodies, as in the segment file) from ``start`` on, all in
        one segment, about ``max_bytes`` long but at least one entry; and how many there are.

        Every entry's CRCs are checked. Decode with :func:`codec.iter_entries`.
        """
        with self._lock:
            self._check_open()
            if start == self._last_index + 1:
                return b"", 0
            self._check_range(start)
            rec = self._index.record(start)
            seg = self._segments.segment_at(rec.position)
            mm = seg.mm
            off0 = off = rec.position - seg.start
            index = start
            limit = min(seg.size_bytes, self._write_pos - seg.start)
            while index <= self._last_index and off + ENTRY_HEADER_SIZE <= limit:
                if mm[off : off + 4] == BLANK_MAGIC_BYTES:
                    break  # the segment ends here; the next batch starts in the next one
                try:
                    h = codec.verify_entry(mm, off, expected_position=seg.start + off)
                except RecordError as e:
                    raise corrupt_error(seg, seg.start + off, e.reason, index) from None
                if h.index != index:
                    raise corrupt_error(seg, seg.start + off, f"expected index {index}", index)
                if off > off0 and off + h.total_size - off0 > max_bytes:
                    break
                off += h.total_size
                index += 1
            return bytes(mm[off0:off]), index - start

    # ------------------------------------------------------------------ LogStore: writes

    def append(self, entries: Sequence[Entry]) -> int:
        if not entries:
            return self._last_index
        with self._lock:
            self._check_open()
            idx = self._last_index
            term = self._last_term
            max_body = self._max_body
            for e in entries:  # validate the whole batch before writing any of it
                idx += 1
                if e.index != idx:
                    raise ValueError(f"append: entry index {e.index}, expected {idx}")
                if e.term < term:
                    raise ValueError(f"append: term {e.term} < previous term {term}")
                if len(e.body) > max_body:
                    raise ValueError(f"append: body of {len(e.body)} bytes > {max_body}")
                if not 0 <= e.type <= ENTRY_TYPE_MAX:
                    raise ValueError(f"append: type {e.type} out of range")
                term = e.term
            self._append_locked([(e.term, e.type, e.body) for e in entries])
            return self._last_index

    def append_bodies(self, term: int, bodies: Sequence[bytes], type: int = 0) -> int:
        """Batch path for a leader: append ``bodies`` as entries of ``term``, indices assigned
        by the store. Returns the new last index."""
        if not bodies:
            return self._last_index
        with self._lock:
            self._check_open()
            if term < self._last_term:
                raise ValueError(f"append: term {term} < previous term {self._last_term}")
            if not 0 <= type <= ENTRY_TYPE_MAX:
                raise ValueError(f"append: type {type} out of range")
            max_body = self._max_body
            for b in bodies:
                if len(b) > max_body:
                    raise ValueError(f"append: body of {len(b)} bytes > {max_body}")
            self._append_locked([(term, type, b) for b in bodies])
            return self._last_index

    def _append_locked(self, items: list[Item]) -> None:
        """Encode and write ``items`` (term, type, body), validated by the caller.

        The entries that fit in the current data segment and index file are encoded into
        one buffer and written with one ``pwrite``, their index records with another. Writes
        go through the file descriptor, not the mapping (readers still use the mapping: both
        are the same page cache): a store through the mapping takes a page fault per page,
        and one on a page that a sync has cleaned, or on a fallocated block not yet written,
        costs several microseconds (measured: 16 KiB entries appended at ~0.4-0.9 GB/s
        through the mapping, ~10 GB/s with pwrite). The kernel copies a write into the page
        cache in ascending order and a kill stops it only between pages, so a process crash
        leaves a byte prefix of the batch: whole entries, then at most one torn entry before
        zeros, which recovery treats as the end of the log (a torn tail). ``_last_index``
        moves only after the write, so no reader is handed a half-written entry."""
        segs = self._segments
        seg = segs.active
        off = self._write_pos - seg.start
        idx = self._last_index
        n_items = len(items)
        ifile = self._cur_index
        if ifile is None or not ifile.start <= (idx + 1) * INDEX_RECORD_SIZE < ifile.end:
            ifile = self._index.file_of(idx + 1)
        ioff = (idx + 1) * INDEX_RECORD_SIZE - ifile.start
        # Every file the batch needs is allocated before any byte of it is written, so that
        # a full disk refuses the whole batch (DiskFullError) and leaves the log as it was.
        spare: list[MappedFile] = []
        if off + n_items * ENTRY_HEADER_SIZE + sum(len(it[2]) for it in items) > self._seg_size:
            spare = self._take_segments(items, off, seg)
        if ioff + n_items * INDEX_RECORD_SIZE > ifile.size_bytes:
            self._prepare_index_files(idx + 1, idx + n_items)
        seg, off, ifile, idx, term, chain = self._write_runs(items, seg, off, ifile, ioff, spare)
        assert not spare
        assert off <= self._seg_size and seg is segs.active
        assert idx == self._last_index + n_items and term >= self._last_term
        self._cur_index = ifile
        self._write_pos = seg.start + off
        self._last_index = idx
        self._last_term = term
        self._last_chain = chain
        if off >= self._prealloc_at and self._next_requested != seg.end:
            self._maybe_preallocate()

    def _write_runs(
        self,
        items: list[Item],
        seg: MappedFile,
        off: int,
        ifile: MappedFile,
        ioff: int,
        spare: list[MappedFile],
    ) -> tuple[MappedFile, int, MappedFile, int, int, int]:
        """Write ``items`` from offset ``off`` of the active segment ``seg`` and ``ioff`` of
        index file ``ifile`` in runs (:func:`encode_run`), rolling to the ``spare`` segments
        (taken from the list) and to the next index file where one is full. Returns where the
        writing ended (segment, offset, index file) and the last entry's index, term and
        chain. The store's log state is not touched: the caller moves it after the writes."""
        segs = self._segments
        seg_size = self._seg_size
        isize = ifile.size_bytes
        idx, term, chain = self._last_index, self._last_term, self._last_chain
        rolled = False
        i = 0
        n_items = len(items)
        while i < n_items:
            if off + ENTRY_HEADER_SIZE + len(items[i][2]) > seg_size:
                seg = self._roll(seg, off, spare.pop(0))
                rolled = True
                off = 0
            if ioff >= isize:
                ifile = self._index.file_of(idx + 1)  # prepared by the caller
                ioff = 0
            first_before = -1
            if off == 0:
                first_before = segs.active_first()
                segs.set_active_first(idx + 1)
            i0 = i
            i, term, chain, parts, records, end = encode_run(
                items, i, seg.start, off, seg_size, ioff, isize, idx, chain
            )
            if end > seg.reserved:  # keep the warmer out (about once per MiB)
                seg.reserve(end, RESERVE_AHEAD_BYTES)
            try:
                seg.write_parts(off, parts)
                ifile.write(ioff, records)
            except OSError as e:
                # Into allocated blocks this fails only on a file system that allocates on
                # write anyway (copy-on-write) or on a failing disk. Before a roll nothing
                # of the batch counts yet: refuse it. After one, the in-memory state no
                # longer matches a prefix of the batch: end the process (recovery cuts the
                # torn tail on restart).
                if first_before >= 0:
                    segs.set_active_first(first_before)
                if is_disk_full(e) and not rolled:
                    raise self._disk_full("append", e) from None
                fatal("store-append", f"WRITE_FAILED root={short_path(self.root)} error={e}")
            idx += i - i0
            off = end
            ioff += len(records)
        return seg, off, ifile, idx, term, chain

    def _maybe_preallocate(self, *, force: bool = False) -> None:
        """Ask for the next segment once the active one is PREALLOCATE_AT_FILL full (at once
        with ``force``: the Raft reserve reaches into it)."""
        seg = self._segments.active
        full = self._write_pos - seg.start >= self._prealloc_at
        if force or (full and self._next_requested != seg.end):
            assert self._allocator is not None
            self._allocator.request(seg.end)
            self._next_requested = seg.end

    def _take_segments(self, items: list[Item], off: int, seg: MappedFile) -> list[MappedFile]:
        """The segments after ``seg`` that appending ``items`` at offset ``off`` fills, created
        (allocated) now. On a full disk, those made are deleted and DiskFullError raised."""
        seg_size = self._seg_size
        count = segments_filled(items, off, seg_size)
        assert self._allocator is not None
        taken: list[MappedFile] = []
        try:
            for k in range(count):
                taken.append(self._allocator.take(seg.end + k * seg_size))
        except OSError as e:
            for f in taken:
                f.delete()
            if is_disk_full(e):
                raise self._disk_full("new data segment", e) from None
            raise
        return taken

    def _prepare_index_files(self, first: int, last: int) -> None:
        """Create (allocated) the index files that records ``first..last`` fall into."""
        lo = first * INDEX_RECORD_SIZE // self._index.file_bytes
        hi = last * INDEX_RECORD_SIZE // self._index.file_bytes
        for number in range(lo, hi + 1):
            try:
                self._index.file(number, create=True)
            except OSError as e:
                if is_disk_full(e):
                    raise self._disk_full("new index file", e) from None
                raise

    def _disk_full(self, what: str, e: OSError) -> DiskFullError:
        self.disk_full_count += 1
        return DiskFullError(
            f"no space for {what} in store {short_path(self.root)}: {e.strerror or e}"
        )

    def _roll(self, seg: MappedFile, off: int, nxt: MappedFile) -> MappedFile:
        """Close ``seg`` with a blank record (if one fits) and start ``nxt``, the next segment
        (allocated by :meth:`_take_segments`)."""
        remaining = self._seg_size - off
        seg.reserve(self._seg_size)
        if remaining >= BLANK_SIZE:
            seg.mm[off : off + BLANK_SIZE] = codec.encode_blank(
                position=seg.start + off, length=remaining
            )
        self._segments.roll(nxt)
        self._write_pos = nxt.start
        return nxt

    def append_durable(self, entries: Sequence[Entry]) -> int:
        """``append`` then wait until the entries are durable (group commit)."""
        last = self.append(entries)
        self._flush_to(last)
        return last

    # ------------------------------------------------------------------ flushing

    def flush(self) -> int:
        with self._lock:
            self._check_open()
            target = self._last_index
        return self._flush_to(target)

    def _flush_to(self, target: int) -> int:
        """Group commit. A thread whose entries no running sync covers starts one that covers
        everything appended so far; threads that arrive meanwhile wait for it or, when it
        started before their append, start the next one (up to MAX_CONCURRENT_SYNCS run at
        once: an fdatasync that returns covers every byte written before it began, so
        overlapping syncs are safe and keep the disk busy while others gather a batch).
        Appends continue during a sync: ``_lock`` is not held across it and fdatasync
        releases the GIL (``mmap.flush`` would not)."""
        with self._lock:
            while True:
                self._check_open()
                assert self._flushed_index <= self._last_index
                assert self._flushed_pos <= self._write_pos
                goal = min(target, self._last_index)
                if self._flushed_index >= goal:
                    return self._flushed_index
                if (
                    not self._reshaping
                    and self._syncs_in_flight < MAX_CONCURRENT_SYNCS
                    and (self._syncs_in_flight == 0 or self._sync_started_index < goal)
                ):
                    break
                self._sync_done.wait()
            self._syncs_in_flight += 1
            start, end, end_index = self._flushed_pos, self._write_pos, self._last_index
            self._sync_started_index = end_index
            segments = self._segments.overlapping(start, end)
        ok = False
        t0 = time.perf_counter()
        try:
            failpoints.hit("flush")
            for seg in segments:
                try:
                    os.fdatasync(seg.fd)
                except OSError as e:
                    # Never retried ("fsyncgate"): after a failed fdatasync the kernel may
                    # have dropped the dirty pages and marked them clean, so a second call
                    # would succeed over lost data. Restart and recover from what is on disk.
                    fatal("store-flush", f"FSYNC_FAILED path={short_path(seg.path)} error={e}")
            ok = True
        finally:
            elapsed = time.perf_counter() - t0
            with self._lock:
                self.sync_seconds += elapsed
                if self.on_sync is not None:
                    self.on_sync(elapsed)
                self._syncs_in_flight -= 1
                if not ok:
                    self._sync_started_index = self._flushed_index  # let a waiter retry
                if ok and end_index > self._flushed_index:
                    assert end >= self._flushed_pos
                    self._flushed_pos = end
                    self._flushed_index = end_index
                self.flush_count += 1
                self._sync_done.notify_all()
        due = (time.monotonic() - self._last_checkpoint_s) * 1000
        if due >= self.config.checkpoint_interval_ms and self._flush_lock.acquire(blocking=False):
            try:
                if not self._closed:
                    self._persist_checkpoint_or_warn()
            finally:
                self._flush_lock.release()
        return end_index

    @contextlib.contextmanager
    def _exclusive(self) -> Iterator[None]:
        """Hold ``_flush_lock`` with no sync running (to truncate, delete, close)."""
        with self._flush_lock:
            with self._lock:
                self._reshaping = True
                while self._syncs_in_flight:
                    self._sync_done.wait()
            try:
                yield
            finally:
                with self._lock:
                    self._reshaping = False
                    self._sync_started_index = self._flushed_index
                    self._sync_done.notify_all()

    def flushed_index(self) -> int:
        return self._flushed_index

    def _flush_loop(self) -> None:
        """ASYNC_FLUSH's flusher thread (run under guard_thread: any error but a close is
        fatal; a failed fdatasync already is, see _flush_to)."""
        interval_s = self.config.flush_interval_ms / 1000
        while not self._stop_flusher.wait(interval_s):
            try:
                self.flush()
            except StoreClosedError:
                return

    # ------------------------------------------------------------------ checkpoint / meta

    def _persist_checkpoint(self, truncate_pending: int = NO_TRUNCATE_PENDING) -> None:
        """Write the checkpoint durably. Caller holds ``_flush_lock`` (or is opening)."""
        with self._lock:
            self._persist_checkpoint_locked(truncate_pending, io_under_lock=False)

    def _persist_checkpoint_locked(
        self, truncate_pending: int = NO_TRUNCATE_PENDING, *, io_under_lock: bool = True
    ) -> None:
        """Snapshot under ``_lock`` (held by the caller) and write. With ``io_under_lock``
        false the lock is dropped around the file I/O (the flush path)."""
        ckpt = Checkpoint(
            flushed_position=self._flushed_pos,
            flushed_index=self._flushed_index,
            commit_index=self._commit_index,
            applied_index=self._applied_index,
            base_index=self._base_index,
            base_term=self._base_term,
            truncate_pending_position=truncate_pending,
            base_chain=self._base_chain,
            feature_level=self._feature_level,
        )
        lo = max(self._index_synced, self._base_index) + 1
        hi = self._flushed_index
        files = self._index.files()
        if not io_under_lock:
            self._lock.release()
        try:
            # Index records below the checkpoint are not rebuilt by recovery: sync them first.
            sync_records(files, lo, hi)
            self._meta.write_checkpoint(ckpt)
        finally:
            if not io_under_lock:
                self._lock.acquire()
        self._index_synced = max(self._index_synced, hi)
        self._last_checkpoint_s = time.monotonic()

    def _persist_checkpoint_or_warn(self) -> None:
        """A periodic checkpoint: on a full disk (reserve used up too) skip it with a
        rate-limited warning. It only bounds how much recovery re-reads; the next one, once
        space returns, catches up."""
        try:
            self._persist_checkpoint()
        except DiskFullError as e:
            now = time.monotonic()
            if now - self._disk_full_warned_s >= DISK_FULL_WARN_INTERVAL_S:
                self._disk_full_warned_s = now
                log.warning("checkpoint skipped root=%s: DISK_FULL %s", self.root, e)

    def write_checkpoint(self, commit_index: int, applied_index: int) -> None:
        """Record the server's commit and applied indices (durably, with the flushed ones).
        On a full disk the write is skipped (see _persist_checkpoint_or_warn), never raised:
        the caller's loop must go on."""
        with self._flush_lock:
            with self._lock:
                self._check_open()
                self._commit_index = commit_index
                self._applied_index = applied_index
            self._persist_checkpoint_or_warn()
            self._reserve.maybe_rearm()

    @property
    def feature_level(self) -> int:
        """The group's feature level this store's checkpoint is (or next is) written at."""
        return self._feature_level

    def set_feature_level(self, level: int) -> None:
        """The group committed feature level ``level``: from its next checkpoint on, the store
        writes the format that level calls for (format 3 from level 2, dledger.features),
        and the level never goes down again. The caller writes a checkpoint when it wants the
        change on disk now (the node does, at once)."""
        if not BASELINE_LEVEL <= level <= self._supported_feature_level:
            raise FeatureLevelError(
                f"store {self.root}: feature level {level} is outside [{BASELINE_LEVEL}, "
                f"{self._supported_feature_level}] (raftmq {RELEASE})"
            )
        with self._lock:
            self._feature_level = max(self._feature_level, level)

    def read_checkpoint(self) -> Checkpoint:
        """The checkpoint as stored on disk."""
        return self._meta.read_checkpoint()

    def load_hard_state(self) -> HardState:
        return self._meta.load_hard_state()

    def save_hard_state(self, state: HardState) -> None:
        self._meta.save_hard_state(state, self._check_open)

    @property
    def reserve_held(self) -> bool:
        """Whether the space reserve is allocated now (for tests and metrics)."""
        return self._reserve.held

    # ------------------------------------------------------------------ the Raft reserve

    @property
    def log_room_refusals(self) -> int:
        """Application entries refused to keep the Raft reserve."""
        return self._room.refusals

    def reserve_bytes_for(self, headroom_bytes: int = 0) -> tuple[int, int]:
        """(data bytes, index bytes) of room the log keeps after application entries: the
        Raft reserve plus the caller's ``headroom_bytes``, each capped to a share of a file."""
        return self._room.reserve_bytes_for(headroom_bytes)

    def admit_application_entries(
        self,
        batch_bytes: int,
        batch_count: int,
        largest_entry_bytes: int,
        headroom_bytes: int = 0,
    ) -> None:
        """A leader's check before it accepts application entries (docs/STORAGE.md "Disk
        full"): ``batch_bytes`` encoded bytes in ``batch_count`` entries (those accepted but not
        appended yet, and the new ones), the largest ``largest_entry_bytes``. Raises
        :class:`DiskFullError` unless, after them, the log keeps the Raft reserve (and
        ``headroom_bytes``) in files that are allocated, or certain to be: the next data
        segment and index file are allocated here when the file system is short of space."""
        assert batch_bytes >= 0 and batch_count >= 0 and largest_entry_bytes >= 0
        with self._lock:
            self._check_open()
            assert self._allocator is not None
            self._room.admit(
                self._allocator,
                (self._write_pos, self._last_index),
                (batch_bytes, batch_count, largest_entry_bytes),
                headroom_bytes,
            )

    def next_allocation_bytes(self) -> int:
        """Bytes the log must still allocate before it can grow past its active files: the
        next data segment unless it is allocated already, and the next index file unless it
        exists (the disk watermark counts them: docs/STORAGE.md "Disk full")."""
        with self._lock:
            if self._closed or self._allocator is None:
                return 0
            return self._room.next_allocation_bytes(self._allocator, self._last_index)

    # ------------------------------------------------------------------ truncation / deletion

    def truncate_suffix(self, index: int) -> None:
        with self._exclusive(), self._lock:
            self._check_open()
            if index > self._last_index:
                if index == self._last_index + 1:
                    return
                raise IndexOutOfRangeError(f"truncate at {index} > last index + 1")
            if index <= self._base_index:
                raise LogCompactedError(f"truncate at {index} <= deleted index {self._base_index}")
            rec = self._index.record(index)
            new_pos = rec.position
            old_pos = self._write_pos
            old_last = self._last_index
            new_term, new_chain = self._base_term, self._base_chain
            if index - 1 > self._base_index:
                rec = self._index.record(index - 1)
                new_term, new_chain = rec.term, rec.chain
            self._flushed_pos = min(self._flushed_pos, new_pos)
            self._flushed_index = min(self._flushed_index, index - 1)
            self._index_synced = min(self._index_synced, index - 1)
            # 1. Durable intent: recovery finishes the job if we crash from here on.
            self._persist_checkpoint_locked(truncate_pending=new_pos)
            # 2. Zero the data and drop segments after the one holding new_pos.
            self._segments.zero_data(new_pos, old_pos)
            self._segments.keep_through(new_pos)
            assert self._allocator is not None
            self._allocator.discard_from(self._segments.active.end + 1)
            self._next_requested = -1
            self._maybe_preallocate()
            fsync_dir(self._data_dir)
            # 3. Index records.
            self._index.clean_after(index - 1)
            fsync_dir(self._index_dir)
            assert new_pos <= old_pos and self._flushed_pos <= new_pos
            assert self._segments.active.start <= new_pos <= self._segments.active.end
            self._cur_index = None
            self._write_pos = new_pos
            self._last_index = index - 1
            self._last_term = new_term
            self._last_chain = new_chain
            # 4. Done: clear the intent.
            self._persist_checkpoint_locked()
            log.info(
                "truncated suffix root=%s from_index=%d old_last=%d position=%d old_position=%d",
                self.root,
                index,
                old_last,
                new_pos,
                old_pos,
            )

    def segment_infos(self) -> list[SegmentInfo]:
        """One :class:`SegmentInfo` per data segment, oldest first."""
        with self._lock:
            self._check_open()
            lasts = self._segments.last_indices(self._last_index)
            firsts = self._segments.first_indices
            return [
                SegmentInfo(
                    path=str(s.path),
                    start_position=s.start,
                    first_index=firsts[k],
                    last_index=lasts[k],
                    mtime_s=os.stat(s.path).st_mtime,
                )
                for k, s in enumerate(self._segments)
            ]

    def delete_prefix(self, index: int) -> int:
        """Delete the leading segments whose entries are all ``<= index`` (never the last
        segment). Flushes first. Returns the new :meth:`first_index`."""
        self.flush()
        with self._exclusive(), self._lock:
            self._check_open()
            lasts = self._segments.last_indices(self._last_index)
            n = 0
            while n < len(self._segments) - 1 and 0 < lasts[n] <= min(index, self._last_index):
                n += 1
            if n == 0:
                return self._base_index + 1
            new_base = lasts[n - 1]
            new_base_term, new_base_chain = self._last_term, self._last_chain
            if new_base != self._last_index:
                rec = self._index.record(new_base)
                new_base_term, new_base_chain = rec.term, rec.chain
            old = self._base_index, self._base_term, self._base_chain
            self._base_index = new_base
            self._base_term = new_base_term
            self._base_chain = new_base_chain
            # Durable first: a crash after this point finishes the deletion on open.
            try:
                self._persist_checkpoint_locked()
            except DiskFullError:
                # Nothing deleted: the store stays as it was (retention tries again later).
                self._base_index, self._base_term, self._base_chain = old
                raise
            self._segments.drop_first(n)
            fsync_dir(self._data_dir)
            self._cur_index = None
            self._index.clean_before(new_base + 1)
            fsync_dir(self._index_dir)
            log.info(
                "deleted prefix root=%s segments=%d old_first=%d new_first=%d",
                self.root,
                n,
                old[0] + 1,
                new_base + 1,
            )
            return new_base + 1

    def apply_retention(
        self,
        *,
        now: datetime,
        applied_index: int,
        file_reserved_time_hours: int = DEFAULT_FILE_RESERVED_TIME_HOURS,
        delete_when: str = DEFAULT_DELETE_WHEN,
        held_index: int | None = None,
        max_lag_hours: int = DEFAULT_MAX_LAG_RETENTION_HOURS,
        early: bool = False,
    ) -> int:
        """Apply :func:`segments_to_delete`; return how many segments were deleted."""
        doomed = segments_to_delete(
            self.segment_infos(),
            now=now,
            applied_index=applied_index,
            file_reserved_time_hours=file_reserved_time_hours,
            delete_when=delete_when,
            held_index=held_index,
            max_lag_hours=max_lag_hours,
            early=early,
        )
        if not doomed:
            return 0
        before = len(self._segments)
        self.delete_prefix(doomed[-1].last_index)
        return before - len(self._segments)

    def verify(self) -> int:
        """Check every entry's CRCs and links; return how many were checked."""
        with self._lock:
            self._check_open()
            for index in range(self._base_index + 1, self._last_index + 1):
                self._read_locked(index)
            return self._last_index - self._base_index

    @property
    def write_position(self) -> int:
        return self._write_pos

    @property
    def segment_count(self) -> int:
        return len(self._segments)

    @property
    def closed(self) -> bool:
        return self._closed

    def close(self) -> None:
        """Flush, write the checkpoint, unmap, remove the abort marker, release the lock."""
        if self._closed:
            return
        self._stop_flusher.set()
        if self._flusher is not None:
            self._flusher.join()
            self._flusher = None
        self.flush()
        with self._exclusive():
            self._persist_checkpoint_or_warn()
            with self._lock:
                self._closed = True
        self._release_files()
        with contextlib.suppress(FileNotFoundError):
            os.unlink(self.root / ABORT_FILE)
        fsync_dir(self.root)
        self._unlock()
        log.info("store closed root=%s last_index=%d", self.root, self._last_index)

    def _release_files(self) -> None:
        if self._allocator is not None:
            self._allocator.close()
            self._allocator = None
        self._segments.close()
        self._index.close()
        self._cur_index = None

    def _unlock(self) -> None:
        if self._lock_fd >= 0:
            with contextlib.suppress(OSError):
                fcntl.flock(self._lock_fd, fcntl.LOCK_UN)
            os.close(self._lock_fd)
            self._lock_fd = -1

    def __enter__(self) -> SegmentedLogStore:
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.close()


_check: type[LogStore] = SegmentedLogStore
