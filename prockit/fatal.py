"""Fail fast, never half alive: how a long-running part of a process ends the process.

A node whose tick task, ready loop, flush thread, apply path, scheduler or registration loop
died must not linger: peers would keep seeing a process that accepts connections but can no
longer campaign, commit or apply. Every such task is started through :func:`supervise` (asyncio)
or runs its body under :func:`guard_thread` (threads); an unexpected exception ends the process
at once with one CRITICAL log line naming the component and the cause, and exit status
:data:`EXIT_FATAL`. ``mqcluster status`` shows that line for a node that exited.

The exit is ``os._exit``: no ``finally`` blocks, no atexit handlers, no flush of buffered log
data. That is on purpose: the state is unknown, and everything durable was made durable by
fsync before it was acknowledged (recovery handles the rest, exactly as after SIGKILL).
"""

from __future__ import annotations

import asyncio
import logging
import os
import sys
import threading
import traceback
from collections.abc import Callable
from typing import Any, NoReturn, TypeVar

logger = logging.getLogger(__name__)

# EX_SOFTWARE from sysexits.h: an internal error, distinct from bad usage (2) or a failed
# check (1), so that supervisors and `mqcluster status` can tell the cases apart.
EXIT_FATAL = 70
# What a FATAL line starts with: `mqcluster status` and the tests look for it in a node's log.
FATAL_MARK = "FATAL"
# Characters of the cause kept on the FATAL line (the traceback follows on its own lines).
CAUSE_MAX_CHARS = 500

_T = TypeVar("_T")
_exit: Callable[[int], NoReturn] = os._exit  # replaced by tests that exercise fatal() in-process


def describe(exc: BaseException | str) -> str:
    """One line: the exception's type and message, bounded."""
    text = exc if isinstance(exc, str) else f"{type(exc).__name__}: {exc}"
    text = " ".join(text.split())
    return text if len(text) <= CAUSE_MAX_CHARS else text[: CAUSE_MAX_CHARS - 3] + "..."


def fatal(component: str, cause: BaseException | str) -> NoReturn:
    """Log ``FATAL component=<c> cause=<...>`` (plus the traceback) and end the process now."""
    line = f"{FATAL_MARK} component={component} cause={describe(cause)}"
    try:
        logger.critical(line)
        if isinstance(cause, BaseException) and cause.__traceback__ is not None:
            sys.stderr.write("".join(traceback.format_exception(cause)))
        for h in logging.getLogger().handlers:
            h.flush()
        sys.stderr.flush()
    finally:
        _exit(EXIT_FATAL)


def supervise(task: asyncio.Task[_T], component: str) -> asyncio.Task[_T]:
    """End the process if ``task`` ends with an exception. Cancellation (shutdown) is fine; a
    task that returns normally is fine too (loops that may end say so by returning)."""

    def done(t: asyncio.Task[_T]) -> None:
        if t.cancelled():
            return
        exc = t.exception()
        if exc is not None:
            fatal(component, exc)

    task.add_done_callback(done)
    return task


def spawn(coro: Any, component: str) -> asyncio.Task[Any]:
    """``create_task`` + :func:`supervise` on the running loop, named after the component."""
    return supervise(asyncio.get_running_loop().create_task(coro, name=component), component)


def guard_thread(component: str, body: Callable[[], None]) -> Callable[[], None]:
    """A thread target that ends the process if ``body`` raises."""

    def run() -> None:
        try:
            body()
        except BaseException as exc:  # any escape from a worker thread is fatal
            fatal(component, exc)

    run.__name__ = f"guarded_{component}"
    return run


def fatal_thread_excepthook() -> None:
    """Make an exception escaping *any* thread of this process fatal (a safety net for threads
    not started through :func:`guard_thread`, e.g. inside libraries' executors)."""

    def hook(args: threading.ExceptHookArgs) -> None:
        if args.exc_type is SystemExit:
            return
        name = args.thread.name if args.thread is not None else "thread"
        fatal(
            f"thread:{name}", args.exc_value if args.exc_value is not None else str(args.exc_type)
        )

    threading.excepthook = hook


# What a restart line starts with (a node that restarts itself to repair its store).
RESTART_MARK = "RESTART"


def _exec_self() -> NoReturn:
    """Replace this process by a fresh run of the same command line (same PID, same open
    stdin/stdout/stderr; every other descriptor is close-on-exec, so the store's lock and the
    listening ports are free for the new run)."""
    os.execv(sys.executable, [sys.executable, *sys.orig_argv[1:]])


_restart: Callable[[], NoReturn] = _exec_self  # replaced by tests that run nodes in-process


def restart(component: str, cause: BaseException | str) -> NoReturn:
    """Log ``RESTART component=<c> cause=<...>`` and start this process again from scratch,
    as after a kill: nothing is flushed or closed (everything acknowledged is durable). For
    a state that only a fresh start handles, e.g. a store cut back by damage that the whole
    process (the application's derived state included) must recover from. An exec that
    fails ends the process as :func:`fatal` does."""
    line = f"{RESTART_MARK} component={component} cause={describe(cause)}"
    try:
        logger.error(line)
        for h in logging.getLogger().handlers:
            h.flush()
        sys.stderr.flush()
        sys.stdout.flush()
        _restart()
    except OSError as exc:
        fatal(component, f"restart failed: {exc}; {line}")
