"""Disk watermarks: the leader refuses sends while the store's file system is too full.

RocketMQ refuses writes when the commitlog's disk is above ``diskSpaceWarningLevelRatio`` and
writes on the hot path read a flag that a background service sets. Here the same idea in one
object on the send path: :meth:`DiskGuard.check` costs a clock read and a comparison, and at
most once every ``check_interval_ms`` one ``statvfs`` call (about a microsecond). Above the
high mark (``diskSpaceWarningLevelRatio``, as in RocketMQ) sends are refused with
``RESOURCE_EXHAUSTED`` and a detail ``DISK_FULL node=... path=... used=...%``; they are
accepted again once usage falls below the low mark (``diskSpaceResumeRatio``), which keeps a
disk hovering at the high mark from flapping between the two answers. The marks change live
(:meth:`DiskGuard.retune`, broker.liveconfig). Sends are also refused while the file
system has less free space than the log's next allocation (the next data segment unless it
is allocated already, and the next index file): the log must always be able to take its
next files, or the Raft reserve (dledger.server.logroom) is all it has left. Pulls, offset
commits, elections, heartbeats and retention are never refused: they do not grow the log by
more than the headroom above the mark holds, and retention is what frees space. See
docs/STORAGE.md "Disk full".
"""

from __future__ import annotations

import logging
import os
import time
from collections.abc import Callable
from dataclasses import dataclass

from broker.state.errors import ConfigError
from dledger.storage import DiskFullError
from dledger.storage.retention import used_percent as used_percent  # the one definition

logger = logging.getLogger(__name__)

# RocketMQ refuses writes at 90 % (diskSpaceWarningLevelRatio); the 10 % left holds what is
# in flight when the mark is crossed (one statvfs period of sends, the ConsumeQueue and key
# index entries of what was committed, checkpoints) on any disk of a few GiB or more.
DEFAULT_MAX_USED_PERCENT = 90
# Sends resume once usage falls 5 points below the high mark (the hysteresis band).
DEFAULT_RESUME_PERCENT = 85
# statvfs is cheap but not free: at most one call per this many ms on the send path. The
# usage seen may be this old: sends of one period (at 1 GB/s, 0.5 GB) land above the mark.
DEFAULT_CHECK_INTERVAL_MS = 500
# Bounds of the keys: a mark below 10 % or at 100 % makes no sense (100 % is ENOSPC itself).
# (RocketMQ clamps its refusal mark to 35..90 % without a word; raftmq takes 10..99 as set.)
MIN_USED_PERCENT = 10
MAX_USED_PERCENT = 99
MIN_CHECK_INTERVAL_MS = 10
MAX_CHECK_INTERVAL_MS = 60_000
# Characters of the store path kept in a DISK_FULL detail (details stay well under 1 KiB).
PATH_MAX_CHARS = 200


@dataclass(frozen=True, slots=True)
class Watermarks:
    """``max_used_percent``: refuse sends above it; ``resume_percent``: accept them again
    below it (``< max_used_percent``); ``check_interval_ms``: how stale the usage may be."""

    max_used_percent: int = DEFAULT_MAX_USED_PERCENT
    resume_percent: int = DEFAULT_RESUME_PERCENT
    check_interval_ms: int = DEFAULT_CHECK_INTERVAL_MS

    def __post_init__(self) -> None:
        if not MIN_USED_PERCENT <= self.max_used_percent <= MAX_USED_PERCENT:
            raise ConfigError(
                f"max_used_percent={self.max_used_percent} is outside "
                f"[{MIN_USED_PERCENT}, {MAX_USED_PERCENT}]"
            )
        if not 1 <= self.resume_percent < self.max_used_percent:
            raise ConfigError(
                f"resume_percent={self.resume_percent} must be in [1, max_used_percent="
                f"{self.max_used_percent})"
            )
        if not MIN_CHECK_INTERVAL_MS <= self.check_interval_ms <= MAX_CHECK_INTERVAL_MS:
            raise ConfigError(
                f"check_interval_ms={self.check_interval_ms} is outside "
                f"[{MIN_CHECK_INTERVAL_MS}, {MAX_CHECK_INTERVAL_MS}]"
            )


