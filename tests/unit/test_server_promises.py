"""The server's start-time recovery of promises and hard state (dledger/server/promises.py,
docs/RAFT.md section 11): a lost or damaged ``meta`` is never read as "term 0, no vote"."""

from __future__ import annotations

import logging
from collections.abc import Iterator
from pathlib import Path

import pytest

from dledger.core import Promised
from dledger.log import Entry, HardState
from dledger.server.promises import PromiseError, promise_file, recover, write_promise
from dledger.storage import SegmentedLogStore, StoreConfig
from dledger.storage.promise import PromiseWriter, promise_path, read_promise

SEG = 1 << 16
SMALL = StoreConfig(segment_size_bytes=SEG, index_segment_size_bytes=SEG, reserve_bytes=0)


@pytest.fixture
def root(tmp_path: Path) -> Path:
    return tmp_path


def _store(root: Path, n: int = 0) -> SegmentedLogStore:
    s = SegmentedLogStore(root / "dledger-n0", SMALL)
    if n:
        s.append([Entry(2, i, b"x%d" % i) for i in range(s.last_index() + 1, n + 1)])
        s.flush()
    return s


def _promise(root: Path, index: int, hs: HardState, node: str = "n0") -> None:
    w = PromiseWriter(promise_path(root, "n0"), "g", node, None)
    w.write(index, hs)
    w.close()


@pytest.fixture
def warnings_logged() -> Iterator[list[str]]:
    """The WARNING lines of dledger.server.promises, read from a handler on that logger itself:
    what earlier tests in the same process did to the root logger's handlers or levels cannot
    hide them (caplog reads through the root logger)."""
    lines: list[str] = []
    handler = logging.Handler(logging.WARNING)
    handler.emit = lambda record: lines.append(record.getMessage())  # type: ignore[method-assign]
    log = logging.getLogger("dledger.server.promises")
    old_level, old_disabled = log.level, log.disabled
    log.addHandler(handler)
    log.setLevel(logging.WARNING)
    log.disabled = False
    try:
        yield lines
    finally:
        log.removeHandler(handler)
        log.setLevel(old_level)
        log.disabled = old_disabled


@pytest.fixture
def opened(root: Path) -> Iterator[list[SegmentedLogStore]]:
    stores: list[SegmentedLogStore] = []
    yield stores
    for s in stores:
        s.close()


def _recover(root: Path, store: SegmentedLogStore, applied: int = 0):
    path = promise_file(str(root / "dledger-n0"), "")
    assert path == promise_path(root, "n0")
    return recover("g", "n0", store, path, applied)


def test_a_brand_new_member_starts_at_term_zero(
    root: Path, opened: list[SegmentedLogStore]
) -> None:
    store = _store(root)
    opened.append(store)
    st = _recover(root, store)
    assert st.promised == Promised(0) and st.hard_state == HardState()


def test_missing_meta_is_recovered_from_the_promise_copy(
    root: Path,
    opened: list[SegmentedLogStore],
    warnings_logged: list[str],
) -> None:
    store = _store(root, 5)
    opened.append(store)
    store.save_hard_state(HardState(7, "n2"))
    _promise(root, 5, HardState(7, "n2"))
    (store.root / "meta").unlink()
    st = _recover(root, store)
    assert st.hard_state == HardState(7, "n2") and st.promised == Promised(5)
    assert any("missing" in line for line in warnings_logged)
    assert store.load_hard_state() == HardState(7, "n2")  # rewritten


def test_damaged_meta_starts_from_the_copy_with_a_warning(
    root: Path,
    opened: list[SegmentedLogStore],
    warnings_logged: list[str],
) -> None:
    store = _store(root, 3)
    opened.append(store)
    store.save_hard_state(HardState(4, "n1"))
    _promise(root, 3, HardState(4, "n1"))
    meta = store.root / "meta"
    raw = bytearray(meta.read_bytes())
    raw[10] ^= 0xFF
    meta.write_bytes(bytes(raw))
    st = _recover(root, store)
    assert st.hard_state == HardState(4, "n1") and not st.promised.vote_lost
    assert any("damaged" in line for line in warnings_logged)


def test_the_higher_term_wins(root: Path, opened: list[SegmentedLogStore]) -> None:
    store = _store(root, 3)
    opened.append(store)
    store.save_hard_state(HardState(3, "n1"))
    _promise(root, 3, HardState(5, None))
    assert _recover(root, store).hard_state == HardState(5, None)


def test_no_meta_and_no_promise_with_entries_is_a_lost_vote(
    root: Path, opened: list[SegmentedLogStore]
) -> None:
    store = _store(root, 4)
    opened.append(store)
    st = _recover(root, store)
    assert st.promised == Promised(0, vote_lost=True)


