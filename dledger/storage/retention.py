"""Retention policy: which whole data segments may be deleted (RocketMQ's cleanup rules).

Pure functions with the clock passed in, so that every rule is testable. The store applies
the result with :meth:`dledger.storage.store.SegmentedLogStore.delete_prefix`.
"""

from __future__ import annotations

import os
from collections.abc import Sequence
from dataclasses import dataclass
from datetime import datetime

from dledger.log import ConfigError

# RocketMQ's defaults: keep files 72 hours, delete at 4 in the morning (local time).
DEFAULT_FILE_RESERVED_TIME_HOURS = 72
DEFAULT_DELETE_WHEN = "04"
SECONDS_PER_HOUR = 3600
# How long segments are kept for a member that lacks them (behind, or down) before retention
# deletes them anyway and the member is caught up by a snapshot when it returns
# (maxLagRetentionHours). Two days: a machine that is down over a weekend night still
# catches up from the log, one that is gone does not fill its group's disks for ever.
DEFAULT_MAX_LAG_RETENTION_HOURS = 48
# The largest value accepted: ten years, "never" in practice.
MAX_LAG_RETENTION_HOURS_LIMIT = 24 * 365 * 10
# Early retention (RocketMQ's diskMaxUsedSpaceRatio, 75 % by default there): above this share
# of the store's file system used, expired segments are deleted at once instead of waiting for
# a deleteWhen hour. 0 turns it off; a mark is a whole percent in [MIN, MAX] (100 % is ENOSPC).
# RocketMQ's default: well below the 90 % at which the broker refuses sends, so expired data
# goes before the refusal, and above what a disk holding fileReservedTime of traffic is sized for.
DEFAULT_EARLY_USED_PERCENT = 75
MIN_EARLY_USED_PERCENT = 10
MAX_EARLY_USED_PERCENT = 99


@dataclass(frozen=True, slots=True)
class SegmentInfo:
    """What the policy needs to know about one data segment."""

    path: str
    start_position: int
    first_index: int  # 0 when the segment holds no entry
    last_index: int  # 0 when the segment holds no entry
    mtime_s: float  # last modification time, seconds since the epoch


def used_percent(st: os.statvfs_result) -> float:
    """Percent of the file system this process cannot write: blocks reserved for root count
    as used (``f_bavail``), so a mark means the same for root and other users."""
    if st.f_blocks <= 0:
        return 0.0
    return 100.0 * (st.f_blocks - st.f_bavail) / st.f_blocks


def check_early_used_percent(percent: int) -> None:
    """ConfigError unless ``percent`` is 0 (off) or in [MIN_EARLY_USED_PERCENT,
    MAX_EARLY_USED_PERCENT]."""
    if percent and not MIN_EARLY_USED_PERCENT <= percent <= MAX_EARLY_USED_PERCENT:
        raise ConfigError(
            f"retention_early_used_percent={percent} is outside "
            f"[{MIN_EARLY_USED_PERCENT}, {MAX_EARLY_USED_PERCENT}] (0: off)"
        )


def parse_delete_when(delete_when: str) -> frozenset[int]:
    """``"04"`` or ``"04;05"`` -> the hours of the day at which deletion may run."""
    hours: set[int] = set()
    for part in delete_when.split(";"):
        text = part.strip()
        if not text.isdigit() or not 0 <= int(text) <= 23:
            raise ConfigError(f"deleteWhen={delete_when!r}: {part!r} is not an hour 00..23")
        hours.add(int(text))
    return frozenset(hours)


def segments_to_delete(
    segments: Sequence[SegmentInfo],
    *,
    now: datetime,
    applied_index: int,
    file_reserved_time_hours: int = DEFAULT_FILE_RESERVED_TIME_HOURS,
    delete_when: str = DEFAULT_DELETE_WHEN,
    held_index: int | None = None,
    max_lag_hours: int = DEFAULT_MAX_LAG_RETENTION_HOURS,
    early: bool = False,
) -> list[SegmentInfo]:
    """The leading segments (oldest first) that retention deletes now.

    A segment is deleted when all of these hold: the hour of ``now`` is one of
    ``delete_when``, or ``early`` (the disk is above the early mark: RocketMQ's
    diskMaxUsedSpaceRatio; every other rule still holds, so only expired segments go); the
    segment was last modified at least ``file_reserved_time_hours``
    before ``now``; every entry in it is at or below ``applied_index`` (committed and applied
    by the state machine here); every entry in it is at or below ``held_index`` (held by every
    member of the group; None: not asked), or it was last modified at least ``max_lag_hours``
    before ``now`` (a member that still lacks it is caught up by a snapshot); it is not the
    last (active) segment; and every segment before it is deleted too (the log stays a
    contiguous suffix).
    """
    if file_reserved_time_hours < 0:
        raise ConfigError(f"fileReservedTime={file_reserved_time_hours} must be >= 0")
    if not 0 <= max_lag_hours <= MAX_LAG_RETENTION_HOURS_LIMIT:
        raise ConfigError(
            f"maxLagRetentionHours={max_lag_hours} is outside [0, {MAX_LAG_RETENTION_HOURS_LIMIT}]"
        )
    hours = parse_delete_when(delete_when)
    if now.hour not in hours and not early:
        return []
    cutoff_s = now.timestamp() - file_reserved_time_hours * SECONDS_PER_HOUR
    lag_cutoff_s = now.timestamp() - max_lag_hours * SECONDS_PER_HOUR
    out: list[SegmentInfo] = []
    for seg in segments[:-1]:
        if seg.last_index == 0 or seg.last_index > applied_index or seg.mtime_s > cutoff_s:
            break
        if held_index is not None and seg.last_index > held_index and seg.mtime_s > lag_cutoff_s:
            break  # a member still needs it, and it is younger than the lag bound
        out.append(seg)
    return out
