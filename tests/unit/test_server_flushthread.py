"""The flush thread (dledger.server.flushthread): jobs run one at a time in one named thread,
in order; each waiter gets its job's result or exception on its own loop through one
``call_soon_threadsafe`` and no ``concurrent.futures`` machinery; a future cancelled before
its job starts skips the job; shutdown runs what was queued, then ends the thread. And the
persister queues a Ready's job before its ``begin`` returns (the node applies stored entries
meanwhile without giving the loop a turn first)."""

from __future__ import annotations

import asyncio
import concurrent.futures
import functools
import threading
import time
from pathlib import Path
from typing import Any

import pytest

from dledger.core import Ready
from dledger.log import Entry, HardState
from dledger.server.flushthread import FlushThread
from dledger.server.persister import ReadyPersister
from dledger.storage import SegmentedLogStore, StoreConfig
from dledger.storage.promise import PromiseWriter

WAIT_S = 10.0  # the longest any step of these tests may take


def test_jobs_run_in_order_in_one_named_thread_and_results_come_back() -> None:
    flush = FlushThread("flush-t1")
    seen: list[tuple[int, str]] = []

    def job(i: int) -> int:
        seen.append((i, threading.current_thread().name))
        return i * 10

    async def main() -> list[int]:
        futs = [flush.run(functools.partial(job, i)) for i in range(20)]
        return list(await asyncio.gather(*futs))

    try:
        assert asyncio.run(main()) == [i * 10 for i in range(20)]
    finally:
        flush.shutdown()
    assert [i for i, _ in seen] == list(range(20))
    assert {name for _, name in seen} == {"flush-t1"}
    assert not flush.alive


def test_an_exception_reaches_the_waiter_and_the_thread_goes_on() -> None:
    flush = FlushThread("flush-t2")

    def fail() -> None:
        raise OSError(28, "No space left on device")

    async def main() -> int:
        with pytest.raises(OSError, match="No space"):
            await flush.run(fail)
        return await flush.run(lambda: 7)

    try:
        assert asyncio.run(main()) == 7
    finally:
        flush.shutdown()


def test_the_hand_off_uses_no_executor_future_and_one_threadsafe_call() -> None:
    """run_in_executor made a concurrent.futures.Future per job and chained it to an asyncio
    future by callbacks on both sides; the flush thread settles the waiter's own future."""
    flush = FlushThread("flush-t3")
    made: list[object] = []
    real_init = concurrent.futures.Future.__init__

    def counting_init(self: concurrent.futures.Future[Any]) -> None:
        made.append(self)
        real_init(self)

    async def main() -> None:
        loop = asyncio.get_running_loop()
        calls: list[object] = []
        real_threadsafe = loop.call_soon_threadsafe

        def counting(cb: Any, *args: Any, **kw: Any) -> asyncio.Handle:
            calls.append(cb)
            return real_threadsafe(cb, *args, **kw)

        loop.call_soon_threadsafe = counting  # type: ignore[method-assign,assignment]
        for _ in range(5):
            await flush.run(lambda: None)
        assert len(calls) == 5

    concurrent.futures.Future.__init__ = counting_init  # type: ignore[method-assign,assignment]
    try:
        asyncio.run(main())
    finally:
        concurrent.futures.Future.__init__ = real_init  # type: ignore[method-assign]
        flush.shutdown()
    assert made == []


def test_a_job_cancelled_before_it_starts_is_skipped_and_a_started_one_ends() -> None:
    flush = FlushThread("flush-t4")
    started = threading.Event()
    release = threading.Event()
    ran: list[str] = []

    def blocking() -> str:
        started.set()
        assert release.wait(WAIT_S)
        ran.append("first")
        return "first"

    async def main() -> None:
        first = flush.run(blocking)
        second = flush.run(lambda: ran.append("second"))
        assert await asyncio.get_running_loop().run_in_executor(None, started.wait, WAIT_S)
        first.cancel()  # started: runs to its end, its result dropped
        second.cancel()  # not started: skipped
        release.set()
        assert await flush.run(lambda: "third") == "third"

    try:
        asyncio.run(main())
    finally:
        flush.shutdown()
    assert ran == ["first"]


def test_shutdown_runs_what_was_queued_then_refuses_new_jobs() -> None:
    flush = FlushThread("flush-t5")
    release = threading.Event()
    ran: list[int] = []

    async def main() -> None:
        flush.run(lambda: release.wait(WAIT_S))
        for i in range(3):
            flush.run(functools.partial(ran.append, i))
        stopper = threading.Thread(target=flush.shutdown)
        stopper.start()
        release.set()
        stopper.join(WAIT_S)
        assert not stopper.is_alive()
        with pytest.raises(RuntimeError, match="shut down"):
            flush.run(lambda: None)

    asyncio.run(main())
    assert ran == [0, 1, 2]
    assert not flush.alive
    flush.shutdown()  # idempotent


def test_a_job_that_ends_after_its_loop_closed_does_not_break_the_thread() -> None:
    flush = FlushThread("flush-t6")
    release = threading.Event()

    async def queue_and_leave() -> None:
        flush.run(lambda: release.wait(WAIT_S))

    asyncio.run(queue_and_leave())  # the loop is closed when the job ends
    release.set()

    async def again() -> int:
        return await flush.run(lambda: 5)

    try:
        assert asyncio.run(again()) == 5
    finally:
        flush.shutdown()


def test_begin_queues_the_persist_job_before_it_returns(tmp_path: Path) -> None:
    """The node applies stored entries while the next job flushes: the job must be in the
    flush thread when ``begin`` returns, with no turn of the loop (which ran other callbacks,
    and cost one) in between."""
    store = SegmentedLogStore(
        str(tmp_path / "s"), StoreConfig(segment_size_bytes=1 << 20, preallocate=False)
    )
    flush = FlushThread("flush-t7")
    promises = PromiseWriter(tmp_path / "promise", "g", "n0", None)
    persister = ReadyPersister(
        store,
        flush,
        sync=True,
        node_id="n0",
        promises=promises,
        hard_state=HardState(),
        promised=0,
        promise_ahead=64,
        note_drop=lambda reason, detail: None,
        raft_stats=None,
    )
    flushed = threading.Event()
    real_flush = store.flush

    def noting_flush() -> int:
        flushed.set()
        return real_flush()

    store.flush = noting_flush  # type: ignore[method-assign]
    rd = Ready(
        hard_state=None,
        truncate_from=None,
        entries=(Entry(1, 1, b"one"),),
        early_messages=(),
        messages=(),
        committed=(),
        soft_state=None,
    )

    async def main() -> None:
        pending = persister.begin(rd)
        # Blocking the loop here: only a job already queued can reach the flush.
        deadline = time.monotonic() + WAIT_S
        while not flushed.is_set():
            assert time.monotonic() < deadline, "the job never reached the flush thread"
            flushed.wait(0.01)
        await pending

    try:
        asyncio.run(main())
        assert store.flushed_index() == 1
    finally:
        flush.shutdown()
        persister.close()
        store.close()
