"""The core's view of its log: a stable prefix in the LogStore and an unstable tail in memory.

The core never writes the store. Entries it appends (proposals, a leader's appends) go to the
*unstable tail*; a follower's conflict cuts the tail, or marks the stored log to be cut. The
driver is handed the tail (``take``) together with the point from which the stored log must be
cut first, writes both, and confirms with ``stable`` once they are persisted.

Invariant: the store's entries below ``unstable_first`` agree with the core's view and no
persist job writes them, so they are read from the store even while a job runs; every index
from ``unstable_first`` on is read from memory.
"""

from __future__ import annotations

from collections.abc import Sequence

from dledger.log import Entry, IndexOutOfRangeError, LogStore


class RaftLog:
    """Reads merge the stored prefix and the unstable tail; writes touch only the tail."""

    __slots__ = ("_handed_last", "_stored_last", "_unstable", "_valid_upto", "store", "u_first")

    def __init__(self, store: LogStore) -> None:
        self.store = store
        last = store.last_index()
        # What the store holds once every handed-out job is done (entries at or above u_first
        # there may be stale: then the next take() asks for a truncation).
        self._stored_last = last
        self.u_first = last + 1  # first index of the unstable tail
        self._unstable: list[Entry] = []
        self._handed_last = 0  # last index handed to the driver in the job in flight (0: none)
        self._valid_upto = 0  # the job's entries up to here are still the core's (no cut since)

    # ------------------------------------------------------------------ reads

    def first_index(self) -> int:
        return self.store.first_index()

    def last_index(self) -> int:
        return self.u_first - 1 + len(self._unstable)

    def last_term(self) -> int:
        return self.term_at(self.last_index())

    def stable_last(self) -> int:
        """Highest index the driver confirmed persisted (and that the core still holds)."""
        return self.u_first - 1

    def term_at(self, index: int) -> int:
        if index >= self.u_first:
            k = index - self.u_first
            if k >= len(self._unstable):
                raise IndexOutOfRangeError(f"index {index} above last index {self.last_index()}")
            return self._unstable[k].term
        return self.store.term_at(index)

    def read_range(self, start: int, max_bytes: int, max_count: int) -> list[Entry]:
        """Like ``LogStore.read_range``; a range that starts in the store stops at its end."""
        if start < self.u_first:
            return self.store.read_range(start, max_bytes, min(max_count, self.u_first - start))
        k = start - self.u_first
        if k > len(self._unstable):
            raise IndexOutOfRangeError(f"index {start} above last index {self.last_index()}")
        out: list[Entry] = []
        size = 0
        for e in self._unstable[k : k + max_count]:
            if out and size + len(e.body) > max_bytes:
                break
            out.append(e)
            size += len(e.body)
        return out

    def unstable_count(self) -> int:
        return len(self._unstable)

    # ------------------------------------------------------------------ writes (memory only)

    def append(self, entries: Sequence[Entry]) -> None:
        """Append ``entries``; the first may be at or below the last index: the log is cut
        there first (a follower's conflict repair)."""
        first = entries[0].index
        assert self.first_index() <= first <= self.last_index() + 1, "append not contiguous"
        if first <= self.last_index():
            self._cut(first)
        self._unstable.extend(entries)

    def _cut(self, index: int) -> None:
        if index >= self.u_first:
            del self._unstable[index - self.u_first :]
        else:
            # Into the stored prefix: the next job cuts the store at ``index``.
            self._unstable = []
            self.u_first = index
        self._valid_upto = min(self._valid_upto, index - 1)

    # ------------------------------------------------------------------ the persist job

    def has_work(self) -> bool:
        return bool(self._unstable) or self._stored_last >= self.u_first

    def take(self) -> tuple[int | None, tuple[Entry, ...]]:
        """The job for the next Ready: (truncate the store from this index first, or None;
        then append these entries). At most one job is in flight."""
        assert self._handed_last == 0, "a persist job is already in flight"
        truncate_from = self.u_first if self._stored_last >= self.u_first else None
        entries = tuple(self._unstable)
        if entries:
            self._handed_last = self._valid_upto = entries[-1].index
        if truncate_from is not None or entries:
            self._stored_last = entries[-1].index if entries else self.u_first - 1
        return truncate_from, entries

    def stable(self) -> None:
        """The driver persisted the job last taken: its entries still in the tail (none were
        cut since) become the stable prefix."""
        upto = min(self._handed_last, self._valid_upto)
        self._handed_last = self._valid_upto = 0
        if upto >= self.u_first:
            del self._unstable[: upto - self.u_first + 1]
            self.u_first = upto + 1
