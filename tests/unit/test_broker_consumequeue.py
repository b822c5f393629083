"""ConsumeQueue files of broker/state/consumequeue.py (docs/FORMAT.md, "Broker: ConsumeQueue")."""

from __future__ import annotations

import os
import struct
import threading
from collections.abc import Callable
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from broker.state.consumequeue import (
    CQ_RECORD_SIZE,
    DEFAULT_RECORDS_PER_FILE,
    ConsumeQueue,
    ConsumeQueueStore,
    file_name,
)
from broker.state.errors import (
    CorruptStoreError,
    InvalidTopicError,
    OffsetOutOfRangeError,
    PositionOrderError,
    QueueStoreClosedError,
)

PER_FILE = 4


def records(n: int, start: int = 0, size: int = 100) -> list[tuple[int, int, int]]:
    """``n`` records for consecutive messages of ``size`` bytes from position ``start``."""
    return [(start + i * size, size, (i * 7919) - 5000) for i in range(n)]


def open_cq(path: Path, per_file: int = PER_FILE) -> ConsumeQueue:
    return ConsumeQueue(path, records_per_file=per_file)


def files_of(path: Path) -> list[str]:
    return sorted(p.name for p in path.iterdir())


def test_defaults_match_rocketmq() -> None:
    assert CQ_RECORD_SIZE == 20
    assert DEFAULT_RECORDS_PER_FILE == 300_000
    assert file_name(0) == "00000000000000000000"
    assert file_name(6_000_000) == "00000000000006000000"


def test_append_and_read_across_files(tmp_path: Path) -> None:
    cq = open_cq(tmp_path)
    recs = records(10)
    for i, r in enumerate(recs[:3]):
        assert cq.append(*r) == i
    assert cq.append_many(recs[3:]) == 3
    assert (cq.min_offset, cq.max_offset) == (0, 10)
    assert cq.last_position() == 1000
    assert files_of(tmp_path) == [file_name(0), file_name(80), file_name(160)]
    assert all(os.path.getsize(tmp_path / f) == PER_FILE * 20 for f in files_of(tmp_path))
    for i, r in enumerate(recs):
        assert cq.get(i) == r
    got = cq.read(2, 7)
    assert (got.start_offset, len(got), got.end_offset) == (2, 7, 9)
    assert list(got) == recs[2:9]
    assert got[0] == recs[2] and got[-1] == recs[8]
    assert got.positions() == [r[0] for r in recs[2:9]]
    assert len(got.raw) == 7 * 20
    assert list(cq.read(8, 100)) == recs[8:]
    assert len(cq.read(10, 5)) == 0  # at max_offset: nothing new yet
    with pytest.raises(OffsetOutOfRangeError) as info:
        cq.read(11, 1)
    assert (info.value.min_offset, info.value.max_offset) == (0, 10)
    assert info.value.code == "OFFSET_OUT_OF_RANGE"
    with pytest.raises(OffsetOutOfRangeError):
        cq.get(10)
    with pytest.raises(IndexError):
        got[7]
    cq.close()


def test_record_bytes_are_rocketmq_layout(tmp_path: Path) -> None:
    cq = open_cq(tmp_path)
    cq.append(0x0102030405060708, 0x0A0B0C0D, -2)
    cq.close()
    raw = (tmp_path / file_name(0)).read_bytes()
    assert raw[:20] == bytes.fromhex("01020304050607080A0B0C0DFFFFFFFFFFFFFFFE")
    assert raw[20:] == bytes(20 * (PER_FILE - 1))


def test_order_and_range_checks(tmp_path: Path) -> None:
    cq = open_cq(tmp_path)
    cq.append(1000, 50, 0)
    with pytest.raises(PositionOrderError):
        cq.append(1049, 10, 0)  # overlaps the last message
    cq.append(1050, 10, 0)
    for bad in [(-1, 1, 0), (2000, 0, 0), (2000, 1 << 31, 0), (2000, 1, 1 << 63)]:
        with pytest.raises(ValueError):
            cq.append(*bad)
    with pytest.raises(PositionOrderError):
        cq.append_many([(3000, 10, 0), (2000, 10, 0)])
    assert cq.max_offset == 3  # the good record before the bad one stayed
    with pytest.raises(ValueError):
        cq.read(0, -1)
    cq.close()
    with pytest.raises(QueueStoreClosedError):
        cq.append(5000, 1, 0)
    cq.close()  # idempotent


