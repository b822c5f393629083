"""The contract between the Raft core and a log store.

Both the real store (``dledger.storage``) and the in-memory store used by the simulator
(``dledger.sim``) implement :class:`LogStore`. The Raft core (``dledger.core``) only ever
talks to its log through this interface.

Durability model
----------------
The core only reads a store; its driver writes it, one job per Ready (:func:`persist`):
hard state, then the cut, then the append, then (under SYNC_FLUSH) the flush, all before it
sends the messages that depend on them. ``append`` changes what the store *holds* but promises
nothing about what survives a crash until ``flush``, which makes everything appended so far
durable and returns the highest durable index. ``truncate_suffix`` and ``save_hard_state`` are
durable when they return.

Indices start at 1. Index 0 is the empty prefix, whose term is 0.
"""

from __future__ import annotations

import enum
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Protocol

from mqerrors import codes as E


class EntryType(enum.IntEnum):
    """What an entry means to the Raft layer.

    Values 0..15 are reserved for dledger; values 16..255 belong to the application
    (the broker uses them for its own control records). dledger never interprets them.
    """

    NORMAL = 0
    NOOP = 1  # appended by a new leader to commit entries of earlier terms (Raft, fig. 8)
    CONFIG = 2  # membership configuration (reserved)


APPLICATION_TYPE_MIN = 16
ENTRY_TYPE_MAX = 255


@dataclass(frozen=True, slots=True)
class Entry:
    """One Raft log entry. ``body`` is opaque bytes to everything in ``dledger``."""

    term: int
    index: int
    body: bytes
    type: int = EntryType.NORMAL


@dataclass(frozen=True, slots=True)
class HardState:
    """What Raft must remember across a crash before it may answer a peer."""

    term: int = 0
    voted_for: str | None = None


class DLedgerError(Exception):
    """Root of every error raised by ``dledger``. ``code`` is stable and machine readable."""

    code = E.DLEDGER_ERROR


class ConfigError(DLedgerError, ValueError):
    """A configuration value dledger refuses (Raft timing, peers, store or retention settings,
    a node's configuration). Also a ValueError: callers that parse a value and catch
    ValueError keep working."""

    code = E.INVALID_CONFIG


class LogCompactedError(DLedgerError):
    """The requested index is below the first index still held (deleted by retention)."""

    code = E.LOG_COMPACTED


class IndexOutOfRangeError(DLedgerError):
    """The requested index is above the last index held."""

    code = E.INDEX_OUT_OF_RANGE


class CorruptLogError(DLedgerError):
    """Stored bytes fail a check (magic, size, CRC). Carries the file and byte offset, and
    the index of the damaged entry when it is known (0: unknown)."""

    code = E.CORRUPT_LOG

    def __init__(self, message: str, *, path: str = "", offset: int = -1, index: int = 0) -> None:
        super().__init__(message)
        self.path = path
        self.offset = offset
        self.index = index


class FormatTooNewError(DLedgerError):
    """A stored file has a format version newer than this release reads: written by a newer
    release. Not damage (deliberately not a :class:`CorruptLogError`): nothing may repair,
    recover, cut or rewrite the file; the node refuses to start and the message names the file,
    the version found and the newest this release reads."""

    code = E.FORMAT_TOO_NEW

    def __init__(self, message: str, *, path: str = "", found: int = 0, newest: int = 0) -> None:
        super().__init__(message)
        self.path = path
        self.found = found
        self.newest = newest


class FeatureLevelError(DLedgerError):
    """The group's feature level and a member's support disagree (docs/RAFT.md "Feature
    level"): a raise a member does not support (or a level not above the group's, or above
    this node's support), a joiner older than the group's level, or a log or store at a level
    this node's release does not support. The message names the member and both levels;
    nothing was changed."""

    code = E.FEATURE_LEVEL_UNSUPPORTED


class LogStore(Protocol):
    """The log of one Raft member, as the core sees it."""

    def first_index(self) -> int:
        """Smallest index still held; ``last_index() + 1`` when the store holds nothing."""
        ...

    def last_index(self) -> int:
        """Highest index held; 0 when nothing was ever appended."""
        ...

    def last_term(self) -> int:
        """Term of ``last_index()``; 0 when nothing was ever appended."""
        ...

    def term_at(self, index: int) -> int:
        """Term of entry ``index``.

        ``term_at(0) == 0``. ``term_at(first_index() - 1)`` is still answered after a prefix
        deletion (the store remembers the term of the last deleted entry). Raises
        :class:`LogCompactedError` below that and :class:`IndexOutOfRangeError` above
        ``last_index()``.
        """
        ...

    def chain_at(self, index: int) -> int:
        """The chained checksum of entries ``1..index`` (:mod:`dledger.chain`).

        ``chain_at(0) == CHAIN_ORIGIN``; ``chain_at(first_index() - 1)`` is still answered
        after a prefix deletion or a snapshot install (the store keeps the value at its base);
        ``CHAIN_UNKNOWN`` (0) where the store cannot know it (a prefix deleted by a release
        without chains). Errors as :meth:`term_at`.
        """
        ...

    def read(self, index: int) -> Entry:
        """Entry ``index``; errors as :meth:`term_at`, :class:`CorruptLogError` on bad bytes."""
        ...

    def read_range(self, start: int, max_bytes: int, max_count: int = 1 << 30) -> list[Entry]:
        """Entries from ``start`` on, at most ``max_count`` of them and about ``max_bytes``
        of bodies, but always at least one entry when ``start <= last_index()``.
        Returns ``[]`` when ``start == last_index() + 1``."""
        ...

    def append(self, entries: Sequence[Entry]) -> int:
        """Append entries whose indices are ``last_index()+1, +2, ...`` in order.

        Not durable until :meth:`flush`. Returns the new ``last_index()``.
        """
        ...

    def truncate_suffix(self, index: int) -> None:
        """Remove every entry with index ``>= index`` (Raft conflict repair).

        Durable when it returns: a truncated entry never reappears after a crash.
        """
        ...

    def flush(self) -> int:
        """Make every appended entry durable; return the highest durable index."""
        ...

    def flushed_index(self) -> int:
        """Highest index known to be durable."""
        ...

    def load_hard_state(self) -> HardState:
        """The last hard state saved (``HardState()`` for a new store)."""
        ...

    def save_hard_state(self, state: HardState) -> None:
        """Save atomically and durably (temp file, fsync, rename, fsync dir)."""
        ...


def persist(
    store: LogStore,
    hard_state: HardState | None,
    truncate_from: int | None,
    entries: Sequence[Entry],
    *,
    flush: bool,
) -> None:
    """The persist job of one Ready, in its order: save ``hard_state``, cut the log from
    ``truncate_from`` on, append ``entries``, then flush them when ``flush``.

    Safe to run again after it failed part way (the disk was full): a saved hard state is
    saved again, a cut already made is a no-op (the log ends just below it) and a refused
    append wrote nothing of its batch."""
    if hard_state is not None:
        store.save_hard_state(hard_state)
    if truncate_from is not None and truncate_from <= store.last_index():
        store.truncate_suffix(truncate_from)
    if entries:
        store.append(entries)
        if flush:
            store.flush()
