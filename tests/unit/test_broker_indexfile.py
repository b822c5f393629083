"""The key index of broker/state/indexfile.py (docs/FORMAT.md, "Broker: Key index")."""

from __future__ import annotations

import struct
from pathlib import Path

import crc32c
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from broker.state import indexfile as ix
from broker.state.errors import CorruptStoreError, PositionOrderError, QueueStoreClosedError
from broker.state.indexfile import IndexStore

T0 = 1_763_700_000_000  # 2025-11-21 04:40:00 UTC


def open_store(root: Path, slots: int = 4, records: int = 8) -> IndexStore:
    return IndexStore(root, hash_slots=slots, max_records=records)


def index_files(root: Path) -> list[str]:
    return sorted(p.name for p in (root / "index").iterdir())


def test_file_layout(tmp_path: Path) -> None:
    store = open_store(tmp_path, slots=3, records=5)
    store.put("T#k", 4096, T0 + 2500)
    store.close()
    (name,) = index_files(tmp_path)
    assert name == "20251121044002500"
    raw = (tmp_path / "index" / name).read_bytes()
    assert len(raw) == 64 + 3 * 4 + 6 * 20
    fields = struct.unpack_from(">IHHqqqqqIII", raw, 0)
    assert raw[:4] == b"RIX1"
    assert fields[1:] == (
        1,
        ix.FLAG_CLEAN,
        T0 + 2500,  # begin: the record's second (seconds count from the base timestamp)
        T0 + 3499,  # end: last ms of that second
        4096,
        4096,
        T0 + 2500,  # base timestamp
        3,
        5,
        2,  # next record number
    )
    assert struct.unpack_from(">I", raw, 60)[0] == crc32c.crc32c(raw[:60])
    h = ix.key_hash("T#k")
    slot = h % 3
    assert struct.unpack_from(">I", raw, 64 + slot * 4)[0] == 1
    record_at = 64 + 3 * 4 + 20
    assert struct.unpack_from(">iqiI", raw, record_at) == (h, 4096, 0, 0)
    assert raw[64 + 12 : record_at] == bytes(20)  # record 0 is never used


def test_put_query_with_slot_collisions(tmp_path: Path) -> None:
    store = open_store(tmp_path, slots=1, records=100)  # every key in the same slot
    for i in range(30):
        store.put(f"T#k{i % 3}", i * 100, T0 + i * 1000)
    assert store.query("T#k0", 100) == [2700, 2400, 2100, 1800, 1500, 1200, 900, 600, 300, 0]
    assert store.query("T#k1", 3) == [2800, 2500, 2200]
    assert store.query("T#nope", 10) == []
    assert store.query("T#k0", 0) == []
    store.close()


def test_put_message_indexes_keys_and_uniq_id(tmp_path: Path) -> None:
    store = open_store(tmp_path, slots=7, records=50)
    uniq = "0A0000010D2B1234ABCD00000000002A"
    store.put_message("T", ("order-1", "user-7", "order-1"), uniq, 500, T0)
    store.put_message("T", ("order-1",), "", 600, T0 + 5)
    store.put_message("U", ("order-1",), "", 700, T0 + 6)
    assert store.query_key("T", "order-1", 10) == [600, 500]
    assert store.query_key("T", "user-7", 10) == [500]
    assert store.query_key("T", uniq, 10) == [500]
    assert store.query("U#order-1", 10) == [700]
    assert store.max_position() == 700
    store.close()


def test_time_range_filter(tmp_path: Path) -> None:
    store = open_store(tmp_path, slots=5, records=100)
    for i in range(10):
        store.put("T#k", i * 10, T0 + i * 60_000)  # one a minute
    assert store.query("T#k", 100, T0 + 120_000, T0 + 300_000) == [50, 40, 30, 20]
    assert store.query("T#k", 100, T0 + 120_001, T0 + 299_999) == [40, 30, 20]  # to the second
    assert store.query("T#k", 100, T0 + 119_000, T0 + 119_999) == []
    assert store.query("T#k", 2, 0, T0 + 300_000) == [50, 40]
    assert store.query("T#k", 100, T0 + 10**9, T0 + 2 * 10**9) == []
    store.close()


