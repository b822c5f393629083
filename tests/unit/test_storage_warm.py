"""Segment warming (zeros written ahead of the appender), the pre-allocated segment hand-over,
thread and mapping clean-up on close, and batch encoding."""

from __future__ import annotations

import random
import shutil
import threading
import time
from pathlib import Path

import pytest

from dledger.log import Entry
from dledger.storage import files
from dledger.storage.codec import ENTRY_HEADER_SIZE
from dledger.storage.files import MappedFile
from dledger.storage.store import SegmentedLogStore, StoreConfig

SEG = 1 << 20
CFG = StoreConfig(
    segment_size_bytes=SEG, index_segment_size_bytes=64 * 1024, checkpoint_interval_ms=10**9
)


def body_of(i: int, size: int) -> bytes:
    return (i.to_bytes(4, "big") * (size // 4 + 1))[:size]


def wait_until(cond: object, timeout: float = 10.0) -> None:
    deadline = time.monotonic() + timeout
    while not cond() and time.monotonic() < deadline:  # type: ignore[operator]
        time.sleep(0.002)
    assert cond(), "timed out"  # type: ignore[operator]


def mapped_paths() -> str:
    return Path("/proc/self/maps").read_text()


def test_active_segment_is_warmed_ahead_without_touching_data(tmp_path: Path) -> None:
    seg_size = 16 * SEG
    cfg = StoreConfig(segment_size_bytes=seg_size, index_segment_size_bytes=64 * 1024)
    s = SegmentedLogStore(tmp_path / "s", cfg)
    s.append([Entry(1, i, body_of(i, 1000)) for i in range(1, 11)])
    seg = s._segments[-1]
    alloc = s._allocator
    assert alloc is not None
    wait_until(lambda: seg.warmed == seg_size and alloc.warmed_bytes > 0)
    assert seg.warm_done
    for i in range(1, 11):
        assert s.read(i).body == body_of(i, 1000)
    # everything after the data is zeros, and new appends land in the warmed pages
    end = s.write_position
    assert bytes(seg.mm[end:seg_size]) == bytes(seg_size - end)
    s.append([Entry(1, 11, body_of(11, 5000))])
    assert s.read(11).body == body_of(11, 5000)
    assert s.verify() == 11
    s.close()


def test_warmer_and_appender_interleave_safely(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # Tiny chunks and lead: the warmer and the appender meet often inside one segment.
    monkeypatch.setattr(files, "WARM_CHUNK_BYTES", 8192)
    monkeypatch.setattr(files, "WARM_SYNC_BYTES", 65536)
    monkeypatch.setattr(files, "WARM_LEAD_BYTES", 32768)
    monkeypatch.setattr(files, "WARM_POLL_S", 0.0005)
    monkeypatch.setattr(files, "WARM_POLL_MAX_S", 0.001)
    monkeypatch.setattr(files, "WARM_GAP_BYTES", 0)  # no gap: the appender waits on claims
    rng = random.Random(7)
    s = SegmentedLogStore(tmp_path / "s", CFG)
    sizes: list[int] = []
    index = 0
    while sum(sizes) < 6 * SEG:
        batch = [rng.choice([1, 100, 3000, 20000]) for _ in range(rng.randint(1, 40))]
        s.append_bodies(1, [body_of(index + 1 + k, n) for k, n in enumerate(batch)])
        sizes += batch
        index += len(batch)
        if rng.random() < 0.2:
            time.sleep(0.001)  # let the warmer get ahead now and then
    assert s.segment_count >= 6
    assert s._allocator is not None and s._allocator.warmed_bytes > 0
    assert s.verify() == index
    s.close()
    s = SegmentedLogStore(tmp_path / "s", CFG)
    assert s.last_index() == index
    for i in range(1, index + 1):
        assert s.read(i).body == body_of(i, sizes[i - 1]), i
    s.close()


def test_preallocated_segment_object_is_handed_over(tmp_path: Path) -> None:
    s = SegmentedLogStore(tmp_path / "s", CFG)
    s.append([Entry(1, 1, body_of(1, SEG // 2 + 10))])  # past half: the next one is made
    alloc = s._allocator
    assert alloc is not None
    wait_until(lambda: alloc._ready is not None)
    ready = alloc._ready
    assert isinstance(ready, MappedFile) and ready.start == SEG
    wait_until(lambda: ready.warmed > 0)  # warmed while it waits
    s.append([Entry(1, 2, body_of(2, SEG // 2 + 10))])  # does not fit: rolls
    assert s.segment_count == 2 and s._segments[-1] is ready
    assert alloc.preallocated_count == 1
    assert s.read(2).body == body_of(2, SEG // 2 + 10)
    s.close()


def test_close_stops_threads_and_unmaps_everything(tmp_path: Path) -> None:
    root = tmp_path / "s"
    s = SegmentedLogStore(root, CFG)
    s.append([Entry(1, 1, body_of(1, SEG // 2 + 10))])
    assert s._allocator is not None
    wait_until(lambda: s._allocator is not None and s._allocator._ready is not None)
    s.flush()
    names = {t.name for t in threading.enumerate()}
    assert any(n.startswith("segment-allocator") for n in names)
    assert str(root) in mapped_paths()
    s.close()
    names = {t.name for t in threading.enumerate()}
    assert not any(n.startswith("segment-allocator") for n in names)
    assert str(root) not in mapped_paths()  # the ready (untaken) segment is unmapped too


def test_truncation_discards_a_warming_ready_segment(tmp_path: Path) -> None:
    s = SegmentedLogStore(tmp_path / "s", CFG)
    s.append([Entry(1, 1, body_of(1, SEG // 2 + 10))])
    s.append([Entry(1, 2, body_of(2, SEG // 2 + 10))])  # second segment
    s.append([Entry(1, 3, body_of(3, SEG // 2 + 10))])  # third segment, fourth being made
    s.truncate_suffix(2)
    assert s.last_index() == 1 and s.segment_count == 2  # the one holding position of 2
    s.append([Entry(2, 2, body_of(22, 1000))])
    assert s.read(2).body == body_of(22, 1000)
    s.close()
    s = SegmentedLogStore(tmp_path / "s", CFG)
    assert s.last_index() == 2 and s.read(2).body == body_of(22, 1000)
    s.close()


def test_no_warming_when_disabled(tmp_path: Path) -> None:
    s = SegmentedLogStore(tmp_path / "s", StoreConfig(segment_size_bytes=SEG, warm_segments=False))
    s.append([Entry(1, 1, body_of(1, 100))])
    time.sleep(0.05)
    assert s._allocator is not None and s._allocator.warmed_bytes == 0
    s.close()


def test_a_batch_cut_in_the_middle_keeps_its_whole_entries(tmp_path: Path) -> None:
    # One batch is copied into the mapping at once: a process crash leaves a prefix of it.
    s = SegmentedLogStore(tmp_path / "live", CFG)
    s.append([Entry(1, i, body_of(i, 100)) for i in range(1, 4)])
    s.flush()
    s.write_checkpoint(0, 0)
    s.append([Entry(1, i, body_of(i, 100)) for i in range(4, 10)])
    size = ENTRY_HEADER_SIZE + 100
    for cut_entry, kept in [(4, 0), (6, 30), (6, size - 1), (9, ENTRY_HEADER_SIZE)]:
        root = tmp_path / f"cut-{cut_entry}-{kept}"
        shutil.copytree(s.root, root, ignore=shutil.ignore_patterns("*.alloc"))
        cut = (cut_entry - 1) * size + kept
        with open(root / "commitlog" / f"{0:020d}", "r+b") as f:
            f.seek(cut)
            f.write(bytes(9 * size - cut))
        r = SegmentedLogStore(root, CFG)
        assert r.last_index() == cut_entry - 1
        for i in range(1, cut_entry):
            assert r.read(i).body == body_of(i, 100)
        r.close()
    s.close()


def test_a_batch_copied_but_not_yet_validated_is_a_torn_tail(tmp_path: Path) -> None:
    # A crash after the batch's bytes are copied but before (some of) the magics are set:
    # whatever order memcpy stored the bytes in, no entry of the batch is valid beyond the
    # ones whose magic was set, so recovery sees a torn tail, never a hole in the log.
    s = SegmentedLogStore(tmp_path / "live", CFG)
    s.append([Entry(1, i, body_of(i, 100)) for i in range(1, 4)])
    s.flush()
    s.write_checkpoint(0, 0)
    s.append([Entry(1, i, body_of(i, 100)) for i in range(4, 10)])
    size = ENTRY_HEADER_SIZE + 100
    for magics_set, head_lost in [(0, False), (0, True), (2, False), (5, True)]:
        root = tmp_path / f"m-{magics_set}-{head_lost}"
        shutil.copytree(s.root, root, ignore=shutil.ignore_patterns("*.alloc"))
        with open(root / "commitlog" / f"{0:020d}", "r+b") as f:
            for i in range(4 + magics_set, 10):
                f.seek((i - 1) * size)
                f.write(bytes(4))
            if head_lost:  # the first bytes of the first unset entry were not stored either
                f.seek((4 + magics_set - 1) * size)
                f.write(bytes(32))
        r = SegmentedLogStore(root, CFG)
        assert r.last_index() == 3 + magics_set
        for i in range(1, 4 + magics_set):
            assert r.read(i).body == body_of(i, 100)
        r.close()
    s.close()
