"""The server's side of promises (docs/RAFT.md section 11): at start, read the promise file
and recover the hard state; while running, keep the file ahead of every acknowledgement.

The promise file (``dledger.storage.promise``) lives apart from the store directory (by
default its sibling ``{store_dir}.promise``; ``NodeConfig.promise_path`` puts it elsewhere,
another volume say), so a store rolled back, cut or replaced under the same member id is
noticed: its log ends below the promise and the core starts *repairing*.

Under SYNC_FLUSH (docs/RAFT.md section 11) a persist job whose promise (``Ready.promise``)
the file does not cover durably writes it ``PROMISE_AHEAD_ENTRIES`` ahead, durably, in a
second thread while the flush thread appends and flushes the entries (two ``fdatasync`` side
by side cost about one), recording what was durable before the job (``durable_index``); the
jobs it covers then only refresh the exact promise in the other slot, in the page cache. The
acknowledgements leave once the job's writes are done. At start, a log that ends between
``durable_index`` and the promise was cut short by a crash, and holds every entry whose
acknowledgement left (the promise is then taken as the log's end); a log that ends below it
forgot entries it acknowledged (the node repairs). A job with a hard state or a cut writes
the exact promise durably after the log, as the hard state's copy must follow ``meta``.
Under ASYNC_FLUSH an acknowledgement already
precedes the disk (an entry in the page cache counts as stable, and a power cut may lose
the last flush interval on every member at once): a promise of what was only in the page
cache would, after such a power cut, leave every member below its promise, repairing, and
the group without a voter. So there the promise follows what the store flushed: written
with every hard state change (which fsyncs anyway) and every checkpoint.
"""

from __future__ import annotations

import logging
import os
import weakref
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from dledger.core import Promised, newer_hard_state
from dledger.log import CorruptLogError, HardState
from dledger.storage.files import is_disk_full
from dledger.storage.promise import (
    Promise,
    PromiseDamagedError,
    PromiseError,
    PromiseWriter,
    promise_path_for_store,
    read_promise,
)
from dledger.storage.store import META_FILE, DiskFullError, SegmentedLogStore

logger = logging.getLogger(__name__)

# Writers of a promise file found damaged at start, with what says the repair of the unknown
# promise still runs: until it is done, nothing is written (hold_promise).
_HOLDS: weakref.WeakKeyDictionary[PromiseWriter, Callable[[], bool]] = weakref.WeakKeyDictionary()

# How far a durable promise runs ahead of the acknowledgement that needed it (SYNC_FLUSH):
# the acknowledgements of the next entries up to there only refresh the exact promise in the
# page cache, so one fdatasync of the promise file serves this many entries, not one per
# round (docs/RAFT.md section 11). It bounds the repair target's overshoot in the one case
# that reads the durable promise rather than the exact one: a power cut and a store rolled
# back below what it had flushed (the repair then ends once the group's log passes it, or
# at its next term).
PROMISE_AHEAD_ENTRIES = 512


def promise_ahead_entries(store_dir: str, promise: Path) -> int:
    """How far the durable promise runs ahead for the store at ``store_dir`` whose promise
    file is ``promise``: PROMISE_AHEAD_ENTRIES when both are on one device, 0 (every
    acknowledgement durable in the promise file before it leaves) when the promise file is
    on a device of its own. A promise file beside its store shares the store's fate: a power
    cut that rolls the store back (a write cache that lied) takes the unsynced refreshes
    with it, as it would take a synced promise on that same disk, and an honest disk keeps
    every flushed entry, so reading the anchor instead of the refresh forgets nothing. A
    promise put on another device (``dLegerPromisePath``) is there to outlive the store's
    device: it keeps the exact promise durably, at the cost of one fdatasync per round."""
    try:
        same = os.stat(store_dir).st_dev == os.stat(promise.parent).st_dev
    except OSError:
        same = False  # cannot tell: the safe side
    return PROMISE_AHEAD_ENTRIES if same else 0


@dataclass(frozen=True, slots=True)
class StartState:
    """What a node starts from: the core's promise and hard state, and the file's writer."""

    promised: Promised
    hard_state: HardState
    writer: PromiseWriter
    # The promise file was damaged in both slots (counted as found_by="promise").
    promise_damaged: bool = False


def promise_file(store_dir: str, configured: str) -> Path:
    """The promise file of the store at ``store_dir``: ``configured`` when set, else the
    store directory's sibling ``{store_dir}.promise``."""
    return Path(configured) if configured else promise_path_for_store(store_dir)


