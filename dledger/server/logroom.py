"""A leader's admission of application entries against its log's room (docs/STORAGE.md
"Disk full"): entries are accepted only while, after them and the entries accepted before
that the store has not appended yet, the log keeps the Raft reserve (room for a new term's
no-op and membership entries) in allocated files. A refusal is a ``DISK_FULL`` answer; the
entries never enter the log, so a full disk cannot leave a leader with entries it cannot
write (which would stop its Ready loop, its heartbeats and so the group's elections).
"""

from __future__ import annotations

from collections import deque
from collections.abc import Sequence
from typing import Protocol

from dledger.storage import DiskFullError
from dledger.storage.codec import ENTRY_HEADER_SIZE


class RoomCheckingStore(Protocol):
    def last_index(self) -> int: ...

    def admit_application_entries(
        self,
        batch_bytes: int,
        batch_count: int,
        largest_entry_bytes: int,
        headroom_bytes: int = 0,
    ) -> None: ...


class LogRoom:
    """Tracks the accepted proposals the store has not appended yet, and checks new ones."""

    __slots__ = ("_bytes", "_count", "_largest", "_node_id", "_unstored")

    def __init__(self, node_id: str) -> None:
        self._node_id = node_id
        # (last index, term, encoded bytes, entries) per accepted proposal, in index order
        self._unstored: deque[tuple[int, int, int, int]] = deque()
        self._bytes = 0
        self._count = 0
        self._largest = 0  # largest entry among _unstored (an upper bound: reset when empty)

    def _prune(self, store: RoomCheckingStore, term: int) -> None:
        """Forget the proposals the store holds now, and those of other terms (a new term's
        leader never appends them: they were cut, or are stored already)."""
        stored = store.last_index()
        q = self._unstored
        while q and (q[0][0] <= stored or q[0][1] != term):
            _last, _term, size, count = q.popleft()
            self._bytes -= size
            self._count -= count
        if not q:
            self._bytes = self._count = self._largest = 0
        assert self._bytes >= 0 and self._count >= 0

    def check(
        self, store: RoomCheckingStore, bodies: Sequence[bytes], term: int, headroom_bytes: int
    ) -> None:
        """Raise DiskFullError (``node=... path=... reason=log_room ...``) unless ``store``
        can take ``bodies`` after what is accepted already and keep its reserve."""
        self._prune(store, term)
        size, largest = _measure(bodies)
        largest = max(self._largest, largest)
        try:
            store.admit_application_entries(
                self._bytes + size, self._count + len(bodies), largest, headroom_bytes
            )
        except DiskFullError as exc:
            raise DiskFullError(f"node={self._node_id} {exc}") from None

    def accepted(self, bodies: Sequence[bytes], last_index: int, term: int) -> None:
        """``bodies`` entered the log as entries up to ``last_index`` of ``term``."""
        size, largest = _measure(bodies)
        self._unstored.append((last_index, term, size, len(bodies)))
        self._bytes += size
        self._count += len(bodies)
        self._largest = max(self._largest, largest)


def _measure(bodies: Sequence[bytes]) -> tuple[int, int]:
    """(encoded bytes, largest encoded entry) of ``bodies`` as log entries."""
    size = largest = 0
    for b in bodies:
        n = len(b)
        size += n
        if n > largest:
            largest = n
    header = ENTRY_HEADER_SIZE
    return size + header * len(bodies), largest + header if bodies else 0
