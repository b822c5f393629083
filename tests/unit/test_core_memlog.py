"""The simulator's in-memory LogStore: the LogStore contract and its durability model."""

from __future__ import annotations

import pytest

from dledger.log import Entry, HardState, IndexOutOfRangeError, LogCompactedError
from dledger.sim.memlog import MemLog


def _entries(first: int, terms: list[int]) -> list[Entry]:
    return [Entry(t, first + i, b"b%d" % (first + i)) for i, t in enumerate(terms)]


def test_empty_store() -> None:
    log = MemLog()
    assert (log.first_index(), log.last_index(), log.last_term(), log.term_at(0)) == (1, 0, 0, 0)
    assert log.read_range(1, 100) == []
    assert log.load_hard_state() == HardState()


def test_crash_drops_unflushed_entries_only() -> None:
    log = MemLog()
    log.append(_entries(1, [1, 1, 1]))
    assert log.flush() == 3
    log.append(_entries(4, [2, 2]))
    assert log.flushed_index() == 3
    assert log.crash() == 2
    assert log.last_index() == 3 and log.last_term() == 1


def test_truncation_is_durable() -> None:
    log = MemLog()
    log.append(_entries(1, [1, 1, 1, 1]))
    log.flush()
    log.truncate_suffix(3)
    log.append(_entries(3, [2]))
    log.crash()  # the new entry 3 was not flushed; the old 3 and 4 must not come back
    assert [e.term for e in log.entries()] == [1, 1]


def test_hard_state_is_durable_at_once() -> None:
    log = MemLog()
    log.save_hard_state(HardState(3, "n1"))
    log.crash()
    assert log.load_hard_state() == HardState(3, "n1")


def test_read_range_limits_and_errors() -> None:
    log = MemLog()
    log.append(_entries(1, [1] * 10))
    assert len(log.read_range(1, 1 << 20, max_count=4)) == 4
    assert len(log.read_range(1, 5)) == 2  # 3-byte bodies; at least one, about max_bytes
    assert len(log.read_range(1, 0)) == 1
    with pytest.raises(IndexOutOfRangeError):
        log.read(11)
    with pytest.raises(IndexOutOfRangeError):
        log.term_at(11)
    with pytest.raises(LogCompactedError):
        log.read(0)


def test_prefix_hash_tracks_whole_prefix() -> None:
    a, b = MemLog(), MemLog()
    a.append(_entries(1, [1, 1, 2]))
    b.append(_entries(1, [1, 1]))
    b.append([Entry(2, 3, b"other")])
    assert a.prefix_hash(2) == b.prefix_hash(2)
    assert a.prefix_hash(3) != b.prefix_hash(3)
