"""A member's flush thread: the one thread that runs its persist jobs and the other disk jobs
that must not overlap them (checkpoints, a committed configuration's save), one at a time, in
the order they were queued.

The event loop queues a job with :meth:`FlushThread.run` and awaits the asyncio future it
returns; the thread runs the job and settles that future with one ``call_soon_threadsafe``.
This is the whole hand-off: a job and its future in a ``queue.SimpleQueue`` (a C queue whose
``put`` wakes the thread), one wake-up back. ``loop.run_in_executor`` on a
``ThreadPoolExecutor`` did the same work with more steps per job on the event loop's thread,
at least one job per Ready that persists on every member: the executor's shutdown lock and idle
semaphore (Python-level ``threading`` objects), a ``concurrent.futures.Future`` (with its own
``Condition``) and a work item, an asyncio future chained to it by a done-callback on each
side, and the copy of the result from one to the other (docs/PERFORMANCE.md "Nodes' CPU per
message, third pass").

A future cancelled before its job starts skips the job (as an executor's pending job is
cancelled); a job that started runs to its end whatever happens to its future, and
:meth:`FlushThread.shutdown` runs every job queued before it, then ends the thread."""

from __future__ import annotations

import asyncio
import contextlib
import queue
import threading
from collections.abc import Callable
from typing import Any, TypeVar

__all__ = ["FlushThread"]

T = TypeVar("T")

# A queued job: what to run, the future to settle, the loop that future belongs to.
_Job = tuple[Callable[[], Any], "asyncio.Future[Any]", asyncio.AbstractEventLoop]


class FlushThread:
    """One thread named ``name``, started with the first job, ended by :meth:`shutdown`."""

    def __init__(self, name: str) -> None:
        self.name = name
        self._jobs: queue.SimpleQueue[_Job | None] = queue.SimpleQueue()
        # Held to queue a job, and to start and end the thread: no job is queued behind the end.
        self._lock = threading.Lock()
        self._thread: threading.Thread | None = None
        self._shut = False

    def run(self, job: Callable[[], T]) -> asyncio.Future[T]:
        """On an event loop: queue ``job`` behind those already queued; the future is settled
        on this loop with its result or the exception it raised. Raises RuntimeError after
        :meth:`shutdown`."""
        loop = asyncio.get_running_loop()
        fut: asyncio.Future[T] = loop.create_future()
        with self._lock:
            if self._shut:
                raise RuntimeError(f"flush thread {self.name} is shut down")
            if self._thread is None:
                self._start()
            self._jobs.put((job, fut, loop))
        return fut

    def shutdown(self) -> None:
        """Run every job queued so far, then end the thread (waits for it). Idempotent."""
        with self._lock:
            if not self._shut:
                self._shut = True
                self._jobs.put(None)
            thread = self._thread
        if thread is not None and thread is not threading.current_thread():
            thread.join()

    @property
    def alive(self) -> bool:
        """Whether the thread runs (started, not ended)."""
        thread = self._thread
        return thread is not None and thread.is_alive()

    def _start(self) -> None:
        # A daemon: a process ending without the node's stop (a fatal error) must not hang
        # on it; a job cut short by that end is a crash, which the Ready contract survives
        # (nothing the job covers has been acknowledged yet).
        thread = threading.Thread(target=self._work, name=self.name, daemon=True)
        thread.start()
        self._thread = thread

    def _work(self) -> None:
        get = self._jobs.get
        while True:
            item = get()
            if item is None:
                return
            job, fut, loop = item
            del item
            if fut.cancelled():  # its waiter gave up before the job started
                continue
            result: Any = None
            error: BaseException | None = None
            try:
                result = job()
            except BaseException as exc:  # handed to the waiter, as an executor does
                error = exc
            with contextlib.suppress(RuntimeError):  # the loop is closed: nobody waits any more
                loop.call_soon_threadsafe(_settle, fut, result, error)
            del job, fut, result, error


def _settle(fut: asyncio.Future[Any], result: Any, error: BaseException | None) -> None:
    """On the waiter's loop: the job's outcome into its future (unless it was cancelled)."""
    if fut.cancelled():
        return
    if error is None:
        fut.set_result(result)
    else:
        fut.set_exception(error)
