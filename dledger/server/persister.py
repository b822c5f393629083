"""Step 2 of the core's Ready contract on disk, for one member: the hard state, the cut and
the entries in the store, then the promise file (dledger.server.promises) before any
acknowledgement the Ready carries leaves; and the periodic checkpoint that keeps the promise
file durable. Runs its jobs in the node's flush thread (one at a time) and writes the promise
beside the log's flush in a thread of its own when that saves an fsync.

The node (:class:`dledger.server.node.DLedgerNode`) owns the ready loop and calls
:meth:`ReadyPersister.persist` once per Ready that must persist; it hands over a new store
after a snapshot install (:attr:`ReadyPersister.store`)."""

from __future__ import annotations

import asyncio
import concurrent.futures
import functools
import logging
from collections.abc import Callable, Coroutine
from typing import Any

from dledger.core import Ready
from dledger.log import HardState, persist
from dledger.server.flushthread import FlushThread
from dledger.server.metrics import RaftStats
from dledger.server.promises import held, write_promise, write_promise_ahead
from dledger.storage import DiskFullError, SegmentedLogStore
from dledger.storage.promise import PromiseWriter

logger = logging.getLogger(__name__)

__all__ = ["DROP_DISK_FULL", "PERSIST_RETRY_MS", "ReadyPersister"]

# A persist job refused because the disk is full (the store writes nothing of the append and
# nothing of the Ready that depends on it is sent; the job is retried every PERSIST_RETRY_MS
# until space returns: docs/STORAGE.md). A key of DLedgerNode.dropped().
DROP_DISK_FULL = "disk_full"
# How long the ready loop waits before it retries a persist job the full disk refused: short
# enough that writes resume quickly once space is freed, long enough not to spin.
PERSIST_RETRY_MS = 100