def test_reopen_recovers(tmp_path: Path) -> None:
    cq = open_cq(tmp_path)
    cq.append_many(records(9))
    cq.close()
    cq = open_cq(tmp_path)
    assert (cq.min_offset, cq.max_offset, cq.last_position()) == (0, 9, 900)
    assert list(cq.read(0, 9)) == records(9)
    cq.append(900, 100, 1)
    assert cq.get(9) == (900, 100, 1)
    cq.close()


def test_reopen_at_exact_file_boundary_and_empty(tmp_path: Path) -> None:
    cq = open_cq(tmp_path / "a")
    cq.append_many(records(8))
    cq.close()
    cq = open_cq(tmp_path / "a")
    assert (cq.max_offset, cq.last_position()) == (8, 800)
    cq.append(800, 100, 0)
    assert cq.get(8) == (800, 100, 0)
    cq.close()
    empty = open_cq(tmp_path / "b")
    assert (empty.min_offset, empty.max_offset, empty.last_position()) == (0, 0, 0)
    empty.close()
    empty = open_cq(tmp_path / "b")
    assert empty.max_offset == 0
    empty.close()


def test_torn_record_dropped(tmp_path: Path) -> None:
    cq = open_cq(tmp_path)
    cq.append_many(records(6))
    cq.close()
    path = tmp_path / file_name(80)
    raw = bytearray(path.read_bytes())
    # Record 6 (slot 2 of the second file) half written: position bytes only, size zero.
    raw[40:48] = struct.pack(">Q", 600)
    path.write_bytes(bytes(raw))
    cq = open_cq(tmp_path)
    assert cq.max_offset == 6
    assert path.read_bytes()[40:60] == bytes(20)  # zeroed, so it can never come back
    cq.close()


def test_truncated_file_half_record(tmp_path: Path) -> None:
    cq = open_cq(tmp_path)
    cq.append_many(records(7))
    cq.close()
    path = tmp_path / file_name(80)
    raw = path.read_bytes()
    path.write_bytes(raw[: 2 * 20 + 9])  # record 6 torn after 9 of its 20 bytes
    cq = open_cq(tmp_path)
    assert (cq.max_offset, cq.last_position()) == (6, 600)
    assert os.path.getsize(path) == PER_FILE * 20
    assert list(cq.read(0, 10)) == records(6)
    cq.close()


def test_stray_record_after_a_gap_and_out_of_order(tmp_path: Path) -> None:
    cq = open_cq(tmp_path)
    cq.append_many(records(5))
    cq.close()
    path = tmp_path / file_name(80)
    raw = bytearray(path.read_bytes())
    raw[60:80] = struct.pack(">QIq", 700, 100, 0)  # slot 3 written, slot 2 never was
    path.write_bytes(bytes(raw))
    cq = open_cq(tmp_path)
    assert cq.max_offset == 5
    assert path.read_bytes()[20:] == bytes(60)
    cq.append(500, 100, 0)
    cq.close()
    raw = bytearray(path.read_bytes())
    raw[40:60] = struct.pack(">QIq", 10, 100, 0)  # goes backwards: garbage
    path.write_bytes(bytes(raw))
    cq = open_cq(tmp_path)
    assert cq.max_offset == 6
    cq.close()


def test_empty_trailing_file_removed(tmp_path: Path) -> None:
    cq = open_cq(tmp_path)
    cq.append_many(records(5))
    cq.close()
    (tmp_path / file_name(80)).write_bytes(bytes(80))  # crash right after creating file 2
    cq = open_cq(tmp_path)
    assert cq.max_offset == 4
    assert files_of(tmp_path) == [file_name(0)]
    cq.close()


