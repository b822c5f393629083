"""An in-memory :class:`~dledger.log.LogStore` that models durability for the simulator.

``append`` is volatile until ``flush``; ``truncate_suffix`` and ``save_hard_state`` are
durable at once. :meth:`MemLog.crash` drops every unflushed entry, like a power loss.
It also keeps a running prefix hash per index so that the simulator can check Raft's log
matching property in O(1) per entry.

Snapshots: :meth:`MemLog.compact` deletes a prefix (retention after the state machine saved
a snapshot there) and :meth:`MemLog.install` replaces the whole log by a snapshot; both are
durable at once. The prefix hashes of compacted or installed indexes are kept (an installed
snapshot brings its source's), so the checks still see every index.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

from dledger.chain import CHAIN_ORIGIN, next_chain
from dledger.core.repair import Promised, newer_hard_state
from dledger.core.snapshot import SnapshotMeta
from dledger.log import Entry, HardState, IndexOutOfRangeError, LogCompactedError

AppendHook = Callable[[Entry, int], None]


class MemLog:
    """Entries live in a list; ``_durable`` entries of it would survive a crash."""

    def __init__(self, on_append: AppendHook | None = None) -> None:
        self._entries: list[Entry] = []  # entries _base + 1 ... last
        self._base = 0  # last compacted (or snapshot) index; its term:
        self._base_term = 0
        self._hashes: list[int] = [0]  # _hashes[i] = hash of the prefix 1..i
        # _chains[i] = dledger.chain value at i (what the real store keeps with its index);
        # kept for compacted indexes too, like _hashes (chain_at answers only from the base).
        self._chains: list[int] = [CHAIN_ORIGIN]
        self._durable = 0
        self._hard_state: HardState | None = HardState()  # None: the meta file was lost
        # The promise file, apart from the log (dledger.storage.promise): the highest index
        # vouched for and the copy of the hard state. Survives everything done to the log.
        self.promised = 0
        self.promise_hs: HardState | None = None
        # Both slots of the promise file damaged (``damage_promise``): unknown until rewritten.
        self.promise_damaged = False
        self._held = 0  # promised while the damaged file was held
        self._on_append = on_append
        # For the simulator's checks: (first truncated index, prefix hashes of the removed
        # entries) per truncation since the checker last cleared the list.
        self.truncated: list[tuple[int, list[int]]] = []

    # LogStore protocol -------------------------------------------------------------------

    def first_index(self) -> int:
        return self._base + 1

    def last_index(self) -> int:
        return self._base + len(self._entries)

    def last_term(self) -> int:
        return self._entries[-1].term if self._entries else self._base_term

    def term_at(self, index: int) -> int:
        if index == self._base:
            return self._base_term
        return self.read(index).term

    def chain_at(self, index: int) -> int:
        if index == self._base:
            return self._chains[index]
        self.read(index)  # range checks
        return self._chains[index]

    def read(self, index: int) -> Entry:
        if index <= self._base:
            raise LogCompactedError(f"index {index} below first index {self._base + 1}")
        if index > self.last_index():
            raise IndexOutOfRangeError(f"index {index} above last index {self.last_index()}")
        return self._entries[index - self._base - 1]

    def read_range(self, start: int, max_bytes: int, max_count: int = 1 << 30) -> list[Entry]:
        last = self.last_index()
        if start == last + 1:
            return []
        if start <= self._base:
            raise LogCompactedError(f"index {start} below first index {self._base + 1}")
        if start > last:
            raise IndexOutOfRangeError(f"index {start} above last index {last}")
        out: list[Entry] = []
        size = 0
        k = start - self._base - 1
        for e in self._entries[k : k + min(last - start + 1, max_count)]:
            if out and size + len(e.body) > max_bytes:
                break
            out.append(e)
            size += len(e.body)
        return out

    def append(self, entries: Sequence[Entry]) -> int:
        hashes = self._hashes
        for e in entries:
            assert e.index == self.last_index() + 1, "MemLog.append: index not contiguous"
            self._entries.append(e)
            h = hash((hashes[-1], e.term, e.type, e.body))
            hashes.append(h)
            self._chains.append(next_chain(self._chains[-1], e.index, e.term, e.type, e.body))
            if self._on_append is not None:
                self._on_append(e, h)
        return self.last_index()

    def truncate_suffix(self, index: int) -> None:
        assert index > self._base, "MemLog.truncate_suffix: below the first index"
        if index > self.last_index():
            return
        self.truncated.append((index, self._hashes[index:]))
        del self._entries[index - self._base - 1 :]
        del self._hashes[index:]
        del self._chains[index:]
        self._durable = min(self._durable, index - 1)

    def flush(self) -> int:
        self._durable = self.last_index()
        return self._durable

    def flushed_index(self) -> int:
        return self._durable

    def load_hard_state(self) -> HardState:
        return self._hard_state if self._hard_state is not None else HardState()

    def save_hard_state(self, state: HardState) -> None:
        self._hard_state = state

    def save_promise(
        self, index: int | None, state: HardState | None, *, hold: bool = False
    ) -> None:
        """A Ready's promise and hard state copy, after its entries (durable at once).
        ``hold``: the repair of an unknown promise runs; a damaged file stays as it is
        (``dledger.server.promises.hold_promise``), what is promised is remembered."""
        if index is None and state is None:
            return
        if self.promise_damaged:
            if index is not None:
                self._held = max(self._held, index)
            if hold:
                return
            # The driver's writer knows no current promise: it creates the file anew, with
            # everything promised while it held.
            self.promise_damaged = False
            self.promised = self._held
        if index is not None:
            self.promised = max(self.promised, index)
        # The copy is of the hard state as the same job left it (saved just before).
        self.promise_hs = state if state is not None else self._hard_state

    def start_state(self, applied_index: int = 0) -> tuple[Promised, HardState]:
        """What a driver reads at start: the promise, and the hard state recovered from the
        meta file and the promise's copy (the newer; docs/RAFT.md section 11). A damaged
        promise file: the log's end or the applied index (``dledger.server.promises``)."""
        if self.promise_damaged:
            hs = self._hard_state
            index = max(self.last_index(), applied_index)
            return Promised(index, vote_lost=True), hs or HardState()
        hs = newer_hard_state(self._hard_state, self.promise_hs)
        lost = hs is None and self.last_index() > 0
        return Promised(self.promised, vote_lost=lost), hs if hs is not None else HardState()

    # Simulation helpers ------------------------------------------------------------------

    def crash(self) -> int:
        """Power loss: drop unflushed entries. Returns how many were lost."""
        lost = self.last_index() - self._durable
        del self._entries[self._durable - self._base :]
        del self._hashes[self._durable + 1 :]
        del self._chains[self._durable + 1 :]
        return lost

    def rollback(self, index: int) -> int:
        """A storage fault: the log goes back to an older prefix of itself (a lost write, a
        restored volume snapshot), ending at ``index`` (at least the first index - 1). Not
        recorded as a truncation: the member did not cut it. Returns the entries lost."""
        index = max(index, self._base)
        lost = max(0, self.last_index() - index)
        del self._entries[index - self._base :]
        del self._hashes[index + 1 :]
        del self._chains[index + 1 :]
        self._durable = min(self._durable, index)
        return lost

    def damage_promise(self) -> None:
        """A storage fault: both slots of the promise file are damaged (what it promised and
        its copy of the hard state are unknown; ``meta`` survives)."""
        self.promise_damaged = True
        self.promise_hs = None
        self._held = 0

    def lose_meta(self) -> None:
        """A storage fault: the hard state file is gone (the promise file survives)."""
        self._hard_state = None

    def compact(self, index: int) -> None:
        """Delete the entries up to ``index`` (durable, applied: the caller's state machine
        saved a snapshot there)."""
        assert self._base <= index <= self._durable, "MemLog.compact: not durable"
        self._base_term = self.term_at(index)
        del self._entries[: index - self._base]
        self._base = index

    def install(self, meta: SnapshotMeta, hashes: Sequence[int], chains: Sequence[int]) -> None:
        """Replace the whole log by the snapshot ``meta`` (durable at once); ``hashes`` and
        ``chains`` are the source's prefix hashes and chain values up to its index. Entries
        removed beyond the snapshot's index are recorded in ``truncated`` like a cut."""
        assert len(hashes) > meta.index and len(chains) > meta.index
        if self.last_index() > meta.index:
            self.truncated.append((meta.index + 1, self._hashes[meta.index + 1 :]))
        self._entries = []
        self._base, self._base_term = meta.index, meta.term
        self._hashes = list(hashes[: meta.index + 1])
        self._chains = list(chains[: meta.index + 1])
        self._durable = meta.index

    def prefix_hashes(self, index: int) -> list[int]:
        """The prefix hashes of indexes 0..index (what a snapshot at ``index`` carries)."""
        return self._hashes[: index + 1]

    def prefix_chains(self, index: int) -> list[int]:
        """The chain values of indexes 0..index (what a snapshot at ``index`` carries)."""
        return self._chains[: index + 1]

    def damage(self, index: int, body: bytes) -> None:
        """Fault: entry ``index`` silently holds ``body`` instead (same index, term and type),
        and every chain value and prefix hash from it on follows the new content, as on a
        member that was handed, or wrote, a different history (a forged append, a lost
        write replayed): nothing in this log tells it is wrong. Durable entries only."""
        assert self._base < index <= self._durable, "MemLog.damage: not a durable entry"
        k = index - self._base - 1
        old = self._entries[k]
        self._entries[k] = Entry(old.term, old.index, body, old.type)
        for e in self._entries[k:]:
            i = e.index
            self._hashes[i] = hash((self._hashes[i - 1], e.term, e.type, e.body))
            self._chains[i] = next_chain(self._chains[i - 1], i, e.term, e.type, e.body)

    def prefix_hash(self, index: int) -> int:
        """Hash of entries 1..index (0 for index 0)."""
        return self._hashes[index]

    def entries(self) -> list[Entry]:
        return list(self._entries)
