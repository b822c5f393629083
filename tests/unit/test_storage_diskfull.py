"""The log store on a full disk and on failing fsyncs.

ENOSPC is refused cleanly (``DiskFullError``, nothing of the batch written) and recovered from
by itself; hard state and checkpoints use the space reserve; no file is ever sparse (a write
through a mapping would SIGBUS); a failed fsync, the flusher, the allocator and the warmer end
the process (``prockit.fatal``) instead of being retried or dying silently. Fakes make the
failures exact; one test uses a real tiny ext4 file system on a loop device.
"""

from __future__ import annotations

import errno
import os
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
from loopfs import fill, loop_unavailable, mount_loop_fs, unmount

from dledger import failpoints
from dledger.log import Entry, HardState
from dledger.storage import DiskFullError, files
from dledger.storage import meta as meta_mod
from dledger.storage import reserve as reserve_mod
from dledger.storage.store import (
    RESERVE_FILE,
    FlushDiskType,
    SegmentedLogStore,
    StoreConfig,
)
from prockit import fatal as fatal_mod

SEG = 64 * 1024
CFG = StoreConfig(segment_size_bytes=SEG, index_segment_size_bytes=SEG, reserve_bytes=64 * 1024)
BODY = b"x" * 1000
WAIT_S = 5.0


def _entries(first: int, n: int, term: int = 1) -> list[Entry]:
    return [Entry(term, i, BODY + i.to_bytes(4, "big")) for i in range(first, first + n)]


class Fatal(Exception):
    """Raised by the patched exit: fatal() was called."""


@pytest.fixture
def fatal_calls(monkeypatch: pytest.MonkeyPatch) -> list[int]:
    """fatal() records its exit code and raises Fatal instead of ending the test process
    (in a thread, the thread then ends; its excepthook is told to ignore Fatal)."""
    calls: list[int] = []

    def exit_(code: int) -> None:
        calls.append(code)
        raise Fatal(code)

    monkeypatch.setattr(fatal_mod, "_exit", exit_)
    old_hook = threading.excepthook

    def hook(args: threading.ExceptHookArgs) -> None:
        if args.exc_type is not Fatal:
            old_hook(args)

    monkeypatch.setattr(threading, "excepthook", hook)
    return calls


class NoSpace:
    """Makes posix_fallocate (and optionally atomic writes) fail with ENOSPC while on."""

    def __init__(self, monkeypatch: pytest.MonkeyPatch) -> None:
        self.on = False
        real = os.posix_fallocate

        def fallocate(fd: int, offset: int, length: int) -> None:
            if self.on:
                raise OSError(errno.ENOSPC, "No space left on device")
            real(fd, offset, length)

        monkeypatch.setattr(os, "posix_fallocate", fallocate)


@pytest.fixture
def nospace(monkeypatch: pytest.MonkeyPatch) -> NoSpace:
    return NoSpace(monkeypatch)


def _wait(cond: Callable[[], bool], what: str) -> None:
    deadline = time.monotonic() + WAIT_S
    while time.monotonic() < deadline:
        if cond():
            return
        time.sleep(0.01)
    raise AssertionError(f"timed out waiting for {what}")


# ---------------------------------------------------------------- no sparse files


def test_a_full_disk_fails_file_creation_instead_of_making_a_sparse_file(
    tmp_path: Path, nospace: NoSpace
) -> None:
    nospace.on = True
    path = tmp_path / "00000000000000000000"
    with pytest.raises(OSError) as info:
        files.MappedFile(path, 0, SEG, create=True)
    assert files.is_disk_full(info.value)
    assert list(tmp_path.iterdir()) == []  # neither the file nor its .alloc temp


