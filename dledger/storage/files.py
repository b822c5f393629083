"""Files under the store: memory-mapped segments, their pre-allocation, atomic small files."""

from __future__ import annotations

import contextlib
import errno
import logging
import mmap
import os
import threading
import time
from collections.abc import Sequence
from pathlib import Path

from prockit.fatal import fatal, guard_thread

log = logging.getLogger(__name__)

# errno values that mean "no space left for this write": the disk (or the quota) is full. Such
# a write failed cleanly (nothing of it is on disk) and may succeed later, once space returns.
DISK_FULL_ERRNOS = frozenset({errno.ENOSPC, errno.EDQUOT})
# errno values of posix_fallocate that mean "this file system cannot pre-allocate" (not "no
# space"): blocks are then allocated by writing zeros instead, which is slower but as safe.
FALLOCATE_UNSUPPORTED_ERRNOS = frozenset({errno.EOPNOTSUPP, errno.EINVAL, errno.ENOSYS})
# A repeated warning (pre-allocation failing on a full disk) is logged at most this often.
WARN_INTERVAL_S = 10.0
# How long SegmentAllocator.prepare waits for the background thread's allocation in flight
# (an fallocate and two fsyncs: milliseconds; seconds only on a disk that is failing).
PREPARE_WAIT_S = 10.0


def is_disk_full(exc: BaseException) -> bool:
    """True when ``exc`` is an OSError saying that the file system (or a quota) is full."""
    return isinstance(exc, OSError) and exc.errno in DISK_FULL_ERRNOS


# Segment files are named by their first byte position, zero-padded to 20 digits (the width
# of the largest u64), so that a lexical sort is a numeric sort (RocketMQ's naming).
SEGMENT_NAME_DIGITS = 20
# A file being pre-allocated carries this suffix until it is complete; recovery deletes it.
ALLOC_SUFFIX = ".alloc"
PAGE_SIZE = mmap.PAGESIZE


def segment_name(start_position: int) -> str:
    return f"{start_position:0{SEGMENT_NAME_DIGITS}d}"


