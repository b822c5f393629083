"""QueueLockTable: one live holder per (group, topic, queue); expiry; heartbeat claims; limits."""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from typing import Any

import pytest

from broker.components.locks import ConsumerTable, QueueLockTable
from broker.state.errors import TooManyConsumersError, TooManyLocksError

Q0, Q1 = ("T", 0), ("T", 1)


def test_one_holder_until_unlock_or_expiry() -> None:
    t = QueueLockTable(max_live_ms=1000)
    assert t.lock("g", "a", [Q0, Q1], now_ms=0) == [Q0, Q1]
    assert t.lock("g", "b", [Q0, Q1], now_ms=10) == []
    assert t.lock("g", "a", [Q0], now_ms=500) == [Q0]  # renewal
    assert t.unlock("g", "b", [Q0, Q1]) == []  # not b's to release
    assert t.unlock("g", "a", [Q1]) == [Q1]
    assert t.lock("g", "b", [Q0, Q1], now_ms=600) == [Q1]
    # a renewed Q0 at 500: free at 1500, not before.
    assert t.lock("g", "b", [Q0], now_ms=1499) == []
    assert t.lock("g", "b", [Q0], now_ms=1500) == [Q0]
    assert t.holder(("g", "T", 0), 1500) == "b"


def test_groups_are_independent() -> None:
    t = QueueLockTable()
    assert t.lock("g1", "a", [Q0], now_ms=0) == [Q0]
    assert t.lock("g2", "b", [Q0], now_ms=0) == [Q0]


def test_heartbeat_claim_renews_or_takes_free_but_never_steals() -> None:
    t = QueueLockTable(max_live_ms=1000)
    t.lock("g", "a", [Q0], now_ms=0)
    t.claim("g", "b", [Q0, Q1], now_ms=100)
    assert t.holder(("g", "T", 0), 100) == "a"
    assert t.holder(("g", "T", 1), 100) == "b"
    t.claim("g", "a", [Q0], now_ms=900)  # renews
    assert t.lock("g", "b", [Q0], now_ms=1800) == []
    assert t.lock("g", "b", [Q0], now_ms=1900) == [Q0]


def test_release_client_frees_only_its_locks() -> None:
    t = QueueLockTable()
    t.lock("g", "a", [Q0], now_ms=0)
    t.lock("g", "b", [Q1], now_ms=0)
    assert t.release_client("g", "a") == 1
    assert t.holder(("g", "T", 0), 1) is None
    assert t.holder(("g", "T", 1), 1) == "b"


def test_table_is_bounded_and_sweeps_expired_locks() -> None:
    t = QueueLockTable(max_live_ms=100, max_locks=2)
    with pytest.raises(TooManyLocksError):  # all or nothing: no partial grant when full
        t.lock("g", "a", [("T", 0), ("T", 1), ("T", 2)], now_ms=0)
    assert len(t) == 0
    assert t.lock("g", "a", [("T", 0), ("T", 1)], now_ms=0) == [("T", 0), ("T", 1)]
    with pytest.raises(TooManyLocksError) as err:
        t.lock("g", "b", [("T", 2)], now_ms=50)
    assert err.value.code == "TOO_MANY_LOCKS"
    assert t.lock("g", "a", [("T", 2)], now_ms=100) == [("T", 2)]  # the expired were swept
    assert len(t) == 1


def test_one_client_cannot_fill_the_table() -> None:
    t = QueueLockTable(max_locks=10, max_locks_per_client=3)
    assert len(t.lock("g", "junk", [("T", q) for q in range(3)], now_ms=0)) == 3
    with pytest.raises(TooManyLocksError):
        t.lock("g", "junk", [("T", 3)], now_ms=1)
    assert t.lock("g", "junk", [("T", 0)], now_ms=2) == [("T", 0)]  # renewals always fit
    assert t.claim("g", "junk", [("T", 4), ("T", 5)], now_ms=3) == 0  # claims are capped too
    # A real consumer still gets its queues.
    assert t.lock("g", "real", [("T", 7), ("T", 8)], now_ms=4) == [("T", 7), ("T", 8)]
    assert t.release_client("g", "junk") == 3
    assert t.held_by("g", "junk") == 0


def _count_visits(t: QueueLockTable) -> Any:
    """Replace the table's dict with one that counts the entries its ``items()`` yields:
    every scan of the table goes through it."""
    base: Any = type(t._locks)

    class Counting(base):  # type: ignore[misc]
        visited = 0

        def items(self) -> Iterator[Any]:
            for kv in base.items(self):
                Counting.visited += 1
                yield kv

    t._locks = Counting(t._locks)
    return Counting


def test_a_full_table_is_not_scanned_per_new_key() -> None:
    """Finding: once the table was full, every new key swept the whole table (7-15 s stalls
    of the leader under a flood of junk LockBatchMQ). Now expiry looks only at the oldest
    lock, so a flood costs O(1) per key."""
    n = 2000
    t = QueueLockTable(max_live_ms=60_000, max_locks=n)
    for q in range(n):
        assert t.lock("g", f"c{q}", [("T", q)], now_ms=q) == [("T", q)]
    counter = _count_visits(t)
    attempts = 500
    for q in range(attempts):
        with contextlib.suppress(TooManyLocksError):
            assert t.lock("g", "junk", [("J", q)], now_ms=n + q) == []
    assert counter.visited <= 4 * attempts, counter.visited
    # Releasing one client's locks does not scan the others' either.
    counter.visited = 0
    assert t.release_client("g", "c7") == 1
    assert counter.visited <= 4, counter.visited
    assert len(t) == n - 1


def test_expired_locks_leave_eagerly_in_renewal_order() -> None:
    t = QueueLockTable(max_live_ms=100)
    t.lock("g", "a", [Q0], now_ms=0)
    t.lock("g", "b", [Q1], now_ms=50)
    t.lock("g", "a", [Q0], now_ms=60)  # renewed: now younger than b's
    assert t.expire(now_ms=155) == 1  # b's lock (50 + 100) is gone, a's (60) is not
    assert t.holder(("g", "T", 0), 155) == "a"
    assert t.held_by("g", "b") == 0
    assert t.expire(now_ms=160) == 1
    assert len(t) == 0


def test_consumer_table_caps_and_eager_expiry() -> None:
    c = ConsumerTable(expire_ms=1000, max_consumers=3, max_per_group=2)
    c.heartbeat("g1", "a", 0)
    c.heartbeat("g1", "b", 10)
    with pytest.raises(TooManyConsumersError) as err:
        c.heartbeat("g1", "c", 20)
    assert err.value.code == "TOO_MANY_CONSUMERS"
    c.heartbeat("g2", "x", 30)
    with pytest.raises(TooManyConsumersError):
        c.heartbeat("g3", "y", 40)  # the node's total
    c.heartbeat("g1", "a", 500)  # a renewal always fits
    assert c.clients("g1") == ["a", "b"]
    assert c.expire(1010) == [("g1", "b", "")]  # b: silent since 10
    assert c.clients("g1") == ["a"]
    c.heartbeat("g3", "y", 1020)  # room again
    assert c.remove("g3", "y") and not c.remove("g3", "y")
    assert c.expire(5000) == [("g2", "x", ""), ("g1", "a", "")]
    assert len(c) == 0