def test_bad_directory_contents(tmp_path: Path) -> None:
    cq = open_cq(tmp_path)
    cq.append_many(records(10))
    cq.close()
    (tmp_path / file_name(80)).unlink()
    with pytest.raises(CorruptStoreError, match="missing"):
        open_cq(tmp_path)
    with pytest.raises(CorruptStoreError, match="records_per_file"):
        open_cq(tmp_path, per_file=3)


def test_truncate_after_position(tmp_path: Path) -> None:
    cq = open_cq(tmp_path)
    cq.append_many(records(10))
    assert cq.truncate_after_position(2000) == 10  # nothing at or beyond
    assert cq.truncate_after_position(650) == 7  # drops positions 700.. and keeps 600
    assert (cq.max_offset, cq.last_position()) == (7, 700)
    assert files_of(tmp_path) == [file_name(0), file_name(80)]
    cq.append(700, 50, 3)
    assert cq.get(7) == (700, 50, 3)
    assert cq.truncate_after_position(400) == 4  # exactly at a file start: file removed
    assert files_of(tmp_path) == [file_name(0)]
    assert cq.last_position() == 400
    cq.close()
    cq = open_cq(tmp_path)
    assert (cq.max_offset, cq.last_position()) == (4, 400)
    assert cq.truncate_after_position(0) == 0
    assert (cq.min_offset, cq.max_offset, cq.last_position()) == (0, 0, 0)
    assert (tmp_path / file_name(0)).read_bytes() == bytes(80)
    cq.append_many(records(3))
    assert list(cq.read(0, 3)) == records(3)
    cq.close()


def test_retention_moves_min_offset(tmp_path: Path) -> None:
    cq = open_cq(tmp_path)
    cq.append_many(records(10))  # file 0: 0..300, file 1: 400..700, file 2: 800, 900
    assert cq.delete_files_before(300) == 0  # record 3 (position 300) still readable
    assert cq.min_offset == 3
    with pytest.raises(OffsetOutOfRangeError):
        cq.read(2, 1)
    assert cq.delete_files_before(500) == 1
    assert files_of(tmp_path) == [file_name(80), file_name(160)]
    assert cq.min_offset == 5
    assert list(cq.read(5, 2)) == records(10)[5:7]
    assert cq.delete_files_before(10_000) == 1  # the last file always stays
    assert files_of(tmp_path) == [file_name(160)]
    assert (cq.min_offset, cq.max_offset) == (10, 10)
    cq.close()
    cq = open_cq(tmp_path)
    assert (cq.min_offset, cq.max_offset, cq.last_position()) == (8, 10, 1000)
    cq.delete_files_before(10_000)
    assert cq.min_offset == 10
    cq.append(1000, 1, 0)
    assert cq.get(10) == (1000, 1, 0)
    cq.close()


@settings(max_examples=25, deadline=None)
@given(
    st.lists(
        st.tuples(st.integers(min_value=0, max_value=50), st.integers(min_value=1, max_value=90)),
        max_size=30,
    ),
    st.integers(min_value=0, max_value=3000),
)
def test_two_stores_same_sequence_byte_identical(
    tmp_path_factory: pytest.TempPathFactory, steps: list[tuple[int, int]], cut: int
) -> None:
    roots = [tmp_path_factory.mktemp("a"), tmp_path_factory.mktemp("b")]
    for n, root in enumerate(roots):
        store = ConsumeQueueStore(root, records_per_file=3)
        position = 0
        for i, (gap, size) in enumerate(steps):
            position += gap
            store.append(f"T{i % 2}", i % 3, position, size, i - 10)
            position += size
            if n == 1 and i % 4 == 0:  # flush timing must not matter
                store.flush()
        store.truncate_after_position(cut)
        store.close()
    dumps = []
    for root in roots:
        base = root / "consumequeue"
        dumps.append(
            {str(p.relative_to(base)): p.read_bytes() for p in base.rglob("*") if p.is_file()}
        )
    assert dumps[0] == dumps[1]