def fsync_dir(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY | os.O_DIRECTORY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def atomic_write(path: Path, data: bytes) -> None:
    """Replace ``path`` with ``data``: temp file, fsync, rename, fsync directory."""
    tmp = path.with_name(path.name + ".tmp")
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
    try:
        view = memoryview(data)
        while view:
            written = os.write(fd, view)
            view = view[written:]
        os.fsync(fd)
    finally:
        os.close(fd)
    os.replace(tmp, path)
    fsync_dir(path.parent)


# Segments are warmed (zeros written ahead of the appender, see MappedFile.warm_step) in chunks
# of this size; the warmer fdatasyncs after every WARM_SYNC_BYTES so that the zeros do not
# ride along with a group commit's fdatasync.
WARM_CHUNK_BYTES = 1 << 20
WARM_SYNC_BYTES = 4 << 20
# How far ahead of the appender the warmer writes zeros. Warming a whole 1 GiB segment at
# once saturated the disk and starved group commit (measured: 4x slower); at most this
# much ahead, the zeros go out at the pace of the appends. 64 MiB lasts >= 60 ms at any
# append rate measured here, well above the warmer's poll interval.
WARM_LEAD_BYTES = 64 << 20
# Once the appender writes into a file, the warmer stays at least this far ahead of it: when
# the appender catches up (the warmer fell behind), the warmer skips ahead instead of making
# the appender wait for the chunk it is writing. Waiting held the store's lock while the
# warmer, with 64 appending threads, waited for the GIL: group commit with OS threads fell
# to a third.
WARM_GAP_BYTES = 4 << 20
# The warmer looks for work this often when every file is warmed as far ahead as it may be,
# backing off (doubling) to WARM_POLL_MAX_S while the log does not grow: an idle store costs
# ~20 wake-ups a second, and 64 MiB of lead outlasts 50 ms at any append rate measured here.
WARM_POLL_S = 0.005
WARM_POLL_MAX_S = 0.05
_ZEROS = memoryview(bytes(WARM_CHUNK_BYTES))  # sliced without copying
# Most buffers one pwritev takes: the kernel's IOV_MAX (1024 on Linux; POSIX's floor is 16).
IOV_MAX = max(16, os.sysconf("SC_IOV_MAX"))


def allocate(fd: int, offset: int, length: int) -> None:
    """Give bytes ``[offset, offset + length)`` of ``fd`` real disk blocks (reading as zeros
    where nothing was written), growing the file if needed.

    A page of a shared mapping whose blocks are not allocated is filled on first write, and
    on a full disk that fault is a SIGBUS that kills the process with no log line. Every file
    this package maps is therefore allocated in full before it is mapped: ``posix_fallocate``,
    or, where the file system cannot do that, zeros written with ``pwrite``. Never ``ftruncate``
    alone (a sparse file). Raises OSError (``ENOSPC``: see :func:`is_disk_full`) when the
    space is not there; the bytes already allocated stay allocated.
    """
    if length <= 0:
        return
    try:
        os.posix_fallocate(fd, offset, length)
        return
    except OSError as e:
        if e.errno not in FALLOCATE_UNSUPPORTED_ERRNOS:
            raise
    end = offset + length
    pos = offset
    while pos < end:
        n = min(WARM_CHUNK_BYTES, end - pos)
        _pwrite_all(fd, _ZEROS[:n], pos)
        pos += n


def _create_file(path: Path, size_bytes: int) -> None:
    """Create ``path`` with ``size_bytes`` of allocated zeroed blocks, atomically by name.

    Blocks are reserved up front (:func:`allocate`) so that appends never hit ENOSPC inside
    the mapping (which would be a SIGBUS). fallocate leaves "unwritten" extents: the first
    write to each page then costs a slow page fault and every fdatasync of freshly written
    data a journal commit to convert the extents. :meth:`MappedFile.warm_step` removes both
    costs by writing real zeros ahead of the appender in a background thread.

    On a full disk the half-allocated temporary file is removed (its blocks are freed at once)
    and the OSError is raised: the caller reports ``DISK_FULL`` and tries again later.
    """
    tmp = path.with_name(path.name + ALLOC_SUFFIX)
    fd = os.open(tmp, os.O_RDWR | os.O_CREAT | os.O_TRUNC, 0o644)
    try:
        allocate(fd, 0, size_bytes)
        os.fsync(fd)
    except BaseException:
        os.close(fd)
        with contextlib.suppress(OSError):
            os.unlink(tmp)
        raise
    os.close(fd)
    os.replace(tmp, path)
    fsync_dir(path.parent)


def _pwrite_all(fd: int, data: bytes | memoryview, offset: int) -> None:
    """``pwrite`` all of ``data`` at ``offset`` (a regular file takes it in one call unless
    interrupted)."""
    view = memoryview(data)
    while view:
        written = os.pwrite(fd, view, offset)
        if written <= 0:
            raise OSError(f"pwrite wrote {written} bytes")
        view = view[written:]
        offset += written


def _pwritev_all(fd: int, parts: Sequence[bytes], offset: int) -> None:
    """``pwritev`` all of ``parts``, in order, from ``offset`` on: the kernel gathers them
    into the page cache, so a batch's bodies are not joined into one more copy first. In
    ascending order like one ``pwrite`` (a crash leaves a byte prefix of the batch); a short
    write (a signal) finishes the rest of its chunk with ``pwrite``."""
    for at in range(0, len(parts), IOV_MAX):
        chunk = parts[at : at + IOV_MAX]
        want = sum(len(p) for p in chunk)
        written = os.pwritev(fd, chunk, offset)
        if written <= 0 and want:
            raise OSError(f"pwritev wrote {written} bytes")
        if written < want:
            _pwrite_all(fd, memoryview(b"".join(chunk))[written:], offset + written)
        offset += want


def _round_up(value: int, unit: int) -> int:
    return -(-value // unit) * unit


class MappedFile:
    """One fixed-size file mapped read-write in full.

    **Warming.** A background thread may write zeros into the part of the file that the
    appender has not reached (RocketMQ's warmMappedFile): the blocks become written extents
    that stay in the page cache, so the appender's page faults are cheap minor faults and its
    fdatasyncs write data only, without converting unwritten extents. The two never touch the
    same bytes: the appender calls :meth:`reserve` before it writes below a new offset, the
    warmer only claims whole pages at or above the reserved offset, and :meth:`reserve` waits
    while a claim overlaps the bytes asked for. :meth:`close` waits for a running warm step.
    """

    __slots__ = (
        "_appending",
        "_bursting",
        "_claim",
        "_cond",
        "_warmer_busy",
        "closed",
        "fd",
        "mm",
        "path",
        "reserved",
        "size_bytes",
        "start",
        "warmed",
    )

    def __init__(self, path: Path, start: int, size_bytes: int, *, create: bool) -> None:
        if create and not path.exists():
            _create_file(path, size_bytes)
        self.path = path
        self.start = start
        self.size_bytes = size_bytes
        self.closed = False
        self._cond = threading.Condition(threading.Lock())
        self.reserved = size_bytes  # bytes below this may hold data: never warmed
        self.warmed = 0  # the warmer has written zeros up to here (above ``reserved``)
        self._claim = -1  # start of the range the warmer writes now (-1: none)
        self._warmer_busy = False  # the warmer uses ``fd`` now
        self._appending = False  # the appender has reserved bytes in this file
        self._bursting = False  # the warmer is refilling its lead
        self.fd = os.open(path, os.O_RDWR)
        try:
            actual = os.fstat(self.fd).st_size
            if actual < size_bytes:
                # A file cut short (by a crash during allocation or by hand): grow it back,
                # allocated (never sparse: see allocate); the missing bytes read as zeros,
                # which recovery treats as "no data".
                allocate(self.fd, actual, size_bytes - actual)
            elif actual > size_bytes:
                raise ValueError(
                    f"{path} is {actual} bytes, larger than the configured segment size "
                    f"{size_bytes}: is the store opened with a different segment size than it "
                    "was written with?"
                )
            self.mm = mmap.mmap(self.fd, size_bytes, mmap.MAP_SHARED)
        except BaseException:
            os.close(self.fd)
            raise

    @property
    def end(self) -> int:
        return self.start + self.size_bytes

    def allow_warming(self, from_offset: int) -> None:
        """Let the warmer write zeros at and above ``from_offset`` (where no data lies)."""
        with self._cond:
            self.reserved = from_offset
            self.warmed = from_offset

    def reserve(self, end_offset: int, ahead: int = 0) -> None:
        """Keep the warmer out of ``[.., end_offset)``: call before writing data there. Waits
        only while the warmer writes those bytes. Up to ``ahead`` more bytes are reserved
        (fewer calls), but never bytes the warmer is about to warm or has warmed."""
        with self._cond:
            self._appending = True
            while 0 <= self._claim < end_offset:
                self._cond.wait()
            target = end_offset + ahead
            if self.warmed >= end_offset:
                target = min(target, self.warmed)
            if self._claim >= 0:
                target = min(target, self._claim)
            target = min(max(target, end_offset), self.size_bytes)
            if target > self.reserved:
                self.reserved = target

    def _warm_from(self) -> int:
        """Where the next warm step starts (caller holds ``_cond``)."""
        a = max(self.warmed, self.reserved)
        if self._appending:
            a = max(a, self.reserved + WARM_GAP_BYTES)
        return _round_up(a, PAGE_SIZE)

    @property
    def warm_done(self) -> bool:
        with self._cond:
            return self.closed or self._warm_from() >= self.size_bytes

    def warm_step(self, lead: int = WARM_LEAD_BYTES) -> int:
        """Write zeros into the next chunk above what is reserved and warmed, at most ``lead``
        bytes beyond the reserved offset; return the number of bytes written (0 when nothing
        may be warmed now). Warmer thread only."""
        with self._cond:
            if self.closed:
                return 0
            a = self._warm_from()
            if not self._bursting and self._appending and a - self.reserved > lead // 2:
                return 0  # refill the lead only when half of it is used: in bursts
            b = min(a + WARM_CHUNK_BYTES, self.size_bytes, self.reserved + lead)
            if a >= b:
                self._bursting = False
                return 0
            self._bursting = True
            burst_end = b >= self.reserved + lead
            self._claim = a
            self._warmer_busy = True
        written = 0
        try:
            try:
                _pwrite_all(self.fd, _ZEROS[: b - a], a)
                written = b - a
            finally:
                with self._cond:
                    self._claim = -1
                    if written:
                        self.warmed = b
                    self._cond.notify_all()
            if burst_end or b == self.size_bytes or b // WARM_SYNC_BYTES != a // WARM_SYNC_BYTES:
                # Write the zeros now, not inside a group commit. This fdatasync also writes
                # back the appender's dirty pages of the file: a failure may have dropped them
                # while marking them clean, so a later sync would succeed over lost data
                # ("fsyncgate"). Never retried: the process ends.
                try:
                    os.fdatasync(self.fd)
                except OSError as e:
                    fatal("store-warmer", f"FSYNC_FAILED path={self.path} error={e}")
        finally:
            with self._cond:
                self._warmer_busy = False
                self._cond.notify_all()
        return written

    def write(self, offset: int, data: bytes) -> None:
        """Write ``data`` at ``offset`` through the file descriptor (readers see it through
        the mapping: the same page cache). The caller has reserved the range."""
        assert 0 <= offset <= offset + len(data) <= self.reserved
        _pwrite_all(self.fd, data, offset)

    def write_parts(self, offset: int, parts: Sequence[bytes]) -> None:
        """``write`` of the parts' concatenation, without making it (``_pwritev_all``)."""
        assert 0 <= offset <= offset + sum(len(p) for p in parts) <= self.reserved
        _pwritev_all(self.fd, parts, offset)

    def sync(self, start_offset: int, end_offset: int) -> None:
        """msync(MS_SYNC) the pages covering ``[start_offset, end_offset)``."""
        assert 0 <= start_offset <= end_offset <= self.size_bytes
        if end_offset == start_offset:
            return
        aligned = start_offset - start_offset % PAGE_SIZE
        self.mm.flush(aligned, end_offset - aligned)

    def zero(self, start_offset: int, end_offset: int) -> None:
        assert 0 <= start_offset <= end_offset <= self.size_bytes
        chunk = 1 << 20
        off = start_offset
        while off < end_offset:
            n = min(chunk, end_offset - off)
            self.mm[off : off + n] = bytes(n)
            off += n

    def close(self) -> None:
        with self._cond:
            self.closed = True
            while self._warmer_busy:
                self._cond.wait()
        with contextlib.suppress(BufferError, ValueError):
            self.mm.close()
        with contextlib.suppress(OSError):
            os.close(self.fd)

    def delete(self) -> None:
        self.close()
        with contextlib.suppress(FileNotFoundError):
            os.unlink(self.path)


class SegmentAllocator:
    """Creates the next data segment in the background (RocketMQ's AllocateMappedFileService)
    and warms segments (RocketMQ's warmMappedFile, see :class:`MappedFile`).

    At most one request is outstanding and at most one ready file waits to be used, so the
    thread never runs ahead of the log by more than one segment. The ready file is created,
    mapped and handed to the warmer; ``take`` returns it at once (warmed or not: warming goes
    on while the appender writes), and otherwise creates the file in the caller's thread.
    Requests come before warming; files are warmed in the order they were handed over (the
    active segment first).
    """

    def __init__(
        self, directory: Path, size_bytes: int, *, enabled: bool = True, warm: bool = True
    ) -> None:
        self._dir = directory
        self._size = size_bytes
        self._warm = warm and enabled
        self._cond = threading.Condition()
        self._requested: int | None = None  # start position asked for, not yet created
        self._busy: int | None = None  # start position being created right now
        self._ready: MappedFile | None = None  # created and mapped, not yet taken
        self._to_warm: list[MappedFile] = []
        self._stopping = False
        self._thread: threading.Thread | None = None
        self.preallocated_count = 0  # files created ahead of need (for tests and metrics)
        self.warmed_bytes = 0  # zeros written ahead of the appender (for tests and metrics)
        self._poll_s = WARM_POLL_S
        self._warned_s = -WARN_INTERVAL_S  # monotonic time of the last rate-limited warning
        self.allocation_failures = 0  # pre-allocations refused for lack of space (metrics)
        if enabled:
            self._thread = threading.Thread(
                target=guard_thread("segment-allocator", self._run),
                name=f"segment-allocator-{directory.name}",
                daemon=True,
            )
            self._thread.start()

    def _path(self, start: int) -> Path:
        return self._dir / segment_name(start)

    def request(self, start: int) -> None:
        """Ask for the segment starting at ``start`` to be created ahead of time."""
        if self._thread is None:
            return
        with self._cond:
            ready = self._ready.start if self._ready is not None else None
            if start in (self._requested, self._busy, ready):
                return
            self._requested = start
            self._cond.notify_all()

    def warm(self, f: MappedFile, from_offset: int) -> None:
        """Warm ``f`` from ``from_offset`` on (no data lies there) in the background."""
        if not self._warm or self._thread is None:
            return
        f.allow_warming(from_offset)
        with self._cond:
            if f not in self._to_warm:
                self._to_warm.append(f)
            self._cond.notify_all()

    def is_ready(self, start: int) -> bool:
        """Whether the segment starting at ``start`` is created (allocated) and waits to be
        taken: the log may then grow into it without allocating anything."""
        with self._cond:
            return self._ready is not None and self._ready.start == start

    def prepare(self, start: int, *, create: bool = True) -> None:
        """Make the segment starting at ``start`` ready now, creating it in the caller's
        thread if the background thread has not (the store's Raft reserve needs it allocated
        before the log grows near its active segment's end). Raises OSError (``ENOSPC``:
        :func:`is_disk_full`) when it cannot be created; nothing is left behind then. With
        ``create=False`` only wait for the thread's request of ``start`` to be done."""
        deadline = time.monotonic() + PREPARE_WAIT_S
        with self._cond:
            # Never race the thread for ``_ready``; let it finish a request for ``start``.
            while self._busy is not None or (
                self._requested == start and self._thread is not None and not self._stopping
            ):
                left = deadline - time.monotonic()
                if left <= 0:
                    raise OSError(errno.EBUSY, f"segment allocator busy for {PREPARE_WAIT_S} s")
                self._cond.wait(left)
            if not create or (self._ready is not None and self._ready.start == start):
                return
            if self._requested == start:
                self._requested = None
            stale = self._ready
            self._ready = None
        if stale is not None:
            stale.delete()  # a truncation moved the log back past it
        f = MappedFile(self._path(start), start, self._size, create=True)
        with self._cond:
            while self._busy is not None:  # an older request the thread picked up meanwhile
                self._cond.wait()
            other, self._ready = self._ready, f
        if other is not None:
            # The thread made another segment meanwhile (an older request): not the next one.
            if other.start == start:
                other.close()  # the same file as ``f``: unmap it, keep the file
            else:
                other.delete()
        self.warm(f, 0)

    def take(self, start: int) -> MappedFile:
        """The segment starting at ``start``: the pre-allocated one, or a new file."""
        with self._cond:
            while self._busy == start:
                self._cond.wait()
            if self._requested == start:
                self._requested = None
            ready = self._ready
            if ready is not None and ready.start == start:
                self._ready = None
                return ready
        f = MappedFile(self._path(start), start, self._size, create=True)
        self.warm(f, 0)
        return f

    def _run(self) -> None:
        while True:
            with self._cond:
                while self._requested is None and not self._to_warm and not self._stopping:
                    self._cond.wait()
                if self._stopping:
                    return
                start = self._requested
                if start is None:
                    files = list(self._to_warm)
                else:
                    self._requested = None
                    stale = self._ready
                    self._ready = None
                    self._busy = start
            if start is None:
                self._warm_some(files)
                continue
            made: MappedFile | None = None
            path = self._path(start)
            try:
                if stale is not None and stale.start != start:
                    # A truncation moved the log back: the file made earlier is not needed.
                    stale.delete()
                elif stale is not None:
                    made = stale
                if made is None:
                    if not path.exists():
                        _create_file(path, self._size)
                        self.preallocated_count += 1
                        log.debug("preallocated segment path=%s size_bytes=%d", path, self._size)
                    made = MappedFile(path, start, self._size, create=False)
            except OSError as e:
                if not is_disk_full(e):
                    raise  # an I/O error, not a full disk: fatal (guard_thread)
                # The appender creates the file itself when it needs it, and reports DISK_FULL
                # to its caller if the space is still missing then.
                self.allocation_failures += 1
                self._warn("segment preallocation failed path=%s error=%s", path, e)
            if made is not None and self._warm:
                made.allow_warming(0)  # before anyone can take it
            with self._cond:
                self._busy = None
                self._ready = made
                if made is not None and self._warm:
                    self._to_warm.append(made)
                self._cond.notify_all()

    def _warm_some(self, files: list[MappedFile]) -> None:
        """One warm step on the first file (in order) that may be warmed now; if none may,
        wait (WARM_POLL_S, backing off to WARM_POLL_MAX_S) or until a request or close."""
        for f in files:
            try:
                n = f.warm_step()
            except OSError as e:
                if not is_disk_full(e):
                    raise  # an I/O error: fatal (guard_thread)
                # Only slower appends follow: warming is an optimisation (and the file's blocks
                # are allocated, so a full disk here means a file system without fallocate).
                self._warn("segment warming failed path=%s error=%s", f.path, e)
                n = -1
            with self._cond:
                if n > 0:
                    self.warmed_bytes += n
                if (n < 0 or f.warm_done) and f in self._to_warm:
                    self._to_warm.remove(f)
            if n > 0:
                self._poll_s = WARM_POLL_S
                return
        with self._cond:
            if self._requested is None and not self._stopping:
                self._cond.wait(self._poll_s)
        self._poll_s = min(self._poll_s * 2, WARM_POLL_MAX_S)

    def _warn(self, fmt: str, *args: object) -> None:
        now = time.monotonic()
        if now - self._warned_s >= WARN_INTERVAL_S:
            self._warned_s = now
            log.warning(fmt, *args)

    def discard_from(self, start: int) -> None:
        """Forget (and delete) a pre-allocated file at or beyond ``start`` (after truncation)."""
        with self._cond:
            while self._busy is not None:
                self._cond.wait()
            if self._requested is not None and self._requested >= start:
                self._requested = None
            if self._ready is not None and self._ready.start >= start:
                self._ready.delete()
                self._ready = None

    def close(self) -> None:
        """Stop the thread (it finishes the step it is in) and unmap an untaken file."""
        with self._cond:
            self._stopping = True
            self._cond.notify_all()
        if self._thread is not None:
            self._thread.join()
            self._thread = None
        with self._cond:
            if self._ready is not None:
                self._ready.close()
                self._ready = None
            self._to_warm.clear()


def read_marker_fields(path: Path, max_bytes: int) -> dict[str, str] | None:
    """A marker file's ``key=value`` words (one short ASCII line a node wrote for its next
    start); None when there is none. ValueError (UnicodeDecodeError included) when it is
    longer than ``max_bytes`` or a word has no ``=``: the caller picks the safe reading."""
    try:
        with path.open("rb") as f:
            data = f.read(max_bytes + 1)
    except FileNotFoundError:
        return None
    if len(data) > max_bytes:
        raise ValueError("too long")
    return dict(word.split("=", 1) for word in data.decode("ascii").split())
