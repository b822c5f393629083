"""The DLedger log store of one Raft member: mmap'd data segments, an O(1) index, durable
metadata, group-commit flushing and crash recovery. See docs/STORAGE.md and docs/FORMAT.md.

Locking: ``_lock`` guards all in-memory state and the mappings; it is never held across an
fsync/msync on the append path. ``_flush_lock`` serialises the things that sync or reshape
files (flush, checkpoint, truncate, delete, close); a thread that holds both takes
``_flush_lock`` first.
"""

from __future__ import annotations

import contextlib
import enum
import errno
import fcntl
import itertools
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
from dledger.chain import CHAIN_ORIGIN, link
from dledger.log import (
    ENTRY_TYPE_MAX,
    ConfigError,
    CorruptLogError,
    DLedgerError,
    Entry,
    HardState,
    IndexOutOfRangeError,
    LogCompactedError,
    LogStore,
)
from dledger.storage import codec, damage
from dledger.storage.codec import (
    BLANK_MAGIC_BYTES,
    BLANK_SIZE,
    CHECKPOINT_VERSION,
    ENTRY_HEADER_SIZE,
    ENTRY_MAGIC,
    FORMAT_VERSION,
    HEADER,
    HEADER_CRC_OFFSET,
    HEADER_NO_CRC,
    INDEX_CRC_OFFSET,
    INDEX_MAGIC,
    INDEX_NO_CRC,
    INDEX_RECORD_SIZE,
    MAX_ENTRY_BODY_BYTES,
    NO_TRUNCATE_PENDING,
    U32,
    Checkpoint,
    ItemKind,
    RecordError,
    crc32c,
)
from dledger.storage.files import (
    ALLOC_SUFFIX,
    PAGE_SIZE,
    SEGMENT_NAME_DIGITS,
    MappedFile,
    SegmentAllocator,
    allocate,
    atomic_write,
    fsync_dir,
    is_disk_full,
    segment_name,
)
from dledger.storage.retention import (
    DEFAULT_DELETE_WHEN,
    DEFAULT_FILE_RESERVED_TIME_HOURS,
    DEFAULT_MAX_LAG_RETENTION_HOURS,
    SegmentInfo,
    segments_to_delete,
)
from mqerrors import codes as E
from prockit.fatal import fatal, guard_thread

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

# Recovery reads segments in chunks of this size when it looks for the end of written data.
SCAN_CHUNK_BYTES = 1 << 20

# The next data segment is requested when the active one is this full: early enough that
# the background thread has written its zeros before the roll at any realistic append rate,
# late enough that a short-lived or idle store does not pay for a segment it never uses.
PREALLOCATE_AT_FILL = 0.5

# The appender reserves (keeps the warmer out of) this much beyond what it writes, so that it
# takes the warmer's lock about once per this many bytes, not once per entry.
RESERVE_AHEAD_BYTES = 1 << 20

# Space set aside in the store's root (the file RESERVE_FILE, allocated at open) so that the
# hard state and the checkpoint can always be written: on ENOSPC the file is deleted and the
# write retried. Each such write needs one block for a few seconds (temp file, then rename);
# 4 MiB is a thousand of them, and small next to any segment.
DEFAULT_RESERVE_BYTES = 4 << 20
# After the reserve was used, it is allocated again at most this often, and only once the file
# system has at least RESERVE_REARM_FACTOR times its size free (so that re-arming it does not
# itself fill the disk again).
RESERVE_RETRY_S = 1.0
RESERVE_REARM_FACTOR = 4
# Repeated disk-full warnings (periodic checkpoints refused) are logged at most this often.
DISK_FULL_WARN_INTERVAL_S = 10.0
# Log room kept for Raft's own entries (docs/STORAGE.md "Disk full"): a leader admits
# application entries only if, after them, the log still has this much room in files already
# allocated (or certain to be), so that a new term's no-op (a 48-byte header, empty body) and
# membership entries (at most 16 KiB each) are written without allocating anything. 256 KiB
# holds 5,000 no-ops or 15 membership entries of the largest size; next to a 1 GiB segment
# it is nothing.
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
# Characters of a path kept in an error message (messages become RPC details: bounded).
PATH_MAX_CHARS = 200

DATA_DIR = "commitlog"
INDEX_DIR = "index"
CHECKPOINT_FILE = "checkpoint"
ABORT_FILE = "abort"
LOCK_FILE = "lock"
META_FILE = "meta"
RESERVE_FILE = "reserve"


class FlushDiskType(enum.Enum):
    """RocketMQ's ``flushDiskType``."""

    SYNC_FLUSH = "SYNC_FLUSH"  # callers flush (group commit) before acknowledging
    ASYNC_FLUSH = "ASYNC_FLUSH"  # a background thread flushes every flush_interval_ms


class StoreLockedError(DLedgerError):
    """Another process (or another open store in this process) holds the store's lock."""

    code = E.STORE_LOCKED


class StoreClosedError(DLedgerError):
    code = E.STORE_CLOSED


class DiskFullError(DLedgerError):
    """The file system holding the store has no space for a write. Nothing of the refused
    write is in the log (an append is all or nothing); retry once space returns."""

    code = E.DISK_FULL


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