def test_an_empty_store_under_a_surviving_promise_is_repairing(
    root: Path,
    opened: list[SegmentedLogStore],
) -> None:
    _promise(root, 40, HardState(6, "n0"))
    store = _store(root)
    opened.append(store)
    st = _recover(root, store, applied=35)
    assert st.promised == Promised(40) and st.hard_state == HardState(6, "n0")
    # The application applied beyond both: that is a promise too.
    assert _recover(root, store, applied=50).promised.index == 50


def test_another_members_or_a_damaged_promise_file_is_refused(
    root: Path,
    opened: list[SegmentedLogStore],
) -> None:
    _promise(root, 4, HardState(1), node="n9")
    store = _store(root)
    opened.append(store)
    with pytest.raises(PromiseError, match="member 'n9'"):
        _recover(root, store)


def test_a_promise_file_damaged_in_both_slots_starts_repairing_with_the_vote_lost(
    root: Path, opened: list[SegmentedLogStore]
) -> None:
    """Both slots damaged: the node starts (no person needed), repairing with its vote
    counted as lost, from ``meta``'s hard state, and says so in one ERROR line."""
    store = _store(root, 6)
    opened.append(store)
    store.save_hard_state(HardState(3, "n1"))
    _promise(root, 9, HardState(3, "n1"))
    path = promise_path(root, "n0")
    data = bytearray(path.read_bytes())
    for slot in range(2):
        data[slot * 1024 + 40] ^= 0xFF  # inside the head (or the zeros of the empty slot)
    path.write_bytes(bytes(data))
    errors: list[str] = []
    handler = logging.Handler(logging.ERROR)
    handler.emit = lambda record: errors.append(record.getMessage())  # type: ignore[method-assign]
    log = logging.getLogger("dledger.server.promises")
    log.addHandler(handler)
    try:
        st = _recover(root, store, applied=4)
    finally:
        log.removeHandler(handler)
    assert st.promised == Promised(0, vote_lost=True) and st.promise_damaged  # the log: 6
    assert st.hard_state == HardState(3, "n1")
    assert len(errors) == 1 and str(path) in errors[0] and "vote counted as lost" in errors[0]
    # The damaged file stays until the first promise replaces it (a restart before that
    # must not read "no promise file").
    assert path.read_bytes() == bytes(data)
    st.writer.write(7, HardState(3, "n1"))
    got = read_promise(path)
    assert got is not None and got.promised_index == 7
    st.writer.close()
    # A file of the wrong size is damage too; the applied index counts as the promise.
    path.write_bytes(b"\0" * 100)
    st = _recover(root, store, applied=8)
    assert st.promised == Promised(8, vote_lost=True)


def test_write_promise_goes_through_the_writer(root: Path) -> None:
    w = PromiseWriter(promise_path(root, "n0"), "g", "n0", None)
    write_promise(w, 9, HardState(2, "n1"))
    got = read_promise(promise_path(root, "n0"))
    assert got is not None and got.promised_index == 9 and got.hard_state == HardState(2, "n1")
    w.close()


def test_a_log_ending_inside_the_job_the_promise_was_written_beside_is_a_crash(
    root: Path, opened: list[SegmentedLogStore]
) -> None:
    """The promise (10) was written beside the flush of entries 8..10 (7 durable before):
    a log ending at 8 lost only that job's tail to a crash, before its answers left."""
    w = PromiseWriter(promise_path(root, "n0"), "g", "n0", None)
    w.write(10, HardState(2, "n1"), durable_index=7)
    w.close()
    store = _store(root, 8)
    opened.append(store)
    store.save_hard_state(HardState(2, "n1"))
    assert _recover(root, store).promised == Promised(8)
    # Below what was durable before that job: it forgot acknowledged entries.
    store.truncate_suffix(6)
    assert _recover(root, store).promised == Promised(10)


def test_after_a_power_cut_that_lost_the_refreshes_a_whole_log_is_not_repairing(
    root: Path, opened: list[SegmentedLogStore]
) -> None:
    """Issue 36: the promise ran ahead (durably) and the exact refreshes were lost with the
    page cache; the log (flushed before each acknowledgement) holds every acknowledged
    entry. The member starts from its log's end, not repairing: a group whose power failed
    at once elects at once. A log rolled back below the durable index still repairs."""
    hs = HardState(2, "n1")
    path = promise_path(root, "n0")
    w = PromiseWriter(path, "g", "n0", None)
    w.write(20, hs)
    w.write_ahead(21, hs, 20, 512)
    on_disk = path.read_bytes()
    for index in range(22, 41):
        w.refresh(index, hs, index)
    w.close()
    path.write_bytes(on_disk)  # the power cut: only what was fsynced
    store = _store(root, 40)
    opened.append(store)
    store.save_hard_state(hs)
    st = _recover(root, store, applied=30)
    assert st.promised == Promised(40)  # the log's end: not repairing
    store.truncate_suffix(15)  # the same store, rolled back below the durable index
    st = _recover(root, store, applied=14)
    assert st.promised.index == 21 + 512  # repairing up to what the durable promise covered
