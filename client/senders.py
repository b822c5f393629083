"""The threads that carry a producer's calls: blocking gRPC calls on threads the client owns.

Why not gRPC futures: the synchronous channel runs a future's call on a "channel spin" thread
that it starts whenever its count of calls in flight goes from 0 to 1 and that exits when the
count is back at 0. A producer with one call in flight (a chain of sends, a single caller)
therefore paid a new thread per send: ``Thread.__init__`` and ``start`` (a clone and a
handshake with the new thread), and the spin thread's own start-up, most of the client's CPU
per send (docs/PERFORMANCE.md, "Our client's CPU per send"). A blocking call is driven on the
calling thread (its own completion queue), so a sender that lives across calls costs one
wake-up per call and no thread start.

``hand(fn, *args)`` runs ``fn(*args)`` on an idle sender, or on a new one while fewer than
``max_threads`` exist; beyond that the work waits for the first sender to be free. A sender
left idle for ``idle_s`` exits, so a producer that stopped sending holds no sender. After
``close()`` each piece of work gets a thread of its own (nothing handed is ever dropped).

``hand_after(fn, *args)`` on a sender thread defers the work until the sender's current work
returns, and then runs it on that same thread: a chain of sends whose next send is issued by
the previous one's callback (which runs on the sender that got the answer) costs no thread
wake-up at all, and everything the callbacks of one answer send to a group leaves in one call.
Work deferred beyond the first piece, or released early (``release_deferred``: before the
thread blocks on anything, or when the current work runs long), goes to other senders. On any
other thread ``hand_after`` is ``hand``.
"""

from __future__ import annotations

import logging
import queue
import threading
from collections.abc import Callable
from typing import Any

log = logging.getLogger(__name__)

# The work a sender runs: a function and its arguments; None tells one sender to exit.
_Work = tuple[Callable[..., None], tuple[Any, ...]] | None


class Senders:
    """A pool of sender threads, made on demand and bounded (module docstring)."""

    def __init__(self, name: str, max_threads: int, idle_s: float) -> None:
        assert max_threads >= 1 and idle_s > 0, (max_threads, idle_s)
        self._name = name
        self._max_threads = max_threads
        self._idle_s = idle_s
        self._work: queue.SimpleQueue[_Work] = queue.SimpleQueue()
        self._lock = threading.Lock()
        self._gone = threading.Condition(self._lock)  # the last sender left (close waits)
        self._threads = 0  # senders alive
        self._idle = 0  # senders waiting for work
        self._queued = 0  # work handed and not yet taken
        self._made = 0  # senders ever started (names, and tests)
        self._closed = False
        # Per thread: the work deferred by hand_after (a list only on a sender thread).
        self._local = threading.local()

    @property
    def started(self) -> int:
        """How many sender threads were ever started."""
        return self._made

    def hand(self, fn: Callable[..., None], *args: Any) -> None:
        """Runs ``fn(*args)`` on a sender thread; never blocks. ``fn`` must not raise."""
        with self._lock:
            closed = self._closed
            if not closed:
                self._queued += 1
                start = self._queued > self._idle and self._threads < self._max_threads
                if start:
                    self._threads += 1
                    self._made += 1
                number = self._made
        if closed:
            threading.Thread(target=fn, args=args, daemon=True).start()
            return
        self._work.put((fn, args))
        if start:
            threading.Thread(target=self._run, name=f"{self._name}-{number}", daemon=True).start()

    def hand_after(self, fn: Callable[..., None], *args: Any) -> None:
        """On a sender thread: ``fn(*args)`` once the current work is over (module
        docstring); elsewhere :meth:`hand`."""
        deferred: list[tuple[Callable[..., None], tuple[Any, ...]]] | None = getattr(
            self._local, "deferred", None
        )
        if deferred is None:
            self.hand(fn, *args)
        else:
            deferred.append((fn, args))

    def release_deferred(self) -> None:
        """Hands this thread's deferred work to other senders now (before the thread waits
        for something that deferred work may be needed for)."""
        deferred = getattr(self._local, "deferred", None)
        if deferred:
            work, deferred[:] = list(deferred), []
            for fn, args in work:
                self.hand(fn, *args)

    def _work_on(self, fn: Callable[..., None], args: tuple[Any, ...]) -> None:
        """``fn(*args)``, then what it deferred: the first piece here, the rest elsewhere,
        until nothing is left (a loop, never a recursion: a chain of sends is long)."""
        deferred: list[tuple[Callable[..., None], tuple[Any, ...]]] = []
        self._local.deferred = deferred
        try:
            while True:
                try:
                    fn(*args)
                except Exception:
                    log.exception("sender work failed")
                if not deferred:
                    return
                (fn, args), rest = deferred[0], deferred[1:]
                deferred.clear()
                for other, other_args in rest:
                    self.hand(other, *other_args)
        finally:
            self._local.deferred = None
            for other, other_args in deferred:  # only if the loop was left by an error
                self.hand(other, *other_args)

    def _run(self) -> None:
        while True:
            with self._lock:
                self._idle += 1
            try:
                work = self._work.get(timeout=self._idle_s)
            except queue.Empty:
                with self._lock:
                    self._idle -= 1
                    if self._queued > 0:  # handed while we timed out: it counted on us
                        continue
                    self._leave()
                    return
            with self._lock:
                self._idle -= 1
                self._queued -= 1
                if work is None:
                    self._leave()
                    return
            self._work_on(*work)

    def _leave(self) -> None:
        """A sender exits (the lock is held)."""
        self._threads -= 1
        if self._threads == 0:
            self._gone.notify_all()

    def close(self, timeout_s: float) -> None:
        """Tells every sender to exit once the work handed before is done; waits at most
        ``timeout_s`` for them. Work handed afterwards runs on threads of its own."""
        with self._lock:
            self._closed = True
            alive = self._threads
            self._queued += alive
        for _ in range(alive):
            self._work.put(None)
        with self._gone:
            if not self._gone.wait_for(lambda: self._threads == 0, timeout_s):
                log.warning("%d %s threads still busy at close", self._threads, self._name)