def short_path(path: object) -> str:
    """``path`` as text of at most PATH_MAX_CHARS characters (the tail, which names it)."""
    text = str(path)
    return text if len(text) <= PATH_MAX_CHARS else "..." + text[-(PATH_MAX_CHARS - 3) :]


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
    ):
        """``before_damage_cut``: called when the open found damage, before it cuts the log
        (the node raises its promise to the old last index there); an exception it raises
        stops the open with nothing cut."""
        self.config = config if config is not None else StoreConfig()
        self.root = Path(root_dir)
        self._seg_size = self.config.segment_size_bytes
        self._idx_size = self.config.index_segment_size_bytes
        self._max_body = self.config.max_body_bytes
        self._prealloc_at = int(self._seg_size * PREALLOCATE_AT_FILL)
        self._next_requested = -1  # start of the segment last asked of the allocator
        self._lock = threading.Lock()
        self._flush_lock = threading.Lock()
        self._sync_done = threading.Condition(self._lock)
        self._syncs_in_flight = 0  # group-commit syncs running now
        self._sync_started_index = 0  # highest index a started sync covers
        self._reshaping = False  # truncate/delete/close waiting for syncs to drain
        self._meta_lock = threading.Lock()
        self._closed = True
        self._lock_fd = -1
        self._segments: list[MappedFile] = []
        self._seg_first: list[int] = []  # first entry index in each segment, 0 when empty
        self._index_files: dict[int, MappedFile] = {}  # index file number -> file
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
        self._before_damage_cut = before_damage_cut
        self._created_first_segment = False
        self._stop_flusher = threading.Event()
        self._flusher: threading.Thread | None = None
        self._allocator: SegmentAllocator | None = None
        self._reserve_held = False  # RESERVE_FILE exists, allocated in full
        self._reserve_tried_s = -RESERVE_RETRY_S  # monotonic time of the last re-arm attempt
        self._disk_full_warned_s = -DISK_FULL_WARN_INTERVAL_S
        self.disk_full_count = 0  # writes refused (or checkpoints skipped) for lack of space
        self.log_room_refusals = 0  # application entries refused to keep the Raft reserve
        self._allocate_tried_s = -ALLOCATE_RETRY_S  # last allocation ahead that failed
        self._keep_cache: dict[int, tuple[int, int]] = {}  # headroom -> reserve_bytes_for
        self._forced_request_s = -ALLOCATE_RETRY_S  # last early request of the next segment

        self.root.mkdir(parents=True, exist_ok=True)
        self._data_dir = self.root / DATA_DIR
        self._index_dir = self.root / INDEX_DIR
        self._data_dir.mkdir(exist_ok=True)
        self._index_dir.mkdir(exist_ok=True)
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
        ckpt = self._read_checkpoint()
        abort = self.root / ABORT_FILE
        self.recovered_from_crash = abort.exists()
        abort.touch()
        fsync_dir(self.root)
        self._base_index = ckpt.base_index
        self._base_term = ckpt.base_term
        self._base_chain = ckpt.base_chain
        self._commit_index = ckpt.commit_index
        self._applied_index = ckpt.applied_index
        self._arm_reserve()
        if ckpt.version != CHECKPOINT_VERSION:
            self._drop_old_index(ckpt)
        self._open_index_files()
        self._open_data_segments(ckpt)
        marker = damage.read_marker(self.root)
        full = self.config.full_verify_on_open or (marker is not None and marker.verify)
        self._recover(ckpt, full=full)
        if marker is not None and marker.verify:
            damage.verified(self.root, marker)
        self._allocator = SegmentAllocator(
            self._data_dir,
            self._seg_size,
            enabled=self.config.preallocate,
            warm=self.config.warm_segments,
        )
        active = self._segments[-1]
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

    def _read_checkpoint(self) -> Checkpoint:
        path = self.root / CHECKPOINT_FILE
        with contextlib.suppress(FileNotFoundError):
            os.unlink(path.with_name(path.name + ".tmp"))
        try:
            data = path.read_bytes()
        except FileNotFoundError:
            return Checkpoint()
        try:
            return codec.decode_checkpoint(data)
        except RecordError as e:
            raise CorruptLogError(
                f"checkpoint {path}: {e.reason}", path=str(path), offset=e.offset
            ) from None

    def _drop_old_index(self, ckpt: Checkpoint) -> None:
        """A store of an older format (its checkpoint says so): its index records have
        another layout and no chains. The index is derived data: delete it; recovery
        rebuilds it from the data segments (a full scan, once)."""
        log.warning(
            "store root=%s has format %d (this release writes %d): rebuilding its index from "
            "the data segments%s",
            self.root,
            ckpt.version,
            CHECKPOINT_VERSION,
            ""
            if ckpt.base_index == 0
            else f"; the chain below its first index {ckpt.base_index + 1} is unknown (deleted "
            "before chains): matching falls back to terms until a snapshot is installed",
        )
        for p in self._index_dir.iterdir():
            p.unlink()
        fsync_dir(self._index_dir)

    def _list_files(self, directory: Path, unit: int) -> list[int]:
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

    def _open_index_files(self) -> None:
        for start in self._list_files(self._index_dir, self._idx_size):
            path = self._index_dir / segment_name(start)
            self._index_files[start // self._idx_size] = MappedFile(
                path, start, self._idx_size, create=False
            )

    def _open_data_segments(self, ckpt: Checkpoint) -> None:
        starts = self._list_files(self._data_dir, self._seg_size)
        for a, b in itertools.pairwise(starts):
            if b != a + self._seg_size:
                missing = self._data_dir / segment_name(a + self._seg_size)
                raise CorruptLogError(
                    f"data segment {missing} is missing (the log has a hole)",
                    path=str(missing),
                    offset=0,
                )
        for start in starts:
            path = self._data_dir / segment_name(start)
            self._segments.append(MappedFile(path, start, self._seg_size, create=False))
        # A crash inside delete_prefix leaves segments whose entries are all <= base_index.
        while len(self._segments) >= 2:
            first = self._peek_first_index(self._segments[1])
            if first == 0 or first > self._base_index + 1:
                break
            log.info("dropping segment left by an interrupted delete path=%s", self._segments[0])
            self._segments.pop(0).delete()
        if not self._segments:
            start = ckpt.flushed_position - ckpt.flushed_position % self._seg_size
            path = self._data_dir / segment_name(start)
            self._segments.append(MappedFile(path, start, self._seg_size, create=True))
            self._created_first_segment = True

    def _peek_first_index(self, seg: MappedFile) -> int:
        try:
            return codec.decode_header(seg.mm, 0).index
        except RecordError:
            return 0

    def _corrupt(self, seg: MappedFile, pos: int, reason: str, index: int = 0) -> CorruptLogError:
        offset = pos - seg.start
        named = f" index {index}" if index else ""
        return CorruptLogError(
            f"corrupt log entry{named} in {seg.path} at byte offset {offset} (position {pos}): "
            f"{reason}",
            path=str(seg.path),
            offset=offset,
            index=index,
        )

    def _scan_origin(self, ckpt_pos: int, full: bool) -> tuple[int, int, int, int]:
        """Where recovery starts scanning: the segment (from the one holding the checkpoint's
        flushed position, or the first with ``full``), the index of its first entry and the
        term and chain before it. A segment whose first entry (or the index record before it)
        is unreadable moves the start one segment back, so that the scan meets the damage."""
        segs = self._segments
        origin = (0, self._base_index + 1, self._base_term, self._base_chain)
        if full or ckpt_pos <= segs[0].start:
            return origin
        # the last segment holding flushed bytes (ckpt_pos may be the start of an empty one)
        k0 = max(k for k, s in enumerate(segs) if s.start < ckpt_pos)
        while k0 > 0:
            first = self._peek_first_index(segs[k0])
            if first > self._base_index + 1:
                try:
                    rec = self._record(first - 1)
                    return k0, first, rec.term, rec.chain
                except CorruptLogError:
                    pass
            k0 -= 1
        return origin

    def _recover(self, ckpt: Checkpoint, *, full: bool) -> None:
        segs = self._segments
        ckpt_pos = ckpt.flushed_position
        pending = ckpt.truncate_pending_position
        rebuild = ckpt.version != CHECKPOINT_VERSION  # the index was dropped: scan it all
        k0, expected, prev_term, chain = self._scan_origin(ckpt_pos, full or rebuild)
        self._last_index = expected - 1
        self._last_term = prev_term
        self._last_chain = chain
        self._index_synced = expected - 1  # records below the scan are not rewritten
        end_pos = segs[k0].start  # write position after the last valid (kept) record
        scan_stop = end_pos  # first position not covered by a valid record (stale included)
        bad_reason = ""
        for k in range(k0, len(segs)):
            seg = segs[k]
            terminal: codec.ScanItem | None = None
            for item in codec.iter_segment(seg.mm, seg.start):
                if item.kind is not ItemKind.ENTRY:
                    terminal = item
                    break
                h = item.header
                assert h is not None
                if h.index != expected or h.term < self._last_term:
                    terminal = item
                    bad_reason = (
                        f"entry index={h.index} term={h.term} does not follow "
                        f"index={expected - 1} term={self._last_term}"
                    )
                    break
                expected += 1
                scan_stop = item.position + item.size
                if item.position >= pending:
                    continue  # an entry an interrupted truncate_suffix was removing
                chain = next_link(self._last_chain, h)
                self._write_index_record(h.index, h.total_size, h.position, h.term, h.type, chain)
                self._last_index = h.index
                self._last_term = h.term
                self._last_chain = chain
                end_pos = scan_stop
            assert terminal is not None
            if terminal.kind in (ItemKind.BLANK, ItemKind.PADDING):
                scan_stop = seg.end
                if terminal.position < pending:
                    end_pos = seg.end
                continue  # the log goes on in the next segment, if there is one
            if terminal.kind is ItemKind.CORRUPT and not bad_reason:
                bad_reason = terminal.reason
            scan_stop = terminal.position
            break
        if pending != NO_TRUNCATE_PENDING:
            log.warning("completing an interrupted truncation position=%d", pending)
            self._zero_data(max(pending, end_pos), scan_stop)
            scan_stop = end_pos if scan_stop >= pending else scan_stop
        # Torn tail or damage? Damage: the valid log ends below what the checkpoint says is
        # durable, or a valid entry follows its end (the middle of the log is bad).
        problem = ""
        if end_pos < ckpt_pos:
            problem = (
                f"{bad_reason or 'entry missing'}; the checkpoint says the log is durable up "
                f"to position {ckpt_pos}"
            )
        else:
            after = self._valid_entry_after(scan_stop)
            if after:
                problem = f"{bad_reason or 'entry missing'}, but a valid entry follows at {after}"
        if problem:
            self._cut_damage(end_pos, problem, ckpt)
        elif bad_reason or self._has_nonzero_header(end_pos):
            log.warning(
                "truncating torn tail path=%s offset=%d reason=%s",
                self._segment_at(end_pos).path,
                end_pos - self._segment_at(end_pos).start,
                bad_reason or "partial entry",
            )
            self._zero_torn_tail(end_pos)
        self._finish_recovery(ckpt, end_pos)

    def _finish_recovery(self, ckpt: Checkpoint, end_pos: int) -> None:
        """The log ends at ``end_pos``: drop what lies beyond, sync what survived, and write
        the checkpoint if it changed."""
        segs = self._segments
        # Drop empty segments beyond the write position (pre-allocated, or emptied above).
        dropped = False
        while len(segs) > 1 and segs[-1].start > end_pos:
            segs.pop().delete()
            dropped = True
        if dropped or self._created_first_segment:
            fsync_dir(self._data_dir)
        assert self._last_index >= self._base_index
        assert segs[0].start <= end_pos <= segs[-1].end
        self._write_pos = end_pos
        self._fill_seg_first()
        if self._clean_index_after(self._last_index) | self._clean_index_before(
            self._base_index + 1
        ):
            fsync_dir(self._index_dir)
        # What survived is in the page cache; make it durable before calling it flushed.
        start = min(ckpt.flushed_position, end_pos)
        self._sync_data(self._segment_floor(start), end_pos)
        self._flushed_pos = end_pos
        self._flushed_index = self._last_index
        rebuild = ckpt.version != CHECKPOINT_VERSION  # written again in this version's format
        pending = ckpt.truncate_pending_position
        if (
            rebuild
            or not (self.root / CHECKPOINT_FILE).exists()
            or (
                ckpt.flushed_position,
                ckpt.flushed_index,
                pending,
            )
            != (
                end_pos,
                self._last_index,
                NO_TRUNCATE_PENDING,
            )
        ):
            self._persist_checkpoint()

    def _cut_damage(self, end_pos: int, problem: str, ckpt: Checkpoint) -> None:
        """Damage at ``end_pos`` (inside what was durable): report it, then cut the log
        there: zero the written bytes from ``end_pos`` to the end of its segment's data (the
        later segments go in :meth:`_finish_recovery`). A crash part way leaves the
        checkpoint as it was, so the next open finds and cuts the same damage again."""
        seg = self._segment_at(end_pos)
        first = self._last_index + 1
        old_last = max(ckpt.flushed_index, self._highest_index_record(first), first)
        report = damage.DamageReport(
            path=str(seg.path),
            offset=end_pos - seg.start,
            first_index=first,
            last_index=old_last,
            reason=problem,
            found_by="open",
        )
        log.error(
            "DAMAGE in the log: cutting it at the first damaged entry (the leader sends "
            "everything after again) root=%s %s",
            self.root,
            report.describe(),
        )
        if self._before_damage_cut is not None:
            self._before_damage_cut(report)
        end_off = max(end_pos - seg.start, self._search_end(seg, end_pos - seg.start))
        self._zero_data(end_pos, seg.start + end_off)
        self.damage = report
        self.damage_found["open"] = self.damage_found.get("open", 0) + 1
        self.damaged_entries_cut += report.entries_lost

    def _highest_index_record(self, first: int) -> int:
        """The highest index from ``first`` on with a valid index record, stopping at the
        first that is not (the records the log held before its end was lost); 0 if none."""
        last = 0
        index = first
        while True:
            byte = index * INDEX_RECORD_SIZE
            f = self._index_files.get(byte // self._idx_size)
            if f is None:
                return last
            try:
                codec.decode_index_record(f.mm, byte - f.start)
            except RecordError:
                return last
            last = index
            index += 1

    def _segment_floor(self, pos: int) -> int:
        return max(self._segments[0].start, pos)

    def _fill_seg_first(self) -> None:
        self._seg_first = [self._peek_first_index(s) for s in self._segments]
        for k, s in enumerate(self._segments):
            if s.start >= self._write_pos:
                self._seg_first[k] = 0

    def _has_nonzero_header(self, pos: int) -> bool:
        seg = self._segment_at(pos)
        off = pos - seg.start
        n = min(ENTRY_HEADER_SIZE, seg.size_bytes - off)
        return n > 0 and any(seg.mm[off : off + n])

    def _valid_entry_after(self, scan_stop: int) -> str:
        """Where the first valid entry after ``scan_stop`` lies ("<path> offset <n>"), searched
        byte by byte up to the end of the written data; "" if there is none."""
        for seg in self._segments:
            if seg.end <= scan_stop:
                continue
            start_off = scan_stop - seg.start if seg.start <= scan_stop else 0
            end_off = self._search_end(seg, start_off)
            found = codec.find_valid_entry(seg.mm, seg.start, start_off, end_off)
            if found >= 0:
                return f"{seg.path} offset {found}"
        return ""

    def _search_end(self, seg: MappedFile, start_off: int) -> int:
        """Where the search for valid entries after the end of the log may stop: the start of
        the first run of zero bytes longer than any entry (a run that long cannot lie inside
        written records, since every entry header has a non-zero magic). Bounds the work on
        open to the written bytes plus one maximum entry, not the whole (1 GiB) segment."""
        chunk = SCAN_CHUNK_BYTES
        limit = self._max_body + ENTRY_HEADER_SIZE + 2 * chunk
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

    def _zero_torn_tail(self, pos: int) -> None:
        seg = self._segment_at(pos)
        off = pos - seg.start
        end = min(seg.size_bytes, off + ENTRY_HEADER_SIZE)
        with contextlib.suppress(RecordError, Exception):
            (magic, total) = HEADER.unpack_from(seg.mm, off)[:2]
            if magic == ENTRY_MAGIC and ENTRY_HEADER_SIZE <= total <= seg.size_bytes - off:
                end = off + total
        seg.zero(off, end)
        seg.sync(off, end)

    def _zero_data(self, start: int, end: int) -> None:
        """Zero data bytes in ``[start, end)`` and sync them (truncation)."""
        for seg in self._segments:
            a = max(start, seg.start)
            b = min(end, seg.end)
            if a < b:
                seg.zero(a - seg.start, b - seg.start)
                seg.sync(a - seg.start, b - seg.start)

    def _segment_at(self, pos: int) -> MappedFile:
        """The segment holding ``pos`` (the last one when ``pos`` is past the end)."""
        segs = self._segments
        k = (pos - segs[0].start) // self._seg_size
        return segs[max(0, min(k, len(segs) - 1))]

    # ------------------------------------------------------------------ index records

    def _index_file(self, number: int, *, create: bool) -> MappedFile | None:
        f = self._index_files.get(number)
        if f is None and create:
            start = number * self._idx_size
            f = MappedFile(
                self._index_dir / segment_name(start), start, self._idx_size, create=True
            )
            self._index_files[number] = f
        return f

    def _write_index_record(
        self, index: int, size: int, pos: int, term: int, typ: int, chain: int
    ) -> None:
        byte = index * INDEX_RECORD_SIZE
        f = self._index_file(byte // self._idx_size, create=True)
        assert f is not None
        off = byte - f.start
        head = INDEX_NO_CRC.pack(INDEX_MAGIC, size, pos, term, chain, typ)
        f.mm[off : off + INDEX_CRC_OFFSET] = head
        U32.pack_into(f.mm, off + INDEX_CRC_OFFSET, crc32c(head))

    def _record(self, index: int) -> codec.IndexRecord:
        byte = index * INDEX_RECORD_SIZE
        f = self._index_files.get(byte // self._idx_size)
        if f is None:
            path = self._index_dir / segment_name(byte - byte % self._idx_size)
            raise CorruptLogError(
                f"index file {path} for index {index} is missing", path=str(path), offset=0
            )
        try:
            return codec.decode_index_record(f.mm, byte - f.start)
        except RecordError as e:
            raise CorruptLogError(
                f"index record of index {index} in {f.path} at offset {e.offset}: {e.reason}",
                path=str(f.path),
                offset=e.offset,
                index=index,
            ) from None

    def _clean_index_after(self, last: int) -> bool:
        """Zero index records above ``last`` and delete index files wholly above it. Returns
        whether a file was deleted (the caller syncs the directory)."""
        first_byte = (last + 1) * INDEX_RECORD_SIZE
        deleted = False
        for number in sorted(self._index_files):
            f = self._index_files[number]
            if f.start > first_byte and number != first_byte // self._idx_size:
                del self._index_files[number]
                f.delete()
                deleted = True
            elif f.end > first_byte:
                off = first_byte - f.start
                end = off
                while end < f.size_bytes and f.mm[end : end + 4] != b"\0\0\0\0":
                    end += INDEX_RECORD_SIZE
                f.zero(off, end)
                f.sync(off, end)
        return deleted

    def _clean_index_before(self, first: int) -> bool:
        """Delete index files whose records are all below ``first``; True if any."""
        deleted = False
        for number in sorted(self._index_files):
            f = self._index_files[number]
            if f.end <= first * INDEX_RECORD_SIZE:
                del self._index_files[number]
                f.delete()
                deleted = True
        return deleted

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
            return self._record(index).term

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
            return self._record(index).chain

    def _read_locked(self, index: int) -> Entry:
        seg, off, rec = self._check_entry_locked(index)
        body = seg.mm[off + ENTRY_HEADER_SIZE : off + rec.size]
        return Entry(term=rec.term, index=index, body=body, type=rec.type)

    def _check_entry_locked(self, index: int) -> tuple[MappedFile, int, codec.IndexRecord]:
        """Check entry ``index`` (its index record, header and body CRCs, and that they
        agree); its segment, offset there and index record, or CorruptLogError naming it."""
        rec = self._record(index)
        seg = self._segment_at(rec.position)
        off = rec.position - seg.start
        mm = seg.mm
        if not seg.start <= rec.position < seg.end or off + rec.size > seg.size_bytes:
            raise self._corrupt(seg, rec.position, "index record points outside", index)
        (magic, total, idx, term, pos, typ, version, _r, body_size, body_crc, hcrc) = (
            HEADER.unpack_from(mm, off)
        )
        if magic != ENTRY_MAGIC or crc32c(mm[off : off + HEADER_CRC_OFFSET]) != hcrc:
            raise self._corrupt(seg, rec.position, "entry header magic or CRC mismatch", index)
        if (idx, term, pos, total, typ) != (index, rec.term, rec.position, rec.size, rec.type):
            raise self._corrupt(seg, rec.position, "entry does not match its index record", index)
        if version != FORMAT_VERSION or total != ENTRY_HEADER_SIZE + body_size:
            raise self._corrupt(seg, rec.position, "entry version or size mismatch", index)
        with memoryview(mm) as mv:
            if crc32c(mv[off + ENTRY_HEADER_SIZE : off + total]) != body_crc:
                raise self._corrupt(seg, rec.position, "entry body CRC mismatch", index)
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
            while index <= last and self._record(index).position < end_position:
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
                rec = self._record(mid)
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
            return self._record(index).position + ENTRY_HEADER_SIZE

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
                rec = self._record(index)
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
            seg = self._segment_at(position)
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
            rec = self._record(start)
            seg = self._segment_at(rec.position)
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
                    raise self._corrupt(seg, seg.start + off, e.reason, index) from None
                if h.index != index:
                    raise self._corrupt(seg, seg.start + off, f"expected index {index}", index)
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

    def _append_locked(self, items: list[tuple[int, int, bytes]]) -> None:
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
        seg = self._segments[-1]
        seg_size = self._seg_size
        off = self._write_pos - seg.start
        idx = self._last_index
        term = self._last_term
        chain = self._last_chain
        ifile = self._cur_index
        if ifile is None or not ifile.start <= (idx + 1) * INDEX_RECORD_SIZE < ifile.end:
            ifile = self._index_file(((idx + 1) * INDEX_RECORD_SIZE) // self._idx_size, create=True)
            assert ifile is not None
        ioff = (idx + 1) * INDEX_RECORD_SIZE - ifile.start
        isize = ifile.size_bytes
        head_pack = HEADER_NO_CRC.pack
        idx_pack = INDEX_NO_CRC.pack
        u32_pack = U32.pack
        header_size = ENTRY_HEADER_SIZE
        i = 0
        n_items = len(items)
        # Every file the batch needs is allocated before any byte of it is written, so that
        # a full disk refuses the whole batch (DiskFullError) and leaves the log as it was.
        spare: list[MappedFile] = []
        if off + n_items * header_size + sum(len(it[2]) for it in items) > seg_size:
            spare = self._take_segments(items, off, seg)
        if ioff + n_items * INDEX_RECORD_SIZE > isize:
            self._prepare_index_files(idx + 1, idx + n_items)
        rolled = False
        while i < n_items:
            if off + header_size + len(items[i][2]) > seg_size:
                seg = self._roll(seg, off, spare.pop(0))
                rolled = True
                off = 0
            if ioff >= isize:
                ifile = self._index_file((ifile.start + isize) // isize, create=False)
                assert ifile is not None
                ioff = 0
            seg_start = seg.start
            first_before = self._seg_first[-1]
            if off == 0:
                self._seg_first[-1] = idx + 1
            off0, ioff0 = off, ioff
            parts: list[bytes] = []
            iparts: list[bytes] = []
            add = parts.extend
            iadd = iparts.extend
            while i < n_items:
                term, typ, body = items[i]
                n = len(body)
                total = header_size + n
                if off + total > seg_size or ioff >= isize:
                    break
                idx += 1
                pos = seg_start + off
                bcrc = crc32c(body)
                head = head_pack(
                    ENTRY_MAGIC, total, idx, term, pos, typ, FORMAT_VERSION, 0, n, bcrc
                )
                add((head, u32_pack(crc32c(head)), body))
                chain = link(chain, idx, term, typ, n, bcrc) if chain else chain
                ihead = idx_pack(INDEX_MAGIC, total, pos, term, chain, typ)
                iadd((ihead, u32_pack(crc32c(ihead))))
                off += total
                ioff += INDEX_RECORD_SIZE
                i += 1
            if off > seg.reserved:  # keep the warmer out (about once per MiB)
                seg.reserve(off, RESERVE_AHEAD_BYTES)
            try:
                seg.write(off0, b"".join(parts))
                ifile.write(ioff0, b"".join(iparts))
            except OSError as e:
                # Into allocated blocks this fails only on a file system that allocates on
                # write anyway (copy-on-write) or on a failing disk. Before a roll nothing
                # of the batch counts yet: refuse it. After one, the in-memory state no
                # longer matches a prefix of the batch: end the process (recovery cuts the
                # torn tail on restart).
                self._seg_first[-1] = first_before
                if is_disk_full(e) and not rolled:
                    raise self._disk_full("append", e) from None
                fatal("store-append", f"WRITE_FAILED root={short_path(self.root)} error={e}")
        assert not spare
        assert off <= seg_size and seg is self._segments[-1]
        assert idx == self._last_index + len(items) and term >= self._last_term
        self._cur_index = ifile
        self._write_pos = seg.start + off
        self._last_index = idx
        self._last_term = term
        self._last_chain = chain
        if off >= self._prealloc_at and self._next_requested != seg.end:
            self._maybe_preallocate()

    def _maybe_preallocate(self, *, force: bool = False) -> None:
        """Ask for the next segment once the active one is PREALLOCATE_AT_FILL full (at once
        with ``force``: the Raft reserve reaches into it)."""
        seg = self._segments[-1]
        full = self._write_pos - seg.start >= self._prealloc_at
        if force or (full and self._next_requested != seg.end):
            assert self._allocator is not None
            self._allocator.request(seg.end)
            self._next_requested = seg.end

    def _take_segments(
        self, items: list[tuple[int, int, bytes]], off: int, seg: MappedFile
    ) -> list[MappedFile]:
        """The segments after ``seg`` that appending ``items`` at offset ``off`` fills, created
        (allocated) now. On a full disk, those made are deleted and DiskFullError raised."""
        seg_size = self._seg_size
        count = 0
        for _term, _typ, body in items:
            total = ENTRY_HEADER_SIZE + len(body)
            if off + total > seg_size:
                count += 1
                off = 0
            off += total
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
        lo = first * INDEX_RECORD_SIZE // self._idx_size
        hi = last * INDEX_RECORD_SIZE // self._idx_size
        for number in range(lo, hi + 1):
            try:
                self._index_file(number, create=True)
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
        assert nxt.start == seg.end
        self._segments.append(nxt)
        self._seg_first.append(0)
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
            segments = [s for s in self._segments if s.end > start and s.start < end]
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

    def _sync_data(self, start: int, end: int, *, whole_file: bool = False) -> None:
        """Make data bytes ``[start, end)`` durable. Holding ``_flush_lock`` (or opening): the
        segment list only grows at its end meanwhile. ``whole_file`` uses fdatasync, which
        writes back every dirty page of the file (those dirtied through the shared mapping
        too) and releases the GIL while it waits for the disk."""
        for seg in list(self._segments):
            a = max(start, seg.start)
            b = min(end, seg.end)
            if a < b:
                if whole_file:
                    os.fdatasync(seg.fd)
                else:
                    seg.sync(a - seg.start, b - seg.start)

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
        )
        lo = max(self._index_synced, self._base_index) + 1
        hi = self._flushed_index
        files = list(self._index_files.values())
        if not io_under_lock:
            self._lock.release()
        try:
            # Index records below the checkpoint are not rebuilt by recovery: sync them first.
            for f in files:
                a = max(lo * INDEX_RECORD_SIZE, f.start)
                b = min((hi + 1) * INDEX_RECORD_SIZE, f.end)
                if a < b:
                    f.sync(a - f.start, b - f.start)
            self._write_meta(CHECKPOINT_FILE, codec.encode_checkpoint(ckpt))
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
            self._maybe_rearm_reserve()

    def read_checkpoint(self) -> Checkpoint:
        """The checkpoint as stored on disk."""
        return self._read_checkpoint()

    def load_hard_state(self) -> HardState:
        path = self.root / META_FILE
        with self._meta_lock:
            try:
                data = path.read_bytes()
            except FileNotFoundError:
                return HardState()
        try:
            return codec.decode_hard_state(data)
        except RecordError as e:
            raise CorruptLogError(
                f"hard state {path}: {e.reason}", path=str(path), offset=e.offset
            ) from None

    def save_hard_state(self, state: HardState) -> None:
        data = codec.encode_hard_state(state)
        with self._meta_lock:
            self._check_open()
            self._write_meta(META_FILE, data)

    # ------------------------------------------------------------------ the space reserve

    def _write_meta(self, name: str, data: bytes) -> None:
        """``atomic_write`` a small metadata file. On a full disk the reserve is released and
        the write tried once more; DiskFullError if there is still no space. Any other error
        is fatal: it is an fsync or I/O failure of the store's own metadata (never retried)."""
        path = self.root / name
        try:
            try:
                atomic_write(path, data)
                return
            except OSError as e:
                if not is_disk_full(e) or not self._release_reserve(name):
                    raise
            atomic_write(path, data)
        except OSError as e:
            if is_disk_full(e):
                raise self._disk_full(name, e) from None
            fatal("store-meta", f"WRITE_FAILED path={short_path(path)} error={e}")

    def _arm_reserve(self) -> None:
        """Allocate RESERVE_FILE (``reserve_bytes``) if it is not there; on a full disk, go
        without it for now (:meth:`_maybe_rearm_reserve` tries again)."""
        size = self.config.reserve_bytes
        self._reserve_tried_s = time.monotonic()
        if size == 0:
            return
        path = self.root / RESERVE_FILE
        fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o644)
        try:
            have = os.fstat(fd).st_size
            allocate(fd, 0, size)
            if have > size:
                os.ftruncate(fd, size)
            os.fsync(fd)
        except OSError as e:
            if not is_disk_full(e):
                raise
            os.close(fd)
            fd = -1
            with contextlib.suppress(OSError):
                os.unlink(path)
            log.warning(
                "space reserve not allocated root=%s bytes=%d: %s", self.root, size, e.strerror
            )
            return
        finally:
            if fd >= 0:
                os.close(fd)
        if not self._reserve_held:
            fsync_dir(self.root)
        self._reserve_held = True

    def _release_reserve(self, why: str) -> bool:
        """Delete RESERVE_FILE (its blocks are free at once); False if there was none."""
        if not self._reserve_held:
            return False
        self._reserve_held = False
        self._reserve_tried_s = time.monotonic()
        with contextlib.suppress(FileNotFoundError):
            os.unlink(self.root / RESERVE_FILE)
        log.warning(
            "disk full: released the space reserve root=%s bytes=%d to write %s",
            self.root,
            self.config.reserve_bytes,
            why,
        )
        return True

    def _maybe_rearm_reserve(self) -> None:
        """Re-allocate the reserve after it was used, once the disk has room again."""
        if self._reserve_held or self.config.reserve_bytes == 0:
            return
        now = time.monotonic()
        if now - self._reserve_tried_s < RESERVE_RETRY_S:
            return
        self._reserve_tried_s = now
        try:
            st = os.statvfs(self.root)
        except OSError:
            return
        if st.f_bavail * st.f_frsize < RESERVE_REARM_FACTOR * self.config.reserve_bytes:
            return
        self._arm_reserve()
        if self._reserve_held:
            log.info(
                "space reserve restored root=%s bytes=%d", self.root, self.config.reserve_bytes
            )

    @property
    def reserve_held(self) -> bool:
        """Whether the space reserve is allocated now (for tests and metrics)."""
        return self._reserve_held

    # ------------------------------------------------------------------ the Raft reserve

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

    def _fits_in_active_files(
        self, batch_bytes: int, batch_count: int, headroom_bytes: int
    ) -> bool:
        """The common case, cheaply (a few microseconds per proposal): the batch and the
        reserve fit in the active segment and index file. Caller holds ``_lock``."""
        cached = self._keep_cache.get(headroom_bytes)
        if cached is None:
            if len(self._keep_cache) >= KEEP_CACHE_MAX:
                self._keep_cache.clear()
            cached = self._keep_cache[headroom_bytes] = self.reserve_bytes_for(headroom_bytes)
        keep, keep_index = cached
        record = (self._last_index + 1) * INDEX_RECORD_SIZE
        number, offset = divmod(record, self._idx_size)
        return (
            self._write_pos + batch_bytes + keep <= self._segments[-1].end
            and offset + batch_count * INDEX_RECORD_SIZE + keep_index <= self._idx_size
            and number in self._index_files
        )

    def _room_needed(
        self, batch_bytes: int, batch_count: int, largest_entry_bytes: int, headroom_bytes: int
    ) -> tuple[list[tuple[str, int]], int]:
        """The files the log lacks for the batch plus the reserve (("data"|"index", start)),
        and their bytes. Caller holds ``_lock``."""
        keep, keep_index = self.reserve_bytes_for(headroom_bytes)
        seg = self._segments[-1]
        n_data = files_needed(
            write_offset=self._write_pos - seg.start,
            segment_bytes=self._seg_size,
            batch_bytes=batch_bytes,
            largest_entry_bytes=min(largest_entry_bytes, self._seg_size),
            keep_bytes=keep,
        )
        missing: list[tuple[str, int]] = []
        assert self._allocator is not None
        for k in range(n_data):
            start = seg.end + k * self._seg_size
            if k > 0 or not self._allocator.is_ready(start):
                missing.append(("data", start))
        record = (self._last_index + 1) * INDEX_RECORD_SIZE
        first_file = record // self._idx_size
        n_index = files_needed(
            write_offset=record - first_file * self._idx_size,
            segment_bytes=self._idx_size,
            batch_bytes=batch_count * INDEX_RECORD_SIZE,
            largest_entry_bytes=0,
            keep_bytes=keep_index,
        )
        for number in range(first_file, first_file + n_index + 1):
            if number not in self._index_files:
                missing.append(("index", number * self._idx_size))
        sizes = {"data": self._seg_size, "index": self._idx_size}
        return missing, sum(sizes[kind] for kind, _start in missing)

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
            if self._fits_in_active_files(batch_bytes, batch_count, headroom_bytes):
                return
            missing, need = self._room_needed(
                batch_bytes, batch_count, largest_entry_bytes, headroom_bytes
            )
            if not missing:
                return
            free = self._free_bytes()
            slack = ALLOCATION_SLACK_COUNT * (self._seg_size + self._idx_size)
            if free >= need + slack:
                now = time.monotonic()
                data_missing = any(kind == "data" for kind, _start in missing)
                if data_missing and now - self._forced_request_s >= ALLOCATE_RETRY_S:
                    # At most this often: a quota (EDQUOT) that statvfs does not show would
                    # otherwise have the allocator fail once per proposal.
                    self._forced_request_s = now
                    self._maybe_preallocate(force=True)
                return
            if self._allocate_ahead(missing):
                missing, need = self._room_needed(
                    batch_bytes, batch_count, largest_entry_bytes, headroom_bytes
                )
                free = self._free_bytes()
                if not missing or free >= need + slack:
                    return
            self.log_room_refusals += 1
            keep, _ = self.reserve_bytes_for(headroom_bytes)
            raise DiskFullError(
                f"path={short_path(self.root)} reason=log_room need_bytes={need} "
                f"free_bytes={free} reserve_bytes={keep}"
            )

    def _free_bytes(self) -> int:
        """Bytes of the store's file system that this process may still allocate (-1 when
        it cannot be read, which admits nothing that needs space)."""
        try:
            st = os.statvfs(self.root)
        except OSError:
            return -1
        return st.f_bavail * st.f_frsize

    def _allocate_ahead(self, missing: list[tuple[str, int]]) -> bool:
        """Allocate the next data segment and the index files of ``missing`` now; False when
        the disk refused (tried again at most every ALLOCATE_RETRY_S; meanwhile a segment the
        background allocator is making is waited for). Caller holds _lock."""
        now = time.monotonic()
        # Between tries only the background allocator's work in flight is waited for.
        create = now - self._allocate_tried_s >= ALLOCATE_RETRY_S
        assert self._allocator is not None
        next_segment = self._segments[-1].end
        try:
            for kind, start in missing:
                if kind == "data" and start == next_segment:
                    self._allocator.prepare(start, create=create)
                elif kind == "index" and create:
                    self._index_file(start // self._idx_size, create=True)
        except OSError as e:
            if e.errno == errno.EBUSY:  # the background allocator is stuck: refuse for now
                return False
            if not is_disk_full(e):
                raise
            self._allocate_tried_s = now
            return False
        return True

    def next_allocation_bytes(self) -> int:
        """Bytes the log must still allocate before it can grow past its active files: the
        next data segment unless it is allocated already, and the next index file unless it
        exists (the disk watermark counts them: docs/STORAGE.md "Disk full")."""
        with self._lock:
            if self._closed or self._allocator is None:
                return 0
            seg = self._segments[-1]
            need = 0 if self._allocator.is_ready(seg.end) else self._seg_size
            record = (self._last_index + 1) * INDEX_RECORD_SIZE
            if record // self._idx_size + 1 not in self._index_files:
                need += self._idx_size
            return need

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
            rec = self._record(index)
            new_pos = rec.position
            old_pos = self._write_pos
            old_last = self._last_index
            new_term, new_chain = self._base_term, self._base_chain
            if index - 1 > self._base_index:
                rec = self._record(index - 1)
                new_term, new_chain = rec.term, rec.chain
            self._flushed_pos = min(self._flushed_pos, new_pos)
            self._flushed_index = min(self._flushed_index, index - 1)
            self._index_synced = min(self._index_synced, index - 1)
            # 1. Durable intent: recovery finishes the job if we crash from here on.
            self._persist_checkpoint_locked(truncate_pending=new_pos)
            # 2. Zero the data and drop segments after the one holding new_pos.
            self._zero_data(new_pos, old_pos)
            keep = self._segments.index(self._segment_at(new_pos)) + 1
            for seg in self._segments[keep:]:
                seg.delete()
            del self._segments[keep:]
            del self._seg_first[keep:]
            if self._segments[-1].start == new_pos:
                self._seg_first[-1] = 0
            assert self._allocator is not None
            self._allocator.discard_from(self._segments[-1].end + 1)
            self._next_requested = -1
            self._maybe_preallocate()
            fsync_dir(self._data_dir)
            # 3. Index records.
            self._clean_index_after(index - 1)
            fsync_dir(self._index_dir)
            assert new_pos <= old_pos and self._flushed_pos <= new_pos
            assert self._segments[-1].start <= new_pos <= self._segments[-1].end
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

    def _segment_last_indices(self) -> list[int]:
        out = []
        n = len(self._segments)
        for k in range(n):
            nxt = next((self._seg_first[j] for j in range(k + 1, n) if self._seg_first[j]), 0)
            if self._seg_first[k] == 0:
                out.append(0)
            else:
                out.append(nxt - 1 if nxt else self._last_index)
        return out

    def segment_infos(self) -> list[SegmentInfo]:
        """One :class:`SegmentInfo` per data segment, oldest first."""
        with self._lock:
            self._check_open()
            lasts = self._segment_last_indices()
            return [
                SegmentInfo(
                    path=str(s.path),
                    start_position=s.start,
                    first_index=self._seg_first[k],
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
            lasts = self._segment_last_indices()
            n = 0
            while n < len(self._segments) - 1 and 0 < lasts[n] <= min(index, self._last_index):
                n += 1
            if n == 0:
                return self._base_index + 1
            new_base = lasts[n - 1]
            new_base_term, new_base_chain = self._last_term, self._last_chain
            if new_base != self._last_index:
                rec = self._record(new_base)
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
            for seg in self._segments[:n]:
                seg.delete()
            del self._segments[:n]
            del self._seg_first[:n]
            fsync_dir(self._data_dir)
            self._cur_index = None
            self._clean_index_before(new_base + 1)
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
        )
        if not doomed:
            return 0
        before = len(self._segments)
        self.delete_prefix(doomed[-1].last_index)
        return before - len(self._segments)

    # ------------------------------------------------------------------ lifecycle

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
        for seg in self._segments:
            seg.close()
        for f in self._index_files.values():
            f.close()
        self._segments = []
        self._index_files = {}
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


def next_link(prev: int, h: codec.EntryHeader) -> int:
    """The chain at the entry of header ``h`` (``prev``: the chain before it; unknown stays
    unknown)."""
    return link(prev, h.index, h.term, h.type, h.body_size, h.body_crc) if prev else prev


_check: type[LogStore] = SegmentedLogStore