def test_rollover_and_query_across_files(tmp_path: Path) -> None:
    store = open_store(tmp_path, slots=2, records=4)
    for i in range(10):
        store.put("T#k", i, T0 + i)  # all in the same millisecond range
    names = index_files(tmp_path)
    assert len(names) == 3
    # Names come from the first record's store time, strictly increasing.
    assert names == ["20251121044000000", "20251121044000004", "20251121044000008"]
    assert store.query("T#k", 100) == list(range(9, -1, -1))
    assert store.query("T#k", 5) == [9, 8, 7, 6, 5]
    # A message's keys never straddle two files.
    store.put_keys(["T#a", "T#b", "T#c"], 10, T0 + 10)
    assert len(index_files(tmp_path)) == 4
    assert store.query("T#a", 5) == [10]
    store.close()


def test_same_millisecond_file_names_stay_unique(tmp_path: Path) -> None:
    store = open_store(tmp_path, slots=2, records=1)
    for i in range(3):
        store.put("T#k", i, T0)
    assert index_files(tmp_path) == [
        "20251121044000000",
        "20251121044000001",
        "20251121044000002",
    ]
    store.close()


def test_reopen(tmp_path: Path) -> None:
    store = open_store(tmp_path, slots=3, records=4)
    for i in range(6):
        store.put(f"T#k{i % 2}", i * 10, T0 + i * 1000)
    store.close()
    store = open_store(tmp_path, slots=3, records=4)
    assert store.max_position() == 50
    assert store.query("T#k0", 10) == [40, 20, 0]
    store.put("T#k0", 60, T0 + 6000)
    assert store.query("T#k0", 10) == [60, 40, 20, 0]
    store.close()


def test_order_errors_and_closed(tmp_path: Path) -> None:
    store = open_store(tmp_path)
    store.put("T#k", 100, T0)
    store.put("T#j", 100, T0)  # same message, another key
    with pytest.raises(PositionOrderError):
        store.put("T#k", 99, T0)
    with pytest.raises(ValueError):
        store.put("T#k", -1, T0)
    with pytest.raises(ValueError):
        store.put_keys([f"T#{i}" for i in range(9)], 200, T0)  # more than a file holds
    store.close()
    with pytest.raises(QueueStoreClosedError):
        store.put("T#k", 200, T0)


def test_truncate_after_position(tmp_path: Path) -> None:
    store = open_store(tmp_path, slots=2, records=4)
    for i in range(10):
        store.put(f"T#k{i % 2}", i * 10, T0 + i * 1000)
    assert len(index_files(tmp_path)) == 3
    store.truncate_after_position(55)  # drops 60.. : third file and half the second
    assert len(index_files(tmp_path)) == 2
    assert store.max_position() == 50
    assert store.query("T#k0", 100) == [40, 20, 0]
    assert store.query("T#k1", 100) == [50, 30, 10]
    store.put("T#k0", 60, T0 + 60_000)
    assert store.query("T#k0", 100) == [60, 40, 20, 0]
    store.truncate_after_position(60)
    store.truncate_after_position(1000)  # nothing beyond: no-op
    store.close()
    store = open_store(tmp_path, slots=2, records=4)
    assert store.max_position() == 50
    assert store.query("T#k0", 100, T0 + 2000) == [40, 20]
    store.truncate_after_position(0)
    assert store.max_position() == -1
    assert index_files(tmp_path) == []
    assert store.query("T#k0", 100) == []
    store.close()


def test_truncate_is_deterministic(tmp_path: Path) -> None:
    """A store truncated then replayed equals one that only saw the final sequence."""
    a = open_store(tmp_path / "a", slots=3, records=6)
    b = open_store(tmp_path / "b", slots=3, records=6)
    for i in range(8):
        a.put(f"T#k{i % 3}", i * 10, T0 + i * 1500)
    for i in range(5):
        b.put(f"T#k{i % 3}", i * 10, T0 + i * 1500)
    a.truncate_after_position(50)
    a.close()
    b.close()
    assert index_files(tmp_path / "a") == index_files(tmp_path / "b")
    for name in index_files(tmp_path / "a"):
        assert (tmp_path / "a" / "index" / name).read_bytes() == (
            tmp_path / "b" / "index" / name
        ).read_bytes()


def test_retention(tmp_path: Path) -> None:
    store = open_store(tmp_path, slots=2, records=4)
    for i in range(10):
        store.put("T#k", i * 10, T0 + i)
    # The first file holds positions 0..30: deleted only once all are below the minimum.
    assert store.delete_files_before(30) == 0
    assert store.delete_files_before(31) == 1
    assert store.query("T#k", 100) == list(range(90, 30, -10))
    assert store.delete_files_before(10_000) == 1  # the newest stays
    assert len(index_files(tmp_path)) == 1
    store.close()