def test_store_layout_and_operations(tmp_path: Path) -> None:
    store = ConsumeQueueStore(tmp_path, records_per_file=PER_FILE)
    assert store.find("TopicA", 0) is None
    assert store.append("TopicA", 0, 100, 10, 1) == 0
    assert store.append("TopicA", 1, 110, 10, 2) == 0
    assert store.append("%RETRY%g", 0, 120, 10, 3) == 0
    assert store.append("TopicA", 0, 130, 10, 4) == 1
    assert (tmp_path / "consumequeue" / "TopicA" / "0" / file_name(0)).is_file()
    assert (tmp_path / "consumequeue" / "%RETRY%g" / "0" / file_name(0)).is_file()
    assert store.last_position() == 140
    with pytest.raises(InvalidTopicError):
        store.queue("bad topic", 0)
    with pytest.raises(ValueError):
        store.queue("TopicA", -1)
    store.close()
    store.close()
    with pytest.raises(QueueStoreClosedError):
        store.queue("TopicA", 0)

    (tmp_path / "consumequeue" / "not a topic").mkdir()
    store = ConsumeQueueStore(tmp_path, records_per_file=PER_FILE)
    assert store.queue_ids() == [("%RETRY%g", 0), ("TopicA", 0), ("TopicA", 1)]
    assert store.last_position() == 140
    q = store.find("TopicA", 0)
    assert q is not None and q.max_offset == 2
    store.truncate_after_position(115)
    assert store.find("TopicA", 0).max_offset == 1  # type: ignore[union-attr]
    assert store.find("TopicA", 1).max_offset == 1  # type: ignore[union-attr]
    assert store.find("%RETRY%g", 0).max_offset == 0  # type: ignore[union-attr]
    assert store.last_position() == 120
    assert store.delete_files_before(0) == 0
    store.flush()
    store.close()


# Bound on every wait in the flush tests: far above any real wait, so only a lock held across
# another queue's flush (the fault under test) reaches it.
WAIT_S = 10.0


def hold_flush(cq: ConsumeQueue) -> tuple[threading.Event, threading.Event]:
    """Make ``cq``'s next flush announce itself and then wait (under its own lock) until
    released: (started, release). The release is bounded too, so a failing test ends."""
    started, release = threading.Event(), threading.Event()
    real = cq._flush_locked

    def slow() -> None:
        started.set()
        assert release.wait(WAIT_S), "flush never released"
        real()

    cq._flush_locked = slow  # type: ignore[method-assign]
    return started, release


def in_thread(fn: Callable[[], object]) -> threading.Thread:
    t = threading.Thread(target=fn, daemon=True)
    t.start()
    return t


def test_store_flush_stalls_no_other_queue(tmp_path: Path) -> None:
    """While queue B's flush is stuck on the disk, queue A is read and appended to, a new
    queue is opened and listed: the store lock is not held across a queue's flush."""
    store = ConsumeQueueStore(tmp_path, records_per_file=PER_FILE)
    store.append("TopicB", 0, 0, 10, 1)  # B is flushed first (the open queues in order)
    store.append("TopicA", 0, 10, 10, 2)
    started, release = hold_flush(store.queue("TopicB", 0))
    flusher = in_thread(store.flush)
    assert started.wait(WAIT_S)
    done = threading.Event()

    def use_others() -> None:
        qa = store.find("TopicA", 0)
        assert qa is not None and list(qa.read(0, 1)) == [(10, 10, 2)]
        assert store.append("TopicA", 0, 20, 10, 3) == 1
        assert store.append("TopicC", 0, 30, 10, 4) == 0
        assert ("TopicC", 0) in store.queue_ids()
        done.set()

    in_thread(use_others)
    try:
        assert done.wait(WAIT_S), "queue A waited for queue B's flush"
    finally:
        release.set()
    flusher.join(WAIT_S)
    assert not flusher.is_alive()
    store.close()