def recover(
    group: str,
    node_id: str,
    store: SegmentedLogStore,
    path: Path,
    applied_index: int,
) -> StartState:
    """Read the promise file and the store's hard state and decide what the node starts
    from. PromiseError when the promise file is unreadable, newer or another member's (the
    operator must look: guessing could make this member vote twice). A missing or damaged
    ``meta`` is recovered from the promise's copy (and rewritten); with neither, a store that
    holds entries makes the node start repairing with its vote counted as lost, and so does a
    promise file damaged in both slots (whatever ``meta`` says)."""
    promise, promise_damaged = _read_promise(node_id, path)
    writer = PromiseWriter(path, group, node_id, promise)
    copy = promise.hard_state if promise is not None else None
    meta, damaged = _read_meta(store, copy is not None)
    hs = newer_hard_state(meta, copy)
    vote_lost = promise_damaged or (hs is None and (damaged or store.last_index() > 0))
    if hs is not None and hs != meta:
        logger.warning(
            "node=%s hard state %s: recovered term=%d vote=%s from the promise file %s",
            node_id,
            "damaged" if damaged else "missing" if meta is None else "behind its copy",
            hs.term,
            hs.voted_for,
            path,
        )
        store.save_hard_state(hs)
    if vote_lost and not promise_damaged:
        logger.error(
            "node=%s hard state %s and no promise file at %s: the store holds entries, so "
            "this member may have voted; it starts repairing and counts the first leader's "
            "term as voted",
            node_id,
            "damaged" if damaged else "missing",
            path,
        )
    promised = _effective_promise(node_id, promise, store.last_index())
    if applied_index > max(store.last_index(), promised):
        # The application applied entries the store no longer holds: they were committed
        # here, so this member had them (a store replaced under an old promise file, or a
        # store older than the promise file's feature).
        promised = applied_index
    writer.restart_from(promised)
    return StartState(Promised(promised, vote_lost), hs or HardState(), writer, promise_damaged)


def _read_promise(node_id: str, path: Path) -> tuple[Promise | None, bool]:
    """(the promise file's content, whether it was damaged in every slot). A damaged file
    stays where it is until the first promise replaces it: removed, a restart before that
    would read "no promise file" (an upgrade) and vote as if nothing were promised."""
    try:
        return read_promise(path), False
    except PromiseDamagedError as exc:
        logger.error(
            "node=%s promise file %s damaged (%s): what this member promised and its copy "
            "of the hard state are unknown. Assumed: it may have acknowledged entries beyond "
            "its log and voted in any term up to the first leader's it hears from; it starts "
            "repairing with its vote counted as lost (no votes, counted towards no commit) "
            "until a leader elected without it brings its log past that leader's commit index "
            "and an entry of its term; the file is rewritten once it is repaired",
            node_id,
            path,
            exc,
        )
        return None, True


def _effective_promise(node_id: str, promise: Promise | None, last: int) -> int:
    """The index the log must reach: the promise, unless the log ends inside the persist job
    the promise was written beside (a crash cut that job short before its answers left)."""
    if promise is None:
        return 0
    if promise.durable <= last < promise.promised_index:
        logger.warning(
            "node=%s log ends at %d, inside the persist job promised up to %d (durable %d "
            "before it): a crash cut that job short, its acknowledgements never left",
            node_id,
            last,
            promise.promised_index,
            promise.durable,
        )
        return last
    return promise.promised_index


def _read_meta(store: SegmentedLogStore, have_copy: bool) -> tuple[HardState | None, bool]:
    """(the store's hard state or None when missing or damaged, whether it was damaged)."""
    if not (store.root / META_FILE).exists():
        return None, False
    try:
        return store.load_hard_state(), False
    except CorruptLogError as exc:
        logger.warning(
            "hard state damaged (%s)%s", exc, "; its copy in the promise file is used" * have_copy
        )
        return None, True


def hold_promise(writer: PromiseWriter, repairing: Callable[[], bool]) -> None:
    """Write nothing through ``writer`` while ``repairing()`` says the repair of an unknown
    promise runs (the file was damaged in both slots, ``StartState.promise_damaged``). A
    file rewritten then would hold only what the member promised since its start: a restart
    before the repair ended would read it as the whole promise and vote on a log that may
    lack what it acknowledged. Left damaged, a restart starts the same repair again. The
    first write after the repair ended carries everything promised meanwhile."""
    _HOLDS[writer] = repairing


def held(writer: PromiseWriter) -> bool:
    """Whether ``writer`` must write nothing now (``hold_promise``); a hold whose repair
    ended is dropped, so the next write carries everything promised meanwhile."""
    repairing = _HOLDS.get(writer)
    if repairing is None:
        return False
    if repairing():
        return True
    _HOLDS.pop(writer, None)
    return False


def write_promise(writer: PromiseWriter, index: int, hard_state: HardState) -> None:
    """Make the promise durable, after the log's flush (everything promised is durable in
    the store). A full disk (only creating the file allocates) is a DiskFullError, retried
    by the job like a refused append. Nothing while the promise is held (``hold_promise``)."""
    if held(writer):
        return
    try:
        writer.write(index, hard_state)
    except OSError as exc:
        if is_disk_full(exc):
            raise DiskFullError(f"promise file {writer.path}: {exc}") from None
        raise


def write_promise_ahead(
    writer: PromiseWriter, index: int, hard_state: HardState, durable_index: int, ahead: int
) -> None:
    """Make ``index`` plus ``ahead`` (``promise_ahead_entries``) durable, beside the log's
    flush of the job that acknowledges ``index`` (``durable_index``: what the store held
    durably when the job began). DiskFullError as ``write_promise``; nothing while the
    promise is held."""
    if held(writer):
        return
    try:
        writer.write_ahead(index, hard_state, durable_index, ahead)
    except OSError as exc:
        if is_disk_full(exc):
            raise DiskFullError(f"promise file {writer.path}: {exc}") from None
        raise


__all__ = [
    "PROMISE_AHEAD_ENTRIES",
    "PromiseError",
    "StartState",
    "held",
    "hold_promise",
    "promise_ahead_entries",
    "promise_file",
    "recover",
    "write_promise",
    "write_promise_ahead",
]
