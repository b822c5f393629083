"""An in-memory :class:`~dledger.log.LogStore` that models durability for the simulator.

``append`` is volatile until ``flush``; ``truncate_suffix`` and ``save_hard_state`` are
durable at once. :meth:`MemLog.crash` drops every unflushed entry, like a power loss.
It also keeps a running prefix hash per index so that the simulator can check Raft's log
matching property in O(1) per entry.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

from dledger.log import Entry, HardState, IndexOutOfRangeError, LogCompactedError

AppendHook = Callable[[Entry, int], None]


class MemLog:
    """Entries live in a list; ``_durable`` entries of it would survive a crash."""

    def __init__(self, on_append: AppendHook | None = None) -> None:
        self._entries: list[Entry] = []
        self._hashes: list[int] = [0]  # _hashes[i] = hash of the prefix 1..i
        self._durable = 0
        self._hard_state = HardState()
        self._on_append = on_append
        # For the simulator's checks: (first truncated index, prefix hashes of the removed
        # entries) per truncation since the checker last cleared the list.
        self.truncated: list[tuple[int, list[int]]] = []

    # LogStore protocol -------------------------------------------------------------------

    def first_index(self) -> int:
        return 1

    def last_index(self) -> int:
        return len(self._entries)

    def last_term(self) -> int:
        return self._entries[-1].term if self._entries else 0

    def term_at(self, index: int) -> int:
        if index == 0:
            return 0
        if index < 0:
            raise LogCompactedError(f"index {index} below first index 1")
        if index > len(self._entries):
            raise IndexOutOfRangeError(f"index {index} above last index {len(self._entries)}")
        return self._entries[index - 1].term

    def read(self, index: int) -> Entry:
        if index < 1:
            raise LogCompactedError(f"index {index} below first index 1")
        if index > len(self._entries):
            raise IndexOutOfRangeError(f"index {index} above last index {len(self._entries)}")
        return self._entries[index - 1]

    def read_range(self, start: int, max_bytes: int, max_count: int = 1 << 30) -> list[Entry]:
        last = len(self._entries)
        if start == last + 1:
            return []
        if start < 1:
            raise LogCompactedError(f"index {start} below first index 1")
        if start > last:
            raise IndexOutOfRangeError(f"index {start} above last index {last}")
        out: list[Entry] = []
        size = 0
        for e in self._entries[start - 1 : min(last, start - 1 + max_count)]:
            if out and size + len(e.body) > max_bytes:
                break
            out.append(e)
            size += len(e.body)
        return out

    def append(self, entries: Sequence[Entry]) -> int:
        hashes = self._hashes
        for e in entries:
            assert e.index == len(self._entries) + 1, "MemLog.append: index not contiguous"
            self._entries.append(e)
            h = hash((hashes[-1], e.term, e.type, e.body))
            hashes.append(h)
            if self._on_append is not None:
                self._on_append(e, h)
        return len(self._entries)

    def truncate_suffix(self, index: int) -> None:
        assert index >= 1
        if index > len(self._entries):
            return
        self.truncated.append((index, self._hashes[index:]))
        del self._entries[index - 1 :]
        del self._hashes[index:]
        self._durable = min(self._durable, index - 1)

    def flush(self) -> int:
        self._durable = len(self._entries)
        return self._durable

    def flushed_index(self) -> int:
        return self._durable

    def load_hard_state(self) -> HardState:
        return self._hard_state

    def save_hard_state(self, state: HardState) -> None:
        self._hard_state = state

    # Simulation helpers ------------------------------------------------------------------

    def crash(self) -> int:
        """Power loss: drop unflushed entries. Returns how many were lost."""
        lost = len(self._entries) - self._durable
        del self._entries[self._durable :]
        del self._hashes[self._durable + 1 :]
        return lost

    def prefix_hash(self, index: int) -> int:
        """Hash of entries 1..index (0 for index 0)."""
        return self._hashes[index]

    def entries(self) -> list[Entry]:
        return list(self._entries)