def test_store_flush_makes_every_queue_durable(tmp_path: Path) -> None:
    """Every queue appended to before the flush is synced by it; a queue whose topic is
    dropped while the flush runs is skipped (its files are gone), not an error."""
    store = ConsumeQueueStore(tmp_path, records_per_file=PER_FILE)
    for i, topic in enumerate(["TopicA", "TopicB", "TopicC"]):
        store.append(topic, 0, i * 10, 10, i)
        store.append(topic, 1, 100 + i * 10, 10, i)
    synced: list[str] = []
    for topic, queue_id in store.queue_ids():
        cq = store.queue(topic, queue_id)
        real = cq._flush_locked

        def spy(cq: ConsumeQueue = cq, real: Callable[[], None] = real) -> None:
            had_dirty = bool(cq._dirty)
            real()
            assert not cq._dirty
            if had_dirty:
                synced.append(cq.name)

        cq._flush_locked = spy  # type: ignore[method-assign]
    started, release = hold_flush(store.queue("TopicA", 0))
    errors: list[BaseException] = []

    def flush() -> None:
        try:
            store.flush()
        except BaseException as exc:  # reported below: a thread's exception is otherwise lost
            errors.append(exc)

    flusher = in_thread(flush)
    assert started.wait(WAIT_S)
    dropped = in_thread(lambda: store.drop_topic("TopicC"))
    dropped.join(WAIT_S)
    release.set()
    assert not dropped.is_alive(), "the topic drop waited for another queue's flush"
    flusher.join(WAIT_S)
    assert not flusher.is_alive() and errors == []
    # TopicC's queues were synced once, by their close when the topic was dropped.
    assert sorted(synced) == [f"Topic{t}/{q}" for t in "ABC" for q in (0, 1)]
    assert store.queue_ids() == [("TopicA", 0), ("TopicA", 1), ("TopicB", 0), ("TopicB", 1)]
    store.close()
    with pytest.raises(QueueStoreClosedError):
        store.flush()


def test_read_is_a_copy_safe_after_close(tmp_path: Path) -> None:
    cq = open_cq(tmp_path)
    cq.append_many(records(3))
    got = cq.read(0, 3)
    cq.close()
    assert list(got) == records(3)


def test_offset_of_finds_a_position_by_binary_search(tmp_path: Path) -> None:
    cq = ConsumeQueue(tmp_path / "q", records_per_file=4)
    positions = [100 + 37 * i for i in range(11)]  # spans 3 files
    for p in positions:
        cq.append(p, 10, 0)
    assert [cq.offset_of(p) for p in positions] == list(range(11))
    assert cq.offset_of(101) is None and cq.offset_of(0) is None and cq.offset_of(10_000) is None
    cq.close()


@settings(max_examples=60, deadline=None)
@given(st.lists(st.integers(min_value=1, max_value=9), min_size=1, max_size=12))
def test_append_many_in_chunks_equals_one_by_one(
    tmp_path_factory: pytest.TempPathFactory, chunks: list[int]
) -> None:
    """The batch path (one write per file) leaves the same bytes, offsets and errors as
    appending record by record, across file boundaries and after a bad record."""
    base = tmp_path_factory.mktemp("cq")
    one, many = open_cq(base / "one"), open_cq(base / "many")
    recs = records(sum(chunks), start=40)
    at = 0
    for n in chunks:
        for r in recs[at : at + n]:
            one.append(*r)
        assert many.append_many(recs[at : at + n]) == at
        at += n
    assert (one.max_offset, one.last_position()) == (many.max_offset, many.last_position())
    bad = [(recs[-1][0] + 100, 10, 0), (0, 10, 0)]  # the second goes backwards
    for cq in (one, many):
        with pytest.raises(PositionOrderError):
            cq.append_many(list(bad))
    assert one.max_offset == many.max_offset == len(recs) + 1
    one.close()
    many.close()
    assert files_of(base / "one") == files_of(base / "many")
    for name in files_of(base / "one"):
        assert (base / "one" / name).read_bytes() == (base / "many" / name).read_bytes()
