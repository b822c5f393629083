"""The in-node half of ``bench.steps``: counts what one node does while a window is open.

Armed only in processes started by ``bench.steps`` (``sitecustomize.py`` beside this file
imports it when ``RAFTMQ_STEPS_DIR`` is set); a broker started any other way never imports it,
so production pays nothing. It imports nothing of raftmq's, so the same hook counts in any
checkout's brokers (``bench.steps --compare``). ``SIGUSR1`` opens a window, ``SIGUSR2``
closes it and writes ``<RAFTMQ_STEPS_DIR>/<pid>.json``. What a window records is read from
``<RAFTMQ_STEPS_DIR>/window.json`` when it opens (``{"mode": ..., "copy_bytes": ...}``):

- ``plain``: only the messages and entries the leader's send path proposed (the divisor of
  every per-message figure; ``bench.steps`` reads CPU, context switches and I/O from /proc).
- ``profile``: also ``cProfile``'s call count of every function that ran (Readys, advances,
  peer messages encoded and decoded, persist jobs, ``pwrite``/``fdatasync`` calls ...).
- ``copies``: also where the event loop's thread made a Python object of at least
  ``copy_bytes`` bytes (a copy of a body): ``tracemalloc`` plus a profile hook
  that, at every call and return, checks whether the traced memory's peak since the previous
  event grew by that much, and charges it to the code that ran in between. Only allocations
  Python's allocator sees count (bytes objects and the like); copies inside gRPC's core or
  upb's arenas do not show here (``bench.steps`` lists them from the code).
"""

from __future__ import annotations

import cProfile
import json
import os
import pstats
import signal
import sys
import time
import tracemalloc
from collections import Counter
from collections.abc import Callable
from types import FrameType
from typing import Any

ENV_DIR = "RAFTMQ_STEPS_DIR"
WINDOW_FILE = "window.json"
MODES = ("plain", "profile", "copies")
# The modules that have held SendPath, newest first (``bench.steps --compare`` runs older
# checkouts' brokers with this hook).
SEND_PATH_MODULES = ("broker.components.sending", "broker.sending")
# Frames kept per tracemalloc trace: the hook needs no tracebacks, only the totals.
TRACE_FRAMES = 1
# Functions listed by their own time in a profile window (what to look at first).
TOP_FUNCTIONS = 40


def _site(frame: FrameType | None) -> str:
    if frame is None:
        return "(no Python frame: the event loop, gRPC)"
    code = frame.f_code
    path = code.co_filename
    for root in ("/dledger/", "/broker/", "/msgcodec/", "/client/", "/grpc/", "/google/"):
        at = path.rfind(root)
        if at >= 0:
            path = path[at + 1 :]
            break
    return f"{path}:{frame.f_lineno} {code.co_name}"


class Window:
    """One open window in this node (at most one at a time)."""

    def __init__(self, mode: str, copy_bytes: int) -> None:
        self.mode = mode
        self.copy_bytes = copy_bytes
        self.messages = 0
        self.entries = 0
        self.entry_bytes = 0
        self.copies: Counter[str] = Counter()
        self.profile: cProfile.Profile | None = None
        self._restore: Callable[[], None] | None = None
        self._base = 0
        self.started = time.monotonic()

    def open(self) -> None:
        self._count_sends()
        if self.mode == "profile":
            self.profile = cProfile.Profile()
            self.profile.enable()
        elif self.mode == "copies":
            tracemalloc.start(TRACE_FRAMES)
            self._base = tracemalloc.get_traced_memory()[0]
            sys.setprofile(self._hook)

    def close(self) -> dict[str, Any]:
        if self.profile is not None:
            self.profile.disable()
        if self.mode == "copies":
            sys.setprofile(None)
            tracemalloc.stop()
        if self._restore is not None:
            self._restore()
        out: dict[str, Any] = {
            "mode": self.mode,
            "seconds": time.monotonic() - self.started,
            "messages": self.messages,
            "entries": self.entries,
            "entry_bytes": self.entry_bytes,
        }
        if self.profile is not None:
            stats = pstats.Stats(self.profile)
            calls: dict[str, int] = {}
            for (path, _line, name), row in stats.stats.items():  # type: ignore[attr-defined]
                key = f"{os.path.basename(path)}:{name}" if path != "~" else name
                calls[key] = calls.get(key, 0) + row[1]  # primitive + recursive calls
            out["calls"] = calls
            rows = sorted(stats.stats.items(), key=lambda kv: -kv[1][2])  # type: ignore[attr-defined]
            out["top_tottime"] = [
                [f"{os.path.basename(k[0])}:{k[1]} {k[2]}", r[1], r[2], r[3]]
                for k, r in rows[:TOP_FUNCTIONS]
            ]
        if self.mode == "copies":
            out["copy_bytes"] = self.copy_bytes
            out["copies"] = dict(self.copies)
        return out

    def _count_sends(self) -> None:
        """Count the messages and entries the send path proposes (the leader's)."""
        # Where the send path lives, newest first (a checkout before the broker's layers
        # had it in broker/sending.py, with the same _store_body).
        found = [sys.modules.get(m) for m in SEND_PATH_MODULES]
        sending = next((m for m in found if m is not None), None)
        if sending is None:
            return
        cls = sending.SendPath
        original = cls._store_body
        window = self

        async def counted(path: Any, body: bytes, uniq_ids: list[str], sent_to: str = "") -> Any:
            window.messages += len(uniq_ids)
            window.entries += 1
            window.entry_bytes += len(body)
            return await original(path, body, uniq_ids, sent_to)

        cls._store_body = counted

        def restore() -> None:
            cls._store_body = original

        self._restore = restore

    def _hook(self, frame: FrameType, event: str, arg: Any) -> None:
        current, peak = tracemalloc.get_traced_memory()
        if peak - self._base >= self.copy_bytes:
            if event in ("c_return", "c_exception"):
                name = getattr(arg, "__qualname__", None) or repr(arg)
                site = f"C {name} called at {_site(frame)}"
            elif event == "call":
                site = f"before {frame.f_code.co_name}, at {_site(frame.f_back)}"
            else:
                site = _site(frame)
            self.copies[site] += (peak - self._base) // self.copy_bytes
        tracemalloc.reset_peak()
        self._base = current


_window: Window | None = None


def _open(_sig: int, _frame: FrameType | None) -> None:
    global _window
    if _window is not None:
        return
    try:
        with open(os.path.join(os.environ[ENV_DIR], WINDOW_FILE)) as f:
            asked = json.load(f)
    except (OSError, ValueError):
        asked = {}
    mode = asked.get("mode", "plain")
    copy_bytes = int(asked.get("copy_bytes", 0))
    # A threshold of 0 would count every event: copies mode needs a size.
    _window = Window(
        mode if mode in MODES else "plain", max(1, copy_bytes) if copy_bytes else 1 << 40
    )
    _window.open()


def _close(_sig: int, _frame: FrameType | None) -> None:
    global _window
    window, _window = _window, None
    if window is None:
        return
    result = window.close()
    path = os.path.join(os.environ[ENV_DIR], f"{os.getpid()}.json")
    with open(path + ".tmp", "w") as f:
        json.dump(result, f)
    os.replace(path + ".tmp", path)


def arm() -> None:
    """Install the window's signal handlers (called by the step hook's sitecustomize)."""
    signal.signal(signal.SIGUSR1, _open)
    signal.signal(signal.SIGUSR2, _close)