class DiskGuard:
    """The send path's disk check for one node's store directory."""

    __slots__ = (
        "_clock",
        "_interval_s",
        "_next_allocation",
        "_next_s",
        "_statvfs",
        "free_bytes",
        "full",
        "marks",
        "need_bytes",
        "node_id",
        "path",
        "refused_count",
        "used_percent",
    )

    def __init__(
        self,
        node_id: str,
        path: str,
        marks: Watermarks | None = None,
        *,
        statvfs: Callable[[str], os.statvfs_result] = os.statvfs,
        clock: Callable[[], float] = time.monotonic,
        next_allocation: Callable[[], int] | None = None,
    ) -> None:
        """``next_allocation``: bytes the log must still allocate before it can grow past its
        active files (``DLedgerNode.log_next_allocation_bytes``); sends are refused while the
        file system has less free, whatever the used share."""
        self.node_id = node_id
        self._next_allocation = next_allocation
        self.need_bytes = 0
        self.path = path
        self.marks = marks if marks is not None else Watermarks()
        self._statvfs = statvfs
        self._clock = clock
        self._interval_s = self.marks.check_interval_ms / 1000
        self._next_s = float("-inf")
        self.full = False
        self.used_percent = 0.0
        self.free_bytes = -1
        self.refused_count = 0  # sends refused (metrics, tests)

    def retune(self, marks: Watermarks) -> None:
        """New marks (a live change): the next check samples the disk again with them."""
        if marks == self.marks:
            return  # another key changed
        self.marks = marks
        self._interval_s = marks.check_interval_ms / 1000
        self._next_s = float("-inf")
        logger.info(
            "disk marks node=%s refuse_at=%d%% resume_below=%d%% check_interval_ms=%d",
            self.node_id,
            marks.max_used_percent,
            marks.resume_percent,
            marks.check_interval_ms,
        )

    def check(self) -> None:
        """Raise :class:`DiskFullError` (``DISK_FULL ...``) while the disk is above the mark.
        O(1): a clock read; a statvfs at most every ``check_interval_ms``."""
        now = self._clock()
        if now >= self._next_s:
            self._next_s = now + self._interval_s
            self.sample()
        if self.full:
            self.refused_count += 1
            raise DiskFullError(self.detail())

    def sample(self) -> None:
        """Read the file system's usage now and move between the full and writable states."""
        try:
            st = self._statvfs(self.path)
        except OSError as exc:
            # The directory is missing or unreadable: the store itself will say why if it
            # matters; the guard keeps its last state rather than guessing either way.
            logger.debug("disk check failed path=%s error=%s", self.path, exc)
            return
        used = used_percent(st)
        self.used_percent = used
        self.free_bytes = st.f_bavail * st.f_frsize
        self.need_bytes = self._next_allocation() if self._next_allocation is not None else 0
        short = self.free_bytes < self.need_bytes  # the log could not take its next files
        if not self.full and (used >= self.marks.max_used_percent or short):
            self.full = True
            logger.warning("DISK_FULL refusing sends %s", self.detail())
        elif self.full and used < self.marks.resume_percent and not short:
            self.full = False
            logger.warning(
                "disk space back: accepting sends node=%s path=%s used=%.1f%%",
                self.node_id,
                self.path,
                used,
            )

    def detail(self) -> str:
        """What a refused send is told (the ``DISK_FULL`` code is prefixed by the caller)."""
        path = self.path
        if len(path) > PATH_MAX_CHARS:
            path = "..." + path[-(PATH_MAX_CHARS - 3) :]
        return (
            f"node={self.node_id} path={path} used={self.used_percent:.1f}% "
            f"max={self.marks.max_used_percent}% resume_below={self.marks.resume_percent}% "
            f"free_bytes={self.free_bytes} next_allocation_bytes={self.need_bytes}"
        )
