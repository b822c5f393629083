"""Retention policy (fileReservedTime / deleteWhen) and its application by the store."""

from __future__ import annotations

import itertools
import os
from datetime import datetime, timedelta
from pathlib import Path

import pytest

from dledger.log import Entry, LogCompactedError
from dledger.storage.retention import SegmentInfo, parse_delete_when, segments_to_delete
from dledger.storage.store import SegmentedLogStore, StoreConfig

NOW = datetime(2026, 11, 22, 4, 30)
HOUR = 3600.0


def seg(k: int, first: int, last: int, age_hours: float) -> SegmentInfo:
    return SegmentInfo(f"/s/{k}", k * 100, first, last, NOW.timestamp() - age_hours * HOUR)


SEGS = [seg(0, 1, 10, 100), seg(1, 11, 20, 80), seg(2, 21, 30, 50), seg(3, 31, 35, 1)]


def test_parse_delete_when() -> None:
    assert parse_delete_when("04") == {4}
    assert parse_delete_when("04;05") == {4, 5}
    assert parse_delete_when(" 4 ; 23 ") == {4, 23}
    for bad in ("", "24", "4am", "04;;05"):
        with pytest.raises(ValueError):
            parse_delete_when(bad)


def test_deletes_old_applied_segments_at_the_right_hour() -> None:
    got = segments_to_delete(SEGS, now=NOW, applied_index=35)
    assert [s.path for s in got] == ["/s/0", "/s/1"]  # older than 72 h


def test_not_at_another_hour() -> None:
    assert segments_to_delete(SEGS, now=NOW.replace(hour=5), applied_index=35) == []
    got = segments_to_delete(SEGS, now=NOW.replace(hour=5), applied_index=35, delete_when="04;05")
    assert len(got) == 2


def test_only_applied_entries() -> None:
    assert [s.path for s in segments_to_delete(SEGS, now=NOW, applied_index=15)] == ["/s/0"]
    assert segments_to_delete(SEGS, now=NOW, applied_index=9) == []


def test_reserved_time_and_prefix_only() -> None:
    got = segments_to_delete(SEGS, now=NOW, applied_index=35, file_reserved_time_hours=40)
    assert len(got) == 3  # never the last (active) segment
    young_first = [seg(0, 1, 10, 1), *SEGS[1:]]
    assert segments_to_delete(young_first, now=NOW, applied_index=35) == []  # prefix only
    assert len(segments_to_delete(SEGS, now=NOW, applied_index=35, file_reserved_time_hours=0))


def test_empty_segment_stops_deletion() -> None:
    assert (
        segments_to_delete([seg(0, 0, 0, 100), seg(1, 1, 5, 100)], now=NOW, applied_index=9) == []
    )
    with pytest.raises(ValueError):
        segments_to_delete(SEGS, now=NOW, applied_index=1, file_reserved_time_hours=-1)


def test_store_applies_retention(tmp_path: Path) -> None:
    cfg = StoreConfig(segment_size_bytes=64 * 1024, index_segment_size_bytes=64 * 1024)
    s = SegmentedLogStore(tmp_path / "s", cfg)
    s.append([Entry(1 + i // 300, i, b"r" * 500) for i in range(1, 1001)])
    infos = s.segment_infos()
    assert len(infos) >= 4
    assert infos[0].first_index == 1 and infos[-1].last_index == 1000
    assert all(a.last_index + 1 == b.first_index for a, b in itertools.pairwise(infos))
    old = (NOW - timedelta(hours=100)).timestamp()
    for info in infos[:3]:
        os.utime(info.path, (old, old))
    applied = infos[1].last_index  # only the first two are applied
    assert s.apply_retention(now=NOW.replace(hour=3), applied_index=applied) == 0
    assert s.apply_retention(now=NOW, applied_index=applied) == 2
    assert s.first_index() == infos[2].first_index
    assert s.term_at(s.first_index() - 1) == 1 + (s.first_index() - 1) // 300
    with pytest.raises(LogCompactedError):
        s.read(1)
    s.close()
    s = SegmentedLogStore(tmp_path / "s", cfg)
    assert s.first_index() == infos[2].first_index
    assert s.read(1000).body == b"r" * 500
    s.close()


def test_a_member_lacking_segments_holds_them_only_up_to_the_lag_bound() -> None:
    # Every member holds up to index 15: segment 0 (1..10) goes at fileReservedTime;
    # segments 1 and 2 wait for the member unless older than maxLagRetentionHours.
    def paths(**kw: int) -> list[str]:
        got = segments_to_delete(SEGS, now=NOW, applied_index=35, held_index=15, **kw)
        return [s.path for s in got]

    assert paths(max_lag_hours=100) == ["/s/0"]
    assert paths(max_lag_hours=60) == ["/s/0", "/s/1"]
    assert paths(max_lag_hours=0) == ["/s/0", "/s/1"]  # /s/2 is younger than 72 h
    assert paths(max_lag_hours=0, file_reserved_time_hours=40) == ["/s/0", "/s/1", "/s/2"]
    # Unknown members (held_index=-1): only what is older than the bound.
    got = segments_to_delete(SEGS, now=NOW, applied_index=35, held_index=-1, max_lag_hours=90)
    assert [s.path for s in got] == ["/s/0"]
    with pytest.raises(ValueError):
        segments_to_delete(SEGS, now=NOW, applied_index=35, held_index=1, max_lag_hours=-1)


def test_early_deletion_waives_only_the_hour() -> None:
    """Above diskMaxUsedSpaceRatio retention does not wait for deleteWhen; every other rule
    (expired, applied and on disk, held by the members or past the lag bound) still holds."""
    later = NOW.replace(hour=5)
    assert segments_to_delete(SEGS, now=later, applied_index=35) == []
    got = segments_to_delete(SEGS, now=later, applied_index=35, early=True)
    assert [s.path for s in got] == ["/s/0", "/s/1"]  # only the expired ones, not /s/2 (50 h)
    assert [s.path for s in segments_to_delete(SEGS, now=later, applied_index=15, early=True)] == [
        "/s/0"
    ]
    held = segments_to_delete(
        SEGS, now=later, applied_index=35, held_index=12, max_lag_hours=90, early=True
    )
    assert [s.path for s in held] == ["/s/0"]  # a member lacks /s/1, younger than the lag bound
    young_first = [seg(0, 1, 10, 1), *SEGS[1:]]
    assert segments_to_delete(young_first, now=later, applied_index=35, early=True) == []
