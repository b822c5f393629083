"""The core's view of its log: a stable prefix in the LogStore and an unstable tail in memory.

The core never writes the store. Entries it appends (proposals, a leader's appends) go to the
*unstable tail*; a follower's conflict cuts the tail, or marks the stored log to be cut. The
driver is handed the tail (``take``) together with the point from which the stored log must be
cut first, writes both, and confirms with ``stable`` once they are persisted.

Invariant: the store's entries below ``unstable_first`` agree with the core's view and no
persist job writes them, so they are read from the store even while a job runs; every index
from ``unstable_first`` on is read from memory.

A follower that accepts a snapshot (``restore``) replaces its whole log: until the driver
confirmed the install (``stable`` after the job that carried it), the snapshot's metadata
answers for everything up to its index (its term at its index, LogCompactedError below) and
the store is not read at all.
"""

from __future__ import annotations

from collections.abc import Sequence

from dledger.chain import CHAIN_ORIGIN, next_chain
from dledger.core.snapshot import SnapshotMeta
from dledger.log import Entry, IndexOutOfRangeError, LogCompactedError, LogStore


class RaftLog:
    """Reads merge the stored prefix and the unstable tail; writes touch only the tail."""

    __slots__ = (
        "_handed_last",
        "_handed_snap",
        "_snap",
        "_snap_taken",
        "_stored_last",
        "_uchains",
        "_unstable",
        "_valid_upto",
        "store",
        "u_first",
    )

    def __init__(self, store: LogStore) -> None:
        self.store = store
        last = store.last_index()
        # What the store holds once every handed-out job is done (entries at or above u_first
        # there may be stale: then the next take() asks for a truncation).
        self._stored_last = last
        self.u_first = last + 1  # first index of the unstable tail
        self._unstable: list[Entry] = []
        self._uchains: list[int] = []  # dledger.chain value of each entry of the tail
        self._handed_last = 0  # last index handed to the driver in the job in flight (0: none)
        self._valid_upto = 0  # the job's entries up to here are still the core's (no cut since)
        # A snapshot accepted and not yet confirmed installed; whether a job carries it, and
        # the one the job in flight carries.
        self._snap: SnapshotMeta | None = None
        self._snap_taken = False
        self._handed_snap: SnapshotMeta | None = None

    # ------------------------------------------------------------------ reads

    def first_index(self) -> int:
        if self._snap is not None:
            return self._snap.index + 1
        return self.store.first_index()

    def last_index(self) -> int:
        return self.u_first - 1 + len(self._unstable)

    def last_term(self) -> int:
        return self.term_at(self.last_index())

    def stable_last(self) -> int:
        """Highest index the driver confirmed persisted (and that the core still holds)."""
        return self.u_first - 1

    def term_at(self, index: int) -> int:
        if index == 0:
            return 0  # the empty prefix, known to every log (a heartbeat's prev after retention)
        if index >= self.u_first:
            k = index - self.u_first
            if k >= len(self._unstable):
                raise IndexOutOfRangeError(f"index {index} above last index {self.last_index()}")
            return self._unstable[k].term
        if self._snap is not None:
            if index == self._snap.index:
                return self._snap.term
            raise LogCompactedError(f"index {index} below the snapshot {self._snap.index}")
        return self.store.term_at(index)

    def chain_at(self, index: int) -> int:
        """The chained checksum at ``index`` (``LogStore.chain_at``; errors as term_at)."""
        if index == 0:
            return CHAIN_ORIGIN
        if index >= self.u_first:
            k = index - self.u_first
            if k >= len(self._uchains):
                raise IndexOutOfRangeError(f"index {index} above last index {self.last_index()}")
            return self._uchains[k]
        if self._snap is not None:
            if index == self._snap.index:
                return self._snap.chain
            raise LogCompactedError(f"index {index} below the snapshot {self._snap.index}")
        return self.store.chain_at(index)

    def read_range(self, start: int, max_bytes: int, max_count: int) -> list[Entry]:
        """Like ``LogStore.read_range``; a range that starts in the store stops at its end."""
        if start < self.u_first:
            if self._snap is not None:
                raise LogCompactedError(f"index {start} is in the snapshot {self._snap.index}")
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

    def pending_snapshot(self) -> SnapshotMeta | None:
        """The snapshot accepted and not yet confirmed installed (None: none)."""
        return self._snap

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
        chain = self.chain_at(first - 1)
        chains = self._uchains
        for e in entries:
            chain = next_chain(chain, e.index, e.term, e.type, e.body)
            chains.append(chain)
        self._unstable.extend(entries)

    def _cut(self, index: int) -> None:
        if index >= self.u_first:
            del self._unstable[index - self.u_first :]
            del self._uchains[index - self.u_first :]
        else:
            # Into the stored prefix: the next job cuts the store at ``index``.
            self._unstable = []
            self._uchains = []
            self.u_first = index
        self._valid_upto = min(self._valid_upto, index - 1)

    # ------------------------------------------------------------------ the persist job

    def restore(self, meta: SnapshotMeta) -> None:
        """Replace the whole log by ``meta`` (a snapshot accepted beyond the commit index):
        the next job installs it, and the store then ends at its index."""
        self._unstable = []
        self._uchains = []
        self.u_first = meta.index + 1
        self._stored_last = meta.index
        self._valid_upto = 0  # the job in flight (if any) writes a log that is void now
        self._snap = meta
        self._snap_taken = False

    def has_work(self) -> bool:
        return (
            bool(self._unstable)
            or self._stored_last >= self.u_first
            or (self._snap is not None and not self._snap_taken)
        )

    def take(self) -> tuple[SnapshotMeta | None, int | None, tuple[Entry, ...]]:
        """The job for the next Ready: (install this snapshot first, or None; truncate the
        store from this index, or None; then append these entries). At most one job is in
        flight."""
        assert self._handed_last == 0 and self._handed_snap is None, "a job is in flight"
        snap = None
        if self._snap is not None and not self._snap_taken:
            snap = self._handed_snap = self._snap
            self._snap_taken = True
        truncate_from = self.u_first if self._stored_last >= self.u_first else None
        entries = tuple(self._unstable)
        if entries:
            self._handed_last = self._valid_upto = entries[-1].index
        if truncate_from is not None or entries:
            self._stored_last = entries[-1].index if entries else self.u_first - 1
        return snap, truncate_from, entries

    def stable(self) -> None:
        """The driver persisted the job last taken: its entries still in the tail (none were
        cut since) become the stable prefix."""
        upto = min(self._handed_last, self._valid_upto)
        self._handed_last = self._valid_upto = 0
        if self._handed_snap is not None and self._handed_snap is self._snap:
            self._snap = None  # installed: the store answers for it now
        self._handed_snap = None
        if upto >= self.u_first:
            del self._unstable[: upto - self.u_first + 1]
            del self._uchains[: upto - self.u_first + 1]
            self.u_first = upto + 1