def test_without_fallocate_support_blocks_are_written(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    def unsupported(fd: int, offset: int, length: int) -> None:
        raise OSError(errno.EOPNOTSUPP, "Operation not supported")

    monkeypatch.setattr(os, "posix_fallocate", unsupported)
    f = files.MappedFile(tmp_path / "00000000000000000000", 0, SEG, create=True)
    try:
        assert os.fstat(f.fd).st_blocks * 512 >= SEG  # allocated, not sparse
    finally:
        f.close()


def test_a_short_file_is_grown_allocated(tmp_path: Path) -> None:
    path = tmp_path / "00000000000000000000"
    path.write_bytes(b"\1" * 4096)
    f = files.MappedFile(path, 0, SEG, create=False)
    try:
        assert os.fstat(f.fd).st_blocks * 512 >= SEG
    finally:
        f.close()


# ---------------------------------------------------------------- appends


def test_an_append_needing_a_segment_on_a_full_disk_writes_nothing_and_resumes(
    tmp_path: Path, nospace: NoSpace
) -> None:
    cfg = StoreConfig(
        segment_size_bytes=SEG, index_segment_size_bytes=SEG, preallocate=False, reserve_bytes=0
    )
    s = SegmentedLogStore(tmp_path / "s", cfg)
    try:
        s.append(_entries(1, 40))  # 40 KiB of the first 64 KiB segment
        pos = s.write_position
        nospace.on = True
        with pytest.raises(DiskFullError) as info:
            s.append(_entries(41, 40))  # would roll into a second segment
        assert info.value.code == "DISK_FULL" and "new data segment" in str(info.value)
        assert (s.last_index(), s.write_position, s.segment_count) == (40, pos, 1)
        assert s.flush() == 40
        s.write_checkpoint(40, 40)
        assert s.read(40).body == _entries(40, 1)[0].body
        assert s.disk_full_count == 1
        nospace.on = False  # space is back: the same append succeeds
        s.append(_entries(41, 40))
        s.flush()
    finally:
        s.close()
    s = SegmentedLogStore(tmp_path / "s", cfg)
    try:
        assert s.last_index() == 80 and s.verify() == 80
    finally:
        s.close()


def test_an_append_needing_an_index_file_on_a_full_disk_writes_nothing(
    tmp_path: Path, nospace: NoSpace
) -> None:
    cfg = StoreConfig(
        segment_size_bytes=SEG, index_segment_size_bytes=SEG, preallocate=False, reserve_bytes=0
    )
    s = SegmentedLogStore(tmp_path / "s", cfg)
    try:
        # 64 KiB of index holds records 0..2047; bodies of 1 byte keep the data in one segment.
        s.append([Entry(1, i, b"a") for i in range(1, 2040)])
        nospace.on = True
        with pytest.raises(DiskFullError, match="new index file"):
            s.append([Entry(1, i, b"a") for i in range(2040, 2060)])
        assert s.last_index() == 2039
        nospace.on = False
        s.append([Entry(1, i, b"a") for i in range(2040, 2060)])
        assert s.read(2059).body == b"a"
    finally:
        s.close()


# ---------------------------------------------------------------- the reserve


def test_hard_state_and_checkpoint_use_the_reserve_then_it_is_rearmed(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    s = SegmentedLogStore(tmp_path / "s", CFG)
    try:
        assert s.reserve_held and (tmp_path / "s" / RESERVE_FILE).stat().st_size == 64 * 1024
        real = files.atomic_write
        fail = {"n": 0}

        def full_until_reserve_gone(path: Path, data: bytes) -> None:
            if (tmp_path / "s" / RESERVE_FILE).exists():
                fail["n"] += 1
                raise OSError(errno.ENOSPC, "No space left on device")
            real(path, data)

        monkeypatch.setattr(meta_mod, "atomic_write", full_until_reserve_gone)
        s.save_hard_state(HardState(term=7, voted_for="n1"))
        assert fail["n"] == 1 and not s.reserve_held
        assert s.load_hard_state() == HardState(term=7, voted_for="n1")
        monkeypatch.setattr(meta_mod, "atomic_write", real)
        monkeypatch.setattr(reserve_mod, "RESERVE_RETRY_S", 0.0)
        s.write_checkpoint(0, 0)  # re-arms the reserve once the disk has room
        assert s.reserve_held and (tmp_path / "s" / RESERVE_FILE).exists()
    finally:
        s.close()


def test_no_space_even_after_the_reserve(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    s = SegmentedLogStore(tmp_path / "s", CFG)
    try:
        s.append(_entries(1, 3))

        def full(path: Path, data: bytes) -> None:
            raise OSError(errno.ENOSPC, "No space left on device")

        monkeypatch.setattr(meta_mod, "atomic_write", full)
        with pytest.raises(DiskFullError, match="meta"):
            s.save_hard_state(HardState(term=2))
        s.write_checkpoint(3, 3)  # a periodic checkpoint is skipped, never raised
        assert s.flush() == 3
        monkeypatch.undo()
    finally:
        s.close()


# ---------------------------------------------------------------- fail fast


def test_a_failed_fsync_is_fatal_and_never_retried(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, fatal_calls: list[int]
) -> None:
    s = SegmentedLogStore(tmp_path / "s", CFG)
    s.append(_entries(1, 3))
    calls = []

    def eio(fd: int) -> None:
        calls.append(fd)
        raise OSError(errno.EIO, "Input/output error")

    monkeypatch.setattr(os, "fdatasync", eio)
    with pytest.raises(Fatal):
        s.flush()
    assert fatal_calls == [fatal_mod.EXIT_FATAL] and len(calls) == 1
    monkeypatch.undo()
    s.close()


def test_the_flusher_thread_is_fatal_on_an_unexpected_error(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, fatal_calls: list[int]
) -> None:
    cfg = StoreConfig(
        segment_size_bytes=SEG,
        index_segment_size_bytes=SEG,
        flush_disk_type=FlushDiskType.ASYNC_FLUSH,
        flush_interval_ms=10,
    )
    s = SegmentedLogStore(tmp_path / "s", cfg)
    try:
        s.append(_entries(1, 3))
        monkeypatch.setattr(failpoints, "_armed", {"flush": 1})
        monkeypatch.setattr(failpoints, "_hits", {})
        _wait(lambda: bool(fatal_calls), "the flusher's failure to be fatal")
    finally:
        monkeypatch.setattr(failpoints, "_armed", {})
        s.close()


def test_the_flush_failpoint_is_hit_on_the_sync_path(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    s = SegmentedLogStore(tmp_path / "s", CFG)
    try:
        s.append(_entries(1, 3))
        monkeypatch.setattr(failpoints, "_armed", {"flush": 1})
        monkeypatch.setattr(failpoints, "_hits", {})
        with pytest.raises(failpoints.FailpointError):
            s.flush()
        monkeypatch.setattr(failpoints, "_armed", {})
        assert s.flush() == 3
    finally:
        s.close()


def test_the_allocator_thread_is_fatal_on_an_io_error_but_not_on_enospc(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, fatal_calls: list[int]
) -> None:
    errors = [OSError(errno.ENOSPC, "No space left on device"), OSError(errno.EIO, "I/O")]

    def create(path: Path, size_bytes: int) -> None:
        raise errors.pop(0)

    monkeypatch.setattr(files, "_create_file", create)
    alloc = files.SegmentAllocator(tmp_path, SEG, warm=False)
    try:
        alloc.request(SEG)
        _wait(lambda: alloc.allocation_failures == 1, "the ENOSPC to be counted")
        assert not fatal_calls
        alloc.request(2 * SEG)
        _wait(lambda: bool(fatal_calls), "the EIO to be fatal")
    finally:
        alloc.close()


def test_a_failed_warmer_fdatasync_is_fatal(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, fatal_calls: list[int]
) -> None:
    f = files.MappedFile(tmp_path / "00000000000000000000", 0, SEG, create=True)
    try:
        f.allow_warming(0)

        def eio(fd: int) -> None:
            raise OSError(errno.EIO, "Input/output error")

        monkeypatch.setattr(os, "fdatasync", eio)
        with pytest.raises(Fatal):
            f.warm_step()
        assert fatal_calls == [fatal_mod.EXIT_FATAL]
    finally:
        monkeypatch.undo()
        f.close()


# ---------------------------------------------------------------- a real full disk


@pytest.fixture
def tiny_fs(tmp_path: Path) -> Iterator[Path]:
    why = loop_unavailable()
    if why:
        pytest.skip(why)
    mnt = tmp_path / "mnt"
    mount_loop_fs(tmp_path / "fs.img", mnt, 16)
    try:
        yield mnt
    finally:
        unmount(mnt)


def test_a_real_full_disk(tiny_fs: Path) -> None:
    cfg = StoreConfig(
        segment_size_bytes=256 * 1024, index_segment_size_bytes=SEG, reserve_bytes=256 * 1024
    )
    s = SegmentedLogStore(tiny_fs / "s", cfg)
    filler = tiny_fs / "filler"
    try:
        fill(filler, 600 * 1024)  # room for about two more segments
        last = 0
        with pytest.raises(DiskFullError):
            for _ in range(200):  # bounded: 200 x 16 KiB is far more than the free space
                last = s.append(_entries(last + 1, 16))
        assert s.last_index() == last
        s.save_hard_state(HardState(term=3, voted_for="n0"))  # the reserve covers it
        s.write_checkpoint(last, last)
        assert s.flush() == last
        filler.unlink()  # space returns: appends go on, nothing restarted
        s.append(_entries(last + 1, 64))
        s.flush()
    finally:
        s.close()
    s = SegmentedLogStore(tiny_fs / "s", cfg)
    try:
        assert s.verify() == last + 64
        assert s.load_hard_state() == HardState(term=3, voted_for="n0")
    finally:
        s.close()


def test_retention_on_a_full_disk_deletes_nothing_and_keeps_the_log_readable(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    s = SegmentedLogStore(tmp_path / "s", CFG)
    try:
        s.append(_entries(1, 200))  # about 4 segments of 64 KiB
        s.flush()
        segments = s.segment_count

        def full(path: Path, data: bytes) -> None:
            raise OSError(errno.ENOSPC, "No space left on device")

        monkeypatch.setattr(meta_mod, "atomic_write", full)
        s._reserve.release("test")  # the reserve is gone already
        with pytest.raises(DiskFullError):
            s.delete_prefix(100)
        assert (s.first_index(), s.segment_count) == (1, segments)
        assert s.read(1).body == _entries(1, 1)[0].body
        monkeypatch.undo()
        assert s.delete_prefix(100) > 1
    finally:
        s.close()