def crash_copy(store: IndexStore, root: Path, dest: Path) -> None:
    """Copy the index files as they are now (page cache, no flush): a process crash."""
    (dest / "index").mkdir(parents=True)
    for path in store.files:
        (dest / "index" / path.name).write_bytes(path.read_bytes())


def test_crash_after_flush_loses_only_unflushed(tmp_path: Path) -> None:
    store = open_store(tmp_path / "live", slots=3, records=100)
    for i in range(5):
        store.put_message("T", (f"k{i % 2}",), "", i * 10, T0 + i * 1000)
    store.flush()
    for i in range(5, 9):
        store.put_message("T", (f"k{i % 2}",), "", i * 10, T0 + i * 1000)
    crash_copy(store, store.files[0].parent.parent, tmp_path / "crashed")
    store.close()
    crashed = open_store(tmp_path / "crashed", slots=3, records=100)
    # The header on disk predates the last four puts: they are gone, and the slots that
    # pointed at them were walked back to the flushed records.
    assert crashed.max_position() == 40
    assert crashed.query_key("T", "k0", 100) == [40, 20, 0]
    assert crashed.query_key("T", "k1", 100) == [30, 10]
    # Rebuild from the commitlog: re-put what came after max_position(); same bytes as live.
    for i in range(5, 9):
        crashed.put_message("T", (f"k{i % 2}",), "", i * 10, T0 + i * 1000)
    crashed.close()
    live = tmp_path / "live" / "index"
    for name in index_files(tmp_path / "live"):
        assert (live / name).read_bytes() == (tmp_path / "crashed" / "index" / name).read_bytes()


def test_crash_with_broken_chain_rebuilds_slots(tmp_path: Path) -> None:
    store = open_store(tmp_path / "live", slots=2, records=100)
    for i in range(6):
        store.put(f"T#k{i}", i * 10, T0)
    store.flush()
    for i in range(6, 10):
        store.put(f"T#k{i}", i * 10, T0)
    crash_copy(store, tmp_path / "live", tmp_path / "crashed")
    store.close()
    (name,) = index_files(tmp_path / "crashed")
    path = tmp_path / "crashed" / "index" / name
    raw = bytearray(path.read_bytes())
    records_at = 64 + 2 * 4
    raw[records_at + 7 * 20 : records_at + 11 * 20] = bytes(80)  # those records never hit disk
    path.write_bytes(bytes(raw))
    crashed = open_store(tmp_path / "crashed", slots=2, records=100)
    assert crashed.max_position() == 50
    for i in range(6):
        assert crashed.query(f"T#k{i}", 10) == [i * 10]
    assert crashed.query("T#k7", 10) == []
    crashed.close()


def test_never_flushed_new_file_is_dropped(tmp_path: Path) -> None:
    (tmp_path / "index").mkdir()
    (tmp_path / "index" / "20251121044000000").write_bytes(bytes(200))
    store = open_store(tmp_path)
    assert index_files(tmp_path) == []
    assert store.max_position() == -1
    store.close()


def test_corrupt_header_is_reported(tmp_path: Path) -> None:
    store = open_store(tmp_path)
    store.put("T#k", 1, T0)
    store.close()
    (name,) = index_files(tmp_path)
    path = tmp_path / "index" / name
    raw = bytearray(path.read_bytes())
    raw[20] ^= 1
    path.write_bytes(bytes(raw))
    with pytest.raises(CorruptStoreError, match="CRC") as info:
        open_store(tmp_path)
    assert info.value.path == str(path)
    raw[20] ^= 1
    path.write_bytes(bytes(raw[:-1]))
    with pytest.raises(CorruptStoreError, match="bytes"):
        open_store(tmp_path)