class ReadyPersister:
    """The persist jobs of one member. ``sync``: the store's flush type is SYNC_FLUSH;
    ``promises``: the promise file's writer;
    ``hard_state``: the hard state its copy carries; ``promised``: the highest index promised
    at start; ``promise_ahead``: how far ahead of the log a promise written beside a flush
    reaches (dledger.server.promises)."""

    def __init__(
        self,
        store: SegmentedLogStore,
        flush: FlushThread,
        *,
        sync: bool,
        node_id: str,
        promises: PromiseWriter,
        hard_state: HardState,
        promised: int,
        promise_ahead: int,
        note_drop: Callable[[str, str], None],
        raft_stats: RaftStats | None,
    ) -> None:
        self.store = store  # replaced by the node when a snapshot install opens a new one
        self.sync = sync  # SYNC_FLUSH: entries count as stable once flushed
        self.promises = promises
        self._node_id = node_id
        self._flush = flush
        # The promise file's writes beside the log's flush (one at a time, like the flush).
        self._promise_pool = concurrent.futures.ThreadPoolExecutor(1, f"promise-{node_id}")
        self._hard_state = hard_state
        self._promise_wanted = promised  # the highest index the core asked to promise
        self._promise_ahead = promise_ahead
        self._note_drop = note_drop
        self._raft_stats = raft_stats

    async def persist(self, rd: Ready) -> None:
        """The Ready's persist job, awaited to its end (:meth:`begin`)."""
        await self.begin(rd)

    def begin(self, rd: Ready) -> Coroutine[Any, Any, None]:
        """Start the Ready's persist job and return what waits for its end: hard state, cut,
        append and (under SYNC_FLUSH) flush, and the promise, in the flush thread; under
        ASYNC_FLUSH an entry in the page cache counts as stable (docs/STORAGE.md). When this
        returns the job is queued in the flush thread (or done, inline), so the caller can
        work meanwhile (the apply of entries stored before) and then await the coroutine,
        which it must. A full disk refuses the job without writing the append: the
        coroutine retries it until space returns, and nothing that depends on it is sent
        meanwhile."""
        job = self._job(rd)
        # ASYNC_FLUSH with only entries to append: a copy into the page cache, which never
        # waits for the disk; the hop to the thread and back cost more than the copy (ASYNC
        # sends at 1-16 in flight were 20-35% slower with it). Hard state and cuts fsync.
        inline = not self.sync and rd.hard_state is None and rd.truncate_from is None
        if rd.entries and self._raft_stats is not None:
            self._raft_stats.appended(rd.entries)
        return self._finish(rd, job, inline, *self._attempt(job, inline))

    def _job(self, rd: Ready) -> Callable[[], None]:
        """The Ready's persist job. SYNC_FLUSH, a promise beyond what the promise file covers
        durably, no hard state and no cut: the promise, PROMISE_AHEAD_ENTRIES ahead, is
        written in its own thread while the flush thread writes the log (two fdatasync side
        by side cost about one), recording what was durable before the job. The jobs after
        it only refresh the exact promise (no fdatasync) until they pass it
        (dledger.server.promises)."""
        sync = self.sync
        beside = (
            sync
            and rd.promise is not None
            and rd.promise > self.promises.ceiling
            and rd.hard_state is None
            and rd.truncate_from is None
            and rd.snapshot is None
        )
        job: Callable[[], None] = functools.partial(self._persist_job, rd, sync, beside)
        if not beside:
            return job
        assert rd.promise is not None
        self._promise_wanted = max(self._promise_wanted, rd.promise)
        promise = functools.partial(
            write_promise_ahead,
            self.promises,
            rd.promise,
            self._hard_state,
            self.store.flushed_index(),
            self._promise_ahead,
        )
        return functools.partial(self._beside_job, job, promise)

    def _attempt(
        self, job: Callable[[], None], inline: bool
    ) -> tuple[asyncio.Future[None] | None, DiskFullError | None]:
        """One try of ``job``: queued in the flush thread (its future), or run here (the
        full disk's refusal, if any)."""
        if not inline:
            return self._flush.run(job), None
        try:
            job()
        except DiskFullError as exc:
            return None, exc
        return None, None

    async def _finish(
        self,
        rd: Ready,
        job: Callable[[], None],
        inline: bool,
        attempt: asyncio.Future[None] | None,
        refused: DiskFullError | None,
    ) -> None:
        """Wait for the job's try and, while the disk is full, try again every
        PERSIST_RETRY_MS."""
        while True:
            try:
                if attempt is not None:
                    await attempt
                elif refused is not None:
                    raise refused
                return
            except DiskFullError as exc:
                self._note_drop(DROP_DISK_FULL, f"persist of {len(rd.entries)} entries: {exc}")
            await asyncio.sleep(PERSIST_RETRY_MS / 1000)
            attempt, refused = self._attempt(job, inline)

    def _beside_job(self, log_job: Callable[[], None], promise_job: Callable[[], None]) -> None:
        """In the flush thread: hand the durable promise to its own thread, write and flush
        the log here, and once both are done refresh the exact promise; the first error is
        raised (every step is safe to run again). The event loop waits for this one job: one
        hop to a thread and one wake-up per round, not two and a gather."""
        promised = self._promise_pool.submit(promise_job)
        try:
            log_job()
        finally:
            # Never return (nor retry the job) while the promise write still runs: one writer.
            failed = promised.exception()
        if failed is not None:
            raise failed
        self._refresh_promise()

    def _persist_job(self, rd: Ready, sync: bool, promised_beside: bool) -> None:
        """Step 2 of the Ready contract: hard state, cut, entries, flush, then the promise
        (with the hard state's copy) before any acknowledgement leaves, unless it is being
        written beside this job. Under SYNC_FLUSH a job with a hard state, a cut or a
        snapshot writes the promise durably after the log; a job whose promise the file
        covers durably already refreshes the exact promise (no fdatasync). Under ASYNC_FLUSH
        the promise follows what the store flushed (dledger.server.promises), written here
        only with a hard state change; the checkpoint catches up the rest."""
        persist(self.store, rd.hard_state, rd.truncate_from, rd.entries, flush=sync)
        if rd.hard_state is not None:
            self._hard_state = rd.hard_state
        if promised_beside:
            return
        if rd.promise is not None:
            self._promise_wanted = max(self._promise_wanted, rd.promise)
        if not sync:
            if rd.hard_state is not None:
                self._write_flushed_promise()
            return
        plain = rd.hard_state is None and rd.truncate_from is None and rd.snapshot is None
        if plain and rd.promise is not None and rd.promise <= self.promises.ceiling:
            self._refresh_promise()
        elif rd.promise is not None or rd.hard_state is not None:
            write_promise(self.promises, self._promise_wanted, self._hard_state)

    def _refresh_promise(self) -> None:
        """SYNC_FLUSH, in the flush thread after the log's flush: the exact promise and what
        the store flushed, in the page cache (the durable promise covers it already);
        nothing while the promise is held (a damaged file's repair)."""
        if held(self.promises):
            return
        self.promises.refresh(self._promise_wanted, self._hard_state, self.store.flushed_index())

    def _write_flushed_promise(self) -> None:
        """ASYNC_FLUSH: promise only what the store flushed (in the flush thread)."""
        flushed = min(self._promise_wanted, self.store.flushed_index())
        write_promise(self.promises, flushed, self._hard_state)

    def checkpoint_job(self, commit_index: int, applied_index: int) -> None:
        """In the flush thread: the store's applied/commit checkpoint, and the promise file
        made durable (or rewritten) up to what was asked."""
        self.store.write_checkpoint(commit_index, applied_index)
        try:
            if not self.sync:
                self._write_flushed_promise()
            elif self.promises.current is None and not held(self.promises):
                # A promise file found damaged at start is rewritten once its repair ended,
                # whether or not a new entry comes to carry it (docs/RAFT.md section 11).
                write_promise(self.promises, self._promise_wanted, self._hard_state)
            else:
                # The refreshed exact promise made durable once per checkpoint: after a
                # power cut the file is at most this far behind the acknowledgements.
                self.promises.sync()
        except DiskFullError as exc:
            # Only creating the file allocates; the next checkpoint tries again.
            logger.warning("node=%s promise not written: %s", self._node_id, exc)

    def close(self) -> None:
        """After the flush thread stopped: wait for a promise write in flight, close the file."""
        self._promise_pool.shutdown(wait=True)
        self.promises.close()
