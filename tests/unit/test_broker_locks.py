"""QueueLockTable: one live holder per (group, topic, queue); expiry; heartbeat claims; limits."""

from __future__ import annotations

from broker.locks import QueueLockTable

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
    assert t.lock("g", "a", [("T", 0), ("T", 1), ("T", 2)], now_ms=0) == [("T", 0), ("T", 1)]
    assert len(t) == 2
    assert t.lock("g", "a", [("T", 2)], now_ms=100) == [("T", 2)]  # the expired were swept
    assert len(t) == 1
