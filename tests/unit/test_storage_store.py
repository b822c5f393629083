"""SegmentedLogStore: API, segment boundaries, metadata, locking, flushing."""

from __future__ import annotations

import os
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from dledger.log import (
    CorruptLogError,
    Entry,
    HardState,
    IndexOutOfRangeError,
    LogCompactedError,
    LogStore,
)
from dledger.storage import codec
from dledger.storage.codec import BLANK_SIZE, ENTRY_HEADER_SIZE, ItemKind
from dledger.storage.store import (
    FlushDiskType,
    SegmentedLogStore,
    StoreClosedError,
    StoreConfig,
    StoreLockedError,
)

SEG = 64 * 1024
SMALL = StoreConfig(segment_size_bytes=SEG, index_segment_size_bytes=SEG)


@pytest.fixture
def store(tmp_path: Path) -> Iterator[SegmentedLogStore]:
    s = SegmentedLogStore(tmp_path / "s", SMALL)
    yield s
    s.close()


def body_of(i: int, size: int) -> bytes:
    return (i.to_bytes(4, "big") * (size // 4 + 1))[:size]


def entries(start: int, sizes: list[int], term: int = 1) -> list[Entry]:
    return [Entry(term, start + k, body_of(start + k, n)) for k, n in enumerate(sizes)]


def data_files(root: Path) -> list[str]:
    names = (p.name for p in (root / "commitlog").iterdir())
    return sorted(n for n in names if not n.endswith(".alloc"))


def test_satisfies_logstore_protocol(store: SegmentedLogStore) -> None:
    s: LogStore = store
    assert (s.first_index(), s.last_index(), s.last_term(), s.term_at(0)) == (1, 0, 0, 0)
    assert s.read_range(1, 100) == []
    assert s.load_hard_state() == HardState()


def test_layout(tmp_path: Path) -> None:
    root = tmp_path / "dledger-n0"
    s = SegmentedLogStore(root, SMALL)
    s.append(entries(1, [10]))
    names = {p.name for p in root.iterdir()}
    assert {"commitlog", "index", "checkpoint", "abort", "lock"} <= names
    assert data_files(root)[0] == "00000000000000000000"
    s.save_hard_state(HardState(2, "n1"))
    s.close()
    assert not (root / "abort").exists()
    assert (root / "meta").exists()


def test_append_read_term_at(store: SegmentedLogStore) -> None:
    assert store.append([*entries(1, [0, 5, 100]), Entry(2, 4, b"x", type=17)]) == 4
    assert store.last_term() == 2
    assert store.read(2) == Entry(1, 2, body_of(2, 5))
    assert store.read(4) == Entry(2, 4, b"x", 17)
    assert [store.term_at(i) for i in range(5)] == [0, 1, 1, 1, 2]
    with pytest.raises(IndexOutOfRangeError):
        store.read(5)
    with pytest.raises(IndexOutOfRangeError):
        store.term_at(5)
    with pytest.raises(LogCompactedError):
        store.read(0)


def test_append_validates_batch_before_writing(store: SegmentedLogStore) -> None:
    store.append(entries(1, [1], term=3))
    with pytest.raises(ValueError):
        store.append([Entry(3, 2, b""), Entry(3, 4, b"")])
    with pytest.raises(ValueError):
        store.append([Entry(2, 2, b"")])
    with pytest.raises(ValueError):
        store.append([Entry(3, 2, b"x" * SEG)])
    with pytest.raises(ValueError):
        store.append([Entry(3, 2, b"", type=300)])
    assert store.last_index() == 1
    assert store.append_bodies(4, [b"a", b"b"]) == 3
    assert store.read(3) == Entry(4, 3, b"b")


def test_read_range_limits(store: SegmentedLogStore) -> None:
    store.append(entries(1, [100] * 10))
    assert [e.index for e in store.read_range(3, 250)] == [3, 4]
    assert [e.index for e in store.read_range(3, 1)] == [3]  # at least one
    assert [e.index for e in store.read_range(3, 10**9, max_count=3)] == [3, 4, 5]
    assert store.read_range(11, 100) == []
    with pytest.raises(IndexOutOfRangeError):
        store.read_range(12, 100)


def test_read_raw_batch(store: SegmentedLogStore) -> None:
    store.append(entries(1, [1000] * 200))  # spans several 64 KiB segments
    raw, count = store.read_raw(1, 10_000)
    assert count == 9 and len(raw) == 9 * 1048
    got = list(codec.iter_entries(raw))
    assert got == [store.read(i) for i in range(1, 10)]
    total = 0
    index = 1
    while index <= 200:  # the whole log moves as raw batches, never straddling segments
        raw, count = store.read_raw(index, 1 << 20)
        assert count >= 1
        assert [e.index for e in codec.iter_entries(raw)] == list(range(index, index + count))
        index += count
        total += 1
    assert total == store.segment_count
    assert store.read_raw(201, 100) == (b"", 0)


def max_body_in(space: int) -> int:
    return space - ENTRY_HEADER_SIZE


@pytest.mark.parametrize(
    ("first_fill", "expect_blank"),
    [
        (SEG, False),  # entries exactly fill the segment: no blank, no padding
        (SEG - BLANK_SIZE, True),  # room for exactly a blank record
        (SEG - BLANK_SIZE + 1, False),  # fewer bytes than a blank header: zero padding
        (SEG - 1, False),  # one byte left
    ],
)
def test_segment_boundaries(tmp_path: Path, first_fill: int, expect_blank: bool) -> None:
    root = tmp_path / "s"
    s = SegmentedLogStore(root, SMALL)
    # one big entry ending at first_fill, then one that cannot fit in the rest
    s.append([Entry(1, 1, b"a" * max_body_in(first_fill))])
    assert s.write_position == first_fill
    s.append([Entry(1, 2, b"b" * 100)])
    assert s.segment_count == 2
    assert s.write_position == SEG + 148
    assert s.read(2).body == b"b" * 100
    s.flush()
    seg0 = (root / "commitlog" / "00000000000000000000").read_bytes()
    items = list(codec.iter_segment(seg0, 0))
    kinds = [i.kind for i in items]
    assert kinds[0] is ItemKind.ENTRY
    assert kinds[1] is (ItemKind.BLANK if expect_blank else ItemKind.PADDING)
    if not expect_blank:
        assert seg0[first_fill:] == bytes(SEG - first_fill)
    s.close()
    s = SegmentedLogStore(root, SMALL)
    assert [s.read(i).body for i in (1, 2)] == [b"a" * max_body_in(first_fill), b"b" * 100]
    s.append([Entry(1, 3, b"c")])
    assert s.write_position == SEG + 148 + 49
    s.close()


def test_one_byte_too_many_goes_to_next_segment(store: SegmentedLogStore) -> None:
    store.append([Entry(1, 1, b"a" * 1000)])
    rest = SEG - 1048
    store.append([Entry(1, 2, b"b" * (rest - ENTRY_HEADER_SIZE + 1))])
    assert store.segment_count == 2
    assert store.write_position == SEG + rest + 1
    assert store.read(2).body == b"b" * (rest - ENTRY_HEADER_SIZE + 1)


def test_largest_entry_fits_a_segment(store: SegmentedLogStore) -> None:
    big = b"z" * (SEG - ENTRY_HEADER_SIZE)
    store.append([Entry(1, 1, b"x"), Entry(1, 2, big), Entry(1, 3, big)])
    assert store.segment_count == 3
    assert store.read(3).body == big


def test_truncate_suffix(store: SegmentedLogStore) -> None:
    store.append(entries(1, [3000] * 60))  # 3 segments
    segs = store.segment_count
    store.truncate_suffix(10)
    assert (store.last_index(), store.last_term()) == (9, 1)
    assert store.segment_count == 1 < segs
    with pytest.raises(IndexOutOfRangeError):
        store.read(10)
    store.append(entries(10, [7], term=2))
    assert store.read(10) == Entry(2, 10, body_of(10, 7))
    store.truncate_suffix(11)  # no-op: nothing at 11
    with pytest.raises(IndexOutOfRangeError):
        store.truncate_suffix(12)
    store.truncate_suffix(1)
    assert (store.first_index(), store.last_index(), store.last_term()) == (1, 0, 0)


def test_truncate_at_segment_start(store: SegmentedLogStore) -> None:
    store.append(entries(1, [30000, 30000, 30000]))  # entry 3 starts segment 2
    assert store.segment_count == 2
    store.truncate_suffix(3)
    assert store.write_position == SEG
    store.append(entries(3, [10], term=5))
    assert store.read(3).term == 5 and store.read(2).body == body_of(2, 30000)


def test_delete_prefix_keeps_term_of_last_deleted(store: SegmentedLogStore) -> None:
    es = [Entry(1 + i // 20, 1 + i, body_of(1 + i, 3000)) for i in range(100)]
    store.append(es)
    before = store.segment_count
    assert store.delete_prefix(1) == 1  # nothing wholly <= 1
    first = store.delete_prefix(50)
    assert store.segment_count < before
    assert 1 < first <= 51
    assert store.first_index() == first
    assert store.term_at(first - 1) == es[first - 2].term
    with pytest.raises(LogCompactedError):
        store.term_at(first - 2)
    with pytest.raises(LogCompactedError):
        store.read(first - 1)
    assert store.read(first) == es[first - 1]
    # never deletes the active segment, even when asked for everything
    store.delete_prefix(10**9)
    assert store.segment_count == 1
    assert store.read(100) == es[99]


def test_delete_everything_then_reopen(tmp_path: Path) -> None:
    root = tmp_path / "s"
    s = SegmentedLogStore(root, SMALL)
    s.append([Entry(4, 1, b"a" * (SEG - ENTRY_HEADER_SIZE))])  # fills segment 0 exactly
    s.append([Entry(5, 2, b"b")])
    s.truncate_suffix(2)  # segment 1 is now empty: the log ends exactly at its start
    assert s.delete_prefix(1) == 2  # segment 0 goes, the empty active one stays
    assert (s.first_index(), s.last_index(), s.term_at(1)) == (2, 1, 4)
    s.close()
    s = SegmentedLogStore(root, SMALL)
    assert (s.first_index(), s.last_index(), s.last_term(), s.term_at(1)) == (2, 1, 4, 4)
    s.append([Entry(6, 2, b"c")])
    assert s.read(2).body == b"c"
    s.close()


def test_reopen_many_segments_and_index_files(tmp_path: Path) -> None:
    root = tmp_path / "s"
    s = SegmentedLogStore(root, SMALL)
    n = 5000  # 5000 index records = 5 index files of 1024 records
    s.append([Entry(1, i, body_of(i, i % 50)) for i in range(1, n + 1)])
    s.close()
    assert len(list((root / "index").iterdir())) == 5
    s = SegmentedLogStore(root, SMALL)
    assert s.last_index() == n
    assert all(s.read(i).body == body_of(i, i % 50) for i in range(1, n + 1))
    assert s.verify() == n
    s.close()


def test_lock_second_open_fails(tmp_path: Path) -> None:
    root = tmp_path / "s"
    s = SegmentedLogStore(root, SMALL)
    with pytest.raises(StoreLockedError) as e:
        SegmentedLogStore(root, SMALL)
    assert e.value.code == "STORE_LOCKED"
    s.close()
    SegmentedLogStore(root, SMALL).close()  # released on close


def test_lock_held_against_another_process(tmp_path: Path) -> None:
    root = tmp_path / "s"
    s = SegmentedLogStore(root, SMALL)
    child = (
        "import sys\n"
        "from dledger.storage.store import SegmentedLogStore, StoreLockedError\n"
        "try:\n"
        "    SegmentedLogStore(sys.argv[1])\n"
        "except StoreLockedError as e:\n"
        "    print(e.code)\n"
        "    sys.exit(3)\n"
    )
    env = {**os.environ, "PYTHONPATH": str(Path(__file__).resolve().parents[2])}
    r = subprocess.run(
        [sys.executable, "-c", child, str(root)], capture_output=True, env=env, timeout=60
    )
    assert (r.returncode, r.stdout.strip()) == (3, b"STORE_LOCKED"), r.stderr
    s.close()


def test_closed_store_refuses(tmp_path: Path) -> None:
    s = SegmentedLogStore(tmp_path / "s", SMALL)
    s.close()
    s.close()  # idempotent
    with pytest.raises(StoreClosedError):
        s.append(entries(1, [1]))
    with pytest.raises(StoreClosedError):
        s.read(1)


def test_hard_state_round_trip_and_atomicity(tmp_path: Path) -> None:
    root = tmp_path / "s"
    s = SegmentedLogStore(root, SMALL)
    s.save_hard_state(HardState(3, "n2"))
    s.save_hard_state(HardState(4, None))
    s.close()
    s = SegmentedLogStore(root, SMALL)
    assert s.load_hard_state() == HardState(4, None)
    # A crash between writing the temp file and the rename leaves the old state in force.
    (root / "meta.tmp").write_bytes(b"half-written garbage")
    assert s.load_hard_state() == HardState(4, None)
    s.save_hard_state(HardState(5, "n0"))
    assert not (root / "meta.tmp").exists()
    assert s.load_hard_state() == HardState(5, "n0")
    # A corrupt file is reported, never read as a default.
    data = bytearray((root / "meta").read_bytes())
    data[9] ^= 1
    (root / "meta").write_bytes(bytes(data))
    with pytest.raises(CorruptLogError) as e:
        s.load_hard_state()
    assert e.value.path.endswith("meta")
    s.close()


def test_checkpoint_round_trip(tmp_path: Path) -> None:
    root = tmp_path / "s"
    s = SegmentedLogStore(root, SMALL)
    s.append(entries(1, [100] * 5))
    s.flush()
    s.write_checkpoint(commit_index=4, applied_index=3)
    c = s.read_checkpoint()
    assert (c.commit_index, c.applied_index, c.flushed_index) == (4, 3, 5)
    assert c.flushed_position == s.write_position
    s.close()
    c2 = codec.decode_checkpoint((root / "checkpoint").read_bytes())
    assert (c2.commit_index, c2.applied_index, c2.flushed_index) == (4, 3, 5)
    assert c2.truncate_pending_position == codec.NO_TRUNCATE_PENDING


def test_corrupt_checkpoint_refuses_to_open(tmp_path: Path) -> None:
    root = tmp_path / "s"
    SegmentedLogStore(root, SMALL).close()
    data = bytearray((root / "checkpoint").read_bytes())
    data[12] ^= 4
    (root / "checkpoint").write_bytes(bytes(data))
    with pytest.raises(CorruptLogError) as e:
        SegmentedLogStore(root, SMALL)
    assert e.value.path.endswith("checkpoint")
    with pytest.raises(CorruptLogError):
        SegmentedLogStore(root, SMALL)


def wait_for_files(root: Path, n: int) -> list[str]:
    deadline = time.monotonic() + 10
    while len(data_files(root)) < n and time.monotonic() < deadline:
        time.sleep(0.005)
    return data_files(root)


def test_preallocates_next_segment(tmp_path: Path) -> None:
    root = tmp_path / "s"
    s = SegmentedLogStore(root, SMALL)
    s.append([Entry(1, 1, b"x" * 30000)])  # below half of the segment: nothing asked yet
    time.sleep(0.05)
    assert data_files(root) == ["00000000000000000000"]
    s.append([Entry(1, 2, b"x" * 3000)])  # past half: the next segment is made ahead of need
    assert wait_for_files(root, 2) == ["00000000000000000000", f"{SEG:020d}"]
    assert s.segment_count == 1
    s.append([Entry(1, 3, b"x" * 40000)])  # rolls into the ready file, already past half
    assert s.segment_count == 2
    assert len(wait_for_files(root, 3)) == 3  # and the one after is made; only one ahead
    time.sleep(0.05)
    assert len(data_files(root)) == 3
    assert os.path.getsize(root / "commitlog" / f"{2 * SEG:020d}") == SEG
    assert any(t.name.startswith("segment-allocator") for t in threading.enumerate())
    s.close()
    assert not any(t.name.startswith("segment-allocator") for t in threading.enumerate())
    s = SegmentedLogStore(root, StoreConfig(segment_size_bytes=SEG, preallocate=False))
    s.close()
    assert len(data_files(root)) == 2  # the unused pre-allocated file is dropped on open


def test_warm_segments_are_written_zeros(tmp_path: Path) -> None:
    root = tmp_path / "s"
    cfg = StoreConfig(segment_size_bytes=SEG, index_segment_size_bytes=SEG, warm_segments=True)
    s = SegmentedLogStore(root, cfg)
    s.append([Entry(1, 1, b"w" * 40000), Entry(1, 2, b"v" * 40000)])
    assert s.read(2).body == b"v" * 40000
    s.close()
    assert os.stat(root / "commitlog" / f"{SEG:020d}").st_blocks * 512 >= SEG


def test_no_preallocation(tmp_path: Path) -> None:
    root = tmp_path / "s"
    cfg = StoreConfig(segment_size_bytes=SEG, index_segment_size_bytes=SEG, preallocate=False)
    s = SegmentedLogStore(root, cfg)
    s.append([Entry(1, i, b"x" * 30000) for i in range(1, 4)])
    assert data_files(root) == ["00000000000000000000", f"{SEG:020d}"]
    s.close()


def test_config_validation() -> None:
    with pytest.raises(ValueError):
        StoreConfig(segment_size_bytes=1000)
    with pytest.raises(ValueError):
        StoreConfig(segment_size_bytes=1 << 32)
    with pytest.raises(ValueError):
        StoreConfig(flush_interval_ms=0)
    assert StoreConfig().max_body_bytes == 64 * 1024 * 1024
    assert SMALL.max_body_bytes == SEG - ENTRY_HEADER_SIZE


def test_wrong_segment_size_is_a_clear_error(tmp_path: Path) -> None:
    root = tmp_path / "s"
    s = SegmentedLogStore(
        root, StoreConfig(segment_size_bytes=2 * SEG, index_segment_size_bytes=SEG)
    )
    s.append([Entry(1, i, b"x" * 60000) for i in range(1, 4)])
    s.close()
    with pytest.raises(Exception, match="segment size"):
        SegmentedLogStore(root, SMALL)


def test_group_commit_shares_syncs(tmp_path: Path) -> None:
    s = SegmentedLogStore(tmp_path / "s", SMALL)
    n_threads, per_thread = 16, 20
    errors: list[BaseException] = []
    acked: list[int] = []
    lock = threading.Lock()

    def worker() -> None:
        try:
            for _ in range(per_thread):
                last = s.append_bodies(1, [b"p" * 100])
                durable = s.flush()
                assert durable >= last
                assert s.flushed_index() >= last
                with lock:
                    acked.append(last)
        except BaseException as e:  # pragma: no cover - reported below
            errors.append(e)

    threads = [threading.Thread(target=worker) for _ in range(n_threads)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not errors
    assert sorted(acked) == list(range(1, n_threads * per_thread + 1))
    assert s.flush_count < n_threads * per_thread  # syncs were shared
    s.close()


def test_append_durable(store: SegmentedLogStore) -> None:
    assert store.append_durable(entries(1, [10, 20])) == 2
    assert store.flushed_index() == 2


def test_async_flush_flushes_in_background(tmp_path: Path) -> None:
    cfg = StoreConfig(
        segment_size_bytes=SEG,
        index_segment_size_bytes=SEG,
        flush_disk_type=FlushDiskType.ASYNC_FLUSH,
        flush_interval_ms=10,
    )
    s = SegmentedLogStore(tmp_path / "s", cfg)
    s.append(entries(1, [100] * 10))
    deadline = time.monotonic() + 10
    while s.flushed_index() < 10 and time.monotonic() < deadline:
        time.sleep(0.005)
    assert s.flushed_index() == 10
    s.close()
    assert not any(t.name.startswith("flusher-") for t in threading.enumerate())


def test_concurrent_readers_and_writer(store: SegmentedLogStore) -> None:
    stop = threading.Event()
    bad: list[str] = []

    def reader() -> None:
        while not stop.is_set():
            last = store.last_index()
            if last:
                e = store.read(last)
                if e.body != body_of(last, 300):
                    bad.append(f"index {last}")

    t = threading.Thread(target=reader)
    t.start()
    for i in range(1, 600):
        store.append(entries(i, [300]))
    stop.set()
    t.join()
    assert not bad


def test_truncate_while_other_threads_append_and_flush(tmp_path: Path) -> None:
    root = tmp_path / "s"
    s = SegmentedLogStore(root, SMALL)
    stop = threading.Event()
    errors: list[BaseException] = []

    def worker() -> None:
        try:
            while not stop.is_set():
                s.append_bodies(1, [b"t" * 700])
                s.flush()
        except BaseException as e:  # pragma: no cover - reported below
            errors.append(e)

    threads = [threading.Thread(target=worker) for _ in range(4)]
    for t in threads:
        t.start()
    try:
        for _ in range(20):
            deadline = time.monotonic() + 10
            while s.last_index() < 50 and time.monotonic() < deadline:
                time.sleep(0.001)
            s.truncate_suffix(max(1, s.last_index() - 30))
            assert s.flushed_index() <= s.last_index()
    finally:
        stop.set()
        for t in threads:
            t.join()
    assert not errors
    last = s.last_index()
    assert s.verify() == last
    s.close()
    s = SegmentedLogStore(root, SMALL)
    assert s.last_index() == last and s.verify() == last
    s.close()


def test_body_position_and_read_at_address_bytes_inside_entries(tmp_path: Path) -> None:
    bodies = [bytes([i % 251]) * (1000 + 37 * i) for i in range(200)]  # crosses segments
    twin_positions = []
    for name in ("a", "b"):
        s = SegmentedLogStore(tmp_path / name, SMALL)
        s.append([Entry(1, i + 1, b) for i, b in enumerate(bodies)])
        positions = [s.body_position(i + 1) for i in range(len(bodies))]
        for i, (pos, body) in enumerate(zip(positions, bodies, strict=True)):
            assert s.read_at(pos, len(body)) == body, i
            assert s.read_at(pos + 3, 5) == body[3:8]
        with pytest.raises(IndexOutOfRangeError):
            s.read_at(s.write_position, 1)
        with pytest.raises(IndexOutOfRangeError):
            s.body_position(len(bodies) + 1)
        twin_positions.append(positions)
        s.close()
    # Same log, same segment size: the same positions on every replica.
    assert twin_positions[0] == twin_positions[1]