@settings(max_examples=30, deadline=None)
@given(
    st.lists(
        st.tuples(
            st.lists(st.sampled_from(["a", "b", "c", "d", "e", "f"]), min_size=1, max_size=3),
            st.integers(min_value=0, max_value=5),
            st.integers(min_value=-3000, max_value=3000),
        ),
        min_size=1,
        max_size=25,
    ),
    st.sampled_from(["a", "b", "c", "d", "e", "f"]),
    st.integers(min_value=0, max_value=200),
    st.integers(min_value=-2000, max_value=60_000),
    st.integers(min_value=0, max_value=60_000),
)
def test_query_matches_a_model(
    tmp_path_factory: pytest.TempPathFactory,
    ops: list[tuple[list[str], int, int]],
    key: str,
    cut: int,
    begin_delta: int,
    span: int,
) -> None:
    root = tmp_path_factory.mktemp("ix")
    store = open_store(root, slots=3, records=5)
    model: list[tuple[str, int, int]] = []
    position = 0
    ts = T0
    for keys, gap, dt in ops:
        position += gap
        ts = max(0, ts + dt)  # store times may go backwards across leaders
        store.put_message("T", keys, "", position, ts)
        model.extend((k, position, ts) for k in dict.fromkeys(keys))
    store.truncate_after_position(cut)
    model = [r for r in model if r[1] < cut]
    store.close()
    store = open_store(root, slots=3, records=5)
    begin, end = T0 + begin_delta, T0 + begin_delta + span
    got = store.query_key("T", key, 1000, begin, end)
    # The store keeps seconds since its file's base; a record matches when its second overlaps.
    exact = [p for k, p, t in model if k == key and begin <= t <= end]
    loose = [p for k, p, t in model if k == key and begin - 1000 < t <= end + 1000]
    assert got == sorted(set(got), reverse=True)
    assert set(exact) <= set(got) <= set(loose)
    assert store.query_key("T", key, 1000) == sorted(
        {p for k, p, _ in model if k == key}, reverse=True
    )
    store.close()


def test_crash_right_after_rollover(tmp_path: Path) -> None:
    store = open_store(tmp_path / "live", slots=2, records=3)
    for i in range(3):
        store.put_message("T", ("k",), "", i * 10, T0 + i)
    store.flush()
    store.put_message("T", ("k", "j"), "", 30, T0 + 3)  # starts file 2, never flushed
    assert len(store.files) == 2
    crash_copy(store, tmp_path / "live", tmp_path / "crashed")
    store.close()
    crashed = open_store(tmp_path / "crashed", slots=2, records=3)
    assert len(crashed.files) == 1  # the empty second file is gone
    assert crashed.max_position() == 20
    assert crashed.query_key("T", "k", 10) == [20, 10, 0]
    crashed.put_message("T", ("k", "j"), "", 30, T0 + 3)
    assert crashed.query_key("T", "k", 10) == [30, 20, 10, 0]
    crashed.close()


def test_put_messages_equals_put_message_one_by_one(tmp_path: Path) -> None:
    items = [
        ("T", (f"k{i}", f"shared{i % 3}"), f"{i:032X}", 100 * i, 1_000_000 + 700 * i)
        for i in range(40)
    ]
    one = IndexStore(tmp_path / "one", hash_slots=7, max_records=25)
    for topic, keys, uniq, position, ts in items:
        one.put_message(topic, keys, uniq, position, ts)
    many = IndexStore(tmp_path / "many", hash_slots=7, max_records=25)
    many.put_messages(items[:15])
    many.put_messages(items[15:])
    one.close()
    many.close()
    files_one = sorted((tmp_path / "one" / "index").iterdir())
    files_many = sorted((tmp_path / "many" / "index").iterdir())
    assert [f.name for f in files_one] == [f.name for f in files_many] and len(files_one) > 1
    assert [f.read_bytes() for f in files_one] == [f.read_bytes() for f in files_many]
    with pytest.raises(PositionOrderError):
        IndexStore(tmp_path / "many", hash_slots=7, max_records=25).put_messages([items[0]])


@pytest.mark.parametrize("keys_per_msg", [0, 1, 2])
def test_batch_fast_path_writes_the_same_bytes(tmp_path: Path, keys_per_msg: int) -> None:
    """put_messages' one-pass path (a batch that fits the current file) against one message at
    a time, with batches that fit, batches that roll over, and a key equal to the uniq id."""
    items = [
        (
            "T",
            tuple(f"{i:032X}" if i % 9 == 0 else f"k{i}-{j}" for j in range(keys_per_msg)),
            f"{i:032X}",
            100 * i,
            1_000_000 + 300 * i,
        )
        for i in range(120)
    ]
    one = IndexStore(tmp_path / "one", hash_slots=11, max_records=100)
    for topic, keys, uniq, position, ts in items:
        one.put_message(topic, keys, uniq, position, ts)
    many = IndexStore(tmp_path / "many", hash_slots=11, max_records=100)
    for at in range(0, len(items), 7):
        many.put_messages(items[at : at + 7])
    one.close()
    many.close()
    files_one = sorted((tmp_path / "one" / "index").iterdir())
    files_many = sorted((tmp_path / "many" / "index").iterdir())
    assert [f.name for f in files_one] == [f.name for f in files_many] and len(files_one) > 1
    assert [f.read_bytes() for f in files_one] == [f.read_bytes() for f in files_many]
